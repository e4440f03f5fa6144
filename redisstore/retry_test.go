package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestResendable: a read is sent again after a cut-off or refused
// connection or a cluster that is not ready, never after any other answer.
func TestResendable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	// Real server answers: an unknown command is not resendable.
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		for {
			c, err := srv.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					_, _ = c.Write([]byte("-CLUSTERDOWN The cluster is down\r\n"))
				}
			}()
		}
	}()
	down := redis.NewClient(&redis.Options{Addr: srv.Addr().String(), MaxRetries: -1, Protocol: 2, DisableIdentity: true})
	defer down.Close()
	clusterDown := down.Get(ctx, "k").Err()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{io.EOF, true},
		{fmt.Errorf("get left rows: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{rdb.Get(ctx, "k").Err(), true}, // nothing listens on port 1
		{clusterDown, true},
		{redis.Nil, false},
		{errors.New("CLUSTERDOWN but not from Redis"), false},
		{context.Canceled, false},
		{errors.New("read dependents: member outside the range"), false},
	} {
		if got := Resendable(c.err); got != c.want {
			t.Errorf("Resendable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestRetryReadBounded: a read that keeps failing is sent readAttempts
// times and its last error returned; one that fails otherwise is sent once;
// a cancelled context ends the pauses.
func TestRetryReadBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	n := 0
	err := retryRead(ctx, nil, func() error { n++; return io.EOF })
	if !errors.Is(err, io.EOF) || n != readAttempts {
		t.Fatalf("always EOF: %d sends, %v; want %d sends and EOF", n, err, readAttempts)
	}
	n = 0
	err = retryRead(ctx, nil, func() error {
		n++
		if n < 3 {
			return io.EOF
		}
		return nil
	})
	if err != nil || n != 3 {
		t.Fatalf("EOF twice then success: %d sends, %v", n, err)
	}
	n = 0
	bad := errors.New("WRONGTYPE")
	if err := retryRead(ctx, nil, func() error { n++; return bad }); !errors.Is(err, bad) || n != 1 {
		t.Fatalf("another error: %d sends, %v", n, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	start := time.Now()
	time.AfterFunc(20*time.Millisecond, cancel)
	err = retryRead(cctx, nil, func() error { return io.EOF })
	if !errors.Is(err, context.Canceled) || !errors.Is(err, io.EOF) || time.Since(start) > 2*time.Second {
		t.Fatalf("cancelled: %v after %v", err, time.Since(start))
	}
}
