package fkmat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// daemon holds the connections and components every command shares.
type daemon struct {
	cfg    *config.Config
	opts   Options
	log    *slog.Logger
	source *pgxpool.Pool
	target *pgxpool.Pool
	rdb    redis.UniversalClient
	plans  []*plan.JoinPlan
	cdc    *cdc.Client
	writer *sink.Writer
	joins  []pipeline.Join
	obs    *observer // nil without --metrics-addr
	// builds are the joins to build anew beside the running ones (a
	// changed definition, backfill --force): d.plans holds their old
	// definitions meanwhile (daemon_rebuild.go).
	builds []*rebuildJob
	// phases are the joins' phases in fkmat.join_state, as open read them.
	phases map[string]string
	// switching orders a rebuild's switch with the partition moves: a move
	// commits its rows into the WAL wholly before the switch's marker or
	// not in this run (the next one follows the change again), never
	// across it.
	switching sync.Mutex
}

// open connects to the source, the target and Redis, resolves the joins
// against the source catalog, migrates the target's metadata schema, creates
// (or checks) the target tables and opens each join's Redis state.
func open(ctx context.Context, cfg *config.Config, opts Options) (_ *daemon, err error) {
	opts.setDefaults()
	d := &daemon{cfg: cfg, opts: opts, log: opts.Logger}
	// d, not the result: a failing return has already set the result to nil.
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.source, err = connectPostgres(ctx, cfg.Source, "source", cfg.TimeZone); err != nil {
		return nil, err
	}
	if d.target, err = connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone); err != nil {
		return nil, err
	}
	if d.rdb, err = connectRedis(ctx, cfg.Redis); err != nil {
		return nil, err
	}
	if d.plans, err = plan.Resolve(ctx, d.source, cfg); err != nil {
		return nil, err
	}
	if err := migrate(ctx, d.target); err != nil {
		return nil, err
	}
	if err := checkOwners(ctx, d.target, cfg); err != nil {
		return nil, err
	}
	if err := recordPublication(ctx, d.target, cfg); err != nil {
		return nil, err
	}
	d.writer = sink.NewWriter(d.target)
	gens := make([]int, len(d.plans))
	d.phases = map[string]string{}
	for i, p := range d.plans {
		if err := d.widen(ctx, p); err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		st, err := d.loadJoinState(ctx, p.Name)
		if err != nil {
			return nil, err
		}
		gens[i] = st.generation
		if st.exists {
			d.phases[p.Name] = st.phase
		}
		b, err := d.planRebuild(ctx, p, st)
		if err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		if b != nil {
			d.builds = append(d.builds, b)
			d.plans[i] = b.old // until the new one is switched in; nil: frozen
			p = b.old
		}
		if p == nil {
			continue
		}
		// A join whose backfill was interrupted is backfilled again, and
		// the backfill swaps the new shape in.
		if err := d.ensureTarget(ctx, p, d.opts.Force || (st.exists && st.phase != "streaming")); err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
	}
	for _, b := range d.builds {
		if b.old == nil {
			if err := d.freeze(ctx, b); err != nil {
				return nil, err
			}
		}
	}
	published := slices.DeleteFunc(slices.Clone(d.plans), func(p *plan.JoinPlan) bool { return p == nil })
	for _, b := range d.builds {
		published = append(published, b.plan)
	}
	if d.cdc, err = cdc.New(cdc.Config{
		ConnString: cfg.Source, Slot: cfg.Slot, Publication: cfg.Publication,
		Tables: publishedTables(published), Logger: d.log, SlotBusyTimeout: opts.slotBusyTimeout(),
	}); err != nil {
		return nil, err
	}
	var running []*plan.JoinPlan
	for i, p := range d.plans {
		if p == nil {
			continue // frozen until its rebuild switches in
		}
		j, err := d.openJoin(ctx, p, gens[i])
		if err != nil {
			return nil, err
		}
		if j, err = d.serveLayout(ctx, j, gens[i]); err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		d.joins = append(d.joins, j)
		running = append(running, p)
	}
	d.plans = running
	return d, nil
}

