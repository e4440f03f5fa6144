package fkmat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
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
}

func (b *BatchLimits) setDefaults() {
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
}

// joinRunner is one join's engine, state and column mapping.
type joinRunner struct {
	plan   *plan.JoinPlan
	engine *join.Engine
	// store is the join's Redis state; state is the same store as the
	// pipeline uses it (a fake in the pipeline's unit tests).
	store *redisstore.Store
	state stateStore
	// pending is the engine's reader: the store, overlaid with the
	// mutations of the batches whose commits are in flight, the older
	// through older (nearer the store), the newer through pending.
	pending, older *join.Pending
	mapper         changeMapper
	// epoch is the Redis state's epoch the daemon started streaming with.
	epoch string
	// chain, for a list-form join, holds its steps; engine, store,
	// pending and older are then unused, and state is the chain's.
	chain *chainRunner
}

// apply joins a batch's changes. bound says what the batch brings: a chain
// step whose checkpoint is at least bound has it already (a replay after a
// crash between the steps' commits), and only the steps before it run.
// flush, inside a large transaction, writes a chain's pages of a fan-out
// through an entry before the last as partial state (join.Chain.ApplyPrefix);
// without it such a fan-out beyond a page fails with join.ErrChainFanOut,
// and the pipeline applies the batch's transactions as large ones.
func (jr *joinRunner) apply(ctx context.Context, changes []join.Change, bound cdc.LSN, emit func(context.Context, join.Output) error,
	flush func(context.Context, join.Mutations) error) (join.Mutations, error) {
	if jr.chain == nil {
		return jr.engine.Apply(ctx, changes, emit)
	}
	var pages func(context.Context, []join.Mutations) error
	if flush != nil {
		pages = func(ctx context.Context, muts []join.Mutations) error { return flush(ctx, join.ChainMutations(muts)) }
	}
	muts, err := jr.chain.chain.ApplyPrefix(ctx, changes, jr.chain.prefix(bound), emit, pages)
	if errors.Is(err, join.ErrChainNullRight) {
		// Nothing of the batch is committed. Once everything has stopped,
		// the daemon drops the join's state (daemon.stream), so that the
		// restart finds it lost and rebuilds it (or refuses, naming fkmat
		// backfill --force, with --on-lost-state refuse).
		return join.Mutations{}, &chainRebuild{jr: jr, err: err}
	}
	if err != nil {
		return join.Mutations{}, err
	}
	return join.ChainMutations(muts), nil
}

// stats returns the join's engine counters.
func (jr *joinRunner) stats() join.Stats {
	if jr.chain != nil {
		return jr.chain.stats()
	}
	return jr.engine.Stats()
}

// overlay sets the in-flight mutations the engine reads through: older
// (the batch in its state commit) and newer (the next one); nil for none.
func (jr *joinRunner) overlay(older, newer *join.Mutations) error {
	if jr.chain != nil {
		return jr.chain.overlay(older, newer)
	}
	err := jr.older.Set(older)
	if err2 := jr.pending.Set(newer); err == nil {
		err = err2
	}
	return err
}

// chainRebuild is a change a join chain cannot follow (ErrChainNullRight):
// its state must be rebuilt.
type chainRebuild struct {
	jr  *joinRunner
	err error
}

func (e *chainRebuild) Error() string {
	return fmt.Sprintf("join %q: %v; its state is dropped and rebuilt", e.jr.plan.Name, e.err)
}

func (e *chainRebuild) Unwrap() []error { return []error{errStateChanged, e.err} }

// errStateChanged means a join's Redis state vanished or was replaced while
// the daemon ran; the pipeline restarts and the start-up checks decide
// (rebuild or refuse).
var errStateChanged = errors.New("redis state lost or replaced while running")

// verifyState checks, after the engine's reads and before the target
// commit, that the join's Redis state is still the one the daemon started
// with. If it vanished (FLUSHALL, eviction) the reads may have seen empty
// state and the output would be wrong: nothing is committed. A loss after
// this check is harmless: the reads came before it.
func (jr *joinRunner) verifyState(ctx context.Context) error {
	m, err := jr.state.Meta(ctx)
	if errors.Is(err, redisstore.ErrNoState) || (err == nil && m.Epoch != jr.epoch) {
		return fmt.Errorf("join %q: %w", jr.plan.Name, errStateChanged)
	}
	if err != nil {
		return fmt.Errorf("join %q: %w", jr.plan.Name, err)
	}
	return nil
}

