package cdc

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fkmat/fkmat/internal/crash"
)

// Sentinel errors. Errors returned by this package wrap one of these when the
// cause is known; test with errors.Is. Each wrapping message names the fix.
var (
	// ErrWALLevel: the server's wal_level is not logical.
	ErrWALLevel = errors.New("wal_level is not logical")
	// ErrServerVersion: the server is older than MinServerVersion.
	ErrServerVersion = errors.New("PostgreSQL is too old")
	// ErrReplicationPrivilege: the role may not use replication.
	ErrReplicationPrivilege = errors.New("role lacks the REPLICATION privilege")
	// ErrPermission: the role may not do a catalog operation (publication,
	// table ownership).
	ErrPermission = errors.New("permission denied")
	// ErrSlotsExhausted: max_replication_slots are all in use.
	ErrSlotsExhausted = errors.New("all replication slots are in use")
	// ErrWALSendersExhausted: max_wal_senders connections are all in use.
	ErrWALSendersExhausted = errors.New("all wal senders are in use")
	// ErrStopped: the stream met the marker of StopAt and stopped.
	ErrStopped = errors.New("replication stopped at its marker")
	// ErrSlotInUse: another process streams from the slot.
	ErrSlotInUse = errors.New("replication slot is in use")
	// ErrSlotExists: CreateSlot found a slot of that name.
	ErrSlotExists = errors.New("replication slot already exists")
	// ErrSlotMissing: the slot does not exist (never created, or dropped).
	ErrSlotMissing = errors.New("replication slot does not exist")
	// ErrSlotInvalidated: the slot lost WAL it needed (wal_status "lost").
	ErrSlotInvalidated = errors.New("replication slot is invalidated")
	// ErrPublicationMissing: the publication does not exist, or did not
	// exist at the WAL position being decoded.
	ErrPublicationMissing = errors.New("publication does not exist")
	// ErrTableMissing: a configured table does not exist.
	ErrTableMissing = errors.New("table does not exist")
	// ErrProtocol: the server sent something this package cannot decode.
	ErrProtocol = errors.New("pgoutput protocol error")
)

// terminal lists the sentinels that retrying cannot fix.
var terminal = []error{
	ErrWALLevel, ErrServerVersion, ErrReplicationPrivilege, ErrPermission, ErrSlotsExhausted,
	ErrSlotInUse, ErrSlotExists, ErrSlotMissing, ErrSlotInvalidated,
	ErrPublicationMissing, ErrTableMissing, ErrProtocol,
}

// Unrecoverable reports whether err wraps one of the sentinels that
// retrying can never fix (a slot or publication gone, wal_level, the
// REPLICATION privilege...); ErrPermission is not one of them: a
// permission may be granted back. Unlike IsTerminal, it says nothing of
// other Postgres errors: their SQLSTATE says what they mean to the
// consumer.
func Unrecoverable(err error) bool {
	return terminalSentinel(err) && !errors.Is(err, ErrPermission)
}

