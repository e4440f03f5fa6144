package fkmat

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"
)

// widen follows the widened column types of join p (plan.Widens: integer
// widths up, varchar lengths up or to text, numeric and timestamp
// precision up): when the definition the join was built with (kept in
// fkmat.join_state) differs from p's only by such types, it widens the
// target's columns (ALTER TABLE … ALTER COLUMN … TYPE) and records the new
// definition, in one target transaction, before anything streams. The
// state needs nothing: it keeps values as their text, which a widening
// leaves as it is (a key's too: plan.Widens refuses a key's numeric scale).
//
// It runs at every start. A widening met in the stream (pipeline.ErrWidened)
// restarts the daemon from its checkpoints, so the target column is widened
// before the first row of the new type is written, whatever the daemon
// committed or crashed in between; rows from before the widening that are
// read again fit the wider type.
//
// Any other change of the definition is left to assess, which refuses it.
// A join built before fkmat kept definitions gets its definition recorded
// here when nothing changed.
func (d *daemon) widen(ctx context.Context, p *plan.JoinPlan) error {
	st, err := d.loadJoinState(ctx, p.Name)
	if err != nil || !st.exists {
		return err
	}
	p.WidenedBefore = uint64(st.widenedLSN)
	definition := plan.Definition(p)
	if st.fingerprint == p.Fingerprint {
		if st.definition == nil {
			_, err := d.target.Exec(ctx, `UPDATE fkmat.join_state SET definition = $3
				WHERE slot = $1 AND join_name = $2 AND fingerprint = $4 AND definition IS NULL`,
				d.cfg.Slot, p.Name, string(definition), p.Fingerprint)
			if err != nil {
				return fmt.Errorf("record the definition of the join: %w", err)
			}
		}
		return nil
	}
	if st.definition == nil {
		return nil
	}
	widenings, ok, err := plan.Widenings(st.definition, definition)
	if err != nil || !ok {
		return err
	}
	// Every change of the old type is before the DDL, which the catalog
	// shows, so before this position.
	var current string
	if err := d.source.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&current); err != nil {
		return fmt.Errorf("read the source's WAL position: %w", err)
	}
	now, err := wal.ParseLSN(current)
	if err != nil {
		return fmt.Errorf("read the source's WAL position: %w", err)
	}
	tx, err := d.target.Begin(ctx)
	if err != nil {
		return fmt.Errorf("widen the target: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.Target.Ident()).Scan(&exists); err != nil {
		return fmt.Errorf("look up %s: %w", p.Target.Ident(), err)
	}
	if exists && len(widenings) > 0 {
		// Bounded, like the backfill's swap: a long reader must not queue
		// every new reader behind the ALTER's lock.
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+swapLockTimeout+"'"); err != nil {
			return fmt.Errorf("widen the target: %w", err)
		}
		alters := make([]string, len(widenings))
		for i, w := range widenings {
			alters[i] = "ALTER COLUMN " + ident(w.Column) + " TYPE " + w.To
		}
		if _, err := tx.Exec(ctx, "ALTER TABLE "+p.Target.Ident()+" "+strings.Join(alters, ", ")); err != nil {
			if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55P03" {
				return fmt.Errorf("%w: %s waits for its readers to widen a column (lock_timeout %s); trying again shortly",
					errTargetBusy, p.Target.Ident(), swapLockTimeout)
			}
			if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "0A000" {
				// feature_not_supported: a view or a rule uses the column.
				return &config.ConfigError{Problems: []string{fmt.Sprintf(
					"join %q: a source column it uses was widened, and fkmat cannot widen %s to follow: %s; "+
						"widen the target's column yourself (dropping and recreating what uses it) and start fkmat run again, "+
						"or run fkmat backfill --force", p.Name, p.Target.Ident(), pgErr.Message)}}
			}
			return fmt.Errorf("widen the columns of %s: %w", p.Target.Ident(), err)
		}
	}
	tag, err := tx.Exec(ctx, `UPDATE fkmat.join_state SET fingerprint = $3, definition = $4, widened_lsn = $6::pg_lsn, updated_at = now()
		WHERE slot = $1 AND join_name = $2 AND fingerprint = $5`, d.cfg.Slot, p.Name, p.Fingerprint, string(definition), st.fingerprint, now.String())
	if err != nil {
		return fmt.Errorf("record the widened definition: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return errors.New("record the widened definition: the join's definition changed meanwhile (another fkmat process?)")
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("widen the target: %w", err)
	}
	p.WidenedBefore = uint64(now)
	for _, w := range widenings {
		d.log.Info("followed a widened column type", "join", p.Name, "target", p.Target.Ident(), "column", w.Column, "from", w.From, "to", w.To)
	}
	if len(widenings) == 0 {
		d.log.Info("followed a widened column type (no target column)", "join", p.Name)
	}
	return nil
}
