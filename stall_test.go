package fkmat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/redisstore"
)

// replyErr is a Redis error reply, as go-redis returns it (redis.Error).
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// TestTransient: connection problems and servers saying "not now" restart
// the session forever; anything else counts towards a stall.
func TestTransient(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("read wal: %w", io.EOF), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{fmt.Errorf("commit: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("get left rows: %w", replyErr("CLUSTERDOWN The cluster is down")), true},
		{fmt.Errorf("apply: %w (%w)", errors.New("shard 3"), replyErr("LOADING Redis is loading the dataset in memory")), true},
		{replyErr("READONLY You can't write against a read only replica."), true},
		{replyErr("BUSY Redis is busy running a script."), true},
		{redis.ErrClosed, true},
		{&pgconn.PgError{Code: "57P01"}, true},  // admin shutdown
		{&pgconn.PgError{Code: "53300"}, true},  // too many connections
		{&pgconn.PgError{Code: "42703"}, false}, // undefined column
		{replyErr("BUSYKEY Target key name already exists."), false},
		{replyErr("NOPERM this user has no permissions"), false},
		{fmt.Errorf("decode: %w", redisstore.ErrLayout), false},
		{context.Canceled, false},
	} {
		if got := transient(c.err); got != c.want {
			t.Errorf("transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
