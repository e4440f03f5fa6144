package fkmat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// replyErr is a Redis error reply, as go-redis returns it (redis.Error).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestRecoveryOf: connection problems and servers saying "not now"
// restart the session for as long as they last, even behind the daemon's
// redacted connect errors; refused credentials stop a first start; what
// retrying cannot fix stops run; anything else may become a stall.
func TestRecoveryOf(t *testing.T) {
	t.Parallel()
	url := "redis://:s3cret@127.0.0.1:6379/0"
	loading := replyErr("LOADING Redis is loading the dataset in memory")
	for _, c := range []struct {
		err       error
		connected bool
		want      recovery
	}{
		{fmt.Errorf("read wal: %w", io.EOF), true, retryConnection},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true, retryConnection},
		{fmt.Errorf("commit: %w", context.DeadlineExceeded), true, retryConnection},
		{fmt.Errorf("get left rows: %w", replyErr("CLUSTERDOWN The cluster is down")), true, retryConnection},
		{fmt.Errorf("apply: %w (%w)", errors.New("shard 3"), loading), true, retryConnection},
		{replyErr("READONLY You can't write against a read only replica."), true, retryConnection},
		{replyErr("BUSY Redis is busy running a script."), true, retryConnection},
		{replyErr("TRYAGAIN Multiple keys request during rehashing of slot"), true, retryConnection},
		{replyErr("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true, retryConnection},
		// A Redis restarting under the daemon: refused, then LOADING, as
		// connectRedis reports them (redacted, the cause kept).
		{fmt.Errorf("connect to redis %s: %w", url, redactErr(loading, url)), true, retryConnection},
		{fmt.Errorf("connect to redis %s: %w", url, redactErr(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, url)), false, retryConnection},
		{redis.ErrClosed, true, retryConnection},
		{&pgconn.PgError{Code: "57P01"}, true, retryConnection}, // admin shutdown
		{&pgconn.PgError{Code: "53300"}, true, retryConnection}, // too many connections
		{fmt.Errorf("join %q: %w", "j", pipeline.ErrStateChanged), true, retryConnection},
		{&pgconn.PgError{Code: "42703"}, true, retryOrStall},    // undefined column: a person adds it
		{&pgconn.PgError{Code: "23514"}, true, retryOrStall},    // a CHECK constraint on the target
		{&pgconn.PgError{Code: "42501"}, true, retryOrStall},    // a grant revoked
		{&pgconn.PgError{Code: "P0001"}, true, retryOrStall},    // a trigger raising
		{&pgconn.PgError{Code: "53100"}, true, retryOrStall},    // disk full
		{&pgconn.PgError{Code: "57014"}, true, retryOrStall},    // statement timeout
		{&pgconn.PgError{Code: "25P03"}, true, retryConnection}, // idle-in-transaction timeout
		{&pgconn.PgError{Code: "55P03"}, true, retryConnection}, // lock timeout
		{&pgconn.PgError{Code: "40P01"}, true, retryConnection}, // deadlock
		{&pgconn.PgError{Code: "40001"}, true, retryConnection}, // serialization failure
		{&pgconn.PgError{Code: "57P02"}, true, retryConnection}, // crash shutdown
		{fmt.Errorf("stream: %w", cdc.ErrSlotInvalidated), true, stopRun},
		{fmt.Errorf("publication: %w", cdc.ErrPermission), true, retryOrStall},
		{fmt.Errorf("join %q: %w", "j", errors.New("value too long")), true, retryOrStall},
		{replyErr("BUSYKEY Target key name already exists."), true, retryOrStall},
		{replyErr("NOPERM this user has no permissions"), true, retryOrStall},
		{fmt.Errorf("decode: %w", redisstore.ErrLayout), true, retryOrStall},
		{context.Canceled, true, retryOrStall},
		{fmt.Errorf("%w: connect to redis: %w", errAuthentication, replyErr("WRONGPASS invalid username-password pair")), false, stopCredentials},
		{fmt.Errorf("%w: connect to redis: %w", errAuthentication, replyErr("WRONGPASS invalid username-password pair")), true, retryOrStall},
		{fmt.Errorf("%w: x509", errCertificate), false, stopCredentials},
		// Postgres refusing the password: the SQLSTATE would read as
		// terminal, the credentials come first.
		{fmt.Errorf("%w: connect: %w", errAuthentication, &pgconn.PgError{Code: "28P01"}), false, stopCredentials},
		{fmt.Errorf("%w: connect: %w", errAuthentication, &pgconn.PgError{Code: "28P01"}), true, retryOrStall},
		{&config.ConfigError{Problems: []string{"bad"}}, true, stopConfig},
		{fmt.Errorf("join %q: %w", "j", sink.ErrShapeMismatch), true, stopConfig},
		{fmt.Errorf("preflight: %w", cdc.ErrWALLevel), false, stopConfig},
		{fmt.Errorf("preflight: %w", cdc.ErrReplicationPrivilege), false, stopConfig},
		{fmt.Errorf("redis: %w", redisstore.ErrTooOld), false, stopConfig},
		{fmt.Errorf("join %q: %w", "j", pipeline.ErrSchemaChanged), true, stopRun},
		{fmt.Errorf("join %q: %w", "j", pipeline.ErrWidened), true, retryOrStall}, // restarted at once by Run
		{fmt.Errorf("join %q: %w: x", "j", errTargetBusy), true, retryConnection},
		{fmt.Errorf("%w: gone", ErrLostState), true, stopRun},
		{fmt.Errorf("%w: detached", ErrPartitionsChanged), true, stopRun},
	} {
		if got := recoveryOf(c.err, c.connected); got != c.want {
			t.Errorf("recoveryOf(%v, connected %v) = %d, want %d", c.err, c.connected, got, c.want)
		}
	}
}

// TestExitCode: the commands' exit statuses follow recoveryOf: what only
// the configuration, a grant or a server setting fixes is 2, refused
// credentials too; verify's targets behind is 3; the rest is 1.
func TestExitCode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{&config.ConfigError{Problems: []string{"bad"}}, 2},
		{fmt.Errorf("join %q: %w", "j", sink.ErrShapeMismatch), 2},
		{fmt.Errorf("%w: set wal_level=logical", cdc.ErrWALLevel), 2},
		{fmt.Errorf("%w: fkmat", cdc.ErrReplicationPrivilege), 2},
		{fmt.Errorf("%w: connect to redis: %w", errAuthentication, replyErr("WRONGPASS invalid username-password pair")), 2},
		{fmt.Errorf("%w: x509", errCertificate), 2},
		{&BehindError{}, 3},
		{fmt.Errorf("%w: gone", ErrLostState), 1},
		{fmt.Errorf("stream: %w", cdc.ErrSlotInvalidated), 1},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, 1},
		{&pgconn.PgError{Code: "42501"}, 1},
	} {
		if got := ExitCode(c.err); got != c.want {
			t.Errorf("ExitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}

// TestRedactErr: the password leaves the message, the cause stays in the
// chain.
func TestRedactErr(t *testing.T) {
	t.Parallel()
	cause := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	err := redactErr(fmt.Errorf("dial redis://:s3cret@host: %w", cause), "redis://:s3cret@host:6379")
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("the password is in %q", err)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("%v lost its cause", err)
	}
}