// errFinalBatch marks a failure of the batch the pipeline finishes during
// shutdown: its effect is not committed, and the exit must say so.
var errFinalBatch = errors.New("the last batch failed during shutdown")

// pipeline is the batch loop: cdc → join → sink → redisstore → ack.
type pipeline struct {
	slot        string
	publication string
	joins       []*joinRunner
	writer      targetDB
	stream      txnSource
	limits      BatchLimits
	sizer       batchSizer
	// stages, when set (by tests), replace commitTarget and commitState.
	stages *commitStages
	log    *slog.Logger

	// targetLSN is the slot's checkpoint in the target database: every
	// transaction with EndLSN <= targetLSN is already in the target.
	targetLSN atomic.Uint64
	// held is a chunk received while collecting that belongs to the next
	// batch.
	held *cdc.Txn
	// garbage is set when a batch dropped a generation of Redis keys
	// (TRUNCATE); the sweeper deletes them.
	garbage atomic.Bool
	// progress, when set, is called after every committed batch.
	progress func()
	// placed caches, per relation, whether a join uses it.
	placed map[*cdc.Relation]bool
	// stats, read by the metrics handler
	batches, txns, changes, upserted, deleted atomic.Int64
	// lastCommit is the source commit time (Unix ns) of the last applied
	// transaction; firstSeen that of the first one received; started is
	// when the pipeline started.
	lastCommit, firstSeen atomic.Int64
	started               time.Time
	// timings, when set, receives each committed batch's timings.
	timings func(batchTiming)
	// inLarge is set while a large transaction is applied chunk by chunk
	// (its end is not received yet).
	inLarge atomic.Bool
	// cuts are the checkpoints of join-chain steps ahead of their chain's
	// first step (a crash between the steps' commits): a batch ends at a
	// transaction ending there, so that no batch straddles a step's
	// checkpoint (chainRunner.prefix).
	cuts map[cdc.LSN]bool
}

// applied records the source commit time of the last transaction applied.
func (p *pipeline) applied(t *cdc.Txn) {
	if !t.CommitTime.IsZero() {
		p.lastCommit.Store(t.CommitTime.UnixNano())
	}
}

// lag is how far the pipeline is behind the source at now: while it has a
// backlog (transactions received and not applied, or changes waiting), the
// time since the source commit of the last transaction it applied (before
// the first, of the first it received; before that, since it started); 0
// without a backlog. It overstates the lag of the oldest waiting change by
// at most the time between two source commits. last is the commit time of
// the last transaction applied (zero before the first).
func (p *pipeline) lag(now time.Time) (seconds float64, last time.Time) {
	if ns := p.lastCommit.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	st := p.stream.Stats()
	if st.ReceivedLSN <= st.AckedLSN && st.BufferedChanges == 0 && !p.inLarge.Load() {
		return 0, last
	}
	since := last
	if since.IsZero() {
		if ns := p.firstSeen.Load(); ns != 0 {
			since = time.Unix(0, ns)
		} else {
			since = p.started
		}
	}
	return max(0, now.Sub(since).Seconds()), last
}

// batch is a run of whole transactions.
type batch struct {
	txns    []*cdc.Txn
	changes int
	bytes   int
	timing  batchTiming
}

// batchTiming is where a batch's time went (logged at debug level).
type batchTiming struct {
	collect, mapping, join, write, verify, target, redis time.Duration
}

