package fkmat

import (
	"context"
	"errors"
	"fmt"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/sink"
)

// Check validates the configuration against the databases and Redis and
// returns every problem found as a *ConfigError (nil when all is well).
func Check(ctx context.Context, cfg *config.Config, opts Options) error {
	opts.setDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	var problems []string
	add := func(err error) {
		var ce *config.ConfigError
		if errors.As(err, &ce) {
			problems = append(problems, ce.Problems...)
		} else if err != nil {
			problems = append(problems, err.Error())
		}
	}
	var plans []*plan.JoinPlan
	source, err := connectPostgres(ctx, cfg.Source, "source", cfg.TimeZone)
	if err != nil {
		add(fmt.Errorf("%v; check the source URL and that Postgres is running", err))
	} else {
		defer source.Close()
		plans, err = plan.Resolve(ctx, source, cfg)
		add(err)
		if err == nil {
			client, err := cdc.New(cdc.Config{ConnString: cfg.Source, Slot: cfg.Slot, Publication: cfg.Publication,
				Tables: publishedTables(plans)})
			add(err)
			if err == nil {
				for _, e := range unjoin(client.Preflight(ctx)) {
					add(e)
				}
			}
			probs, err := sourceGrantProblems(ctx, source, cfg, plans)
			problems = append(problems, probs...)
			add(err)
		} else {
			plans = nil
		}
	}
	target := source
	if cfg.Target != cfg.Source {
		target, err = connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone)
		if err != nil {
			add(fmt.Errorf("%v; check the target URL", err))
		} else {
			defer target.Close()
		}
	}
	if target != nil {
		add(checkOwners(ctx, target, cfg))
	}
	if target != nil && plans != nil {
		probs, err := targetGrantProblems(ctx, target, plans)
		problems = append(problems, probs...)
		add(err)
		// An existing target must already have the join's shape; check it
		// without creating anything.
		w := sink.NewWriter(target)
		for _, p := range plans {
			shape, err := builtShape(ctx, target, cfg.Slot, p)
			if err != nil {
				add(fmt.Errorf("join %q: %w", p.Name, err))
				continue
			}
			var exists bool
			if err := target.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.Target.Ident()).Scan(&exists); err != nil {
				add(fmt.Errorf("look up target %s: %w", p.Target.Ident(), err))
			} else if exists {
				if err := w.CheckTable(ctx, shape); err != nil {
					add(fmt.Errorf("join %q: %w", p.Name, err))
				}
			}
		}
	}
	if rdb, err := connectRedis(ctx, cfg.Redis); err != nil {
		add(fmt.Errorf("%v; check the Redis URL and that Redis is running", err))
	} else {
		_ = rdb.Close()
	}
	if len(problems) > 0 {
		return &config.ConfigError{Problems: problems}
	}
	return nil
}

// builtShape is the shape join p's existing target must have now: p's own,
// or, when the definition changed since the join was built, the shape it
// was built with (run widens a widened column before it streams, and
// builds any other change beside the running join). A join built before
// fkmat kept definitions cannot tell; that is the error run stops with.
func builtShape(ctx context.Context, target *pgxpool.Pool, slot string, p *plan.JoinPlan) (*sink.Table, error) {
	st, err := readJoinState(ctx, target, slot, p.Name)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (pgErr.Code == "42P01" || pgErr.Code == "42703") {
		return &p.Target, nil // fkmat's schema is older or absent: run migrates it
	}
	if err != nil {
		return nil, err
	}
	if !st.exists || st.fingerprint == p.Fingerprint || st.phase != "streaming" {
		return &p.Target, nil // nothing built yet, or a rebuild that starts over
	}
	if st.definition != nil {
		if _, ok, err := plan.Widenings(st.definition, plan.Definition(p)); err != nil {
			return nil, err
		} else if ok {
			t, err := plan.DefinitionTarget(st.definition)
			return &t, err
		}
		// run builds the new definition beside the old target, which
		// keeps its shape until the switch.
		t, err := plan.DefinitionTarget(st.definition)
		return &t, err
	}
	return nil, definitionChanged(p.Name)
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