// openJoin opens a join's Redis states (plan.JoinPlan.States) of
// generation gen (fkmat.join_state.generation) and its
// engine.
func (d *daemon) openJoin(ctx context.Context, p *plan.JoinPlan, gen int) (pipeline.Join, error) {
	prefixes := redisstore.StatePrefixes(d.cfg.Slot, p.Name, p.States()-1, gen)
	stores := make([]*redisstore.Store, len(prefixes))
	for t, prefix := range prefixes {
		var err error
		stores[t], err = redisstore.Open(ctx, d.rdb, redisstore.Config{
			Prefix: prefix, SubShards: d.opts.SubShards, RowShards: d.opts.RowShards, WaitReplicas: d.opts.RedisWaitReplicas,
		})
		if err != nil {
			if p.Edges == nil {
				return nil, fmt.Errorf("join %q: %w", p.Name, err)
			}
			return nil, fmt.Errorf("join %q: table %d: %w", p.Name, t, err)
		}
	}
	return d.joinOn(p, stores)
}

// joinOn returns join p's engine on its Redis states stores.
func (d *daemon) joinOn(p *plan.JoinPlan, stores []*redisstore.Store) (pipeline.Join, error) {
	if p.Edges == nil {
		return pipeline.NewPair(p, stores[0], d.opts.PageSize)
	}
	return pipeline.NewTree(p, stores, d.opts.PageSize)
}

func (d *daemon) close() {
	if d.source != nil {
		d.source.Close()
	}
	if d.target != nil {
		d.target.Close()
	}
	if d.rdb != nil {
		_ = d.rdb.Close()
	}
}

func (d *daemon) loadJoinState(ctx context.Context, name string) (joinState, error) {
	return readJoinState(ctx, d.target, d.cfg.Slot, name)
}

// assess says whether the joins can stream from their checkpoints, or why
// a backfill is needed ("" = ready).
func (d *daemon) assess(ctx context.Context) (reason string, lost bool, err error) {
	info, err := d.cdc.SlotInfo(ctx)
	if err != nil {
		return "", false, err
	}
	targetLSN, err := d.writer.Checkpoint(ctx, d.cfg.Slot)
	if err != nil {
		return "", false, err
	}
	for _, j := range d.joins {
		st, err := d.loadJoinState(ctx, j.Plan().Name)
		if err != nil {
			return "", false, err
		}
		switch {
		case !st.exists:
			return fmt.Sprintf("join %q was never backfilled", j.Plan().Name), false, nil
		case st.phase != "streaming":
			return fmt.Sprintf("the backfill of join %q was interrupted; starting it again", j.Plan().Name), false, nil
		case st.fingerprint != j.Plan().Fingerprint:
			return "", false, definitionChanged(j.Plan().Name)
		case !info.Exists:
			return fmt.Sprintf("replication slot %q is gone", d.cfg.Slot), true, nil
		}
		// A join of more than two tables has one state per table: any of them lost is the
		// join's state lost.
		for _, store := range j.Stores() {
			if why, lost, err := assessStore(ctx, j.Plan().Name, store, st.epoch, targetLSN); why != "" || err != nil {
				return why, lost, err
			}
		}
	}
	return "", false, nil
}