func (t *batchTiming) attrs() []any {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return []any{"collect_ms", ms(t.collect), "map_ms", ms(t.mapping), "join_ms", ms(t.join),
		"write_ms", ms(t.write), "verify_ms", ms(t.verify), "target_commit_ms", ms(t.target), "redis_commit_ms", ms(t.redis)}
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

// target is the target checkpoint.
func (p *pipeline) target() cdc.LSN { return cdc.LSN(p.targetLSN.Load()) }

func (b *batch) end() cdc.LSN { return b.txns[len(b.txns)-1].EndLSN }

// run applies batches until ctx is done; then it finishes the batches in
// hand and returns nil (a clean shutdown) or the first error.
//
// Batches overlap in three stages: while batch N's Redis state commit runs,
// batch N+1's target rows are written and committed, and batch N+2 is
// collected, mapped and joined, reading the Redis state through overlays of
// N's and N+1's mutations (join.Pending), which are the state their commits
// produce. Each batch's target commit follows the previous batch's target
// commit, and its state commit and acknowledgement follow the previous
// batch's state commit, so checkpoints and acknowledgements keep their
// order; an error in a batch discards every later one before it commits
// anything more (a target already committed ahead of the state is replayed
// for Redis only on the next start).
func (p *pipeline) run(ctx context.Context) (err error) {
	var f []*commitJob // in flight, oldest first
	defer func() {
		if werr := p.waitAll(f); err == nil {
			err = werr
		}
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", errFinalBatch, err)
		}
	}()
	for {
		if f, err = p.trim(f); err != nil {
			return err
		}
		if ctx.Err() != nil {
			// Shutdown: the stream still returns what it has queued, but
			// only the batches in hand are finished.
			return nil
		}
		first, err := p.nextWhile(ctx, f)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if !first.Final {
			err := p.waitAll(f)
			f = nil
			if err != nil {
				return err
			}
			// Chunks commit their state as they go: nothing may be overlaid.
			for _, jr := range p.joins {
				_ = jr.overlay(nil, nil)
			}
			if err := p.applyLarge(ctx, first); err != nil {
				return err
			}
			continue
		}
		start := time.Now()
		b := p.collect(ctx, first)
		b.timing.collect = time.Since(start)
		// At most two batches in flight while the next is joined: one in
		// its state commit, one in its target commit.
		for len(f) > 2 {
			if err := p.wait(f[0]); err != nil {
				return err
			}
			f = f[1:]
		}
		// The batch in hand is finished even during shutdown, within a
		// grace period. A batch is never timed out while the daemon runs:
		// a right row with a million dependents takes as long as it takes,
		// and a deadline would fail it again on every restart.
		bctx, cancel := afterGrace(ctx, shutdownGrace)
		job, err := p.prepare(bctx, b, f)
		if err == nil {
			f, err = p.trim(f)
		}
		if err != nil {
			if job != nil && job.tx != nil {
				_ = job.tx.Rollback(context.WithoutCancel(bctx))
			}
			cancel()
			if errors.Is(err, join.ErrChainFanOut) {
				// Nothing of the batch is written: apply its transactions
				// one at a time as large ones, whose chain pages are
				// written as they come.
				err := p.applyEach(ctx, b, f)
				f = nil
				if err != nil {
					return err
				}
				continue
			}
			return err
		}
		var prev *commitJob
		if len(f) > 0 {
			prev = f[len(f)-1]
		}
		f = append(f, p.startCommit(bctx, cancel, job, prev))
	}
}

// shutdownGrace is how long the batch in hand may still take after shutdown
// begins.
const shutdownGrace = 30 * time.Second

// afterGrace returns a context that is not canceled with ctx but grace
// after it: work started under it finishes unless it outlasts the grace.
func afterGrace(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	gctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel(fmt.Errorf("shutdown: the batch in hand did not finish within %s", grace))
		case <-gctx.Done():
		}
	})
	return gctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// next returns the held chunk or the stream's next one.
func (p *pipeline) next(ctx context.Context) (*cdc.Txn, error) {
	if t := p.held; t != nil {
		p.held = nil
		return t, nil
	}
	t, err := p.stream.Next(ctx)
	if err == nil && !t.CommitTime.IsZero() {
		p.firstSeen.CompareAndSwap(0, t.CommitTime.UnixNano())
	}
	return t, err
}

