package fkmat

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/cdc"
)

// stream runs the batch loop from the older of the target and Redis
// checkpoints: the joins resumed (resume), the stream opened after the
// partitions were checked (openStream), the pipeline built (pipelineOf),
// then the stream, the pipeline and their companions supervised together.
func (d *daemon) stream(ctx context.Context, rs *runState) error {
	targetLSN, err := d.writer.Checkpoint(ctx, d.cfg.Slot)
	if err != nil {
		return err
	}
	start, cuts, err := d.resume(ctx, targetLSN)
	if err != nil {
		return err
	}
	if err := d.cdc.EnsurePublication(ctx); err != nil {
		return err
	}
	stream, watch, err := d.openStream(ctx, start, targetLSN)
	if err != nil {
		return err
	}
	rs.start, rs.streaming = start, true
	p := d.pipelineOf(stream, watch, targetLSN, cuts, rs)

	// The stream, the pipeline and the sweeper are supervised together: the
	// first error stops the others, and all have returned before the
	// caller closes the pools and clients they use. The stream outlives ctx
	// by a moment so that the last acknowledgement reaches the server.
	g, gctx := newGroup(ctx)
	streamCtx, stopStream := context.WithCancel(context.WithoutCancel(ctx))
	defer stopStream()
	g.Go(func() error {
		err := stream.Run(streamCtx)
		if streamCtx.Err() != nil || errors.Is(err, cdc.ErrStopped) {
			return nil // stopped by the pipeline's goroutine, or at a rebuild's switch
		}
		return err
	})
	// Nothing else starts before the stream holds the slot: a process that
	// finds it taken (a standby that lost the race for it) stops having
	// written no heartbeat, swept or resized nothing, and never said ready.
	select {
	case <-stream.Holding():
	case <-gctx.Done():
		stopStream()
		return g.Wait()
	}
	// Fence the target's commits: a run that held the slot before (a frozen
	// daemon that comes back) can commit no batch from now on. One it
	// committed while this run started moved the checkpoint this run
	// started from: start again from the checkpoints.
	if err := d.fence(ctx, targetLSN); err != nil {
		stopStream()
		_ = g.Wait()
		return err
	}
	d.log.Info("streaming", "slot", d.cfg.Slot, "start_lsn", start.String(), "joins", len(d.joins))
	d.obs.attach(p)
	d.obs.setPhase("streaming")
	d.startCompanions(gctx, g, p, watch, stream, rs)
	mainDone := make(chan struct{})
	if len(d.builds) > 0 {
		g.Go(func() error { return d.runRebuilds(gctx, stream, mainDone) })
	}
	g.Go(func() error {
		defer close(mainDone)
		runErr := p.Run(gctx)
		if errors.Is(runErr, cdc.ErrStopped) {
			// At a rebuild's switch: runRebuilds goes on from here.
			d.log.Info("the pipeline stopped at the rebuild's switch")
			runErr = nil
		}
		d.obs.setPhase("stopping")
		if stream.Stats().Held {
			// Clear the last acknowledgement, unless the join cannot go
			// on (then nothing after the change may be confirmed).
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
			if err := watch.clear(cctx, stream); err != nil && !errors.Is(err, ErrPartitionsChanged) {
				d.log.Warn("checking the partitions of the joined tables failed", "err", err)
			}
			cancel()
		}
		d.flushAck(stream)
		stopStream()
		return runErr
	})
	if err := g.Wait(); err != nil {
		return err
	}
	c := p.Counters()
	d.log.Info("stopped", "batches", c.Batches, "txns", c.Txns, "changes", c.Changes)
	return nil
}

