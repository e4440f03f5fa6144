package fkmat

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/human"
	"github.com/fkmat/fkmat/internal/wal"
)

// BehindError says how far behind the targets are, and why.
type BehindError struct {
	Slot string
	// Source is the source's WAL position when verify started; Confirmed is
	// the slot's confirmed_flush_lsn, up to which the targets reflect every
	// source commit.
	Source, Confirmed wal.LSN
	// Pending is the commit position of the first transaction not applied,
	// when known (no daemon streams from the slot).
	Pending wal.LSN
	// Streaming says a daemon streams from the slot; Waited is how long
	// verify waited for it.
	Streaming bool
	Waited    time.Duration
	// LastCommit is when the targets' checkpoint last moved (zero when
	// unknown).
	LastCommit time.Time
}

func (e *BehindError) Error() string {
	msg := fmt.Sprintf("%v: replication slot %q has confirmed %s, the source was at %s when verify started (%s of WAL)",
		ErrBehind, e.Slot, e.Confirmed, e.Source, human.Bytes(int64(e.Source-e.Confirmed)))
	if e.Pending != 0 {
		msg += fmt.Sprintf("; the first change not in the targets committed at %s", e.Pending)
	}
	if !e.LastCommit.IsZero() {
		msg += fmt.Sprintf("; the targets last moved at %s (%s ago)", e.LastCommit.UTC().Format(time.RFC3339),
			time.Since(e.LastCommit).Round(time.Second))
	}
	if e.Streaming {
		return msg + fmt.Sprintf("; a daemon streams from the slot but had not passed %s after %s: "+
			"let it catch up (fkmat status shows its lag) and verify again, or pass a longer --wait", e.Source, e.Waited.Round(time.Second))
	}
	return msg + "; no daemon streams from the slot: start fkmat run, then verify again"
}

func (e *BehindError) Unwrap() error { return ErrBehind }

// awaitCaughtUp returns once the targets reflect every source commit up to
// the source's position at the call, waiting up to wait while a daemon
// streams from the slot; else a *BehindError. Without a slot there is
// nothing to wait for.
func awaitCaughtUp(ctx context.Context, source, target *pgxpool.Pool, cfg *config.Config, wait time.Duration) error {
	var text string
	if err := source.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&text); err != nil {
		return fmt.Errorf("read the source's WAL position: %w", err)
	}
	start, err := wal.ParseLSN(text)
	if err != nil {
		return err
	}
	began := time.Now()
	for {
		var active bool
		var text *string
		err := source.QueryRow(ctx, `SELECT active, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
			cfg.Slot).Scan(&active, &text)
		switch {
		case errors.Is(err, pgx.ErrNoRows) || (err == nil && text == nil):
			return nil
		case err != nil:
			return fmt.Errorf("read replication slot %q: %w", cfg.Slot, err)
		}
		confirmed, err := wal.ParseLSN(*text)
		if err != nil {
			return err
		}
		if confirmed >= start {
			return nil
		}
		if !active {
			// A backfill holds the slot without streaming from it.
			_, active, err = readHolder(ctx, source, cfg.Slot)
			if err != nil {
				return err
			}
		}
		behind := &BehindError{Slot: cfg.Slot, Source: start, Confirmed: confirmed, Streaming: active, Waited: time.Since(began)}
		if !active {
			// The WAL after the confirmed position may hold no change of
			// the joined tables at all (other tables, other databases,
			// checkpoints): the slot tells, without consuming anything.
			pending, err := firstPending(ctx, source, cfg, start)
			if errors.Is(err, errSlotTaken) {
				continue // a daemon took it meanwhile
			}
			if err != nil || pending == 0 {
				return err
			}
			// A daemon starting takes the slot within moments.
			if time.Since(began) < min(wait, startGrace) {
				if !sleepCtx(ctx, 100*time.Millisecond) {
					return ctx.Err()
				}
				continue
			}
			behind.Pending = pending
			behind.LastCommit = lastCommit(ctx, target, cfg.Slot)
			return behind
		}
		if time.Since(began) >= wait {
			behind.LastCommit = lastCommit(ctx, target, cfg.Slot)
			return behind
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// startGrace is how long verify gives a daemon that is starting to take
// the slot before it says that none streams.
const startGrace = 3 * time.Second

// errSlotTaken is a peek at a slot a process took meanwhile.
var errSlotTaken = errors.New("the replication slot was taken")

// firstPending peeks at the slot, which no process streams from, for the
// first transaction committed before upTo that it has not confirmed, and
// returns its commit position (zero: none).
func firstPending(ctx context.Context, source *pgxpool.Pool, cfg *config.Config, upTo wal.LSN) (wal.LSN, error) {
	// pgoutput sends a transaction's changes after its BEGIN, whose first
	// byte is 'B' and whose bytes 1..8 are the commit's position.
	var commit int64
	err := source.QueryRow(ctx, `
		SELECT ('x' || encode(substring(data FROM 2 FOR 8), 'hex'))::bit(64)::bigint
		FROM pg_logical_slot_peek_binary_changes($1, $2::pg_lsn, 1, 'proto_version', '1', 'publication_names', $3)
		WHERE get_byte(data, 0) = ascii('B') LIMIT 1`, cfg.Slot, upTo.String(), cfg.Publication).Scan(&commit)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code == "55006" { // object_in_use
		return 0, errSlotTaken
	}
	if err != nil {
		return 0, fmt.Errorf("look for changes replication slot %q has not confirmed: %w", cfg.Slot, err)
	}
	return wal.LSN(commit), nil
}

// lastCommit is when the slot's target checkpoint last moved (zero if
// unknown).
func lastCommit(ctx context.Context, target *pgxpool.Pool, slot string) time.Time {
	var at time.Time
	_ = target.QueryRow(ctx, `SELECT updated_at FROM fkmat.checkpoint WHERE slot = $1`, slot).Scan(&at)
	return at
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
