package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/cdc"
)

func runCommand() *cli.Command {
	return &cli.Command{
		Name:  "run",
		Usage: "the daemon: backfill if needed, then stream and maintain the targets; SIGINT/SIGTERM = flush, checkpoint, exit 0",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "on-lost-state", Value: fkmat.LostStateRebuild, EnvVars: []string{"FKMAT_ON_LOST_STATE"},
				Usage: "when the Redis state is lost or foreign: rebuild (backfill again) or refuse (exit naming fkmat backfill --force)"},
			&cli.IntFlag{Name: "max-stall-restarts", Value: fkmat.DefaultMaxStallRestarts, EnvVars: []string{"FKMAT_MAX_STALL_RESTARTS"},
				Usage: "exit 1 after the same error recurs this many times at the same source position (a stall a restart cannot fix)"},
			&cli.StringFlag{Name: "slot-retained-warn", Value: "1GiB", EnvVars: []string{"FKMAT_SLOT_RETAINED_WARN"},
				Usage: "warn when the replication slot retains more WAL than this on the source, or its safe_wal_size falls below it (e.g. 1GB, 512MB: Postgres's units, 1024-based like 1GiB, 512MiB; a plain number is bytes)"},
			&cli.DurationFlag{Name: "verify-interval", EnvVars: []string{"FKMAT_VERIFY_INTERVAL"}, DefaultText: "off",
				Usage: "compare every target with its SQL join in the background, one throttled round per interval (e.g. 1h)"},
			&cli.IntFlag{Name: "redis-wait-replicas", EnvVars: []string{"FKMAT_REDIS_WAIT_REPLICAS"},
				Usage: "wait (Redis WAIT, up to 1 s) until this many replicas of every Redis primary written to have each batch's state before acknowledging it; 0: do not wait"},
			&cli.IntFlag{Name: "chain-page-rows", EnvVars: []string{"FKMAT_CHAIN_PAGE_ROWS"}, Hidden: true,
				Usage: "no longer used: a fan-out of a join of more than two tables writes no Redis state"},
			&cli.DurationFlag{Name: "slot-busy-timeout", Value: cdc.DefaultSlotBusyTimeout, EnvVars: []string{"FKMAT_SLOT_BUSY_TIMEOUT"},
				Usage: "how long to wait for the replication slot while another process streams from it (a previous run's walsender the server has not yet dropped) before exiting 1 naming that process"},
			&cli.BoolFlag{Name: "standby", EnvVars: []string{"FKMAT_STANDBY"},
				Usage: "wait without limit, changing nothing, while another fkmat run holds the replication slot, and take over when it stops or dies (run one on each of two hosts; --slot-busy-timeout does not apply)"},
			&cli.DurationFlag{Name: "grow-check-interval", Value: fkmat.DefaultGrowCheckInterval, EnvVars: []string{"FKMAT_GROW_CHECK_INTERVAL"},
				Usage: "how often to compare the joined tables' sizes with their Redis states' layouts, and resize the states they outgrew (the stream waits about a second per million rows moved)"},
			&cli.DurationFlag{Name: "stuck-after", Value: fkmat.DefaultStuckAfter, EnvVars: []string{"FKMAT_STUCK_AFTER"},
				Usage: "say not ready on /readyz when the stream has not moved for this long while changes wait (a server hung or slow)"},
			&cli.StringFlag{Name: "metrics-addr", EnvVars: []string{"FKMAT_METRICS_ADDR"},
				Usage: "serve Prometheus /metrics, /healthz and /readyz on this address (e.g. 127.0.0.1:9187)"},
		},
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			opts.OnLostState = c.String("on-lost-state")
			opts.Standby = c.Bool("standby")
			opts.MetricsAddr = c.String("metrics-addr")
			if opts.RedisWaitReplicas = c.Int("redis-wait-replicas"); opts.RedisWaitReplicas < 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--redis-wait-replicas %d: use 0 (do not wait) or the number of replicas to wait for", opts.RedisWaitReplicas)}
			}
			if c.IsSet("chain-page-rows") {
				opts.Logger.Warn("--chain-page-rows (FKMAT_CHAIN_PAGE_ROWS) is no longer used and is ignored: " +
					"a fan-out of a join of more than two tables writes no Redis state, and its target writes go in pages of its own")
			}
			if opts.SlotBusyTimeout = c.Duration("slot-busy-timeout"); opts.SlotBusyTimeout <= 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--slot-busy-timeout %s: use a positive duration (e.g. 30s)", opts.SlotBusyTimeout)}
			}
			if opts.GrowCheckInterval = c.Duration("grow-check-interval"); opts.GrowCheckInterval <= 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--grow-check-interval %s: use a positive duration (e.g. 1m)", opts.GrowCheckInterval)}
			}
			if opts.StuckAfter = c.Duration("stuck-after"); opts.StuckAfter <= 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--stuck-after %s: use a positive duration (e.g. 30s)", opts.StuckAfter)}
			}
			if opts.VerifyInterval = c.Duration("verify-interval"); opts.VerifyInterval < 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--verify-interval %s: use a positive duration, or leave it out", opts.VerifyInterval)}
			}
			if opts.MaxStallRestarts = c.Int("max-stall-restarts"); opts.MaxStallRestarts < 1 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--max-stall-restarts %d: use 1 or more", opts.MaxStallRestarts)}
			}
			if opts.SlotRetainedWarn, err = parseSize(c.String("slot-retained-warn")); err != nil {
				return &exitError{code: exitUsage, err: fmt.Errorf("--slot-retained-warn: %w", err)}
			}
			if opts.OnLostState != fkmat.LostStateRebuild && opts.OnLostState != fkmat.LostStateRefuse {
				return &exitError{code: exitUsage, err: fmt.Errorf("--on-lost-state %q: use rebuild or refuse", opts.OnLostState)}
			}
			ctx, stop := signalContext(c)
			defer stop()
			return fkmat.Run(ctx, cfg, opts)
		},
	}
}
