package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/crash"
	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/redisstore"
)

// writer runs random single-statement transactions on both tables until
// stopped: inserts, updates (values and foreign keys, to NULL and to absent
// customers), deletes.
func writer(t *testing.T, tc *testenv.Case, seed uint64, maxOrder, maxCustomer int) (stop func() int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(seed, 7))
		for ctx.Err() == nil {
			o, c := 1+r.IntN(maxOrder), 1+r.IntN(maxCustomer)
			var q string
			switch r.IntN(8) {
			case 0:
				q = fmt.Sprintf(`INSERT INTO orders VALUES (%d, %d, 1, 'w') ON CONFLICT (id) DO UPDATE SET amount = orders.amount + 1`, maxOrder+o, c)
			case 1:
				q = fmt.Sprintf(`UPDATE orders SET customer_id = %d WHERE id = %d`, c, o)
			case 2:
				q = fmt.Sprintf(`UPDATE orders SET customer_id = NULL WHERE id = %d`, o)
			case 3:
				q = fmt.Sprintf(`DELETE FROM orders WHERE id = %d`, o)
			case 4:
				q = fmt.Sprintf(`UPDATE customers SET name = name || 'x' WHERE id = %d`, c)
			case 5:
				q = fmt.Sprintf(`DELETE FROM customers WHERE id = %d`, c)
			case 6:
				q = fmt.Sprintf(`INSERT INTO customers VALUES (%d, 'new', 'n') ON CONFLICT (id) DO UPDATE SET tier = 'again'`, c)
			default:
				q = fmt.Sprintf(`BEGIN; UPDATE orders SET amount = amount + 1 WHERE id = %d; UPDATE customers SET tier = 't%d' WHERE id = %d; COMMIT`, o, o%5, c)
			}
			if _, err := tc.Pool.Exec(ctx, q); err != nil && ctx.Err() == nil {
				t.Errorf("writer: %s: %v", q, err)
				return
			}
			n.Add(1)
		}
	}()
	return func() int64 { cancel(); wg.Wait(); return n.Load() }
}

