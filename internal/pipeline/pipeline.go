package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/internal/crash"
)

// Config is what a Pipeline runs on.
type Config struct {
	// Slot and Publication name the replication slot and publication, for
	// the target's checkpoint and for error messages.
	Slot, Publication string
	Joins             []Join
	Source            Source
	Target            Target
	Limits            BatchLimits
	Log               *slog.Logger
	// TargetCheckpoint is the slot's checkpoint in the target database at
	// the start: every transaction ending at or before it is already there.
	TargetCheckpoint wal.LSN
	// Cuts are the checkpoints of the tables of a tree ahead of its lowest
	// (Resumed.Ahead): a batch ends at a transaction ending there, so that
	// no batch straddles a table's checkpoint.
	Cuts []wal.LSN
	// OnBatch, when set, is called after every acknowledged batch.
	OnBatch func()
	// OnTiming, when set, receives each committed batch's timings.
	OnTiming func(BatchTiming)
	// Ignore, when set, says which tables no join uses whose changes are
	// expected (published for another pipeline: a rebuild's) and skipped;
	// a change of any other such table is ErrUnplaced.
	Ignore func(config.TableName) bool
	// Generator computes the generated columns the joins output
	// (plan.JoinPlan.Generated) that the stream lacks; needed only then.
	Generator Generator
}

// Pipeline is the batch loop: cdc → join → sink → redisstore → ack.
type Pipeline struct {
	slot        string
	publication string
	joins       []Join
	target      Target
	source      Source
	limits      BatchLimits
	sizer       batchSizer
	// stages, when set (by tests), replace commitTarget and commitState.
	stages *commitStages
	// generated fills the generated columns the stream lacks (nil: none).
	generated *generated
	log       *slog.Logger

	// targetLSN is the slot's checkpoint in the target database: every
	// transaction with EndLSN <= targetLSN is already in the target.
	targetLSN atomic.Uint64
	// held is a chunk received while collecting that belongs to the next
	// batch.
	held *cdc.Txn
	// retired are committed jobs whose containers wait for recycle.
	retired []*commitJob
	// garbage is set when a batch dropped a generation of Redis keys
	// (TRUNCATE); the sweeper deletes them.
	garbage atomic.Bool
	onBatch func()
	// maxBuffered is maxBufferedRows (tests lower it).
	maxBuffered int
	// placed caches, per relation, whether a join uses it.
	placed map[*cdc.Relation]bool
	// counters, read by the metrics handler (Counters, JoinRows); rows
	// has one per join.
	batches, txns, changes atomic.Int64
	rows                   []joinRows
	// lastCommit is the source commit time (Unix ns) of the last applied
	// transaction; firstSeen that of the first one received; started is
	// when the pipeline started.
	lastCommit, firstSeen atomic.Int64
	started               time.Time
	onTiming              func(BatchTiming)
	// inLarge is set while a large transaction is applied chunk by chunk
	// (its end is not received yet).
	inLarge atomic.Bool
	// cuts are Config.Cuts.
	cuts map[wal.LSN]bool
	// lastClose is when collect closed the last batch.
	lastClose time.Time
	// between is the work Between asked for, not yet run.
	between atomic.Pointer[func(context.Context)]
	// ignore is Config.Ignore.
	ignore func(config.TableName) bool
}

// Between runs fn on the batch loop before its next batch, once every
// batch in flight has committed and been acknowledged and nothing is
// overlaid: each join's state is exactly at its checkpoint, and nothing
// else writes it until fn returns (a Resize). The next batch waits for fn;
// an fn not yet run when Between is called again is replaced. An idle
// pipeline runs it when the next change arrives.
func (p *Pipeline) Between(fn func(context.Context)) { p.between.Store(&fn) }

