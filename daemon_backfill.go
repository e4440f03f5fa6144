package fkmat

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/crash"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// Backfill runs the consistent initial load of every join in cfg: it creates
// the publication and a fresh slot with an exported snapshot, loads both
// tables of each join from that snapshot into the Redis state and the
// target, and records the slot's consistent point as the checkpoint, so
// streaming starts exactly where the snapshot ends. Previous state (slot,
// Redis keys, target rows) is replaced.
func Backfill(ctx context.Context, cfg *config.Config, opts Options) error {
	d, err := open(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer d.close()
	return d.backfill(ctx, "fkmat backfill")
}

// BackfillIfNeeded is `fkmat backfill`: it backfills when a join was never
// backfilled, an earlier backfill was interrupted, or the Redis state is
// lost; with force it always rebuilds. Otherwise it does nothing.
func BackfillIfNeeded(ctx context.Context, cfg *config.Config, force bool, opts Options) error {
	if force {
		done, err := rebuildOnline(ctx, cfg, opts)
		if done || ctx.Err() != nil {
			return err
		}
		if err != nil {
			opts.setDefaults()
			opts.Logger.Warn("the joins cannot be rebuilt while they stream; rebuilding them from a new slot (the targets keep their rows, not streaming, until the swap)",
				"err", err)
		}
	}
	opts.Force = force
	d, err := open(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer d.close()
	if !force {
		reason, _, err := d.assess(ctx)
		if err != nil {
			return err
		}
		if reason == "" {
			d.log.Info("joins are backfilled and streaming; nothing to do (use --force to rebuild)")
			return nil
		}
		d.log.Info("backfilling", "reason", reason)
		return d.backfill(ctx, reason)
	}
	return d.backfill(ctx, "fkmat backfill --force")
}

// rebuildOnline is backfill --force while the joins can stream: every join
// is built anew beside the running one, which keeps its target streaming
// until the rebuilt one replaces it (daemon_rebuild.go). done says it
// switched the joins in (or was refused, or interrupted); false with an
// error when the joins cannot stream (then the rebuild is done from a new
// slot), false and nil when a join needs a backfill anyway.
func rebuildOnline(ctx context.Context, cfg *config.Config, opts Options) (done bool, err error) {
	opts.online, opts.rebuildAll = true, true
	d, err := open(ctx, cfg, opts)
	if err != nil {
		return true, err
	}
	defer d.close()
	reason, _, err := d.assess(ctx)
	if err != nil || reason != "" || len(d.builds) == 0 {
		return false, err
	}
	if err := d.waitSlotFree(ctx); err != nil {
		return true, err
	}
	err = d.stream(ctx, &runState{verify: &verifyCounters{}, progress: func() {}})
	switch {
	case errors.Is(err, errRebuilt):
		// The old generations' keys go now, not when run starts next: until
		// then they hold about as much Redis memory as the new state (W7:
		// used_memory at 1.96x of the state's after a rebuild).
		if err := d.dropLeftovers(ctx); err != nil {
			d.log.Warn("could not delete the Redis state of the generation the rebuild replaced; the next run deletes it", "err", err)
		}
		return true, nil
	case ctx.Err() != nil:
		return true, ctx.Err()
	case err == nil:
		return false, errors.New("the stream stopped before the rebuild switched in")
	}
	return false, err
}

// backfill rebuilds every join; reason says why, in fkmat.build and status.
func (d *daemon) backfill(ctx context.Context, reason string) error {
	start := time.Now()
	if err := preflightIgnoringSlot(d.cdc.Preflight(ctx)); err != nil {
		return err
	}
	// Nothing is written while another process streams or backfills.
	if err := d.waitSlotFree(ctx); err != nil {
		return err
	}
	if err := d.cdc.EnsurePublication(ctx); err != nil {
		return err
	}
	// The joins are not streamed from until the backfill is done.
	if _, err := d.target.Exec(ctx, `UPDATE fkmat.join_state SET phase = 'backfilling', updated_at = now() WHERE slot = $1`,
		d.cfg.Slot); err != nil {
		return fmt.Errorf("mark the joins backfilling: %w", err)
	}
	// The snapshot comes from a slot of its own: the configured slot
	// keeps its position (or stays absent) until the targets hold the
	// snapshot, then takes the new slot's (CopySlot below). A slot at its
	// consistent point over targets that do not hold it yet would tell a
	// reader who waits for it that they are caught up; so would one
	// created again when a backfill starts over.
	snapshots, err := cdc.New(cdc.Config{ConnString: d.cfg.Source, Slot: cdc.BackfillSlot(d.cfg.Slot), Publication: d.cfg.Publication,
		Tables: d.cdc.Config().Tables, Logger: d.log})
	if err != nil {
		return err
	}
	if err := snapshots.DropSlot(ctx); err != nil { // an interrupted backfill's
		return err
	}
	slot, err := snapshots.CreateSlot(ctx, true)
	if errors.Is(err, cdc.ErrSlotExists) {
		// Dropped a moment ago: another process created it since, and
		// backfills from it.
		return fmt.Errorf("%w: another process created replication slot %q as this backfill was about to (another fkmat run?): %w",
			cdc.ErrSlotInUse, cdc.BackfillSlot(d.cfg.Slot), err)
	}
	if err != nil {
		return err
	}
	done := false
	defer func() {
		_ = slot.Release(context.WithoutCancel(ctx))
		if !done {
			if err := snapshots.DropSlot(context.WithoutCancel(ctx)); err != nil {
				d.log.Warn("could not drop the backfill's slot; the next backfill drops it", "slot", slot.Name, "err", err)
			}
		}
	}()
	d.log.Info("backfill started", "slot", slot.Name, "consistent_point", slot.ConsistentPoint.String(), "joins", len(d.joins))
	crash.At("backfill: slot created", d.cfg.Slot)

	epoch := redisstore.NewEpoch()
	if err := d.beginBackfill(ctx, epoch, slot.ConsistentPoint, reason); err != nil {
		return err
	}
	if err := d.dropOldLayout(ctx); err != nil {
		return err
	}
	rows, leaves, err := d.loaderOf(d.joins, d.log, false).run(ctx, epoch, slot.SnapshotName, slot.ConsistentPoint)
	if err != nil {
		return err
	}
	crash.At("backfill: loaded", d.cfg.Slot)
	if err := d.finishBackfill(ctx, slot.ConsistentPoint, leaves); err != nil {
		return err
	}
	// The targets hold the snapshot: the configured slot takes its
	// position. A crash before this leaves the old slot behind them (or
	// none, and the next start backfills again), never ahead.
	if err := slot.Release(ctx); err != nil {
		return err
	}
	if err := d.waitSlotFree(ctx); err != nil {
		return err
	}
	if err := d.cdc.CopySlot(ctx, slot.Name); err != nil {
		return err
	}
	if err := snapshots.DropSlot(ctx); err != nil {
		return err
	}
	done = true
	d.log.Info("backfill done", "rows", rows, "seconds", time.Since(start).Seconds(), "consistent_point", slot.ConsistentPoint.String())
	return nil
}

// dropOldLayout deletes the Redis state that fkmat before 2026-12 kept
// for a join of more than two tables (one state per entry, with the rows of
// the join so far), which the state per table replaces.
func (d *daemon) dropOldLayout(ctx context.Context) error {
	for _, p := range d.plans {
		for i := range p.Edges {
			store, err := redisstore.Open(ctx, d.rdb, redisstore.Config{Prefix: redisstore.StepPrefix(d.cfg.Slot, p.Name, i)})
			if err != nil {
				return err
			}
			if _, err := store.Meta(ctx); errors.Is(err, redisstore.ErrNoState) {
				continue
			}
			d.log.Info("deleting the Redis state of an older layout", "join", p.Name, "entry", i)
			if err := store.Drop(ctx); err != nil {
				return fmt.Errorf("join %q: delete the state of an older layout: %w", p.Name, err)
			}
		}
	}
	return nil
}

// preflightIgnoringSlot drops the findings about the existing slot from a
// preflight result: a backfill replaces the slot (dropSlot reports a slot in
// use).
func preflightIgnoringSlot(err error) error {
	if err == nil {
		return nil
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var keep []error
	for _, e := range errs {
		if !errors.Is(e, cdc.ErrSlotInvalidated) && !errors.Is(e, cdc.ErrSlotInUse) {
			keep = append(keep, e)
		}
	}
	return errors.Join(keep...)
}

// waitSlotFree waits until no other process holds the slot: none streams
// from it, and none holds the snapshot of its creation (a backfill). A
// daemon restarted after a crash can find its own previous walsender still
// holding the slot for a moment (until the server notices the dead
// connection): it waits for it as the stream does, up to the slot busy
// timeout, before it takes the slot for someone else's.
func (d *daemon) waitSlotFree(ctx context.Context) error {
	deadline := time.Now().Add(d.cdc.Config().SlotBusyTimeout)
	for {
		h, held, err := d.cdc.Holder(ctx)
		if err != nil || !held {
			return err
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w: process %d %s slot %q (still after %s); stop it (another fkmat run or backfill?) before the backfill",
				cdc.ErrSlotInUse, h.PID, h.What(), d.cfg.Slot, d.cdc.Config().SlotBusyTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// beginBackfill marks every join as backfilling (so an interrupted load is
// redone, never streamed from) and forgets the slot's checkpoint, in one
// target transaction. The targets keep their rows: readers see them until
// finishBackfill swaps the new ones in.
func (d *daemon) beginBackfill(ctx context.Context, epoch string, consistent wal.LSN, reason string) error {
	tx, err := d.writer.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tx.Exec(ctx, `DELETE FROM fkmat.checkpoint WHERE slot = $1`, d.cfg.Slot); err != nil {
		return fmt.Errorf("reset checkpoint: %w", err)
	}
	// A rebuild starts past whatever stalled the old stream.
	if err := tx.Exec(ctx, `DELETE FROM fkmat.stall WHERE slot = $1`, d.cfg.Slot); err != nil {
		return fmt.Errorf("reset stall: %w", err)
	}
	for _, j := range d.joins {
		p := j.Plan()
		err := tx.Exec(ctx, `
			INSERT INTO fkmat.join_state AS s (slot, join_name, epoch, fingerprint, definition, target_schema, target_table, phase, consistent_lsn, publication)
			VALUES ($1, $2, $3, $4, $5, $6, $7, 'backfilling', $8::pg_lsn, $9)
			ON CONFLICT (slot, join_name) DO UPDATE SET epoch = EXCLUDED.epoch, fingerprint = EXCLUDED.fingerprint, publication = EXCLUDED.publication,
				definition = EXCLUDED.definition, widened_lsn = NULL, target_schema = EXCLUDED.target_schema, target_table = EXCLUDED.target_table,
				phase = 'backfilling', consistent_lsn = EXCLUDED.consistent_lsn, updated_at = now()`,
			d.cfg.Slot, p.Name, epoch, p.Fingerprint, string(plan.Definition(p)), p.Target.Schema, p.Target.Name, consistent.String(), d.cfg.Publication)
		if err != nil {
			return fmt.Errorf("record backfill of join %q: %w", p.Name, err)
		}
		host, _ := os.Hostname()
		err = tx.Exec(ctx, `
			INSERT INTO fkmat.build (slot, join_name, reason, phase, host, pid) VALUES ($1, $2, $3, 'loading', $4, $5)
			ON CONFLICT (slot, join_name) DO UPDATE SET reason = EXCLUDED.reason, phase = EXCLUDED.phase, rows_done = 0, rows_total = 0,
				host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = now(), updated_at = now()`,
			d.cfg.Slot, p.Name, reason, host, os.Getpid())
		if err != nil {
			return fmt.Errorf("record backfill of join %q: %w", p.Name, err)
		}
	}
	return tx.CommitRows(ctx)
}

// finishBackfill, in one target transaction, swaps each target's shadow
// in (sink.Tx.Swap), records the slot's target checkpoint and the leaf
// partitions the snapshot saw, and marks the joins streaming: readers see
// the old rows until that commit and the new ones after it.
func (d *daemon) finishBackfill(ctx context.Context, consistent wal.LSN, leaves map[uint32]leaf) error {
	return d.swapRetrying(ctx, "swapping the rebuilt rows in", func() error {
		return d.swapTargets(ctx, consistent, leaves)
	})
}

// swapTargets is the target transaction of finishBackfill.
func (d *daemon) swapTargets(ctx context.Context, consistent wal.LSN, leaves map[uint32]leaf) error {
	tx, err := d.writer.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+swapLockTimeout+"'"); err != nil {
		return fmt.Errorf("set the swap's lock timeout: %w", err)
	}
	for _, j := range d.joins {
		p := j.Plan()
		kind, err := tx.Swap(ctx, &p.Target, sink.ShadowOf(&p.Target))
		if err != nil {
			return fmt.Errorf("join %q: %w", p.Name, err)
		}
		d.log.Info("the rebuilt rows replaced the target's", "join", p.Name, "target", p.Target.Ident(), "how", string(kind))
	}
	if err := tx.Exec(ctx, `UPDATE fkmat.join_state SET phase = 'streaming', updated_at = now() WHERE slot = $1`, d.cfg.Slot); err != nil {
		return fmt.Errorf("mark joins streaming: %w", err)
	}
	if err := tx.Exec(ctx, `DELETE FROM fkmat.build WHERE slot = $1`, d.cfg.Slot); err != nil {
		return fmt.Errorf("end the build record: %w", err)
	}
	if err := recordLeaves(ctx, tx, d.cfg.Slot, leaves); err != nil {
		return err
	}
	return tx.Commit(ctx, d.cfg.Slot, consistent)
}
