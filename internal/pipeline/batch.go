package pipeline

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/wal"
)

// BatchLimits bound one batch of whole source transactions.
type BatchLimits struct {
	// Changes is the row-change count after which a batch is closed.
	Changes int
	// Bytes is the approximate payload size after which a batch is closed.
	Bytes int
	// Delay is the longest a batch waits for more transactions once it has one
	// while the pipeline keeps up; behind, up to MaxDelay (see batchSizer).
	Delay time.Duration
	// Idle closes a batch early when no transaction follows for this long.
	// Default Delay: measured in make bench, a 5 ms idle gap saved about
	// 15 ms of median freshness but split bursts (W2's 200 hot renames)
	// into more batches, doubling the fan-out writes.
	Idle time.Duration
	// MaxDelay bounds how long a batch waits while the pipeline is behind
	// (see batchSizer). Default 10 × Delay.
	MaxDelay time.Duration
	// Spacing is the least time between two batches that close because
	// nothing more is queued (see collect): a steady stream is taken in
	// batches this far apart instead of one transaction at a time, which
	// costs each change several times the CPU. Default 20 ms.
	Spacing time.Duration
}

// SetDefaults fills the limits left zero.
func (b *BatchLimits) SetDefaults() {
	if b.Changes == 0 {
		b.Changes = 10_000
	}
	if b.Bytes == 0 {
		b.Bytes = 32 << 20
	}
	if b.Delay == 0 {
		b.Delay = 100 * time.Millisecond
	}
	if b.Idle == 0 {
		b.Idle = b.Delay
	}
	if b.MaxDelay == 0 {
		b.MaxDelay = 10 * b.Delay
	}
	if b.Spacing == 0 {
		b.Spacing = 20 * time.Millisecond
	}
}

// batch is a run of whole transactions.
type batch struct {
	txns    []*cdc.Txn
	changes int
	bytes   int
	timing  BatchTiming
}

// BatchTiming is where a batch's time went (logged at debug level, and
// observed by the daemon's metrics through Phases).
type BatchTiming struct {
	collect, mapping, join, write, verify, target, redis time.Duration
}

// Phase is one phase of a batch's work and the time it took.
type Phase struct {
	Name string
	Time time.Duration
}

// Phases returns the batch's phases in the order they run.
func (t *BatchTiming) Phases() []Phase {
	return []Phase{{"collect", t.collect}, {"map", t.mapping}, {"join", t.join}, {"write", t.write},
		{"verify", t.verify}, {"target_commit", t.target}, {"redis_commit", t.redis}}
}

func (t *BatchTiming) attrs() []any {
	var out []any
	for _, ph := range t.Phases() {
		out = append(out, ph.Name+"_ms", float64(ph.Time.Microseconds())/1000)
	}
	return out
}

// stopwatch returns a function that stores in *d the time since its
// previous call (or since stopwatch was called).
func stopwatch() func(d *time.Duration) {
	lap := time.Now()
	return func(d *time.Duration) {
		now := time.Now()
		*d, lap = now.Sub(lap), now
	}
}

func (b *batch) end() wal.LSN { return b.txns[len(b.txns)-1].EndLSN }

// collect adds whole transactions to a batch that starts with first, until a
// limit is reached, the delay passes, or a transaction on the other side of
// the target checkpoint arrives (replayed and new transactions are never
// mixed). It also closes the batch as soon as no transaction is queued while
// the pipeline can take the batch at once (nothing in flight, or the last
// batch in flight done with the target), once Spacing has passed since the
// previous batch closed: a lone change goes out at once, and a steady stream
// in batches Spacing apart. While the pipeline is busy, the batch keeps
// taking what arrives until it is not (or the idle gap passes with nothing
// new), so batches grow with the load. After a fan-out batch it waits out
// its delay.
func (p *Pipeline) collect(ctx context.Context, first *cdc.Txn, inFlight []*commitJob) *batch {
	b := &batch{txns: []*cdc.Txn{first}, changes: len(first.Changes), bytes: first.Bytes}
	if p.cuts[first.EndLSN] {
		return b
	}
	replay := first.EndLSN <= p.targetCheckpoint()
	deadline := time.Now().Add(p.sizer.delay())
	defer func() { p.lastClose = time.Now() }()
	var busy <-chan struct{} // closed when the pipeline can take the batch
	if n := len(inFlight); n > 0 {
		busy = inFlight[n-1].targetDone
	}
	for b.changes < p.sizer.changeLimit() && b.bytes < p.limits.Bytes && ctx.Err() == nil {
		t, err := p.take(ctx, busy, deadline)
		if err != nil || t == nil {
			break // closed, shutdown, or the stream stopped: run sees it next
		}
		if !t.Final || (t.EndLSN <= p.targetCheckpoint()) != replay {
			p.held = t
			break
		}
		b.txns = append(b.txns, t)
		b.changes += len(t.Changes)
		b.bytes += t.Bytes
		if p.cuts[t.EndLSN] {
			break
		}
	}
	return b
}