// collect adds whole transactions to a batch that starts with first, until a
// limit is reached, the delay passes, no transaction follows within the idle
// gap, or a transaction on the other side of the target checkpoint arrives
// (replayed and new transactions are never mixed).
func (p *pipeline) collect(ctx context.Context, first *cdc.Txn) *batch {
	b := &batch{txns: []*cdc.Txn{first}, changes: len(first.Changes), bytes: first.Bytes}
	if p.cuts[first.EndLSN] {
		return b
	}
	replay := first.EndLSN <= p.target()
	deadline := time.Now().Add(p.sizer.delay())
	for b.changes < p.limits.Changes && b.bytes < p.limits.Bytes && ctx.Err() == nil {
		until := time.Now().Add(p.limits.Idle)
		if deadline.Before(until) {
			until = deadline
		}
		wait, cancel := context.WithDeadline(ctx, until)
		t, err := p.stream.Next(wait)
		cancel()
		if err != nil {
			break // idle, delay passed, shutdown, or the stream stopped: run sees it next
		}
		if !t.Final || (t.EndLSN <= p.target()) != replay {
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

// commitJob is a prepared batch: joined, its target rows and Redis
// mutations computed, its commits not yet done (or running).
type commitJob struct {
	b           *batch
	end         cdc.LSN
	writeTarget bool
	// touched marks the joins the batch had changes for.
	touched []bool
	// outs are the target outputs per join, buffered until the job's turn;
	// tx is set when they were too many and went straight into it.
	outs [][]join.Output
	tx   targetTx
	muts []join.Mutations
	// truncations are the batch's TRUNCATEs, noted with its target write.
	truncations []truncation
	// targetDone is closed when the target stage is done, with its result
	// in targetErr; finished when the job is done, with its result in err.
	targetDone chan struct{}
	targetErr  error
	finished   chan struct{}
	err        error
}

// errEarlierFailed ends a batch whose predecessor failed: it commits
// nothing more (the predecessor's error is the one reported).
var errEarlierFailed = errors.New("an earlier batch failed")

// maxBufferedRows bounds the target rows a prepared batch holds in memory;
// past it (a big fan-out) the batch waits for the one in flight and writes
// its rows into its own target transaction as they come.
const maxBufferedRows = 50_000

// prepare maps and joins a batch. The engines read the state through an
// overlay of the in-flight batch's mutations; if those cannot be overlaid
// (a TRUNCATE), or the batch's output outgrows maxBufferedRows, prepare
// first waits for the in-flight batch, whose error it then returns.
func (p *pipeline) prepare(ctx context.Context, b *batch, f []*commitJob) (*commitJob, error) {
	job := &commitJob{b: b, end: b.end(), touched: make([]bool, len(p.joins)),
		outs: make([][]join.Output, len(p.joins)), muts: make([]join.Mutations, len(p.joins))}
	job.writeTarget = job.end > p.target()
	phase := stopwatch()
	for _, t := range b.txns {
		if err := p.checkPlaced(t); err != nil {
			return nil, err
		}
		if job.writeTarget {
			job.truncations = appendTruncations(job.truncations, t)
		}
	}
	perJoin := make([][]join.Change, len(p.joins))
	spans := make([][]txnSpan, len(p.joins))
	for i, jr := range p.joins {
		var err error
		if perJoin[i], spans[i], err = jr.changes(b.txns); err != nil {
			return nil, err
		}
		job.touched[i] = len(perJoin[i]) > 0
	}
	phase(&b.timing.mapping)

	settled := len(f) == 0
	settle := func() error {
		if settled {
			return nil
		}
		settled = true
		return p.waitAll(f)
	}
	for i, jr := range p.joins {
		var older, newer *join.Mutations
		switch len(f) {
		case 1:
			newer = &f[0].muts[i]
		case 2:
			older, newer = &f[0].muts[i], &f[1].muts[i]
		}
		if err := jr.overlay(older, newer); errors.Is(err, join.ErrCannotOverlay) {
			if err := settle(); err != nil {
				return nil, err
			}
			_ = jr.overlay(nil, nil)
		}
	}
	buffered := 0
	for i, jr := range p.joins {
		if !job.touched[i] {
			continue
		}
		emit := func(ctx context.Context, out join.Output) error {
			if !job.writeTarget {
				return nil // replaying for Redis only: the target has it
			}
			if job.tx == nil {
				if buffered += out.Rows(); buffered <= maxBufferedRows {
					job.outs[i] = append(job.outs[i], out)
					return nil
				}
				// Too much to hold: write it now, in this batch's own
				// transaction, once the batch in flight is committed.
				if err := settle(); err != nil {
					return err
				}
				if err := p.beginTarget(ctx, job); err != nil {
					return err
				}
			}
			return job.tx.Apply(ctx, &jr.plan.Target, out)
		}
		var err error
		if job.muts[i], err = jr.apply(ctx, perJoin[i], job.end, emit, nil); err != nil {
			if job.tx != nil {
				_ = job.tx.Rollback(context.WithoutCancel(ctx))
			}
			return nil, jr.failure(spans[i], fmt.Errorf("join %q: %w", jr.plan.Name, err))
		}
	}
	phase(&b.timing.join)
	return job, nil
}

// beginTarget opens the job's target transaction and writes its buffered
// outputs into it.
func (p *pipeline) beginTarget(ctx context.Context, job *commitJob) error {
	tx, err := p.writer.Begin(ctx)
	if err != nil {
		return err
	}
	job.tx = tx
	for i, outs := range job.outs {
		for _, out := range outs {
			if err := tx.Apply(ctx, &p.joins[i].plan.Target, out); err != nil {
				return err
			}
		}
		job.outs[i] = nil
	}
	return nil
}

// startCommit runs the job's commits in the background, after prev's
// (nil: none in flight); wait collects the result. cancel releases the
// job's context when it is done.
func (p *pipeline) startCommit(ctx context.Context, cancel context.CancelFunc, job, prev *commitJob) *commitJob {
	target, state := p.commitTarget, p.commitState
	if p.stages != nil {
		target, state = p.stages.target, p.stages.state
	}
	job.targetDone, job.finished = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(job.finished)
		defer cancel()
		if prev != nil {
			<-prev.targetDone
		}
		if prev != nil && prev.targetErr != nil {
			job.targetErr = errEarlierFailed
		} else {
			job.targetErr = target(ctx, job)
		}
		if job.tx != nil {
			_ = job.tx.Rollback(context.WithoutCancel(ctx)) // a no-op once committed
		}
		close(job.targetDone)
		if job.err = job.targetErr; job.err != nil {
			return
		}
		if prev != nil {
			if <-prev.finished; prev.err != nil {
				job.err = errEarlierFailed
				return
			}
		}
		job.err = state(ctx, job)
	}()
	return job
}

// commitStages are the two stages of a batch's commit; tests replace the
// pipeline's (commitTarget and commitState) to check how startCommit
// orders them.
type commitStages struct {
	target, state func(ctx context.Context, job *commitJob) error
}

// wait returns the result of the job's commits (nil for no job), waiting
// for them.
func (p *pipeline) wait(job *commitJob) error {
	if job == nil {
		return nil
	}
	<-job.finished
	return job.err
}

// waitAll waits for every job and returns the first one's error (a later
// job of a failed one ends with errEarlierFailed).
func (p *pipeline) waitAll(f []*commitJob) error {
	var first error
	for _, job := range f {
		if err := p.wait(job); first == nil {
			first = err
		}
	}
	return first
}

// trim drops the finished jobs at the front of f, returning the first error.
func (p *pipeline) trim(f []*commitJob) ([]*commitJob, error) {
	for len(f) > 0 {
		select {
		case <-f[0].finished:
		default:
			return f, nil
		}
		if f[0].err != nil {
			return f, f[0].err
		}
		f = f[1:]
	}
	return f, nil
}

// nextWhile is next, but returns an in-flight job's error as soon as its
// commits fail, instead of waiting for a transaction that may never come.
// The last job ends when any fails: every job ends with its predecessor's
// failure.
func (p *pipeline) nextWhile(ctx context.Context, f []*commitJob) (*cdc.Txn, error) {
	if len(f) == 0 {
		return p.next(ctx)
	}
	last := f[len(f)-1]
	nctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-last.finished:
			if last.err != nil {
				cancel()
			}
		case <-nctx.Done():
		}
	}()
	t, err := p.next(nctx)
	if err != nil && ctx.Err() == nil {
		if werr := p.waitAll(f); werr != nil {
			return nil, werr
		}
	}
	return t, err
}

