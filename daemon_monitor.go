package fkmat

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/buildinfo"
	"github.com/fkmat/fkmat/internal/pipeline"
)

// warnEvery is how often one kind of warning repeats while its cause lasts.
const warnEvery = 10 * time.Minute

// ticked waits for the next tick of c and reports whether it came before
// ctx was done.
func ticked(ctx context.Context, c <-chan time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-c:
		return true
	}
}

// rateLimit lets a warning through once per warnEvery per key.
type rateLimit map[string]time.Time

func (r rateLimit) allow(key string, now time.Time) bool {
	if last, ok := r[key]; ok && now.Sub(last) < warnEvery {
		return false
	}
	r[key] = now
	return true
}

// monitor does the daemon's periodic duties while the pipeline streams,
// every SlotCheckInterval:
//   - it samples the replication slot: it publishes the slot's retained
//     WAL, wal_status and safe_wal_size, warns (rate-limited) when the slot
//     retains more than SlotRetainedWarn or is close to being invalidated,
//     and stops run when the slot is invalidated;
//   - it writes the heartbeat in fkmat.daemon that fkmat status reads;
//   - it warns when Redis writes were not confirmed by their replicas;
//   - it logs a summary line every SummaryInterval.
func (d *daemon) monitor(ctx context.Context, p *pipeline.Pipeline) error {
	t := time.NewTicker(d.opts.SlotCheckInterval)
	defer t.Stop()
	host, _ := os.Hostname()
	started := time.Now()
	warned := rateLimit{}
	var last struct {
		at               time.Time
		changes, batches int64
	}
	last.at = started
	var lagBytes int64 // at the last sample
	var short int64    // writes not confirmed by replicas, at the last sample
	for {
		if info, err := d.checkSlot(ctx, warned); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if cdc.IsTerminal(err) {
				return err
			}
			if warned.allow("check", time.Now()) {
				d.log.Warn("sampling the replication slot failed", "err", err)
			}
		} else {
			lagBytes = info.LagBytes
		}
		lag, lastCommit := p.Lag(time.Now())
		if err := d.heartbeat(ctx, host, started, lag, lastCommit); err != nil && ctx.Err() == nil && warned.allow("heartbeat", time.Now()) {
			d.log.Warn("could not report the daemon in fkmat.daemon (fkmat status reads it)", "err", err)
		}
		if n, why := waitShort(p.Joins()); n > short && warned.allow("wait", time.Now()) {
			d.log.Warn("Redis writes not confirmed by --redis-wait-replicas replicas: a failover of their primary may lose them (the state is then rebuilt)",
				"writes", n-short, "last", why)
			short = n
		}
		if now := time.Now(); now.Sub(last.at) >= d.opts.SummaryInterval {
			c := p.Counters()
			changes, batches := c.Changes, c.Batches
			secs := now.Sub(last.at).Seconds()
			d.log.Info("summary", "changes_per_second", float64(changes-last.changes)/secs,
				"batches", batches-last.batches, "lag_seconds", lag, "lag_bytes", lagBytes)
			last.at, last.changes, last.batches = now, changes, batches
		}
		if !ticked(ctx, t.C) {
			return nil
		}
	}
}

// checkSlot samples the slot once.
func (d *daemon) checkSlot(ctx context.Context, warned rateLimit) (cdc.SlotInfo, error) {
	conn, err := d.source.Acquire(ctx)
	if err != nil {
		return cdc.SlotInfo{}, err
	}
	info, err := cdc.ReadSlotInfo(ctx, conn.Conn(), d.cfg.Slot)
	conn.Release()
	if err != nil {
		return info, err
	}
	d.obs.setSlot(&info)
	now := time.Now()
	switch {
	case !info.Exists:
		return info, fmt.Errorf("%w: slot %q was dropped while fkmat streamed from it; run fkmat backfill --force", cdc.ErrSlotMissing, d.cfg.Slot)
	case info.WALStatus == "lost":
		return info, info.Usable()
	case info.WALStatus == "unreserved" && warned.allow("unreserved", now):
		d.log.Warn("the replication slot is about to be invalidated: the WAL it needs is past max_slot_wal_keep_size and may be removed at the next checkpoint",
			"slot", d.cfg.Slot, "retained_bytes", info.RetainedBytes, "wal_status", info.WALStatus)
	}
	if info.RetainedBytes > d.opts.SlotRetainedWarn && warned.allow("retained", now) {
		d.log.Warn("the replication slot retains much WAL on the source's disk",
			"slot", d.cfg.Slot, "retained_bytes", info.RetainedBytes, "threshold_bytes", d.opts.SlotRetainedWarn,
			"wal_status", info.WALStatus, "confirmed_flush_lsn", info.ConfirmedFlushLSN.String())
	}
	if info.SafeWALSize >= 0 && info.SafeWALSize < d.opts.SlotRetainedWarn && warned.allow("safe", now) {
		d.log.Warn("the replication slot is close to max_slot_wal_keep_size: past it, Postgres invalidates the slot and the joins need a rebuild",
			"slot", d.cfg.Slot, "safe_wal_size_bytes", info.SafeWALSize, "threshold_bytes", d.opts.SlotRetainedWarn,
			"retained_bytes", info.RetainedBytes)
	}
	return info, nil
}

// heartbeat reports the daemon in fkmat.daemon.
func (d *daemon) heartbeat(ctx context.Context, host string, started time.Time, lag float64, lastCommit time.Time) error {
	var commit *time.Time
	if !lastCommit.IsZero() {
		commit = &lastCommit
	}
	_, err := d.target.Exec(ctx, `
		INSERT INTO fkmat.daemon AS d (slot, host, pid, version, started_at, heartbeat_at, lag_seconds, last_commit_time)
		VALUES ($1, $2, $3, $4, $5, now(), $6, $7)
		ON CONFLICT (slot) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, version = EXCLUDED.version,
			started_at = EXCLUDED.started_at, heartbeat_at = now(), lag_seconds = EXCLUDED.lag_seconds,
			last_commit_time = coalesce(EXCLUDED.last_commit_time, d.last_commit_time)`,
		d.cfg.Slot, host, os.Getpid(), buildinfo.Version(), started, lag, commit)
	if err != nil {
		return fmt.Errorf("report the daemon: %w", err)
	}
	return nil
}