// assessStore is assess for one Redis state of a join.
func assessStore(ctx context.Context, name string, store *redisstore.Store, epoch string, targetLSN wal.LSN) (string, bool, error) {
	meta, err := store.Meta(ctx)
	switch {
	case errors.Is(err, redisstore.ErrNoState):
		return fmt.Sprintf("the Redis state of join %q is lost (no state under %s)", name, store.Config().Prefix), true, nil
	case err != nil:
		return "", false, fmt.Errorf("join %q: %w", name, err)
	case meta.Epoch != epoch:
		return fmt.Sprintf("the Redis state of join %q is foreign (epoch %s, the target was built with %s)", name, meta.Epoch, epoch), true, nil
	case store.CheckLayout(meta) != nil:
		return fmt.Sprintf("the Redis state of join %q has another layout (%s)", name, meta.Layout), true, nil
	case meta.Checkpoint > targetLSN:
		// Redis is committed after the target, so it is never ahead of
		// it: the target was restored from an older backup, or the state
		// belongs to another run. Streaming from it would skip changes.
		return fmt.Sprintf("the Redis state of join %q is ahead of the target (%s > %s)",
			name, meta.Checkpoint, targetLSN), true, nil
	}
	// On a Redis Cluster: finish a write a crash left half done, and find
	// shards that a failover or a flushed node set back.
	if err := store.Resume(ctx); errors.Is(err, redisstore.ErrLost) {
		return fmt.Sprintf("the Redis state of join %q lost writes: %v", name, err), true, nil
	} else if err != nil {
		return "", false, fmt.Errorf("join %q: %w", name, err)
	}
	return "", false, nil
}

// ensureTarget creates the target or checks its shape. A target fkmat built
// for this join whose shape no longer matches is left to be replaced when
// replace says a backfill swaps the new rows and shape in (Options.Force,
// or a backfill due anyway), unless what is attached to it would be lost;
// otherwise it is reported with that fix.
func (d *daemon) ensureTarget(ctx context.Context, p *plan.JoinPlan, replace bool) error {
	_, err := d.writer.EnsureTable(ctx, &p.Target)
	if !errors.Is(err, sink.ErrShapeMismatch) {
		return err
	}
	var owned bool
	if qerr := d.target.QueryRow(ctx, `SELECT EXISTS (SELECT FROM fkmat.join_state
		WHERE slot = $1 AND join_name = $2 AND target_schema = $3 AND target_table = $4)`,
		d.cfg.Slot, p.Name, p.Target.Schema, p.Target.Name).Scan(&owned); qerr != nil {
		return fmt.Errorf("look up the owner of %s: %w", p.Target.Ident(), qerr)
	}
	if !owned {
		return err
	}
	if !replace {
		return fmt.Errorf("%w; fkmat built this table for the join: run fkmat backfill --force to rebuild it with the new shape", err)
	}
	attached, aerr := d.writer.Attached(ctx, &p.Target)
	if aerr != nil {
		return aerr
	}
	if len(attached) > 0 {
		return fmt.Errorf("%w %s with the join's new shape: %s are attached to it, and replacing the table would lose them "+
			"(fkmat carries over grants and comments only): drop them, run fkmat backfill --force, and create them again (%w)",
			sink.ErrCannotSwap, p.Target.Ident(), strings.Join(attached, ", "), err)
	}
	d.log.Warn("the target has the join's old shape: the backfill replaces it with the new one when it is done", "target", p.Target.Ident())
	return nil
}

// swapRetrying runs swap, a target transaction that renames targets,
// again while a reader holds one of them: a rename waits for the target's
// readers, and a long query would queue every new reader behind the swap,
// so the swap waits a bounded time (swapLockTimeout) and tries again.
func (d *daemon) swapRetrying(ctx context.Context, what string, swap func() error) error {
	for attempt := 1; ; attempt++ {
		err := swap()
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "55P03" || attempt == swapAttempts {
			return err
		}
		d.log.Warn("a reader of a target holds it: "+what+" again shortly", "attempt", attempt, "of", swapAttempts)
		if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
	}
}

// swapAttempts and swapLockTimeout bound the wait of the swap for the
// targets' readers: a lock not granted within swapLockTimeout is tried
// again, up to swapAttempts times.
const (
	swapAttempts    = 30
	swapLockTimeout = "5s"
)

// plansOf returns the joins' plans.
func plansOf(joins []pipeline.Join) []*plan.JoinPlan {
	out := make([]*plan.JoinPlan, len(joins))
	for i, j := range joins {
		out[i] = j.Plan()
	}
	return out
}
