package fkmat

import (
	"sync/atomic"
	"time"
)

// batchSizer adapts how long the next batch collects transactions to how
// far behind the pipeline is: a batch waits at least as long as the
// previous batch's work took (mapping, join, target write, commits), up to
// MaxDelay. When every batch fans a hot right row out to its dependents, as
// pgbench's branches do, each fan-out is then paid for a longer stretch of
// transactions instead of once per Delay. While the source is quiet,
// batches are cheap and the delay stays at Delay, and the idle gap (Idle)
// still closes a batch early when no transaction follows, so freshness
// does not suffer.
//
// The change limit does not grow: measured in make bench, batches of 100k
// changes in W1's catch-up pushed the heap past the daemon's soft memory
// limit and took 5 times the CPU per change.
type batchSizer struct {
	limits BatchLimits
	// work is the last committed batch's work (ns), written by the commit.
	work atomic.Int64
}

// delay returns how long the next batch may wait for transactions.
func (s *batchSizer) delay() time.Duration {
	d := s.limits.Delay
	if w := time.Duration(s.work.Load()); w > d {
		d = min(w, max(s.limits.MaxDelay, s.limits.Delay))
	}
	return d
}

// worked records the work of a committed batch.
func (s *batchSizer) worked(d time.Duration) { s.work.Store(int64(d)) }
