package fkmat

import (
	"context"
	"errors"
	"fmt"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/internal/config"

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
	source, err := connectPostgres(ctx, cfg.Source, "source")
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
		target, err = connectPostgres(ctx, cfg.Target, "target")
		if err != nil {
			add(fmt.Errorf("%v; check the target URL", err))
		} else {
			defer target.Close()
		}
	}
	if target != nil && plans != nil {
		probs, err := targetGrantProblems(ctx, target, plans)
		problems = append(problems, probs...)
		add(err)
		// An existing target must already have the join's shape; check it
		// without creating anything.
		w := sink.NewWriter(target)
		for _, p := range plans {
			var exists bool
			if err := target.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.Target.Ident()).Scan(&exists); err != nil {
				add(fmt.Errorf("look up target %s: %w", p.Target.Ident(), err))
			} else if exists {
				if err := w.CheckTable(ctx, &p.Target); err != nil {
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

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}
