package fkmat

import (
	"context"
	"errors"
	"net"
	"reflect"
	"runtime"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/crash"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// The daemon's errors. The pipeline's own are in internal/pipeline's
// errors.go, the stream's in cdc's, the config file's in internal/config;
// recoveryOf below says what Run does with each.

// ErrLostState means the Redis state of a join is lost or foreign and
// Options.OnLostState is LostStateRefuse.
var ErrLostState = errors.New("redis state lost")

// ErrStalled means the same error recurred at the same source position
// Options.MaxStallRestarts times: retrying cannot help, and run stops.
var ErrStalled = errors.New("pipeline stalled")

// ErrPartitionsChanged means a partition of a joined table was detached
// or dropped while it held rows, or attached with rows in it: the
// table's contents changed without row changes in the WAL, so the join
// cannot follow. A rebuild (fkmat backfill --force) can.
var ErrPartitionsChanged = errors.New("partitions of a joined table changed")

// errAuthentication marks a server refusing fkmat's credentials
// (Postgres SQLSTATE 28P01 or 28000, Redis WRONGPASS or NOAUTH).
var errAuthentication = errors.New("authentication failed")

// errCertificate marks a server certificate that failed verification
// (unknown authority, wrong host name, expired).
var errCertificate = errors.New("server certificate not accepted")

// errBackfillRaced means a joined table was truncated or rewritten, or a
// partition of one attached, detached or dropped, after the slot's
// snapshot, while the backfill read it: TRUNCATE is not MVCC-safe,
// so a read after it saw the table empty, and each load plans with the
// partitions of its own moment. The backfill is retried.
var errBackfillRaced = errors.New("a joined table was truncated or rewritten while the backfill read it")

// errTargetBusy means a reader of a target held it longer than the lock
// timeout of a change that needs it alone (a widened column's ALTER):
// retried, as a server not ready is, without queueing every reader behind
// the waiting change.
var errTargetBusy = errors.New("a reader holds the target")

// redactedError is err with a secret (a password) masked in its message.
// It keeps err in its chain, so that recoveryOf still sees a refused
// connection or a Redis LOADING behind it.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// recovery is what Run does after an error. docs/semantics.md has the
// table ("Errors, by what they mean").
type recovery int

const (
	// stopRun: retrying can never fix it, only a rebuild or a person: a
	// schema change the join cannot follow, lost state under
	// --on-lost-state refuse, a slot or publication gone or invalidated.
	stopRun recovery = iota
	// stopConfig: stopRun for what the configuration, a grant or a
	// server's setting must fix, which check reports too: a configuration
	// error, a target of another shape, a server without wal_level=logical
	// or too old, a role without REPLICATION.
	stopConfig
	// stopCredentials: a server refused the credentials or certificate
	// before run ever connected: a configuration error naming the fix.
	// After a first connection they may be being rotated, and run retries.
	stopCredentials
	// retryConnection: what passes by itself: a server down, restarting,
	// unreachable or slow, or saying "not now" (Redis LOADING, CLUSTERDOWN,
	// TRYAGAIN, MASTERDOWN), a session lost (idle-in-transaction timeout,
	// terminated), a deadlock or serialization failure, a lock timeout, or
	// the state replaced under the daemon: retried for as long as it lasts,
	// and never counted as a stall.
	retryConnection
	// retryOrStall: what needs a person but may pass once they act (a
	// constraint or trigger on the target, a permission revoked, a full
	// disk), and anything not known: retried from the checkpoints; the same
	// error at the same source position again is a stall, shown in
	// fkmat.stall, status, /readyz and the alert, and run stops after
	// Options.MaxStallRestarts of them.
	retryOrStall
)

// recoveryOf classifies err; connected says run has connected to every
// server once.
func recoveryOf(err error, connected bool) recovery {
	credentials := errors.Is(err, errAuthentication) || errors.Is(err, errCertificate)
	_, panicked := errors.AsType[*crash.Error](err)
	switch {
	case panicked:
		// A bug met at a source position: retried like any failure, so
		// that the same panic again is a stall, shown and alerted on, not
		// a process that dies at every start.
		return retryOrStall
	case credentials && !connected:
		return stopCredentials
	case credentials:
		// Once connected, credentials refused may be being rotated.
		return retryOrStall
	case configProblem(err):
		return stopConfig
	case stops(err):
		return stopRun
	case connectionError(err), errors.Is(err, pipeline.ErrStateChanged), errors.Is(err, errBackfillRaced), errors.Is(err, errTargetBusy):
		return retryConnection
	}
	if r, ok := pgRecovery(err); ok {
		return r
	}
	return retryOrStall
}

// configProblem reports whether err is one the configuration, a grant or a
// server's setting must fix.
func configProblem(err error) bool {
	_, isConfig := errors.AsType[*config.ConfigError](err)
	return isConfig || errors.Is(err, sink.ErrShapeMismatch) || errors.Is(err, cdc.ErrWALLevel) ||
		errors.Is(err, cdc.ErrReplicationPrivilege) || errors.Is(err, cdc.ErrServerVersion) || errors.Is(err, redisstore.ErrTooOld)
}

// Exit statuses of the commands (the CLI's; ExitCode).
const (
	ExitOK      = 0
	ExitFailure = 1 // a failure, or verify found differences
	ExitConfig  = 2 // bad usage, or a problem of the configuration, a grant or a server setting
	ExitBehind  = 3 // verify found the targets behind the source
)

// ExitCode is the exit status for a command's error, from the
// classification run restarts by (recoveryOf): ExitConfig for what run
// stops at once because only the configuration, a grant or a server
// setting fixes it (refused credentials included), ExitBehind for verify's
// ErrBehind, ExitFailure for anything else.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrBehind):
		return ExitBehind
	}
	switch recoveryOf(err, false) {
	case stopConfig, stopCredentials:
		return ExitConfig
	}
	return ExitFailure
}

