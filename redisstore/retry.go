package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// readAttempts bounds how often a read-only pipeline is sent: the first
// time and up to five times more, over about 3 s of pauses plus the
// client's own retries.
const readAttempts = 6

// readRetryDelay is the pause before the first resend, doubled before each
// later one.
const readRetryDelay = 100 * time.Millisecond

// retryRead runs read, a read-only round trip, and sends it again when the
// connection broke under it or the cluster was not ready (Resendable).
// go-redis resends a cluster pipeline whose connection failed before it was
// written (a dial refused, a node marked failing), but not one whose reply
// was cut off: a primary killed in a failover answers a read in flight with
// EOF. A read changes nothing, so sending it again is
// safe; writes are never retried here (a commit is made safe to resend by
// its LSN, by the caller). On a cluster the client's slot map is reloaded
// before each resend: go-redis keeps routing to a dead primary's address
// until it learns that its replica took over.
func retryRead(ctx context.Context, rdb redis.UniversalClient, read func() error) error {
	delay := readRetryDelay
	var err error
	for attempt := range readAttempts {
		if attempt > 0 {
			if cc, ok := rdb.(*redis.ClusterClient); ok {
				cc.ReloadState(ctx)
			}
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return errors.Join(err, ctx.Err())
			case <-t.C:
			}
			delay *= 2
		}
		if err = read(); err == nil || !Resendable(err) {
			return err
		}
	}
	return err
}

// Resendable reports whether a Redis round trip that failed with err may
// succeed when sent again: its connection was cut off, refused or timed
// out, or the server said "not now" (CLUSTERDOWN and TRYAGAIN while a
// failover or a slot migration is under way, LOADING and MASTERDOWN while a
// node restarts, READONLY from a primary just made a replica, BUSY while a
// script runs). go-redis resends single commands on these, not pipelines.
// The daemon restarts its session on these too (they are transient).
func Resendable(err error) bool {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		return true
	}
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}
	if re, ok := errors.AsType[redis.Error](err); ok {
		msg := re.Error()
		for _, p := range []string{"CLUSTERDOWN ", "TRYAGAIN ", "LOADING ", "MASTERDOWN ", "READONLY ", "BUSY "} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}