// commitTarget writes the job's target rows and commits them with the
// checkpoint. startCommit runs it once the previous batch's target commit
// is done: target transactions never overlap (two writing the same rows
// could deadlock).
func (p *pipeline) commitTarget(ctx context.Context, job *commitJob) error {
	if !slices.Contains(job.touched, true) {
		return nil
	}
	b, end := job.b, job.end
	phase := stopwatch()
	if job.writeTarget && job.tx == nil {
		if err := p.beginTarget(ctx, job); err != nil {
			return err // startCommit rolls job.tx back
		}
	}
	phase(&b.timing.write)
	// The engines' reads are done: if the state was lost or replaced since
	// the daemon started, they may have seen it empty, and nothing may be
	// committed.
	for i, jr := range p.joins {
		if job.touched[i] {
			if err := jr.verifyState(ctx); err != nil {
				return err
			}
		}
	}
	phase(&b.timing.verify)
	if job.tx != nil {
		if err := noteTruncations(ctx, job.tx, p.slot, job.truncations); err != nil {
			return err
		}
		if err := job.tx.Commit(ctx, p.slot, end); err != nil {
			return err
		}
		p.targetLSN.Store(uint64(end))
		p.upserted.Add(job.tx.Counts().Upserted)
		p.deleted.Add(job.tx.Counts().Deleted)
	}
	phase(&b.timing.target)
	return nil
}