// terminalSentinel reports whether err wraps one of terminal.
func terminalSentinel(err error) bool {
	for _, t := range terminal {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// IsTerminal reports whether err cannot go away by reconnecting: a
// misconfiguration, a missing object or a protocol error. Network errors,
// server restarts and exhausted connections are not terminal.
func IsTerminal(err error) bool {
	if terminalSentinel(err) {
		return true
	}
	if _, busy := errors.AsType[*slotBusyError](err); busy {
		return false // retried up to Config.SlotBusyTimeout
	}
	if _, panicked := errors.AsType[*crash.Error](err); panicked {
		return true // the same message would panic again after a reconnect
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
		// SQLSTATE 55000 while connecting is "database is not currently
		// accepting connections" (ALLOW_CONNECTIONS false during
		// maintenance): the database comes back, like a restarting server.
		if _, connecting := errors.AsType[*pgconn.ConnectError](err); connecting && pgErr.Code == "55000" {
			return false
		}
		return !retryableClass(pgErr.Code)
	}
	return false
}

// retryableClass reports whether a SQLSTATE means "try again later":
// connection exceptions, insufficient resources, operator intervention
// (shutdown, restart, crash recovery) and system errors.
func retryableClass(code string) bool {
	if len(code) < 2 {
		return true
	}
	switch code[:2] {
	case "08", "53", "57", "58", "40":
		return true
	}
	return false
}

var activePIDRE = regexp.MustCompile(`active for PID (\d+)`)

// slotBusyError is the retryable form of "slot is active for PID n"; the
// stream retries it up to Config.SlotBusyTimeout, then reports ErrSlotInUse.
type slotBusyError struct {
	slot string
	pid  int
	err  error
}

func (e *slotBusyError) Error() string {
	return fmt.Sprintf("replication slot %q is active for PID %d: %v", e.slot, e.pid, e.err)
}

func (e *slotBusyError) Unwrap() error { return e.err }

// terminal is the error once the slot has stayed busy for waited (zero:
// not waited for).
func (e *slotBusyError) terminal(waited time.Duration) error {
	still := ""
	if waited > 0 {
		still = fmt.Sprintf(" (still after %s)", waited)
	}
	return fmt.Errorf("%w: slot %q is used by the process with PID %d%s; stop the other consumer, or terminate it with SELECT pg_terminate_backend(%d): %w",
		ErrSlotInUse, e.slot, e.pid, still, e.pid, e.err)
}

// mapError turns a Postgres error into one of the sentinels with a message
// that names the fix. It is the only place that interprets SQLSTATEs. slot,
// publication and user only fill in the message; err is returned unchanged
// when it is not a recognised Postgres error.
func mapError(err error, slot, publication, user string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	msg := pgErr.Message
	switch {
	case pgErr.Code == "55000" && strings.Contains(msg, "wal_level"):
		return fmt.Errorf("%w: set wal_level=logical in postgresql.conf and restart Postgres: %w", ErrWALLevel, err)
	case pgErr.Code == "42501" && strings.Contains(msg, "replication"):
		return fmt.Errorf("%w: grant it with ALTER ROLE %s REPLICATION (or connect as a role that has it): %w",
			ErrReplicationPrivilege, quoteIdent(user), err)
	case pgErr.Code == "42501":
		return fmt.Errorf("%w: connect as the owner of the tables or a superuser, or create the publication %q beforehand: %w",
			ErrPermission, publication, err)
	case pgErr.Code == "53400" && strings.Contains(msg, "replication slots"):
		return fmt.Errorf("%w: drop an unused slot (SELECT pg_drop_replication_slot(name) FROM pg_replication_slots WHERE NOT active) or raise max_replication_slots and restart Postgres: %w",
			ErrSlotsExhausted, err)
	case pgErr.Code == "53300" && strings.Contains(msg, "max_wal_senders"):
		return fmt.Errorf("%w: raise max_wal_senders or stop other replication clients: %w", ErrWALSendersExhausted, err)
	case pgErr.Code == "55006":
		pid := 0
		if m := activePIDRE.FindStringSubmatch(msg); m != nil {
			pid, _ = strconv.Atoi(m[1])
		}
		return &slotBusyError{slot: slot, pid: pid, err: err}
	case pgErr.Code == "42710" && strings.Contains(msg, "replication slot"):
		return fmt.Errorf("%w: slot %q exists; reuse it, or drop it (teardown) to start over: %w", ErrSlotExists, slot, err)
	case pgErr.Code == "42704" && strings.Contains(msg, "replication slot"):
		return fmt.Errorf("%w: slot %q is gone (dropped?); recreate it and backfill again, since changes since the last checkpoint are lost: %w",
			ErrSlotMissing, slot, err)
	case pgErr.Code == "42704" && strings.Contains(msg, "publication"):
		return fmt.Errorf("%w: publication %q is missing at this WAL position; recreate the publication and the slot, then backfill again: %w",
			ErrPublicationMissing, publication, err)
	case pgErr.Code == "55000" && (strings.Contains(msg, "can no longer get changes") || strings.Contains(msg, "cannot read from logical replication slot") || strings.Contains(msg, "invalidated")):
		return fmt.Errorf("%w: slot %q lost WAL it needed (it retained more than max_slot_wal_keep_size); "+
			"run fkmat backfill --force (it recreates the slot and rebuilds the joins), and raise max_slot_wal_keep_size: %w",
			ErrSlotInvalidated, slot, err)
	case pgErr.Code == "42P01":
		return fmt.Errorf("%w: create the table or fix the table list: %w", ErrTableMissing, err)
	}
	return err
}

// redactErr drops errors that may quote a connection string (and with it a
// password).
func redactErr(err error) error {
	var pce *pgconn.ParseConfigError
	if errors.As(err, &pce) {
		return errors.New("connection string cannot be parsed")
	}
	return err
}