// startCompanions starts, in g, what runs beside the main pipeline p: the
// sweeper of dropped generations, the partition watcher, the monitor, the
// state resizer, the continuous verifier, and the deletion of what an
// interrupted rebuild left behind.
func (d *daemon) startCompanions(ctx context.Context, g group, p *pipeline.Pipeline, watch *partitionWatcher, stream *cdc.Stream, rs *runState) {
	g.Go(func() error {
		d.sweep(ctx, p.Garbage())
		return nil
	})
	g.Go(func() error { return watch.run(ctx, stream) })
	g.Go(func() error { return d.monitor(ctx, p) })
	g.Go(func() error {
		d.grow(ctx, p)
		return nil
	})
	g.Go(func() error { return d.verifyLoop(ctx, p, rs.verify) })
	g.Go(func() error {
		if err := d.dropLeftovers(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn("could not drop what an interrupted rebuild left behind; the next start tries again", "err", err)
		}
		return nil
	})
}

// resume resumes each join from its Redis state and returns where the
// stream starts (the oldest checkpoint, at most the target's) and the
// checkpoints of tables ahead of their join's others.
func (d *daemon) resume(ctx context.Context, targetLSN wal.LSN) (wal.LSN, []wal.LSN, error) {
	start := targetLSN
	var cuts []wal.LSN
	for _, j := range d.joins {
		r, err := j.Resume(ctx)
		if err != nil {
			return 0, nil, err
		}
		if r.Undone {
			// A crash in the middle of a large transaction left its
			// partial Redis state behind: it is undone and replayed.
			d.log.Warn("undid a partially applied large transaction", "join", j.Plan().Name)
		}
		start = min(start, r.Checkpoint)
		for i, cp := range r.Ahead {
			cuts = append(cuts, cp)
			d.log.Warn("the tables of a join of more than two tables are at different checkpoints (a crash between their commits); the tables behind catch up first",
				"join", j.Plan().Name, "table", i, "table_lsn", cp.String(), "lowest_lsn", r.Checkpoint.String())
		}
	}
	return start, cuts, nil
}

