package fkmat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// Teardown drops the slot, the publication, every join's Redis state and
// fkmat's metadata rows for the slot, and the shadow tables an interrupted
// rebuild left; with dropTarget also the targets.
//
// It works from the configuration alone, without resolving the joins against
// the source catalog or checking the targets' shape, so that it also cleans
// up after the source tables changed (the fix a stopped daemon names for a
// retyped column). A target is dropped only when fkmat built it for the
// join, or when it has exactly the join's shape: never a table that merely
// has the configured name.
func Teardown(ctx context.Context, cfg *config.Config, dropTarget bool, opts Options) error {
	opts.setDefaults()
	target, err := openTarget(ctx, cfg)
	if err != nil {
		return err
	}
	defer target.Close()
	rdb, err := connectRedis(ctx, cfg.Redis)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	client, err := cdc.New(cdc.Config{ConnString: cfg.Source, Slot: cfg.Slot, Publication: cfg.Publication,
		Tables: configuredTables(cfg), Logger: opts.Logger})
	if err != nil {
		return err
	}
	w := sink.NewWriter(target)
	var drop []*sink.Table
	if dropTarget {
		// Check every target before anything is destroyed.
		for _, j := range cfg.Joins {
			t, err := droppableTarget(ctx, cfg, target, w, j)
			if err != nil {
				return err
			}
			drop = append(drop, t)
		}
	}
	if err := refuseHeld(ctx, client, target, cfg.Slot); err != nil {
		return err
	}
	if err := client.Teardown(ctx); err != nil {
		return err
	}
	// The second slot of a rebuild beside the running joins, and the slot
	// a backfill loads from, if one was interrupted.
	for _, slot := range []string{rebuildSlot(cfg.Slot), cdc.BackfillSlot(cfg.Slot)} {
		other, err := cdc.New(cdc.Config{ConnString: cfg.Source, Slot: slot, Publication: cfg.Publication,
			Tables: configuredTables(cfg), Logger: opts.Logger})
		if err != nil {
			return err
		}
		if err := other.DropSlot(ctx); err != nil {
			return err
		}
	}
	for _, j := range cfg.Joins {
		if err := dropJoinState(ctx, target, rdb, cfg.Slot, j, opts.Logger); err != nil {
			return err
		}
	}
	for _, j := range cfg.Joins {
		// The shadow an interrupted rebuild left is fkmat's own.
		shadow := sink.ShadowOf(&sink.Table{Schema: j.Target.Table.Schema, Name: j.Target.Table.Name})
		if err := w.DropTable(ctx, shadow); err != nil {
			return err
		}
	}
	for _, t := range drop {
		if err := w.DropTable(ctx, t); err != nil {
			return err
		}
	}
	return deleteMetadata(ctx, target, cfg.Slot)
}

// droppableTarget returns j's target if teardown may drop it: fkmat's
// metadata says a backfill of this join wrote it, or it does not exist, or
// it has the shape the join produces from the current source tables.
func droppableTarget(ctx context.Context, cfg *config.Config, target plan.Querier, w *sink.Writer, j config.JoinConfig) (*sink.Table, error) {
	t := &sink.Table{Schema: j.Target.Table.Schema, Name: j.Target.Table.Name}
	var owned, exists bool
	err := target.QueryRow(ctx, `
		SELECT EXISTS (SELECT FROM fkmat.join_state WHERE slot = $1 AND join_name = $2 AND target_schema = $3 AND target_table = $4),
			to_regclass($5) IS NOT NULL`,
		cfg.Slot, j.Name, t.Schema, t.Name, t.Ident()).Scan(&owned, &exists)
	if err != nil {
		return nil, fmt.Errorf("look up target of join %q: %w", j.Name, err)
	}
	if owned || !exists {
		return t, nil
	}
	one := *cfg
	one.Joins = []config.JoinConfig{j}
	source, err := connectPostgres(ctx, cfg.Source, "source", cfg.TimeZone)
	if err != nil {
		return nil, err
	}
	defer source.Close()
	plans, err := plan.Resolve(ctx, source, &one)
	if err == nil {
		_, err = w.EnsureTable(ctx, &plans[0].Target)
	}
	if err != nil {
		return nil, fmt.Errorf("join %q: not dropping %s: fkmat did not build it for this join and its shape does not match (%v); drop it yourself if it is yours to drop",
			j.Name, t.Ident(), err)
	}
	return t, nil
}