// stops reports whether retrying can never fix err.
func stops(err error) bool {
	return errors.Is(err, pipeline.ErrSchemaChanged) || errors.Is(err, ErrLostState) ||
		errors.Is(err, ErrPartitionsChanged) || errors.Is(err, sink.ErrCannotSwap) ||
		errors.Is(err, sink.ErrCheckpointBackwards) || errors.Is(err, sink.ErrFenced) || cdc.Unrecoverable(err)
}

// connectionError reports whether err is a connection problem: a server
// down, restarting, unreachable or slow, or saying "not now". Redis's part
// (a connection cut off or refused, a cluster or node saying "not now") is
// redisstore.Resendable, the test of the state's own resends.
func connectionError(err error) bool {
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout),
		pgconn.Timeout(err), pgconn.SafeToRetry(err), redisstore.Resendable(err):
		return true
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	_, ok := errors.AsType[*pgconn.ConnectError](err)
	return ok
}

// pgRecovery classifies a Postgres error by what its SQLSTATE means; ok is
// false when err holds none.
func pgRecovery(err error) (r recovery, ok bool) {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	if !ok {
		return 0, false
	}
	code := pgErr.Code
	switch {
	case code == "53100": // disk full: a person makes room
		return retryOrStall, true
	case code == "57014":
		// A statement timeout (fkmat cancels nothing while it runs): the
		// same statement at the same position again is a stall.
		return retryOrStall, true
	case code == "25P03", code == "25P04", // a session ended by a timeout
		code == "55P03",                                                                             // lock_timeout
		strings.HasPrefix(code, "40"),                                                               // deadlock, serialization failure
		strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"), strings.HasPrefix(code, "57"), // connection, resources, shutdown
		strings.HasPrefix(code, "58"): // system error (I/O)
		return retryConnection, true
	}
	// Constraints and triggers (23, P0), privileges and missing objects
	// (42), data the target refuses (22), and anything else.
	return retryOrStall, true
}

// group is an errgroup whose goroutines return a panic as a *crash.Error
// (see recoveryOf), named by the function that panicked.
type group struct{ *errgroup.Group }

func newGroup(ctx context.Context) (group, context.Context) {
	g, gctx := errgroup.WithContext(ctx)
	return group{g}, gctx
}

// Go runs fn in the group.
func (g group) Go(fn func() error) {
	g.Group.Go(func() (err error) {
		defer crash.Recover(&err, func() (string, uint64) {
			return "in " + runtime.FuncForPC(reflect.ValueOf(fn).Pointer()).Name(), 0
		})
		return fn()
	})
}

// ErrBehind means verify found a target behind its source: a comparison
// would report the changes not yet applied as differences, so it compares
// nothing (exit 3 from the CLI).
var ErrBehind = errors.New("the targets are behind the source")