// openStream follows the partitions attached or detached while the daemon
// was away, then returns the stream from start, held while a joined table
// is partitioned and limited while a join waits for its rebuild, and the
// partition watcher that clears it.
func (d *daemon) openStream(ctx context.Context, start, targetLSN wal.LSN) (*cdc.Stream, *partitionWatcher, error) {
	// Until the stream runs, the pipeline has applied up to the target's
	// checkpoint.
	watch := d.partitionWatcher(func() wal.LSN { return targetLSN })
	at, err := watch.readCatalog(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := watch.check(ctx, at); err != nil {
		return nil, nil, err
	}
	stream := d.cdc.NewStream(start)
	if at.partitioned {
		// Partition DDL is not in the stream: the slot is confirmed only
		// up to where the catalog was checked (partitionWatcher.clear).
		stream.Hold()
		if at.settled && watch.clearable() {
			stream.Clear(at.before)
		}
	}
	var frozenAt wal.LSN
	for _, b := range d.builds {
		if b.frozenAt != 0 && (frozenAt == 0 || b.frozenAt < frozenAt) {
			frozenAt = b.frozenAt
		}
	}
	if frozenAt != 0 {
		// A join left unmaintained until its rebuild switches in: the
		// slot is not confirmed past where it was left, so that nobody
		// takes its target for caught up.
		stream.Limit(frozenAt)
	}
	watch.mu.Lock()
	watch.applied = func() wal.LSN { return stream.Stats().ConfirmableLSN }
	watch.mu.Unlock()
	return stream, watch, nil
}

// pipelineOf is the main pipeline of the joins on stream.
func (d *daemon) pipelineOf(stream *cdc.Stream, watch *partitionWatcher, targetLSN wal.LSN, cuts []wal.LSN, rs *runState) *pipeline.Pipeline {
	// The tables only a rebuild joins are published for it: the main
	// pipeline skips their changes.
	var rebuilding []config.TableName
	for _, b := range d.builds {
		rebuilding = append(rebuilding, b.plan.Tables()...)
	}
	joined := watch.joinedTables()
	return pipeline.New(pipeline.Config{
		Slot: d.cfg.Slot, Publication: d.cfg.Publication, Joins: d.joins, Source: stream, Target: pipeline.SinkTarget{W: d.writer},
		Limits: d.opts.Batch, Log: d.log.With("component", "pipeline"), TargetCheckpoint: targetLSN, Cuts: cuts,
		OnBatch: rs.progress, OnTiming: d.obs.timingHook(),
		Ignore:    func(t config.TableName) bool { return slices.Contains(rebuilding, t) && !slices.Contains(joined, t) },
		Generator: d.generator(d.plans...),
	})
}

// errTakenOverLate is a batch the slot's previous holder committed after
// this run read the checkpoints and before it fenced them.
var errTakenOverLate = errors.New("the replication slot's previous holder committed a batch while this run took the slot over")

// fence makes this run the owner of the slot's target commits (sink's
// Writer.Fence) and checks that the target's checkpoint is still read,
// the one the run starts from.
func (d *daemon) fence(ctx context.Context, read wal.LSN) error {
	// The previous owner may be frozen holding locks (rows of a batch it
	// was writing, the owner row its commit reads): end its sessions
	// first, or the fence and this run's first writes would wait for it.
	prev, err := d.writer.Owner(ctx, d.cfg.Slot)
	if err != nil {
		return err
	}
	if prev != "" && prev != processSession {
		if n, err := endSessions(ctx, d.target, "fkmat "+prev); err != nil {
			d.log.Warn("could not end the sessions of the slot's previous owner; its locks, if any, end with its idle-in-transaction timeout",
				"session", prev, "err", err)
		} else if n > 0 {
			d.log.Info("ended the sessions of the slot's previous owner", "session", prev, "sessions", n)
		}
	}
	host, _ := os.Hostname()
	if err := d.writer.Fence(ctx, d.cfg.Slot, host, os.Getpid(), processSession); err != nil {
		return err
	}
	now, err := d.writer.Checkpoint(ctx, d.cfg.Slot)
	if err != nil {
		return err
	}
	if now != read {
		return fmt.Errorf("%w (checkpoint %s, read %s); starting again from the checkpoints", errTakenOverLate, now, read)
	}
	return nil
}

// endSessions terminates the target database's sessions named app (a
// previous owner's) and returns how many.
func endSessions(ctx context.Context, db *pgxpool.Pool, app string) (int, error) {
	var n int
	err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid() AND datname = current_database()`, app).Scan(&n)
	return n, err
}

// flushAck waits (briefly) until the stream has reported its last
// acknowledgement to the server.
func (d *daemon) flushAck(stream *cdc.Stream) {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		st := stream.Stats()
		reportable := st.AckedLSN
		if st.Held {
			reportable = min(st.ConfirmableLSN, st.ClearedLSN)
		}
		if st.LimitLSN != 0 {
			reportable = min(reportable, st.LimitLSN)
		}
		if st.ReportedLSN >= reportable {
			return
		}
		select {
		case <-stream.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// sweepInterval is how often the keys of dropped generations (after a
// TRUNCATE or a rebuild) are deleted in the background.
const sweepInterval = 30 * time.Second

// sweep deletes garbage Redis keys in bounded steps until ctx is done: once
// at start, then after batches that truncated a side (garbage is set). A
// sweep SCANs the keyspace, so it does not run when nothing was dropped. The
// store makes it safe next to the batch loop's commits.
func (d *daemon) sweep(ctx context.Context, garbage *atomic.Bool) {
	t := time.NewTicker(sweepInterval)
	defer t.Stop()
	garbage.Store(true)
	warned := rateLimit{}
	for {
		if garbage.Swap(false) {
			for _, j := range d.joins {
				for _, store := range j.Stores() {
					n, err := store.Sweep(ctx)
					if err != nil && ctx.Err() == nil {
						if warned.allow(j.Plan().Name, time.Now()) {
							d.log.Warn("sweeping old redis keys failed (repeats at most every 10 minutes)", "join", j.Plan().Name, "err", err)
						}
						garbage.Store(true) // try again next time
					} else if n > 0 {
						d.log.Info("swept old redis keys", "join", j.Plan().Name, "keys", n)
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