// commitState commits the Redis state of every join the job touched and
// acknowledges the job's end. startCommit runs it once the previous batch
// is done: state commits and acknowledgements keep the batches' order.
func (p *pipeline) commitState(ctx context.Context, job *commitJob) error {
	b, end := job.b, job.end
	if !slices.Contains(job.touched, true) {
		// Nothing for any join: no write is needed, and acknowledging is safe
		// because a restart from the older checkpoint finds nothing either.
		// Counted first, as below.
		p.txns.Add(int64(len(b.txns)))
		p.changes.Add(int64(b.changes))
		p.applied(b.txns[len(b.txns)-1])
		p.stream.Ack(end)
		return nil
	}
	phase := stopwatch()
	for i, jr := range p.joins {
		if !job.touched[i] && jr.state.Checkpoint() >= end {
			continue
		}
		if err := jr.state.Commit(ctx, job.muts[i], end); err != nil {
			return fmt.Errorf("join %q: %w", jr.plan.Name, err)
		}
		if job.muts[i].Clears() {
			p.garbage.Store(true)
		}
	}
	phase(&b.timing.redis)
	t := &b.timing
	p.sizer.worked(t.mapping + t.join + t.write + t.verify + t.target + t.redis)
	// Counted before the acknowledgement: whoever sees the slot past end
	// (a caught-up check) sees the batch in the metrics too.
	p.batches.Add(1)
	p.txns.Add(int64(len(b.txns)))
	p.changes.Add(int64(b.changes))
	p.applied(b.txns[len(b.txns)-1])
	p.stream.Ack(end)
	if p.progress != nil {
		p.progress()
	}
	if p.timings != nil {
		p.timings(b.timing)
	}
	p.log.Debug("batch applied", append([]any{"txns", len(b.txns), "changes", b.changes, "end_lsn", end.String(), "target_written", job.writeTarget}, b.timing.attrs()...)...)
	return nil
}

// txnSpan says that the join changes from index start on come from txn.
type txnSpan struct {
	start int
	txn   *cdc.Txn
}

// changes maps the transactions this join has not applied yet to join
// changes, and says which transaction each comes from.
func (jr *joinRunner) changes(txns []*cdc.Txn) ([]join.Change, []txnSpan, error) {
	done := jr.state.Checkpoint()
	n := 0
	for _, t := range txns {
		n += len(t.Changes)
	}
	out := make([]join.Change, 0, n)
	spans := make([]txnSpan, 0, len(txns))
	for _, t := range txns {
		if t.EndLSN <= done {
			continue
		}
		spans = append(spans, txnSpan{start: len(out), txn: t})
		var err error
		if out, err = jr.appendChunk(out, t); err != nil {
			return nil, nil, err
		}
	}
	return out, spans, nil
}

// failure wraps an engine error of this join with where it happened: the
// source transaction of the failed change, its table and key columns.
func (jr *joinRunner) failure(spans []txnSpan, err error) error {
	ce, ok := errors.AsType[*join.ChangeError](err)
	if !ok || jr.chain != nil { // a chain step's change index is its own
		return err
	}
	f := &failure{Join: jr.plan.Name, err: err}
	tp := &jr.plan.Right
	if ce.Left() {
		tp = &jr.plan.Left
	}
	f.Table = tp.Table.String()
	for _, k := range tp.Key {
		f.KeyColumns = append(f.KeyColumns, k.Name)
	}
	for _, sp := range spans {
		if sp.start > ce.Index {
			break
		}
		f.LSN = sp.txn.CommitLSN
	}
	return f
}

