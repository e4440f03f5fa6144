package cdc

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// setup gives a test its database with the given schema (SQL run once) and a
// Client on it; mutate adjusts the config.
func setup(t testing.TB, schema string, tables []TableName, mutate func(*Config)) (*testenv.Case, *Client) {
	t.Helper()
	tc := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if schema != "" {
		if _, err := tc.Pool.Exec(ctx, schema); err != nil {
			t.Fatalf("create schema: %v", err)
		}
	}
	cfg := Config{
		ConnString:      tc.DatabaseURL,
		Slot:            tc.Slot,
		Publication:     tc.Publication,
		Tables:          tables,
		StandbyInterval: 2 * time.Second,
		BackoffMin:      100 * time.Millisecond,
		BackoffMax:      time.Second,
		Logger:          testLogger(t),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("new client: %v", err)
	}
	return tc, c
}

// testLogger logs to the test at debug level with -v, else only warnings.
func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// runStream starts s.Run in the background; the returned func stops it and
// returns Run's error (nil after a clean stop).
func runStream(t *testing.T, s *Stream) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	stopped := false
	var result error
	stop = func() error {
		if stopped {
			return result
		}
		stopped = true
		cancel()
		select {
		case err := <-errc:
			if err != context.Canceled {
				result = err
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("stream did not stop")
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// next returns the next chunk or fails the test after timeout.
func next(t *testing.T, s *Stream, timeout time.Duration) *Txn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	txn, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("next transaction: %v", err)
	}
	return txn
}

// exec runs SQL statements on the test database.
func exec(t *testing.T, tc *testenv.Case, sqls ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, q := range sqls {
		if _, err := tc.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("exec %q: %v", q, err)
		}
	}
}
