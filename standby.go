package fkmat

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
)

// Standby timing: how often a standby looks at the slot, and how often it
// says that it still waits.
const (
	standbyPoll = 500 * time.Millisecond
	standbyLog  = time.Minute
)

// waitForSlot is every run's first step: it returns once no process holds
// the replication slot (cdc.Holder: none streams from it, none backfills
// from it), or when ctx is done; after limit (a run that is not a
// standby: --slot-busy-timeout) it gives up with cdc.ErrSlotInUse naming
// the holder. limit 0 is a standby's: no limit. It only reads: it connects to the source
// and the target and looks, so that a standby changes nothing while the
// active daemon runs. The slot is the lock: the active daemon's walsender
// holds it until the server notices that its connection is gone: at once
// when the daemon's process dies on a host that stays up (its kernel closes
// the connection); when the host dies or stops answering, after
// wal_sender_timeout while it streams, after the server's TCP keepalives
// give up while it backfills.
func waitForSlot(ctx context.Context, cfg *config.Config, log *slog.Logger, obs *observer, limit time.Duration) error {
	what := "standby"
	if limit > 0 {
		what = "run"
	} else {
		obs.setPhase("standby")
	}
	source, err := connectPostgres(ctx, cfg.Source, "source", cfg.TimeZone)
	if err != nil {
		return err
	}
	defer source.Close()
	target, err := connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone)
	if err != nil {
		return err
	}
	defer target.Close()
	var since, logged time.Time
	for {
		h, held, err := readHolder(ctx, source, cfg.Slot)
		if err != nil {
			return err
		}
		now := time.Now()
		if !held {
			if !since.IsZero() {
				log.Info(what+": the replication slot is free; taking over", "slot", cfg.Slot, "waited", now.Sub(since).Round(time.Millisecond))
			}
			return nil
		}
		if since.IsZero() {
			since = now
		}
		if limit > 0 && now.Sub(since) >= limit {
			return fmt.Errorf("%w: slot %q is used by the process with PID %d, %s (still after %s, --slot-busy-timeout); stop the other fkmat, or run this one with --standby to wait for it",
				cdc.ErrSlotInUse, cfg.Slot, h.PID, describeHolder(ctx, target, cfg.Slot, h), limit)
		}
		if logged.IsZero() || now.Sub(logged) >= standbyLog {
			logged = now
			log.Info(fmt.Sprintf("%s: replication slot %s is held by %s; waiting", what, cfg.Slot, describeHolder(ctx, target, cfg.Slot, h)),
				"slot", cfg.Slot, "holder_pid", h.PID, "client_addr", h.ClientAddr, "waited", now.Sub(since).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(standbyPoll):
		}
	}
}