// TestBackfillConcurrentWrites: writes run on both tables during the whole
// backfill and after it; every one of them appears exactly once in the
// target after streaming catches up (no gap, no overlap at the consistent
// point).
func TestBackfillConcurrentWrites(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop,
		`INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 5000) g`,
		`INSERT INTO orders SELECT g, 1 + g % 5500, g % 100, 'n' FROM generate_series(1, 200000) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	stop := writer(t, tc, 1, 200000, 5500)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	// The target is filled in transactions of 64 pages of orders (about
	// 20), while the writes add rows past the pages counted.
	if err := fkmat.BackfillIfNeeded(ctx, cfg, false, fkmat.Options{TargetChunkBytes: 64 * 8192}); err != nil {
		t.Fatal(err)
	}
	t.Logf("backfill of 200k orders took %.1fs under concurrent writes", time.Since(start).Seconds())
	d := startDaemon(t, cfg, fkmat.Options{})
	time.Sleep(time.Second) // writes continue while streaming
	ops := stop()
	waitCaughtUp(t, tc, d)
	t.Logf("%d concurrent write transactions", ops)
	if ops < 50 {
		t.Fatalf("only %d concurrent writes: the test did not overlap the backfill", ops)
	}
	assertOracle(t, cfg)
}

// TestBackfillInChunks: a backfill fills a target in the source's database
// a range of the left table's pages at a time, each range in a transaction
// of its own; so does a rebuild beside the running join. The left table is
// partitioned (the ranges apply to every partition), filtered, and one of
// its partitions is much larger than the others. Each time, the target
// holds the rows of several transactions and equals the SQL join.
func TestBackfillInChunks(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, `CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text)`)
	sqlExec(t, tc, partitionedOrders...)
	sqlExec(t, tc,
		`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 300) g`,
		`INSERT INTO orders SELECT g, CASE WHEN g % 10 = 0 THEN date '2025-03-01' WHEN g % 10 = 1 THEN date '2030-01-01' ELSE date '2026-02-01' END,
			CASE WHEN g % 11 = 0 THEN NULL ELSE g % 330 END, g % 1000, repeat('n', g % 200) FROM generate_series(1, 30000) g`)
	yaml := strings.Replace(partitionedYAML, "      columns: [id, created, customer_id, amount, note]",
		"      columns: [id, created, customer_id, amount, note]\n      where: amount < 900", 1)
	cfg := daemonConfig(t, tc, yaml)
	opts := fkmat.Options{TargetChunkBytes: 16 * 8192}
	transactions := func() int64 {
		return queryInt(t, tc, `SELECT count(DISTINCT xmin::text) FROM orders_enriched`)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := fkmat.BackfillIfNeeded(ctx, cfg, false, opts); err != nil {
		t.Fatal(err)
	}
	if n := transactions(); n < 10 {
		t.Fatalf("the backfill wrote the target in %d transactions, want several", n)
	}
	assertOracle(t, cfg)

	// The rebuild streams the join's slot while it loads (backfill --force
	// with the daemon stopped).
	d := startDaemon(t, cfg, opts)
	sqlExec(t, tc, `UPDATE orders SET amount = amount + 1 WHERE id % 7 = 0`,
		`INSERT INTO orders SELECT g, date '2026-05-05', g % 300, 1, 'late' FROM generate_series(40001, 42000) g`)
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	if err := fkmat.BackfillIfNeeded(ctx, cfg, true, opts); err != nil {
		t.Fatal(err)
	}
	if n := transactions(); n < 10 {
		t.Fatalf("the rebuild wrote the target in %d transactions, want several", n)
	}
	// The command deleted the Redis state the rebuild replaced before it
	// returned, without waiting for the next run.
	gen := queryInt(t, tc, `SELECT generation FROM fkmat.join_state WHERE slot = $1`, tc.Slot)
	keys, err := tc.Redis.Keys(ctx, "fkmat:"+tc.Slot+":orders_enriched*").Result()
	if err != nil {
		t.Fatal(err)
	}
	current := redisstore.GenerationPrefix(tc.Slot, "orders_enriched", int(gen))
	for _, k := range keys {
		if !strings.HasPrefix(k, current+":") {
			t.Fatalf("generation %d is current, and key %s of another is left after the rebuild", gen, k)
		}
	}
	assertOracle(t, cfg)
	d = startDaemon(t, cfg, opts)
	sqlExec(t, tc, `DELETE FROM orders WHERE id % 13 = 0`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// TestBackfillPartitionChurn: a partition of the left table detached and
// attached back after the backfill's snapshot makes the loads plan with
// another catalog than the snapshot's (a load planned while it was
// detached misses its rows, one planned after does not): the backfill
// starts again from a new snapshot, and the join ends equal to its SQL.
func TestBackfillPartitionChurn(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, `CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text)`)
	sqlExec(t, tc, partitionedOrders...)
	sqlExec(t, tc, `INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 50) g`,
		`INSERT INTO orders SELECT g, date '2025-06-01' + g % 400, g % 60, g, 'n' FROM generate_series(1, 2000) g`)
	cfg := daemonConfig(t, tc, partitionedYAML)
	var starts atomic.Int32
	crash.SetTestHook(func(at string, _ any) {
		if at != "backfill: slot created" || starts.Add(1) != 1 {
			return
		}
		// After the first backfill's snapshot, before its loads. The hook
		// runs on the daemon's goroutine: no t.Fatal here.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, q := range []string{`ALTER TABLE orders DETACH PARTITION orders_2026`,
			`ALTER TABLE orders ATTACH PARTITION orders_2026 FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`} {
			if _, err := tc.Pool.Exec(ctx, q); err != nil {
				t.Errorf("%s: %v", q, err)
				return
			}
		}
	})
	t.Cleanup(func() { crash.SetTestHook(nil) })
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	if n := starts.Load(); n < 2 {
		t.Fatalf("the backfill started %d times: the partition changed after its snapshot, want it started again", n)
	}
	sqlExec(t, tc, `DELETE FROM orders WHERE id % 9 = 0`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// TestBackfillInterrupted: kill -9 and SIGINT of `fkmat backfill` midway
// leave nothing that makes the next run produce wrong rows; the next run
// says it restarts the backfill and converges.
func TestBackfillInterrupted(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, shop,
				`INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 20000) g`,
				`INSERT INTO orders SELECT g, g % 21000, g % 100, 'n' FROM generate_series(1, 400000) g`)
			env := cliEnv(t, tc, leftJoinYAML)
			cfg := daemonConfig(t, tc, leftJoinYAML)
			cmd := exec.Command(fkmatBinary(t), "backfill")
			cmd.Env = env
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// Interrupt once the load is under way: state initialised, target
			// being written.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for {
				var phase string
				err := tc.Pool.QueryRow(ctx, `SELECT phase FROM fkmat.join_state`).Scan(&phase)
				if err == nil && phase == "backfilling" {
					break
				}
				if ctx.Err() != nil {
					t.Fatal("backfill never started")
				}
				time.Sleep(10 * time.Millisecond)
			}
			// status shows the backfill under way: why, how far.
			for {
				b := statusBuild(t, env)
				if b != nil && b.Running && b.RowsDone > 0 {
					if !strings.Contains(b.Reason, "never backfilled") || b.RowsTotal < b.RowsDone || b.PID != cmd.Process.Pid {
						t.Fatalf("status of the backfill under way: %+v", *b)
					}
					break
				}
				if ctx.Err() != nil {
					t.Fatal("status never showed the backfill's progress")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			var phase string
			if err := tc.Pool.QueryRow(ctx, `SELECT phase FROM fkmat.join_state`).Scan(&phase); err != nil || phase != "backfilling" {
				t.Fatalf("after the interruption phase = %q, %v; the test did not interrupt the backfill", phase, err)
			}
			if sig == syscall.SIGKILL {
				// Once it stops recording progress, status calls it
				// interrupted, a problem, and names the fix.
				for {
					b := statusBuild(t, env)
					if b != nil && !b.Running {
						break
					}
					if ctx.Err() != nil {
						t.Fatal("status never called the killed backfill interrupted")
					}
					time.Sleep(200 * time.Millisecond)
				}
				r := runCLI(t, env, "status")
				if r.code == 0 || !strings.Contains(r.stdout, "interrupted at") || !strings.Contains(r.stdout, "start fkmat run or fkmat backfill") {
					t.Fatalf("status after a killed backfill: exit %d\n%s%s", r.code, r.stdout, r.stderr)
				}
				t.Logf("status after a killed backfill:\n%s", r.stdout)
			}
			sqlExec(t, tc, `UPDATE customers SET name = 'after' WHERE id < 100`, `DELETE FROM orders WHERE id % 1000 = 0`)

			run := exec.Command(fkmatBinary(t), "run")
			run.Env = env
			var logs strings.Builder
			run.Stderr = &logs
			if err := run.Start(); err != nil {
				t.Fatal(err)
			}
			d := &daemon{done: make(chan error, 1)}
			go func() { d.done <- run.Wait() }()
			t.Cleanup(func() { _ = run.Process.Kill() })
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			_ = run.Process.Signal(syscall.SIGTERM)
			<-d.done
			if !strings.Contains(logs.String(), "interrupted; starting it again") {
				t.Errorf("run did not say it restarts the interrupted backfill:\n%s", logs.String())
			}
		})
	}
}

// statusBuild returns the build of the first join in `fkmat status --json`.
func statusBuild(t *testing.T, env []string) *fkmat.BuildStatus {
	t.Helper()
	r := runCLI(t, env, "status", "--json")
	var rep fkmat.StatusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status --json: %v\n%s%s", err, r.stdout, r.stderr)
	}
	if len(rep.Joins) == 0 {
		return nil
	}
	return rep.Joins[0].Build
}
