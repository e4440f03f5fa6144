package integration

import (
	"context"
	"os/exec"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// heapPeak samples the Go heap until stop is called and returns the peak.
func heapPeak() (stop func() uint64) {
	var peak atomic.Uint64
	done := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() uint64 { close(done); return peak.Load() }
}

// TestLargeTransaction: one source transaction of 500k rows is applied in
// bounded chunks inside one target transaction, with the heap bounded far
// below the transaction's size, and the target equals the SQL join.
func TestLargeTransaction(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 'gold' FROM generate_series(1, 1000) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)

	runtime.GC()
	stop := heapPeak()
	start := time.Now()
	sqlExec(t, tc, `INSERT INTO orders SELECT g, g % 1200, g % 1000, repeat('x', 40) FROM generate_series(1, 500000) g`)
	waitCaughtUp(t, tc, d)
	peak := stop()
	t.Logf("500k-row transaction applied in %.1fs; peak Go heap %.1f MB", time.Since(start).Seconds(), float64(peak)/(1<<20))
	assertOracle(t, cfg)
	// The transaction's rows alone take over 100 MB as Go values; a bounded
	// pipeline holds a few chunks of 10k changes.
	if peak > 150<<20 {
		t.Fatalf("peak heap %d MB while applying a 500k-row transaction; memory is not bounded", peak>>20)
	}
}

// TestLargeTransactionInterrupted: the daemon stops in the middle of a
// chunked transaction (its Redis state partly written, the target
// transaction open); the restart undoes the partial state and converges.
func TestLargeTransactionInterrupted(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 100) g`,
		`INSERT INTO orders SELECT g, g % 100, 1, 'n' FROM generate_series(1, 1000) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)

	sqlExec(t, tc, `BEGIN; UPDATE customers SET name = name || '+';
		INSERT INTO orders SELECT g, g % 150, 2, 'y' FROM generate_series(1001, 150000) g;
		UPDATE orders SET customer_id = customer_id + 1 WHERE id <= 1000; COMMIT`)
	meta := waitInFlight(t, tc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := d.stop(t); err != nil {
		t.Fatalf("stop mid-transaction: %v", err)
	}
	if v, _ := tc.Redis.HGet(ctx, meta, "inflight").Result(); v != "" && v != "0" {
		t.Logf("in-flight marker left after shutdown (%s): the restart must undo it", v)
	}
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// TestLargeTransactionKilled: kill -9 of the daemon while a chunked
// transaction is half applied leaves the Redis state with an undo log; the
// next start rolls it back and replays the transaction.
func TestLargeTransactionKilled(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 100) g`,
		`INSERT INTO orders SELECT g, g % 100, 1, 'n' FROM generate_series(1, 1000) g`)
	env := cliEnv(t, tc, leftJoinYAML)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	startCLI := func() (*exec.Cmd, *daemon) {
		cmd := exec.Command(fkmatBinary(t), "run")
		cmd.Env = env
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		d := &daemon{done: make(chan error, 1)}
		go func() { d.done <- cmd.Wait() }()
		t.Cleanup(func() { _ = cmd.Process.Kill() })
		return cmd, d
	}
	cmd, d := startCLI()
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `BEGIN; UPDATE customers SET name = name || '+';
		INSERT INTO orders SELECT g, g % 150, 2, 'y' FROM generate_series(1001, 150000) g;
		DELETE FROM orders WHERE id % 7 = 0; COMMIT`)
	meta := waitInFlight(t, tc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.done
	if v, _ := tc.Redis.HGet(ctx, meta, "inflight").Result(); v == "" || v == "0" {
		t.Fatal("no in-flight marker after kill -9: the test did not interrupt a partial transaction")
	}
	_, d = startCLI()
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// waitInFlight waits until the join's Redis state has a partially applied
// large transaction (its in-flight marker) and returns the meta hash key.
func waitInFlight(t *testing.T, tc *testenv.Case) string {
	t.Helper()
	meta := joinState(t, tc, "orders_enriched").MetaKey()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		v, err := tc.Redis.HGet(ctx, meta, "inflight").Result()
		if err == nil && v != "" && v != "0" {
			return meta
		}
		if ctx.Err() != nil {
			t.Fatal("never saw the transaction in flight")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
