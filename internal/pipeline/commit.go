package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"

	"github.com/fkmat/fkmat/internal/crash"
)

// commitJob is a prepared batch: joined, its target rows and Redis
// mutations computed, its commits not yet done (or running).
type commitJob struct {
	b           *batch
	end         wal.LSN
	writeTarget bool
	// touched marks the joins the batch had changes for.
	touched []bool
	// outs are the target outputs per join, buffered until the job's turn;
	// tx is set when they were too many and went straight into it.
	outs [][]join.Output
	tx   TargetTx
	// w writes into tx while the batch is joined, once tx is open.
	w    *asyncWriter
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

// txns are the job's transactions (none for a job without a batch).
func (job *commitJob) txns() []*cdc.Txn {
	if job.b == nil {
		return nil
	}
	return job.b.txns
}

// maxBufferedRows bounds the target rows a prepared batch holds in memory;
// past it (a big fan-out) the batch waits for the one in flight and writes
// its rows into its own target transaction as they come.
const maxBufferedRows = 50_000

// prepare maps and joins a batch. The engines read the state through an
// overlay of the in-flight batch's mutations; if those cannot be overlaid
// (a TRUNCATE), or the batch's output outgrows maxBufferedRows, prepare
// first waits for the in-flight batch, whose error it then returns.
func (p *Pipeline) prepare(ctx context.Context, b *batch, inFlight []*commitJob) (*commitJob, error) {
	job := &commitJob{b: b, end: b.end(), touched: make([]bool, len(p.joins)),
		outs: make([][]join.Output, len(p.joins)), muts: make([]join.Mutations, len(p.joins))}
	job.writeTarget = job.end > p.targetCheckpoint()
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
	for i, j := range p.joins {
		var err error
		if perJoin[i], spans[i], err = j.changes(b.txns); err != nil {
			return nil, err
		}
		job.touched[i] = len(perJoin[i]) > 0
	}
	phase(&b.timing.mapping)

	settled := len(inFlight) == 0
	settle := func() error {
		if settled {
			return nil
		}
		settled = true
		return p.waitAll(inFlight)
	}
	for i, j := range p.joins {
		var older, newer *join.Mutations
		switch len(inFlight) {
		case 1:
			newer = &inFlight[0].muts[i]
		case 2:
			older, newer = &inFlight[0].muts[i], &inFlight[1].muts[i]
		}
		if err := j.overlay(older, newer); errors.Is(err, join.ErrCannotOverlay) {
			if err := settle(); err != nil {
				return nil, err
			}
			_ = j.overlay(nil, nil)
		}
	}
	p.recycle() // the overlays no longer show the retired batches
	buffered := 0
	rows := make([]int, len(p.joins)) // target rows per join
	for i, j := range p.joins {
		if !job.touched[i] {
			continue
		}
		emit := func(ctx context.Context, out join.Output) error {
			rows[i] += out.Rows()
			if !job.writeTarget {
				return nil // replaying for Redis only: the target has it
			}
			if job.tx == nil {
				if buffered += out.Rows(); buffered <= p.maxBuffered {
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
				job.w = startWriter(ctx, job.tx)
			}
			return job.w.send(ctx, &j.Plan().Target, out)
		}
		var err error
		if job.muts[i], err = j.apply(ctx, perJoin[i], job.end, emit); err != nil {
			if werr := job.closeWriter(); errors.Is(err, errWriterFailed) {
				err = werr
			}
			if job.tx != nil {
				_ = job.tx.Rollback(context.WithoutCancel(ctx))
			}
			return nil, j.located(spans[i], fmt.Errorf("join %q: %w", j.Plan().Name, err))
		}
	}
	if err := job.closeWriter(); err != nil {
		_ = job.tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	phase(&b.timing.join)
	// The changes are joined: their memory goes back to the stream (the
	// batch keeps its transactions' positions and times).
	for _, t := range b.txns {
		t.Release()
	}
	fanOut := false
	for i := range p.joins {
		fanOut = fanOut || fannedOut(len(perJoin[i]), rows[i])
	}
	p.sizer.fanOut = fanOut
	return job, nil
}

// closeWriter waits for the job's writer, if it has one, and returns its
// failure.
func (job *commitJob) closeWriter() error {
	if job.w == nil {
		return nil
	}
	w := job.w
	job.w = nil
	return w.close()
}

// beginTarget opens the job's target transaction and writes its buffered
// outputs into it.
func (p *Pipeline) beginTarget(ctx context.Context, job *commitJob) error {
	tx, err := p.target.Begin(ctx)
	if err != nil {
		return err
	}
	job.tx = tx
	for i, outs := range job.outs {
		for _, out := range outs {
			if err := tx.Apply(ctx, &p.joins[i].Plan().Target, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// startCommit runs the job's commits in the background, after prev's
// (nil: none in flight); wait collects the result. cancel releases the
// job's context when it is done.
func (p *Pipeline) startCommit(ctx context.Context, cancel context.CancelFunc, job, prev *commitJob) *commitJob {
	target, state := p.commitTarget, p.commitState
	if p.stages != nil {
		target, state = p.stages.target, p.stages.state
	}
	job.targetDone, job.finished = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(job.finished)
		defer cancel()
		targetClosed := false
		var panicked error
		defer func() {
			// A panic fails the job like an error of its stage.
			if panicked == nil {
				return
			}
			if job.err = panicked; !targetClosed {
				job.targetErr = panicked
				close(job.targetDone)
			}
		}()
		defer crash.Recover(&panicked, func() (string, uint64) { return whereTxns("committing", job.txns()) })
		if prev != nil {
			<-prev.targetDone
		}
		crash.At("commit", job.txns())
		if prev != nil && prev.targetErr != nil {
			job.targetErr = errEarlierFailed
		} else {
			job.targetErr = target(ctx, job)
		}
		if job.tx != nil {
			_ = job.tx.Rollback(context.WithoutCancel(ctx)) // a no-op once committed
		}
		close(job.targetDone)
		targetClosed = true
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
func (p *Pipeline) wait(job *commitJob) error {
	if job == nil {
		return nil
	}
	<-job.finished
	return job.err
}

// waitAll waits for every job and returns the first one's error (a later
// job of a failed one ends with errEarlierFailed).
func (p *Pipeline) waitAll(inFlight []*commitJob) error {
	var first error
	for _, job := range inFlight {
		if err := p.wait(job); first == nil {
			first = err
		}
	}
	return first
}

// trim drops the finished jobs at the front of inFlight, returning the
// first error.
func (p *Pipeline) trim(inFlight []*commitJob) ([]*commitJob, error) {
	for len(inFlight) > 0 {
		select {
		case <-inFlight[0].finished:
		default:
			return inFlight, nil
		}
		if inFlight[0].err != nil {
			return inFlight, inFlight[0].err
		}
		p.retire(inFlight[0])
		inFlight = inFlight[1:]
	}
	return inFlight, nil
}

// nextWhile is next, but returns an in-flight job's error as soon as its
// commits fail, instead of waiting for a transaction that may never come.
// The last job ends when any fails: every job ends with its predecessor's
// failure.
func (p *Pipeline) nextWhile(ctx context.Context, inFlight []*commitJob) (*cdc.Txn, error) {
	if len(inFlight) == 0 {
		return p.next(ctx)
	}
	last := inFlight[len(inFlight)-1]
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
		if werr := p.waitAll(inFlight); werr != nil {
			return nil, werr
		}
	}
	return t, err
}

// commitTarget writes the job's target rows and commits them with the
// checkpoint. startCommit runs it once the previous batch's target commit
// is done: target transactions never overlap (two writing the same rows
// could deadlock).
func (p *Pipeline) commitTarget(ctx context.Context, job *commitJob) error {
	if !slices.Contains(job.touched, true) {
		return nil
	}
	b, end := job.b, job.end
	phase := stopwatch()
	// The engines' reads are done: if the state was lost or replaced since
	// the daemon started, they may have seen it empty, and nothing may be
	// committed. The check reads Redis while the rows are written.
	checked := crash.Go(func() error { return p.checkStates(ctx, job) },
		func() (string, uint64) { return whereTxns("checking the states", job.txns()) })
	if job.writeTarget && job.tx == nil {
		if err := p.beginTarget(ctx, job); err != nil {
			<-checked
			return err // startCommit rolls job.tx back
		}
	}
	phase(&b.timing.write)
	if err := <-checked; err != nil {
		return err
	}
	phase(&b.timing.verify)
	if job.tx != nil {
		crash.At("target written", job.txns())
		if err := p.commitTargetTx(ctx, job.tx, job.truncations, end); err != nil {
			return err
		}
	}
	phase(&b.timing.target)
	return nil
}

// checkStates checks that the Redis state of every join the job touched is
// still the one the run started with.
func (p *Pipeline) checkStates(ctx context.Context, job *commitJob) error {
	for i, j := range p.joins {
		if job.touched[i] {
			if err := j.checkState(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// commitTargetTx commits a target transaction with its TRUNCATE notes and
// the checkpoint end, then publishes the checkpoint and the rows it
// changed. Both paths (batches and large transactions) commit the target
// here.
func (p *Pipeline) commitTargetTx(ctx context.Context, tx TargetTx, truncations []truncation, end wal.LSN) error {
	if err := noteTruncations(ctx, tx, p.slot, truncations); err != nil {
		return err
	}
	if err := tx.Commit(ctx, p.slot, end); err != nil {
		return err
	}
	p.targetLSN.Store(uint64(end))
	for i, j := range p.joins {
		c := tx.Counts(&j.Plan().Target)
		p.rows[i].upserted.Add(c.Upserted)
		p.rows[i].deleted.Add(c.Deleted)
	}
	return nil
}

// acknowledge counts what a commit applied (txns transactions with changes
// changes, last the last of them) and acknowledges end. Both paths
// acknowledge here, and only here. The count comes first: whoever sees the
// slot past end (a caught-up check) sees it in the metrics too. wrote says
// the commit wrote state (a batch that touched no join counts its
// transactions and changes, but is no batch of work).
func (p *Pipeline) acknowledge(txns, changes int, last *cdc.Txn, end wal.LSN, wrote bool) {
	if wrote {
		p.batches.Add(1)
	}
	p.txns.Add(int64(txns))
	p.changes.Add(int64(changes))
	p.applied(last)
	p.source.Ack(end)
	if wrote && p.onBatch != nil {
		p.onBatch()
	}
}

// commitState commits the Redis state of every join the job touched and
// acknowledges the job's end. startCommit runs it once the previous batch
// is done: state commits and acknowledgements keep the batches' order.
func (p *Pipeline) commitState(ctx context.Context, job *commitJob) error {
	b, end := job.b, job.end
	if !slices.Contains(job.touched, true) {
		// Nothing for any join: no write is needed, and acknowledging is safe
		// because a restart from the older checkpoint finds nothing either.
		p.acknowledge(len(b.txns), b.changes, b.txns[len(b.txns)-1], end, false)
		return nil
	}
	crash.At("target committed", job.txns())
	phase := stopwatch()
	for i, j := range p.joins {
		if !job.touched[i] && j.state().Checkpoint() >= end {
			continue
		}
		if err := j.state().Commit(ctx, job.muts[i], end); err != nil {
			return fmt.Errorf("join %q: %w", j.Plan().Name, err)
		}
		if job.muts[i].Clears() {
			p.garbage.Store(true)
		}
	}
	phase(&b.timing.redis)
	t := &b.timing
	p.sizer.worked(t.mapping + t.join + t.write + t.verify + t.target + t.redis)
	crash.At("state committed", job.txns())
	p.acknowledge(len(b.txns), b.changes, b.txns[len(b.txns)-1], end, true)
	if p.onTiming != nil {
		p.onTiming(b.timing)
	}
	p.log.Debug("batch applied", append([]any{"txns", len(b.txns), "changes", b.changes, "end_lsn", end.String(), "target_written", job.writeTarget}, b.timing.attrs()...)...)
	return nil
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
// one partition, which Postgres does not publish (see partitionWatcher.check in the root package).
func noteTruncations(ctx context.Context, tx TargetTx, slot string, ts []truncation) error {
	for _, t := range ts {
		if err := tx.Exec(ctx, `UPDATE fkmat.partitions SET truncated_xid = $3 WHERE slot = $1 AND parent = $2`,
			slot, t.table, int64(t.xid)); err != nil {
			return fmt.Errorf("note the TRUNCATE of %s: %w", t.table, err)
		}
	}
	return nil
}
