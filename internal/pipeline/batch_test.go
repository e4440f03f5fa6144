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