// refuseHeld returns ErrSlotInUse, naming the process, when a process
// streams or backfills from the slot: a running fkmat must be stopped
// first (ending its walsender only makes it reconnect).
func refuseHeld(ctx context.Context, client *cdc.Client, target *pgxpool.Pool, slot string) error {
	h, held, err := client.Holder(ctx)
	if err != nil || !held {
		return err
	}
	return fmt.Errorf("%w: replication slot %q is held by %s; stop that fkmat (its run or backfill) first, "+
		"then run fkmat teardown again: ending its walsender would only make it reconnect", cdc.ErrSlotInUse, slot, describeHolder(ctx, target, slot, h))
}

// dropJoinState deletes every Redis state of join j: each generation a
// rebuild beside the running join made, the state per table, and the
// states of the layout before 2026-12.
func dropJoinState(ctx context.Context, target *pgxpool.Pool, rdb redis.UniversalClient, slot string, j config.JoinConfig, log *slog.Logger) error {
	// The generations a rebuild beside the running join made.
	var gen int
	if err := target.QueryRow(ctx, `SELECT coalesce((SELECT generation FROM fkmat.join_state WHERE slot = $1 AND join_name = $2), 0)`,
		slot, j.Name).Scan(&gen); err != nil {
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || (pgErr.Code != "42P01" && pgErr.Code != "42703" && pgErr.Code != "3F000") {
			return fmt.Errorf("read the generation of join %q: %w", j.Name, err)
		}
	}
	for g := 1; g <= gen+1; g++ {
		if err := redisstore.DropGeneration(ctx, rdb, log, slot, j.Name, g); err != nil {
			return fmt.Errorf("delete redis state of join %q: %w", j.Name, err)
		}
	}
	prefixes := []string{redisstore.Prefix(slot, j.Name)}
	for i := range j.Rights {
		prefixes = append(prefixes, redisstore.StepPrefix(slot, j.Name, i))
	}
	if states := j.States(); states > 1 {
		prefixes = append(prefixes, redisstore.StatePrefixes(slot, j.Name, states-1, 0)...)
	}
	for _, prefix := range prefixes {
		store, err := redisstore.Open(ctx, rdb, redisstore.Config{Prefix: prefix})
		if err == nil {
			err = store.Drop(ctx)
		}
		if err != nil {
			return fmt.Errorf("delete redis state of join %q: %w", j.Name, err)
		}
	}
	return nil
}

// deleteMetadata deletes slot's rows of fkmat's metadata in the target, in
// one transaction.
func deleteMetadata(ctx context.Context, target *pgxpool.Pool, slot string) error {
	tx, err := target.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, q := range []string{`DELETE FROM fkmat.join_state WHERE slot = $1`, `DELETE FROM fkmat.checkpoint WHERE slot = $1`,
		`DELETE FROM fkmat.stall WHERE slot = $1`, `DELETE FROM fkmat.partitions WHERE slot = $1`,
		`DELETE FROM fkmat.daemon WHERE slot = $1`, `DELETE FROM fkmat.owner WHERE slot = $1`, `DELETE FROM fkmat.build WHERE slot = $1`} {
		if _, err := tx.Exec(ctx, q, slot); err != nil {
			return fmt.Errorf("delete fkmat metadata: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, `DELETE FROM fkmat.checkpoint WHERE slot = $1`, rebuildSlot(slot)); err != nil {
		return fmt.Errorf("delete fkmat metadata: %w", err)
	}
	return tx.Commit(ctx)
}

// TeardownPlan lists what Teardown drops for cfg, where it exists, without
// connecting to anything: `fkmat teardown --dry-run`.
func TeardownPlan(cfg *config.Config, dropTarget bool) []string {
	out := []string{
		fmt.Sprintf("replication slot %q, and %q and %q if an interrupted rebuild or backfill left them: its position in the WAL "+
			"is lost, and the next fkmat run starts over from a new snapshot (a full backfill)", cfg.Slot, rebuildSlot(cfg.Slot), cdc.BackfillSlot(cfg.Slot)),
		fmt.Sprintf("publication %q", cfg.Publication),
		fmt.Sprintf("the Redis keys under %q", "fkmat:"+cfg.Slot+":"),
		fmt.Sprintf("fkmat's metadata rows of slot %q in the target database (checkpoints, join states, builds)", cfg.Slot),
	}
	for _, j := range cfg.Joins {
		if dropTarget {
			out = append(out, fmt.Sprintf("target table %s of join %q (only if fkmat built it, or it has the join's shape)", j.Target.Table, j.Name))
		}
	}
	return out
}
