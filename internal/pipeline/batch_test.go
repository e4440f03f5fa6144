package pipeline

import (
	"testing"
	"time"
)

// TestBatchSizer: the delay of the next batch follows the last batch's
// work, between Delay and MaxDelay (10 × Delay by default).
func TestBatchSizer(t *testing.T) {
	t.Parallel()
	l := BatchLimits{}
	l.SetDefaults()
	s := batchSizer{limits: l}
	for _, c := range []struct{ work, want time.Duration }{
		{0, 100 * time.Millisecond},
		{30 * time.Millisecond, 100 * time.Millisecond},  // cheap batches: Delay
		{400 * time.Millisecond, 400 * time.Millisecond}, // a fan-out batch lengthens the next
		{5 * time.Second, time.Second},                   // within MaxDelay
		{10 * time.Millisecond, 100 * time.Millisecond},  // and back
	} {
		s.worked(c.work)
		if got := s.delay(); got != c.want {
			t.Fatalf("after a batch of %s of work, delay %s; want %s", c.work, got, c.want)
		}
	}
	small := BatchLimits{Changes: 40, Delay: 20 * time.Millisecond}
	small.SetDefaults()
	if small.MaxDelay != 200*time.Millisecond || small.Idle != 20*time.Millisecond {
		t.Fatalf("defaults for Delay 20ms = %+v", small)
	}
}

// TestBatchSizerFanOut: after a batch that wrote fanOutRatio times more
// target rows than it had changes, the next may take fanOutChanges times
// the change limit and wait fanOutWait times its work, up to
// fanOutChanges × MaxDelay; after an ordinary batch, the limits are back.
func TestBatchSizerFanOut(t *testing.T) {
	t.Parallel()
	l := BatchLimits{}
	l.SetDefaults()
	s := batchSizer{limits: l}
	s.worked(400 * time.Millisecond)
	for _, c := range []struct {
		changes, rows int
		wantLimit     int
		wantDelay     time.Duration
	}{
		{1000, 1000, l.Changes, 400 * time.Millisecond},                                 // one row per change
		{1000, fanOutRatio*1000 - 1, l.Changes, 400 * time.Millisecond},                 // just under the ratio
		{1000, 200_000, fanOutChanges * l.Changes, fanOutWait * 400 * time.Millisecond}, // a fan-out
		{0, 0, l.Changes, 400 * time.Millisecond},                                       // nothing
	} {
		s.output(c.changes, c.rows)
		if got := s.changeLimit(); got != c.wantLimit {
			t.Errorf("after %d changes making %d rows: change limit %d, want %d", c.changes, c.rows, got, c.wantLimit)
		}
		if got := s.delay(); got != c.wantDelay {
			t.Errorf("after %d changes making %d rows: delay %s, want %s", c.changes, c.rows, got, c.wantDelay)
		}
	}
	s.output(10, 10_000)
	s.worked(10 * time.Second)
	if got, want := s.delay(), fanOutChanges*l.MaxDelay; got != want {
		t.Errorf("a long fan-out: delay %s, want %s", got, want)
	}
}
