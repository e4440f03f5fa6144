package fkmat

import (
	"testing"
	"time"
)

// TestRetryWait: the wait before a restart is drawn in [d/2, d), so that it
// never passes the backoff's cap.
func TestRetryWait(t *testing.T) {
	t.Parallel()
	for _, d := range []time.Duration{time.Second, 8 * time.Second, maxRetryDelay} {
		lo, hi := d, time.Duration(0)
		for range 2000 {
			w := retryWait(d)
			lo, hi = min(lo, w), max(hi, w)
		}
		if lo < d/2 || hi >= d || hi-lo < d/3 {
			t.Errorf("retryWait(%s) ranged over [%s, %s], want within [%s, %s) and spread", d, lo, hi, d/2, d)
		}
	}
}
