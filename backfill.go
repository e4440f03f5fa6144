package fkmat

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/redisstore"
)

// backfillBatch is the number of source rows loaded per engine batch.
const backfillBatch = 10_000

// Backfill runs the consistent initial load of every join in cfg: it creates
// the publication and a fresh slot with an exported snapshot, loads both
// tables of each join from that snapshot into the Redis state and the
// target, and records the slot's consistent point as the checkpoint, so
// streaming starts exactly where the snapshot ends. Previous state (slot,
// Redis keys, target rows) is replaced.
func Backfill(ctx context.Context, cfg *Config, opts Options) error {
	d, err := open(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer d.close()
	return d.backfill(ctx)
}

// BackfillIfNeeded is `fkmat backfill`: it backfills when a join was never
// backfilled, an earlier backfill was interrupted, or the Redis state is
// lost; with force it always rebuilds. Otherwise it does nothing.
func BackfillIfNeeded(ctx context.Context, cfg *Config, force bool, opts Options) error {
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
	}
	return d.backfill(ctx)
}

func (d *daemon) backfill(ctx context.Context) error {
	start := time.Now()
	if err := preflightIgnoringSlot(d.cdc.Preflight(ctx)); err != nil {
		return err
	}
	if err := d.cdc.EnsurePublication(ctx); err != nil {
		return err
	}
	if err := d.dropSlot(ctx); err != nil {
		return err
	}
	slot, err := d.cdc.CreateSlot(ctx, true)
	if err != nil {
		return err
	}
	defer func() { _ = slot.Release(context.WithoutCancel(ctx)) }()
	d.log.Info("backfill started", "slot", d.cfg.Slot, "consistent_point", slot.ConsistentPoint.String(), "joins", len(d.joins))

	epoch := redisstore.NewEpoch()
	if err := d.beginBackfill(ctx, epoch, slot.ConsistentPoint); err != nil {
		return err
	}
	tx, err := d.source.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("begin snapshot transaction: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(slot.SnapshotName)); err != nil {
		return fmt.Errorf("import snapshot %s: %w", slot.SnapshotName, err)
	}
	var rows int64
	for _, jr := range d.joins {
		if err := jr.store.Init(ctx, epoch, jr.plan.Fingerprint); err != nil {
			return fmt.Errorf("join %q: %w", jr.plan.Name, err)
		}
		n, err := d.loadJoin(ctx, tx.Conn(), jr)
		if err != nil {
			return fmt.Errorf("backfill join %q: %w", jr.plan.Name, err)
		}
		rows += n
	}
	if err := d.finishBackfill(ctx, slot.ConsistentPoint); err != nil {
		return err
	}
	d.log.Info("backfill done", "rows", rows, "seconds", time.Since(start).Seconds(), "consistent_point", slot.ConsistentPoint.String())
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

// dropSlot drops the slot if it exists; a slot in use is an error.
func (d *daemon) dropSlot(ctx context.Context) error {
	info, err := d.cdc.SlotInfo(ctx)
	if err != nil {
		return err
	}
	if !info.Exists {
		return nil
	}
	if info.ActivePID != 0 {
		return fmt.Errorf("%w: process %d streams from slot %q; stop it (another fkmat run?) before the backfill",
			cdc.ErrSlotInUse, info.ActivePID, d.cfg.Slot)
	}
	if _, err := d.source.Exec(ctx, "SELECT pg_drop_replication_slot($1)", d.cfg.Slot); err != nil {
		return fmt.Errorf("drop replication slot %q: %w", d.cfg.Slot, err)
	}
	return nil
}

// beginBackfill marks every join as backfilling (so an interrupted load is
// redone, never streamed from), forgets the slot's checkpoint and empties
// the target tables, in one target transaction.
func (d *daemon) beginBackfill(ctx context.Context, epoch string, consistent cdc.LSN) error {
	tx, err := d.writer.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tx.Exec(ctx, `DELETE FROM fkmat.checkpoint WHERE slot = $1`, d.cfg.Slot); err != nil {
		return fmt.Errorf("reset checkpoint: %w", err)
	}
	for _, jr := range d.joins {
		p := jr.plan
		err := tx.Exec(ctx, `
			INSERT INTO fkmat.join_state AS s (slot, join_name, epoch, fingerprint, target_schema, target_table, phase, consistent_lsn)
			VALUES ($1, $2, $3, $4, $5, $6, 'backfilling', $7::pg_lsn)
			ON CONFLICT (slot, join_name) DO UPDATE SET epoch = EXCLUDED.epoch, fingerprint = EXCLUDED.fingerprint,
				target_schema = EXCLUDED.target_schema, target_table = EXCLUDED.target_table,
				phase = 'backfilling', consistent_lsn = EXCLUDED.consistent_lsn, updated_at = now()`,
			d.cfg.Slot, p.Name, epoch, p.Fingerprint, p.Target.Schema, p.Target.Name, consistent.String())
		if err != nil {
			return fmt.Errorf("record backfill of join %q: %w", p.Name, err)
		}
		if err := tx.Truncate(ctx, &p.Target); err != nil {
			return err
		}
	}
	return tx.CommitRows(ctx)
}

// finishBackfill records the consistent point as every join's Redis
// checkpoint and the slot's target checkpoint, and marks the joins streaming.
func (d *daemon) finishBackfill(ctx context.Context, consistent cdc.LSN) error {
	for _, jr := range d.joins {
		if err := jr.store.Commit(ctx, join.Mutations{}, uint64(consistent)); err != nil {
			return fmt.Errorf("join %q: %w", jr.plan.Name, err)
		}
	}
	tx, err := d.writer.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tx.Exec(ctx, `UPDATE fkmat.join_state SET phase = 'streaming', updated_at = now() WHERE slot = $1`, d.cfg.Slot); err != nil {
		return fmt.Errorf("mark joins streaming: %w", err)
	}
	return tx.Commit(ctx, d.cfg.Slot, lsnOf(consistent))
}

// loadJoin reads the right table, then the left table, inside the snapshot
// and feeds their rows through the join engine as inserts. The Redis
// checkpoint counts batches (1, 2, ...) below the consistent point, which is
// recorded last.
func (d *daemon) loadJoin(ctx context.Context, conn *pgx.Conn, jr *joinRunner) (int64, error) {
	p := jr.plan
	var seq uint64
	var total int64
	flush := func(changes []join.Change) error {
		if len(changes) == 0 {
			return nil
		}
		tx, err := d.writer.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		m, err := jr.engine.Apply(ctx, changes, func(ctx context.Context, out join.Output) error {
			return tx.Apply(ctx, &p.Target, out)
		})
		if err != nil {
			return err
		}
		if err := tx.CommitRows(ctx); err != nil {
			return err
		}
		seq++
		total += int64(len(changes))
		return jr.store.Commit(ctx, m, seq)
	}
	rightCols := append(append([]SourceColumn{}, p.Right.Key...), outputSources(p.Right.Values)...)
	nk := len(p.Right.Key)
	err := scanTable(ctx, conn, p.Right.Table, rightCols, backfillBatch, func(rows [][]join.Value) error {
		changes := make([]join.Change, len(rows))
		for i, r := range rows {
			changes[i] = join.Change{Kind: join.RightUpsert, Right: join.RightRow{Key: r[:nk], Values: r[nk:]}}
		}
		return flush(changes)
	})
	if err != nil {
		return total, err
	}
	leftCols := append(append(append([]SourceColumn{}, p.Left.Key...), p.Left.ForeignKey...), outputSources(p.Left.Values)...)
	nk, nf := len(p.Left.Key), len(p.Left.ForeignKey)
	err = scanTable(ctx, conn, p.Left.Table, leftCols, backfillBatch, func(rows [][]join.Value) error {
		changes := make([]join.Change, len(rows))
		for i, r := range rows {
			changes[i] = join.Change{Kind: join.LeftUpsert, Left: join.LeftRow{PK: r[:nk], FK: r[nk : nk+nf], Values: r[nk+nf:]}}
		}
		return flush(changes)
	})
	return total, err
}

func outputSources(cols []OutputColumn) []SourceColumn {
	out := make([]SourceColumn, len(cols))
	for i, c := range cols {
		out[i] = c.Source
	}
	return out
}

// scanTable streams the columns of table in Postgres text form (the same
// form pgoutput sends) and hands them to fn in pages of at most page rows.
func scanTable(ctx context.Context, conn *pgx.Conn, table TableName, cols []SourceColumn, page int,
	fn func([][]join.Value) error) error {
	names := make([]string, len(cols))
	for i, c := range cols {
		names[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	sql := "SELECT " + strings.Join(names, ", ") + " FROM " + pgx.Identifier{table.Schema, table.Name}.Sanitize()
	rr := conn.PgConn().ExecParams(ctx, sql, nil, nil, nil, nil)
	batch := make([][]join.Value, 0, page)
	for rr.NextRow() {
		raw := rr.Values()
		row := make([]join.Value, len(raw))
		for i, b := range raw {
			if b == nil {
				row[i] = join.NullValue()
			} else {
				row[i] = join.TextValue(string(b))
			}
		}
		batch = append(batch, row)
		if len(batch) == page {
			if err := fn(batch); err != nil {
				_, _ = rr.Close()
				return err
			}
			batch = make([][]join.Value, 0, page)
		}
	}
	if _, err := rr.Close(); err != nil {
		return fmt.Errorf("read %s: %w", table, err)
	}
	return fn(batch)
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
