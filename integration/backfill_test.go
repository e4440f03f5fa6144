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
	"github.com/fkmat/fkmat/internal/testenv"
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
	if err := fkmat.BackfillIfNeeded(ctx, cfg, false, fkmat.Options{}); err != nil {
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
