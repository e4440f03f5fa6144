package fkmat

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/crash"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/wal"
)

// Stall describes a pipeline that fails the same way at the same source
// position after every restart.
type Stall struct {
	// Position is where the pipeline restarts from (the older checkpoint);
	// LSN is the commit LSN of the failing transaction when known.
	Position    wal.LSN
	LSN         wal.LSN
	Join        string
	Table       string
	KeyColumns  []string
	Error       string
	Recurrences int
	Since       time.Time
}

// stallTracker counts the recurrences of one error at one position across
// pipeline restarts. Progress (a committed batch) resets it.
type stallTracker struct {
	mu    sync.Mutex
	sig   string
	stall Stall
}

// observe records a failure of a pipeline that started streaming at
// position (ok false: it failed before streaming) and returns the stall it
// makes, with Recurrences 0 for the first occurrence.
func (t *stallTracker) observe(position wal.LSN, ok bool, err error) Stall {
	t.mu.Lock()
	defer t.mu.Unlock()
	pos := "before streaming"
	if ok {
		pos = position.String()
	}
	sig := pos + "\x00" + rootCause(err)
	if sig != t.sig {
		t.sig = sig
		t.stall = Stall{Position: position, Error: err.Error(), Since: time.Now()}
		if f, ok := errors.AsType[*pipeline.TxnError](err); ok {
			t.stall.LSN, t.stall.Join, t.stall.Table, t.stall.KeyColumns = f.LSN, f.Join, f.Table, f.KeyColumns
		} else if c, ok := errors.AsType[*crash.Error](err); ok {
			t.stall.LSN = wal.LSN(c.CommitLSN)
		}
		return t.stall
	}
	t.stall.Recurrences++
	t.stall.Error = err.Error()
	return t.stall
}

// progress forgets the stall, if any, and reports whether there was one.
func (t *stallTracker) progress() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.stall.Recurrences > 0
	t.sig, t.stall = "", Stall{}
	return was
}

// rootCause is the innermost message of err's chain: the part that does
// not depend on how the failing change was batched.
func rootCause(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}

// stallFix names what gets a stalled pipeline going again.
func stallFix(s Stall) string {
	return "fix the cause named in the error and start fkmat run again; if the change cannot be applied as it is, " +
		"fkmat backfill --force rebuilds the joins from a new snapshot, past the failing change " +
		"(until then the slot keeps the WAL from " + s.Position.String() + " on the source's disk)"
}

// stallError is the error run stops with.
func stallError(s Stall, max int) error {
	where := "at " + s.Position.String()
	if s.LSN != 0 {
		where = fmt.Sprintf("in the transaction committed at %s", s.LSN)
	}
	if s.Table != "" {
		where += " on " + s.Table
	}
	return fmt.Errorf("%w: the same error recurred %d times %s, and a restart cannot help: %s; %s",
		ErrStalled, max, where, s.Error, stallFix(s))
}

// stallAttrs are the log attributes of a stall: positions, join, table and
// key column names, never values.
func stallAttrs(s Stall, max int) []any {
	attrs := []any{"restart_lsn", s.Position.String(), "recurrences", s.Recurrences, "max_stall_restarts", max,
		"stalled_for", time.Since(s.Since).Round(time.Second).String()}
	if s.LSN != 0 {
		attrs = append(attrs, "lsn", s.LSN.String())
	}
	if s.Join != "" {
		attrs = append(attrs, "join", s.Join)
	}
	if s.Table != "" {
		attrs = append(attrs, "table", s.Table, "key_columns", strings.Join(s.KeyColumns, ","))
	}
	return append(attrs, "err", s.Error)
}

// recordStall writes s to fkmat.stall in the target database for fkmat
// status (nil s: the stall is over). It is best effort: the target may be
// what fails.
func recordStall(ctx context.Context, cfg *config.Config, s *Stall) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	db, err := connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone)
	if err != nil {
		return err
	}
	defer db.Close()
	if s == nil {
		_, err = db.Exec(ctx, `DELETE FROM fkmat.stall WHERE slot = $1`, cfg.Slot)
		return err
	}
	var lsn *string
	if s.LSN != 0 {
		v := s.LSN.String()
		lsn = &v
	}
	_, err = db.Exec(ctx, `
		INSERT INTO fkmat.stall (slot, restart_lsn, lsn, join_name, table_name, key_columns, error, recurrences, since, updated_at)
		VALUES ($1, $2::pg_lsn, $3::pg_lsn, $4, $5, $6, $7, $8, $9, now())
		ON CONFLICT (slot) DO UPDATE SET restart_lsn = EXCLUDED.restart_lsn, lsn = EXCLUDED.lsn, join_name = EXCLUDED.join_name,
			table_name = EXCLUDED.table_name, key_columns = EXCLUDED.key_columns, error = EXCLUDED.error,
			recurrences = EXCLUDED.recurrences, since = EXCLUDED.since, updated_at = now()`,
		cfg.Slot, s.Position.String(), lsn, s.Join, s.Table, strings.Join(s.KeyColumns, ","), s.Error, s.Recurrences, s.Since)
	return err
}
