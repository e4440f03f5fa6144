package fkmat

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fkmat/fkmat/internal/wal"
)

// TestStallTracker: the same root cause at the same restart position is a
// recurrence, however it is wrapped; another position, another cause or a
// failure before streaming starts over; progress forgets the stall.
func TestStallTracker(t *testing.T) {
	t.Parallel()
	var st stallTracker
	cause := errors.New("value too long for type character varying(3)")
	steps := []struct {
		pos  wal.LSN
		ok   bool
		err  error
		want int
	}{
		{100, true, fmt.Errorf("batch of 3: %w", cause), 0},
		{100, true, fmt.Errorf("batch of 7: %w", cause), 1},
		{100, true, fmt.Errorf("batch of 1: %w", cause), 2},
		{200, true, cause, 0},
		{200, true, errors.New("another cause"), 0},
		{200, false, errors.New("another cause"), 0},
	}
	for i, s := range steps {
		got := st.observe(s.pos, s.ok, s.err)
		if got.Recurrences != s.want {
			t.Errorf("step %d: %d recurrences, want %d", i, got.Recurrences, s.want)
		}
		if got.Position != s.pos || got.Error != s.err.Error() {
			t.Errorf("step %d: stall %+v", i, got)
		}
	}
	if st.progress() {
		t.Error("progress reported a stall after a first occurrence")
	}
	st.observe(100, true, cause)
	st.observe(100, true, cause)
	if !st.progress() {
		t.Error("progress did not report the stall it ended")
	}
	if got := st.observe(100, true, cause); got.Recurrences != 0 {
		t.Errorf("after progress: %d recurrences, want 0", got.Recurrences)
	}
}