// take returns the next queued transaction for the batch being collected,
// or nil when the batch should close: nothing is queued and the pipeline is
// free (busy is nil or closed, and the last batch was no fan-out), or
// nothing came within the idle gap or by the deadline.
func (p *Pipeline) take(ctx context.Context, busy <-chan struct{}, deadline time.Time) (*cdc.Txn, error) {
	now, cancel := context.WithCancel(ctx)
	cancel()
	if t, err := p.source.Next(now); err == nil || ctx.Err() != nil {
		return t, err
	}
	free := func() bool {
		if busy == nil {
			return true
		}
		select {
		case <-busy:
			return true
		default:
			return false
		}
	}
	spaced, isFree := p.lastClose.Add(p.limits.Spacing), free()
	if !p.sizer.fanOut && isFree && !time.Now().Before(spaced) {
		return nil, nil
	}
	until := time.Now().Add(p.limits.Idle)
	if !p.sizer.fanOut && isFree {
		until = spaced // then close, if nothing came
	}
	if deadline.Before(until) {
		until = deadline
	}
	wait, cancelWait := context.WithDeadline(ctx, until)
	defer cancelWait()
	if !p.sizer.fanOut && !isFree {
		// Wake when the pipeline frees up: the batch closes then.
		go func() {
			select {
			case <-busy:
				cancelWait()
			case <-wait.Done():
			}
		}()
	}
	t, err := p.source.Next(wait)
	if err != nil {
		return nil, nil
	}
	return t, nil
}

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
	// fanOut says a join of the last prepared batch wrote fanOutRatio
	// times more target rows than it had changes (fannedOut; the batch
	// loop's alone).
	fanOut bool
}

// fanOutRatio and fanOutChanges: a batch that writes fanOutRatio times more
// target rows than it has changes is paying for fan-outs (a hot right row
// rewritten in its dependents, once per batch), not for its changes; the
// next batch may take fanOutChanges times the change limit and wait
// fanOutWait times as long as the last batch's work for them, so that each
// fan-out is paid for more changes, and fkmat leaves the database more of
// the machine, at the cost of the target's freshness under such a load.
// The byte limit still holds.
// pgbench's TPC-B, whose every transaction changes one of a few branches
// with 100k accounts each, is such a load.
const (
	fanOutRatio   = 4
	fanOutChanges = 4
	fanOutWait    = 2
)

// fannedOut reports whether a join's changes of a batch made fanOutRatio
// times as many target rows: a join's own, so that several joins of one
// table, each writing a row per change, are not taken for a fan-out.
func fannedOut(changes, rows int) bool {
	return changes > 0 && rows >= fanOutRatio*changes
}

// changeLimit is the change count after which the next batch is closed.
func (s *batchSizer) changeLimit() int {
	if s.fanOut {
		return fanOutChanges * s.limits.Changes
	}
	return s.limits.Changes
}

// delay returns how long the next batch may wait for transactions: as
// long as the last batch's work, fanOutWait times as long after a fan-out
// batch, between Delay and MaxDelay (fanOutChanges times MaxDelay after a
// fan-out batch).
func (s *batchSizer) delay() time.Duration {
	d := s.limits.Delay
	limit := max(s.limits.MaxDelay, s.limits.Delay)
	w := time.Duration(s.work.Load())
	if s.fanOut {
		limit *= fanOutChanges
		w *= fanOutWait
	}
	if w > d {
		d = min(w, limit)
	}
	return d
}

// worked records the work of a committed batch.
func (s *batchSizer) worked(d time.Duration) { s.work.Store(int64(d)) }

// whereTxns names transactions for a recovered panic (crash.Recover): the
// one in hand, or the range of a batch, with the first one's commit LSN.
func whereTxns(what string, txns []*cdc.Txn) (string, uint64) {
	switch len(txns) {
	case 0:
		return what + ", between transactions", 0
	case 1:
		t := txns[0]
		return fmt.Sprintf("%s, in the transaction xid %d committed at %s (chunk %d)", what, t.Xid, t.CommitLSN, t.Chunk), uint64(t.CommitLSN)
	}
	first, last := txns[0], txns[len(txns)-1]
	return fmt.Sprintf("%s, in the batch of %d transactions committed from %s (xid %d) to %s (xid %d)",
		what, len(txns), first.CommitLSN, first.Xid, last.CommitLSN, last.Xid), uint64(first.CommitLSN)
}
