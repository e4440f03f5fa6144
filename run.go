package fkmat

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/crash"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/sink"
)

// ShutdownTimeout bounds how long Run takes to return once ctx is done: the
// batch in hand (pipeline.ShutdownGrace), then the last acknowledgement and
// the replication connection's close (a few seconds each). A supervisor
// should wait at least this long before it kills the process
// (deploy/systemd: TimeoutStopSec; deploy/kubernetes:
// terminationGracePeriodSeconds).
const ShutdownTimeout = pipeline.ShutdownGrace + 15*time.Second

// Run is the daemon: it backfills when needed (first start, interrupted
// backfill, lost Redis state when allowed), then streams and maintains every
// target until ctx is done. On shutdown it finishes the batch in hand,
// checkpoints, acknowledges and returns nil.
//
// Errors that a retry can fix (a database or Redis unreachable or
// restarting) restart the whole pipeline from its checkpoints after an
// exponential, jittered backoff; configuration problems, schema changes,
// lost state with OnLostState=refuse and terminal replication errors stop
// Run.
//
// With Options.Standby, Run first waits, changing nothing, while another
// process holds the replication slot, and waits again whenever another
// process takes the slot first.
func Run(ctx context.Context, cfg *config.Config, opts Options) error {
	opts.setDefaults()
	opts.online = true
	// A slot another file's joins own is refused before waiting for it
	// (open checks again, after the metadata's migrations).
	if err := ownersBeforeStart(ctx, cfg); err != nil {
		return err
	}
	obs, stopMetrics, err := startMetrics(ctx, cfg, opts)
	if err != nil {
		return err
	}
	defer stopMetrics()
	delay := time.Second
	connected := false // once, in this process
	var stalls stallTracker
	var cleared atomic.Bool // the stall an earlier process recorded, if any
	verify := &verifyCounters{}
	obs.setVerify(verify)
	rs := &runState{verify: verify, progress: func() {
		was := stalls.progress()
		if was {
			obs.setStall(nil)
			opts.Logger.Info("pipeline moving again after a stall")
		}
		if was || !cleared.Swap(true) {
			if err := recordStall(ctx, cfg, nil); err != nil {
				opts.Logger.Warn("could not clear the stall in fkmat.stall", "err", err)
			}
		}
	}}
	for {
		started := time.Now()
		rs.streaming = false
		err := runOnce(ctx, cfg, opts, obs, &connected, rs)
		if err == nil {
			return nil
		}
		if errors.Is(err, errRebuilt) && ctx.Err() == nil {
			opts.Logger.Info("restarting from the checkpoints with the rebuilt joins")
			delay = time.Second
			continue
		}
		if ctx.Err() != nil {
			// Shutting down: work cut short by the signal is a clean exit; a
			// failure of what shutdown still does (the last batch's commits)
			// is not.
			if !errors.Is(err, pipeline.ErrFinalBatch) {
				return nil
			}
			opts.Logger.Error("shutdown failed", "err", err)
			return err
		}
		if errors.Is(err, sink.ErrFenced) && !opts.Standby {
			// Another process took the slot over (this one froze, or lost
			// its connection): taking it back would only make them thrash.
			opts.Logger.Info("another process took the replication slot over; this run waits for it as a standby from now on", "slot", cfg.Slot)
			opts.Standby = true
		}
		if opts.Standby && (errors.Is(err, cdc.ErrSlotInUse) || errors.Is(err, sink.ErrCheckpointBackwards) || errors.Is(err, sink.ErrFenced)) {
			// Another process took the slot first, or took it over (and
			// committed past a batch this run still had in hand).
			opts.Logger.Info("standby: another process holds the replication slot; waiting for it again", "slot", cfg.Slot, "err", err)
			delay = time.Second
			continue
		}
		class := recoveryOf(err, connected)
		if time.Since(started) > time.Minute || (class == retryConnection && rs.streaming) {
			// It had run well, or connected and streamed: this is a new
			// outage, not the same one going on.
			delay = time.Second
		}
		wait := retryWait(delay)
		switch class {
		case stopRun, stopConfig:
			return err
		case stopCredentials:
			return credentialsError(err)
		}
		if wait, err = onRetry(ctx, cfg, opts, obs, &stalls, rs, err, class, wait); err != nil {
			return err
		}
		if class == retryConnection {
			// Back as soon as the servers answer again, not at the end of
			// the wait.
			if !waitForServers(ctx, cfg, wait) {
				return nil
			}
		} else if !sleepCtx(ctx, wait) {
			return nil
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// startMetrics serves the metrics at Options.MetricsAddr, if set, until the
// returned stop is called; without it the observer is nil (its methods
// then do nothing).
func startMetrics(ctx context.Context, cfg *config.Config, opts Options) (*observer, func(), error) {
	if opts.MetricsAddr == "" {
		return nil, func() {}, nil
	}
	obs := newObserver(cfg)
	obs.stuckAfter = opts.StuckAfter
	mctx, stopMetrics := context.WithCancel(ctx)
	addr, wait, err := serveMetrics(mctx, opts.MetricsAddr, obs, opts.Logger)
	if err != nil {
		stopMetrics()
		return nil, nil, &config.ConfigError{Problems: []string{err.Error() + "; choose another --metrics-addr"}}
	}
	opts.Logger.Info("serving metrics", "addr", addr.String())
	if opts.MetricsBound != nil {
		opts.MetricsBound(addr)
	}
	return obs, func() {
		stopMetrics()
		wait()
	}, nil
}

// onRetry reports a failure that Run retries (class retryConnection or
// retryOrStall) and records one that recurs at the same source position as
// a stall. It returns how long to wait before the retry, or the error Run
// gives up with.
func onRetry(ctx context.Context, cfg *config.Config, opts Options, obs *observer, stalls *stallTracker, rs *runState, err error,
	class recovery, wait time.Duration) (time.Duration, error) {
	switch class {
	case retryConnection:
		obs.restarted()
		opts.Logger.Error("cannot reach a server, or it is not ready; restarting from the checkpoints when it is",
			"err", err, "retry_in", wait.Round(time.Millisecond))
	case retryOrStall:
		obs.restarted()
		st := stalls.observe(rs.start, rs.streaming, err)
		if st.Recurrences == 0 && errors.Is(err, pipeline.ErrWidened) {
			// Followed at once: the restart widens the target
			// column first (daemon.widen).
			opts.Logger.Info("a joined column's type was widened; restarting from the checkpoints to follow it", "change", err)
			wait = 0
			break
		}
		if c, ok := errors.AsType[*crash.Error](err); ok && st.Recurrences == 0 {
			opts.Logger.Error("panic recovered; restarting from the checkpoints (the same panic again is a stall)",
				"err", err, "stack", string(c.Stack), "retry_in", wait.Round(time.Millisecond))
			break
		}
		if st.Recurrences == 0 {
			opts.Logger.Error("pipeline failed; restarting from the checkpoints", "err", err, "retry_in", wait.Round(time.Millisecond))
			break
		}
		// The same error at the same position: a stall, shown
		// everywhere an operator looks.
		obs.setStall(&st)
		if rerr := recordStall(ctx, cfg, &st); rerr != nil {
			opts.Logger.Warn("could not record the stall in fkmat.stall", "err", rerr)
		}
		if st.Recurrences >= opts.MaxStallRestarts {
			opts.Logger.Error("pipeline stalled; giving up", stallAttrs(st, opts.MaxStallRestarts)...)
			return 0, stallError(st, opts.MaxStallRestarts)
		}
		opts.Logger.Error("pipeline stalled: the same error recurs at the same source position; restarting",
			append(stallAttrs(st, opts.MaxStallRestarts), "retry_in", wait.Round(time.Millisecond))...)
	}
	return wait, nil
}

// maxRetryDelay caps the wait between restarts after an error.
const maxRetryDelay = 30 * time.Second

// retryWait is the wait before a restart at backoff delay d: uniform in
// [d/2, d), so that daemons that failed together do not retry together,
// and never above maxRetryDelay.
func retryWait(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2)
}

// probeInterval is how often a daemon waiting out an outage checks whether
// the servers answer again.
const probeInterval = time.Second

// waitForServers waits up to wait, returning early once the source, the
// target and Redis all answer a probe; false when ctx is done.
func waitForServers(ctx context.Context, cfg *config.Config, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		step := min(time.Until(deadline), probeInterval)
		if step <= 0 {
			return true
		}
		if !sleepCtx(ctx, step) {
			return false
		}
		if time.Now().Before(deadline) && serversAnswer(ctx, cfg) {
			return true
		}
	}
}

// serversAnswer reports whether the source, the target and Redis accept a
// connection and answer within a second each.
func serversAnswer(ctx context.Context, cfg *config.Config) bool {
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for _, url := range []string{cfg.Source, cfg.Target} {
		conn, err := pgx.Connect(pctx, url)
		if err != nil {
			return false
		}
		err = conn.Ping(pctx)
		_ = conn.Close(context.WithoutCancel(pctx))
		if err != nil {
			return false
		}
	}
	rdb, err := newRedisClient(cfg.Redis)
	if err != nil {
		return false
	}
	defer func() { _ = rdb.Close() }()
	return rdb.Ping(pctx).Err() == nil
}

// credentialsError is the configuration error run stops with when a server
// refused its credentials or certificate before it ever connected.
func credentialsError(err error) error {
	fix := "fix the user or password in the URL (or the server's pg_hba.conf / Redis ACL)"
	if errors.Is(err, errCertificate) {
		fix = "trust the server's CA (Postgres: sslrootcert in the URL; Redis: SSL_CERT_FILE) and connect by a host name the certificate holds"
	}
	return &config.ConfigError{Problems: []string{err.Error() + "; " + fix + ", then start fkmat run again"}}
}

// runState is what Run learns of one pipeline run: where it started
// streaming, and a hook called after every committed batch.
type runState struct {
	start     wal.LSN
	streaming bool
	progress  func()
	// verify are the background verifier's counters, kept across restarts.
	verify *verifyCounters
}

func runOnce(ctx context.Context, cfg *config.Config, opts Options, obs *observer, connected *bool, rs *runState) error {
	// Nothing is written while another process holds the slot: a standby
	// waits for it, another run for --slot-busy-timeout (its own dead
	// walsender, after a crash, is gone by then).
	limit := opts.SlotBusyTimeout
	if limit <= 0 {
		limit = cdc.DefaultSlotBusyTimeout
	}
	if opts.Standby {
		limit = 0
	}
	if err := waitForSlot(ctx, cfg, opts.Logger, obs, limit); err != nil {
		return err
	}
	obs.setPhase("starting")
	d, err := open(ctx, cfg, opts)
	if err != nil {
		return err
	}
	*connected = true
	defer d.close()
	d.obs = obs
	reason, lost, err := d.assess(ctx)
	if err != nil {
		return err
	}
	if reason != "" && len(d.builds) > 0 {
		// A backfill is due anyway: it builds the new definitions.
		d.close()
		offline := opts
		offline.online, offline.Force = false, true // the backfill swaps the new shapes in
		if d, err = open(ctx, cfg, offline); err != nil {
			return err
		}
		defer d.close()
		d.obs = obs
	}
	if reason != "" {
		if lost && d.opts.OnLostState == LostStateRefuse {
			return fmt.Errorf("%w: %s; run fkmat backfill --force to rebuild it", ErrLostState, reason)
		}
		d.log.Warn("backfilling before streaming", "reason", reason)
		obs.setPhase("backfilling")
		if err := d.backfill(ctx, reason); err != nil {
			return err
		}
	}
	return d.stream(ctx, rs)
}