// New returns a pipeline; Run runs it.
func New(cfg Config) *Pipeline {
	cfg.Limits.SetDefaults()
	p := &Pipeline{
		slot: cfg.Slot, publication: cfg.Publication, joins: cfg.Joins, target: cfg.Target, source: cfg.Source,
		limits: cfg.Limits, sizer: batchSizer{limits: cfg.Limits}, log: cfg.Log,
		onBatch: cfg.OnBatch, onTiming: cfg.OnTiming, started: time.Now(), cuts: map[wal.LSN]bool{},
		rows: make([]joinRows, len(cfg.Joins)), maxBuffered: maxBufferedRows, ignore: cfg.Ignore,
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	for _, c := range cfg.Cuts {
		p.cuts[c] = true
	}
	p.targetLSN.Store(uint64(cfg.TargetCheckpoint))
	if cfg.Generator != nil {
		p.generated = newGenerated(cfg.Generator, cfg.Joins)
	}
	return p
}

// Counters are what a pipeline has applied since it started.
type Counters struct {
	Batches, Txns, Changes, Upserted, Deleted int64
}

// Add adds o's counts to c.
func (c *Counters) Add(o Counters) {
	c.Batches += o.Batches
	c.Txns += o.Txns
	c.Changes += o.Changes
	c.Upserted += o.Upserted
	c.Deleted += o.Deleted
}

// Counters returns what the pipeline has applied so far. A batch is
// counted before it is acknowledged: whoever sees the slot past a batch
// sees it here too.
func (p *Pipeline) Counters() Counters {
	c := Counters{Batches: p.batches.Load(), Txns: p.txns.Load(), Changes: p.changes.Load()}
	for i := range p.rows {
		upserted, deleted := p.JoinRows(i)
		c.Upserted += upserted
		c.Deleted += deleted
	}
	return c
}

// joinRows count the target rows one join changed.
type joinRows struct{ upserted, deleted atomic.Int64 }

// JoinRows returns the target rows the pipeline inserted or changed
// (upserted) and deleted for join i (of Joins) so far.
func (p *Pipeline) JoinRows(i int) (upserted, deleted int64) {
	return p.rows[i].upserted.Load(), p.rows[i].deleted.Load()
}

// Joins returns the joins the pipeline runs.
func (p *Pipeline) Joins() []Join { return p.joins }

// SourceStats returns the replication stream's counters.
func (p *Pipeline) SourceStats() cdc.StreamStats { return p.source.Stats() }

// Garbage is set when a batch dropped a generation of Redis keys (a
// TRUNCATE): the sweeper clears it and deletes them.
func (p *Pipeline) Garbage() *atomic.Bool { return &p.garbage }

// applied records the source commit time of the last transaction applied.
func (p *Pipeline) applied(t *cdc.Txn) {
	if !t.CommitTime.IsZero() {
		p.lastCommit.Store(t.CommitTime.UnixNano())
	}
}

// Lag is how far the pipeline is behind the source at now: while it has a
// backlog (transactions received and not applied, or changes waiting), the
// time since the source commit of the last transaction it applied (before
// the first, of the first it received; before that, since it started); 0
// without a backlog. It overstates the lag of the oldest waiting change by
// at most the time between two source commits. last is the commit time of
// the last transaction applied (zero before the first).
func (p *Pipeline) Lag(now time.Time) (seconds float64, last time.Time) {
	if ns := p.lastCommit.Load(); ns != 0 {
		last = time.Unix(0, ns)
	}
	st := p.source.Stats()
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

// targetCheckpoint is the slot's checkpoint in the target database.
func (p *Pipeline) targetCheckpoint() wal.LSN { return wal.LSN(p.targetLSN.Load()) }

// Run applies batches until ctx is done; then it finishes the batches in
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
func (p *Pipeline) Run(ctx context.Context) (err error) {
	var inFlight []*commitJob // committing, oldest first
	// inHand is the transaction or batch being joined, named by a panic.
	var inHand []*cdc.Txn
	defer func() {
		if werr := p.waitAll(inFlight); err == nil {
			err = werr
		}
		if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("%w: %w", ErrFinalBatch, err)
		}
	}()
	defer crash.Recover(&err, func() (string, uint64) { return whereTxns("in the pipeline", inHand) })
	for {
		if inFlight, err = p.trim(inFlight); err != nil {
			return err
		}
		if ctx.Err() != nil {
			// Shutdown: the stream still returns what it has queued, but
			// only the batches in hand are finished.
			return nil
		}
		if fn := p.between.Swap(nil); fn != nil {
			err := p.settle(inFlight)
			inFlight = nil
			if err != nil {
				return err
			}
			(*fn)(ctx)
			continue
		}
		inHand = nil
		first, err := p.nextWhile(ctx, inFlight)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		inHand = append(inHand, first)
		if !first.Final {
			// Chunks commit their state as they go: nothing may be overlaid.
			err := p.settle(inFlight)
			inFlight = nil
			if err != nil {
				return err
			}
			crash.At("join", inHand)
			if err := p.fill(ctx, first); err != nil {
				return err
			}
			if err := p.applyLarge(ctx, first); err != nil {
				return err
			}
			continue
		}
		start := time.Now()
		b := p.collect(ctx, first, inFlight)
		b.timing.collect = time.Since(start)
		inHand = b.txns
		crash.At("join", inHand)
		if err := p.fill(ctx, b.txns...); err != nil {
			return err
		}
		// At most two batches in flight while the next is joined: one in
		// its state commit, one in its target commit.
		for len(inFlight) > 2 {
			if err := p.wait(inFlight[0]); err != nil {
				return err
			}
			p.retire(inFlight[0])
			inFlight = inFlight[1:]
		}
		// The batch in hand is finished even during shutdown, within a
		// grace period. A batch is never timed out while the daemon runs:
		// a right row with a million dependents takes as long as it takes,
		// and a deadline would fail it again on every restart.
		bctx, cancel := afterGrace(ctx, ShutdownGrace)
		job, err := p.prepare(bctx, b, inFlight)
		if err == nil {
			inFlight, err = p.trim(inFlight)
		}
		if err != nil {
			if job != nil && job.tx != nil {
				_ = job.tx.Rollback(context.WithoutCancel(bctx))
			}
			cancel()
			return err
		}
		var prev *commitJob
		if len(inFlight) > 0 {
			prev = inFlight[len(inFlight)-1]
		}
		inFlight = append(inFlight, p.startCommit(bctx, cancel, job, prev))
	}
}

// settle waits until every batch in flight has committed and been
// acknowledged, and clears the joins' overlays: each state is then exactly
// at its checkpoint.
func (p *Pipeline) settle(inFlight []*commitJob) error {
	if err := p.waitAll(inFlight); err != nil {
		return err
	}
	for _, j := range p.joins {
		_ = j.overlay(nil, nil)
	}
	p.retire(inFlight...)
	p.recycle()
	return nil
}

// retire notes jobs that left the in-flight list committed: their
// mutations and outputs go back to their joins (recycle) once no overlay
// shows them.
func (p *Pipeline) retire(jobs ...*commitJob) { p.retired = append(p.retired, jobs...) }

// recycle gives the retired jobs' mutations and outputs back to their
// joins. It runs while no overlay shows them: after prepare set the
// overlays of the batches in flight, or after settle cleared them.
func (p *Pipeline) recycle() {
	for _, job := range p.retired {
		if len(job.muts) != len(p.joins) {
			continue // the joins changed meanwhile
		}
		for i, j := range p.joins {
			j.recycle(&job.muts[i], job.outs[i])
			job.outs[i] = nil
		}
	}
	clear(p.retired)
	p.retired = p.retired[:0]
}

// ShutdownGrace is how long the batch in hand may still take after shutdown
// begins.
const ShutdownGrace = 30 * time.Second

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
func (p *Pipeline) next(ctx context.Context) (*cdc.Txn, error) {
	if t := p.held; t != nil {
		p.held = nil
		return t, nil
	}
	t, err := p.source.Next(ctx)
	if err == nil && !t.CommitTime.IsZero() {
		p.firstSeen.CompareAndSwap(0, t.CommitTime.UnixNano())
	}
	return t, err
}

// fill computes the generated columns the stream left out of the
// transactions' changes (a batch, or a chunk of a large one), in one round
// trip per table.
func (p *Pipeline) fill(ctx context.Context, txns ...*cdc.Txn) error {
	if p.generated == nil || len(txns) == 0 {
		return nil
	}
	if err := p.generated.fill(ctx, txns); err != nil {
		return &TxnError{LSN: txns[0].CommitLSN, err: err}
	}
	return nil
}

// checkPlaced returns an error for the first row change of t on a relation
// no join uses. The publication holds only the joined tables, published
// under their root's name when partitioned, so such a change means the
// publication was changed by hand or created without
// publish_via_partition_root (a partition's own name arrives).
func (p *Pipeline) checkPlaced(t *cdc.Txn) error {
	if p.placed == nil {
		p.placed = map[*cdc.Relation]bool{}
	}
	place := func(rel *cdc.Relation) error {
		ok, known := p.placed[rel]
		if !known {
			for _, j := range p.joins {
				ok = ok || j.uses(rel)
			}
			p.placed[rel] = ok
		}
		table := config.TableName{Schema: rel.Namespace, Name: rel.Name}
		if ok || (p.ignore != nil && p.ignore(table)) {
			p.placed[rel] = true
			return nil
		}
		return &TxnError{LSN: t.CommitLSN, Table: table.String(), err: fmt.Errorf(
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