// applyEach applies a batch's transactions one at a time as large ones
// (applyLarge), once the batches in flight are committed: a join chain's
// fan-out through an entry before the last passed on more rows than a page
// (join.ErrChainFanOut), and only a large transaction writes pages of its
// state as it goes.
func (p *pipeline) applyEach(ctx context.Context, b *batch, f []*commitJob) error {
	if err := p.waitAll(f); err != nil {
		return err
	}
	for _, jr := range p.joins {
		_ = jr.overlay(nil, nil)
	}
	p.log.Info("a join chain's fan-out is larger than a page; applying the batch's transactions one at a time, in pages",
		"transactions", len(b.txns), "changes", b.changes)
	for _, t := range b.txns {
		if ctx.Err() != nil {
			return nil // shutdown: the rest is replayed on restart
		}
		if err := p.applyLarge(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// applyLarge applies a transaction delivered in several chunks: all chunks
// go into one target transaction, committed at the source commit, while each
// chunk's Redis state is written at once with an undo log (CommitPartial),
// so that later chunks see it and a crash midway is rolled back (Recover).
// If the stream restarts the transaction from chunk 0 (a reconnect), the
// work so far is undone and the transaction starts over.
func (p *pipeline) applyLarge(ctx context.Context, first *cdc.Txn) error {
	p.inLarge.Store(true)
	defer p.inLarge.Store(false)
	for {
		restart, err := p.tryLarge(ctx, first)
		if err != nil && ctx.Err() != nil {
			// Shutdown: the attempt was undone; the transaction is replayed
			// on the next start.
			p.log.Info("shutdown in the middle of a large transaction; it will be applied on restart", "xid", first.Xid)
			return nil
		}
		if err != nil || restart == nil {
			return err
		}
		p.log.Info("transaction restarted by the stream; undoing its partial work", "xid", first.Xid)
		first = restart
	}
}

// tryLarge applies one attempt of a chunked transaction. It returns the
// chunk 0 that restarts it, if the stream sent one.
func (p *pipeline) tryLarge(ctx context.Context, first *cdc.Txn) (restart *cdc.Txn, err error) {
	txnID := first.CommitLSN
	// Transactions are ordered by commit position: one that commits before
	// the target checkpoint is already in the target.
	writeTarget := first.CommitLSN >= p.target()
	var tx targetTx
	if writeTarget {
		if tx, err = p.writer.Begin(ctx); err != nil {
			return nil, err
		}
	}
	partial := make([]bool, len(p.joins))
	done := false
	defer func() {
		if done {
			return
		}
		// Abandon the attempt: nothing of it may remain.
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if tx != nil {
			_ = tx.Rollback(bg)
		}
		for i, jr := range p.joins {
			if partial[i] {
				if _, rerr := jr.state.Recover(bg); rerr != nil && err == nil {
					err = fmt.Errorf("join %q: undo partial transaction: %w", jr.plan.Name, rerr)
				}
			}
		}
	}()
	chunk, changes := first, 0
	var truncations []truncation
	for {
		if err := p.checkPlaced(chunk); err != nil {
			return nil, err
		}
		truncations = appendTruncations(truncations, chunk)
		for i, jr := range p.joins {
			if jr.state.Checkpoint() > chunk.CommitLSN {
				continue // this join's state has the whole transaction
			}
			jc, err := jr.mapChunk(chunk)
			if err != nil {
				return nil, err
			}
			m, err := jr.apply(ctx, jc, chunk.CommitLSN+1, func(ctx context.Context, out join.Output) error {
				if tx == nil {
					return nil
				}
				return tx.Apply(ctx, &jr.plan.Target, out)
			}, func(ctx context.Context, m join.Mutations) error {
				partial[i] = true // before the write: a write cut short is undone too
				return jr.state.CommitPartial(ctx, m, txnID)
			})
			if err != nil {
				return nil, jr.failure([]txnSpan{{txn: chunk}}, fmt.Errorf("join %q: %w", jr.plan.Name, err))
			}
			if err := jr.state.CommitPartial(ctx, m, txnID); err != nil {
				return nil, fmt.Errorf("join %q: %w", jr.plan.Name, err)
			}
			if m.Clears() {
				p.garbage.Store(true)
			}
			partial[i] = true
		}
		changes += len(chunk.Changes)
		if chunk.Final {
			break
		}
		next, err := p.stream.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil // shutdown: undone by the deferred rollback, replayed on restart
			}
			return nil, err
		}
		if next.Chunk == 0 {
			return next, nil
		}
		chunk = next
	}
	end := chunk.EndLSN
	if tx != nil {
		if err := noteTruncations(ctx, tx, p.slot, truncations); err != nil {
			return nil, err
		}
		if err := tx.Commit(ctx, p.slot, end); err != nil {
			return nil, err
		}
		p.targetLSN.Store(uint64(end))
		p.upserted.Add(tx.Counts().Upserted)
		p.deleted.Add(tx.Counts().Deleted)
	}
	done = true
	for i, jr := range p.joins {
		if partial[i] {
			if err := jr.state.FinishPartial(ctx, end); err != nil {
				return nil, fmt.Errorf("join %q: %w", jr.plan.Name, err)
			}
		}
	}
	p.batches.Add(1) // before the acknowledgement, as in commitState
	p.txns.Add(1)
	p.changes.Add(int64(changes))
	p.applied(first)
	p.stream.Ack(end)
	if p.progress != nil {
		p.progress()
	}
	p.log.Info("large transaction applied", "xid", first.Xid, "changes", changes, "chunks", chunk.Chunk+1, "end_lsn", end.String())
	return nil, nil
}

// truncation is a streamed TRUNCATE of a joined table.
type truncation struct {
	xid   uint32
	table string
}

// appendTruncations appends t's TRUNCATEs to out.
func appendTruncations(out []truncation, t *cdc.Txn) []truncation {
	for i := range t.Changes {
		if c := &t.Changes[i]; c.Kind == cdc.ChangeTruncate {
			for _, rel := range c.Truncate.Relations {
				out = append(out, truncation{xid: t.Xid, table: config.TableName{Schema: rel.Namespace, Name: rel.Name}.String()})
			}
		}
	}
	return out
}

// noteTruncations records, with the target write that applies them, the
// source transactions whose TRUNCATE of a partitioned table gave its
// partitions new storage: the partition check tells them from a TRUNCATE of
// one partition, which Postgres does not publish (see checkPartitions).
func noteTruncations(ctx context.Context, tx targetTx, slot string, ts []truncation) error {
	for _, t := range ts {
		if err := tx.Exec(ctx, `UPDATE fkmat.partitions SET truncated_xid = $3 WHERE slot = $1 AND parent = $2`,
			slot, t.table, int64(t.xid)); err != nil {
			return fmt.Errorf("note the TRUNCATE of %s: %w", t.table, err)
		}
	}
	return nil
}

// ErrUnplaced means the stream carried a row change of a table no join
// uses: applying the rest would silently drop it, so the pipeline stops.
var ErrUnplaced = errors.New("change of a table no join uses")

// checkPlaced returns an error for the first row change of t on a relation
// no join uses. The publication holds only the joined tables, published
// under their root's name when partitioned, so such a change means the
// publication was changed by hand or created without
// publish_via_partition_root (a partition's own name arrives).
func (p *pipeline) checkPlaced(t *cdc.Txn) error {
	if p.placed == nil {
		p.placed = map[*cdc.Relation]bool{}
	}
	place := func(rel *cdc.Relation) error {
		ok, known := p.placed[rel]
		if !known {
			for _, jr := range p.joins {
				ok = ok || jr.mapper.uses(rel)
			}
			p.placed[rel] = ok
		}
		if ok {
			return nil
		}
		table := config.TableName{Schema: rel.Namespace, Name: rel.Name}
		return &failure{LSN: t.CommitLSN, Table: table.String(), err: fmt.Errorf(
			"%w: transaction %d at %s changed %s, which no join uses; "+
				"if it is a partition of a joined table, the publication %q did not publish via the partition root: "+
				"run fkmat backfill --force (it sets publish_via_partition_root on the publication and rebuilds the joins past this change)",
			ErrUnplaced, t.Xid, t.CommitLSN, table, p.publication)}
	}
	for i := range t.Changes {
		c := &t.Changes[i]
		switch c.Kind {
		case cdc.ChangeInsert, cdc.ChangeUpdate, cdc.ChangeDelete:
			if err := place(c.Relation); err != nil {
				return err
			}
		case cdc.ChangeTruncate:
			for _, rel := range c.Truncate.Relations {
				if err := place(rel); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// mapChunk maps one chunk's changes to join changes.
func (jr *joinRunner) mapChunk(t *cdc.Txn) ([]join.Change, error) {
	return jr.appendChunk(make([]join.Change, 0, len(t.Changes)), t)
}

// appendChunk appends the join changes of t's row changes to out.
func (jr *joinRunner) appendChunk(out []join.Change, t *cdc.Txn) ([]join.Change, error) {
	for i := range t.Changes {
		var err error
		if out, err = jr.mapper.appendChanges(out, &t.Changes[i]); err != nil {
			return nil, fmt.Errorf("join %q, transaction %d at %s: %w", jr.plan.Name, t.Xid, t.CommitLSN, err)
		}
	}
	return out, nil
}
