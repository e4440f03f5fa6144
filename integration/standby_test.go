package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestStandbyTakeover runs a standby pair on one configuration: daemon A
// streams under a workload while B, started with --standby, waits for the
// slot past its --slot-busy-timeout and changes nothing (it says so in its
// log, its /readyz says standby, the heartbeat, the join's epoch and the
// Redis state's epoch stay A's). A is killed with SIGKILL mid-workload: B
// takes the slot, streams from the checkpoints, and the target equals the
// SQL join with every write, made before, while A was dead, and after.
// Then a new standby takes over from B at B's clean stop (SIGTERM). The
// takeover times are logged.
func TestStandbyTakeover(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop,
		`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 2 = 0 THEN 'gold' END FROM generate_series(1, 30) g`,
		`INSERT INTO orders SELECT g, g % 35, g, 'n' FROM generate_series(1, 300) g`)
	env := cliEnv(t, tc, leftJoinYAML)
	cfg := daemonConfig(t, tc, leftJoinYAML)

	a, aAddr := startMetricsRun(t, env)
	waitCaughtUp(t, tc, a.daemon)
	waitReady(t, a, aAddr)
	aWalsender := slotHolder(t, tc)
	before := joinEpochs(t, tc)

	w := startStandbyWorkload(t, tc)
	w.waitOps(t, 50)

	b, bAddr := startMetricsRun(t, withEnv(env, "FKMAT_SLOT_BUSY_TIMEOUT", "2s"), "--standby")
	waiting := waitLog(t, b, "standby: replication slot "+tc.Slot+" is held by fkmat pid "+strconv.Itoa(a.cmd.Process.Pid))
	t.Logf("B waits: %s", waiting)
	if !strings.Contains(waiting, "server pid "+strconv.Itoa(aWalsender)) {
		t.Errorf("B's waiting line does not name A's walsender %d: %s", aWalsender, waiting)
	}
	// B waits past its --slot-busy-timeout while A applies the workload.
	since := time.Now()
	for time.Since(since) < 3*time.Second || w.ops() < 150 {
		waitCaughtUp(t, tc, a.daemon)
		b.mustRun(t, "while A streams")
	}
	assertStandby(t, tc, b, bAddr, a.cmd.Process.Pid, before)

	// kill -9 A in the middle of the workload.
	w.waitOps(t, w.ops()+20)
	killed, atKill := time.Now(), w.ops()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.done
	tk := waitTakeover(t, tc, b, bAddr, aWalsender, killed)
	t.Logf("takeover after kill -9 of the active daemon: %s; %d statements meanwhile", tk, w.ops()-atKill)
	if w.ops() == atKill {
		t.Errorf("no write while no daemon streamed: the test shows less than it should")
	}
	w.waitOps(t, w.ops()+100) // writes after the takeover
	bWalsender := slotHolder(t, tc)

	// A clean stop of the active one: a new standby takes over.
	c, cAddr := startMetricsRun(t, env, "--standby")
	waitLog(t, c, "standby: replication slot "+tc.Slot+" is held by fkmat pid "+strconv.Itoa(b.cmd.Process.Pid))
	w.waitOps(t, w.ops()+20)
	stopped := time.Now()
	if err := b.term(t); err != nil {
		t.Fatalf("B after SIGTERM: %v\n%s", err, tail(b.stderr.String(), 4000))
	}
	t.Logf("B exited %s after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	t.Logf("takeover after a clean stop (SIGTERM) of the active daemon: %s", waitTakeover(t, tc, c, cAddr, bWalsender, stopped))
	w.waitOps(t, w.ops()+50)

	n := w.stop(t)
	waitCaughtUp(t, tc, c.daemon)
	assertOracle(t, cfg)
	t.Logf("workload: %d statements", n)
	if after := joinEpochs(t, tc); after != before {
		t.Errorf("the join was rebuilt across the takeovers: epochs %v, then %v", before, after)
	}
	if err := c.term(t); err != nil {
		t.Fatalf("standby after SIGTERM: %v\n%s", err, tail(c.stderr.String(), 4000))
	}
}

// TestStandbyFrozenActive: the active daemon A freezes (SIGSTOP: a host
// that stops answering, a VM paused) under a workload. Its walsender ends
// after wal_sender_timeout (5 s here, by the connection string) and the
// standby B takes over. When A thaws, its stream finds the slot taken (or
// its target sessions ended by B): A stops streaming and waits as a
// standby, and the target equals the SQL join.
func TestStandbyFrozenActive(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop,
		`INSERT INTO customers SELECT g, 'c' || g, NULL FROM generate_series(1, 30) g`,
		`INSERT INTO orders SELECT g, g % 35, g, 'n' FROM generate_series(1, 300) g`)
	env := cliEnv(t, tc, leftJoinYAML)
	env = withEnv(env, "FKMAT_SOURCE_URL", tc.DatabaseURL+"&wal_sender_timeout=5s")
	cfg := daemonConfig(t, tc, leftJoinYAML)

	a, aAddr := startMetricsRun(t, env, "--standby")
	waitCaughtUp(t, tc, a.daemon)
	waitReady(t, a, aAddr)
	aWalsender := slotHolder(t, tc)
	w := startStandbyWorkload(t, tc)
	b, bAddr := startMetricsRun(t, env, "--standby")
	waitLog(t, b, "standby: replication slot "+tc.Slot+" is held by fkmat pid "+strconv.Itoa(a.cmd.Process.Pid))
	w.waitOps(t, w.ops()+50)

	frozen := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	t.Logf("takeover from a frozen active daemon (wal_sender_timeout 5s): %s", waitTakeover(t, tc, b, bAddr, aWalsender, frozen))
	w.waitOps(t, w.ops()+100)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Its stream finds the slot taken, or its target sessions ended by B:
	// either way it waits as a standby.
	t.Logf("A thawed: %s", waitLog(t, a, "standby: replication slot "+tc.Slot+" is held by"))
	if code, body := probe(aAddr, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "standby") {
		t.Errorf("thawed A's /readyz = %d %q; want 503 naming the standby", code, body)
	}
	w.waitOps(t, w.ops()+100)
	w.stop(t)
	waitCaughtUp(t, tc, b.daemon)
	assertOracle(t, cfg)
	if err := b.term(t); err != nil {
		t.Fatalf("B after SIGTERM: %v\n%s", err, tail(b.stderr.String(), 4000))
	}
	if err := a.term(t); err != nil {
		t.Fatalf("A after SIGTERM: %v\n%s", err, tail(a.stderr.String(), 4000))
	}
}

// TestStandbyWaitsForBackfill: while another process backfills (it
// created the slot and holds the snapshot it exported; the slot itself is
// inactive), a standby waits and writes nothing (not even fkmat's metadata
// schema), and a backfill gives up naming the process; once the snapshot
// is released, the standby starts, backfills and streams.
func TestStandbyWaitsForBackfill(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop,
		`INSERT INTO customers SELECT g, 'c' || g, NULL FROM generate_series(1, 30) g`,
		`INSERT INTO orders SELECT g, g % 35, g, 'n' FROM generate_series(1, 300) g`)
	env := cliEnv(t, tc, leftJoinYAML)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	other, err := cdc.New(cdc.Config{ConnString: tc.DatabaseURL, Slot: tc.Slot, Publication: tc.Publication,
		Tables: []cdc.TableName{{Name: "orders"}, {Name: "customers"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.EnsurePublication(ctx); err != nil {
		t.Fatal(err)
	}
	slot, err := other.CreateSlot(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = slot.Release(context.Background()) }()

	b, bAddr := startMetricsRun(t, env, "--standby")
	t.Logf("B waits: %s", waitLog(t, b, "that backfills from it; waiting"))
	var migrated bool
	if err := tc.Pool.QueryRow(ctx, `SELECT to_regclass('fkmat.join_state') IS NOT NULL`).Scan(&migrated); err != nil || migrated {
		t.Errorf("the standby created fkmat's metadata schema while it waited (%v)", err)
	}
	if code, body := probe(bAddr, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "standby") {
		t.Errorf("standby's /readyz = %d %q; want 503 naming the standby", code, body)
	}
	err = fkmat.BackfillIfNeeded(ctx, cfg, true, fkmat.Options{SlotBusyTimeout: 2 * time.Second})
	if !errors.Is(err, cdc.ErrSlotInUse) || !strings.Contains(err.Error(), "is backfilling from slot") {
		t.Errorf("backfill while another process backfills: %v; want ErrSlotInUse naming the backfill", err)
	}
	var marked int
	if err := tc.Pool.QueryRow(ctx, `SELECT count(*) FROM fkmat.join_state`).Scan(&marked); err != nil || marked != 0 {
		t.Errorf("the refused backfill left %d rows in fkmat.join_state (%v)", marked, err)
	}

	if err := slot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, tc, b.daemon)
	sqlExec(t, tc, `UPDATE customers SET name = 'renamed' WHERE id = 3`, `INSERT INTO orders VALUES (301, 3, 1, 'x')`)
	waitCaughtUp(t, tc, b.daemon)
	assertOracle(t, cfg)
	if err := b.term(t); err != nil {
		t.Fatalf("B after SIGTERM: %v\n%s", err, tail(b.stderr.String(), 4000))
	}
}

// startMetricsRun starts `fkmat run` with its metrics server on a
// reserved port, and returns the server's address.
func startMetricsRun(t *testing.T, env []string, args ...string) (*childRun, string) {
	t.Helper()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t)))
	return startRunCLI(t, withEnv(env, "FKMAT_METRICS_ADDR", addr), args...), addr
}

// mustRun fails the test when the process has exited.
func (d *childRun) mustRun(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-d.done:
		d.done <- err
		t.Fatalf("%s: fkmat run exited (%v):\n%s", what, err, tail(d.stderr.String(), 4000))
	default:
	}
}

// probe returns the status code and body of GET path on addr (0 when it
// does not answer).
func probe(addr, path string) (int, string) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body))
}

// waitReady waits until d's /readyz answers 200.
func waitReady(t *testing.T, d *childRun, addr string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, body := probe(addr, "/readyz")
		if code == http.StatusOK {
			return
		}
		d.mustRun(t, "waiting for /readyz")
		if time.Now().After(deadline) {
			t.Fatalf("/readyz of %s not 200 within 2 minutes: %d %s", addr, code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitLog waits until d's log has a line holding want, and returns it.
func waitLog(t *testing.T, d *childRun, want string) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		for line := range strings.SplitSeq(d.stderr.String(), "\n") {
			if strings.Contains(line, want) {
				return line
			}
		}
		d.mustRun(t, "waiting for "+want)
		if time.Now().After(deadline) {
			t.Fatalf("no log line with %q within 2 minutes:\n%s", want, tail(d.stderr.String(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// assertStandby checks that the standby b has changed nothing: its log
// has nothing but the wait, its /readyz says standby while /healthz is
// ok, the heartbeat in fkmat.daemon is the active daemon's (pid active),
// and the join's epochs are those of before.
func assertStandby(t *testing.T, tc *testenv.Case, b *childRun, addr string, active int, before [2]string) {
	t.Helper()
	if code, body := probe(addr, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "standby") {
		t.Errorf("standby's /readyz = %d %q; want 503 naming the standby", code, body)
	}
	if code, body := probe(addr, "/healthz"); code != http.StatusOK {
		t.Errorf("standby's /healthz = %d %q; want 200", code, body)
	}
	for _, line := range strings.Split(b.stderr.String(), "\n") {
		if line == "" || strings.Contains(line, "standby: replication slot") || strings.Contains(line, "serving metrics") {
			continue
		}
		t.Errorf("the standby logged more than its wait: %s", line)
	}
	var pid int
	if err := tc.Pool.QueryRow(context.Background(), `SELECT pid FROM fkmat.daemon WHERE slot = $1`, tc.Slot).Scan(&pid); err != nil || pid != active {
		t.Errorf("fkmat.daemon reports pid %d (%v); want the active daemon's %d", pid, err, active)
	}
	if after := joinEpochs(t, tc); after != before {
		t.Errorf("the standby changed the join's state: epochs %v, then %v", before, after)
	}
}

// joinEpochs returns the join's epoch in fkmat.join_state and in its
// Redis state: a backfill changes both.
func joinEpochs(t *testing.T, tc *testenv.Case) [2]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out [2]string
	if err := tc.Pool.QueryRow(ctx, `SELECT epoch FROM fkmat.join_state WHERE slot = $1`, tc.Slot).Scan(&out[0]); err != nil {
		t.Fatal(err)
	}
	meta, err := joinState(t, tc, "orders_enriched").Meta(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out[1] = meta.Epoch
	return out
}

// takeover is how long a standby's takeover took, each step from the
// active daemon's end (kill or signal).
type takeover struct {
	freed, held, ready time.Duration
}

func (tk takeover) String() string {
	return fmt.Sprintf("the slot free after %s, held by the standby after %s, its /readyz 200 after %s",
		tk.freed.Round(time.Millisecond), tk.held.Round(time.Millisecond), tk.ready.Round(time.Millisecond))
}

// waitTakeover waits until the standby d holds the slot (a walsender other
// than old streams from it) and its /readyz answers 200, and returns how
// long each step took from from.
func waitTakeover(t *testing.T, tc *testenv.Case, d *childRun, addr string, old int, from time.Time) takeover {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	var tk takeover
	for tk.held == 0 || tk.ready == 0 {
		if tk.held == 0 {
			var pid *int
			err := tc.Pool.QueryRow(context.Background(), `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot).Scan(&pid)
			switch {
			case err != nil:
			case pid == nil && tk.freed == 0:
				tk.freed = time.Since(from)
			case pid != nil && *pid != old:
				tk.held = time.Since(from)
				if tk.freed == 0 { // freed and taken between two looks
					tk.freed = tk.held
				}
			}
		}
		if tk.ready == 0 {
			if code, _ := probe(addr, "/readyz"); code == http.StatusOK {
				tk.ready = time.Since(from)
			}
		}
		d.mustRun(t, "taking over")
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not take over within 3 minutes (%s):\n%s", tk, tail(d.stderr.String(), 4000))
		}
		time.Sleep(10 * time.Millisecond)
	}
	return tk
}

// standbyWorkload writes to both tables, one statement at a time, until
// stopped: new orders (some of customers that do not exist yet), new
// customers, renamed customers, orders moved to another customer, deleted
// orders.
type standbyWorkload struct {
	n    atomic.Int64
	stop func(t *testing.T) int64
}

func startStandbyWorkload(t *testing.T, tc *testenv.Case) *standbyWorkload {
	t.Helper()
	w := &standbyWorkload{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var failed atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := rand.New(rand.NewPCG(7, 31))
		nextOrder, nextCustomer := int64(1000), int64(100)
		for ctx.Err() == nil {
			var sql string
			var args []any
			switch k := r.IntN(10); {
			case k < 4:
				nextOrder++
				sql, args = `INSERT INTO orders VALUES ($1, $2, $3, 'w')`, []any{nextOrder, 1 + r.Int64N(nextCustomer+5), r.IntN(1000)}
			case k < 5:
				nextCustomer++
				sql, args = `INSERT INTO customers VALUES ($1, $2, 'new') ON CONFLICT DO NOTHING`, []any{nextCustomer, fmt.Sprint("n", nextCustomer)}
			case k < 7:
				sql, args = `UPDATE customers SET name = name || '+' WHERE id = $1`, []any{1 + r.Int64N(nextCustomer)}
			case k < 9:
				sql, args = `UPDATE orders SET customer_id = $1 WHERE id = $2`, []any{1 + r.Int64N(nextCustomer), 1 + r.Int64N(nextOrder)}
			default:
				sql, args = `DELETE FROM orders WHERE id = $1`, []any{1 + r.Int64N(nextOrder)}
			}
			if _, err := tc.Pool.Exec(ctx, sql, args...); err != nil {
				if ctx.Err() == nil {
					failed.Store(fmt.Errorf("%s: %w", sql, err))
				}
				return
			}
			w.n.Add(1)
			select { // a pace the 2-core machine keeps up with
			case <-ctx.Done():
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	stopped := false
	w.stop = func(t *testing.T) int64 {
		t.Helper()
		if !stopped {
			stopped = true
			cancel()
			wg.Wait()
		}
		if err, ok := failed.Load().(error); ok {
			t.Fatalf("workload: %v", err)
		}
		return w.n.Load()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w
}

func (w *standbyWorkload) ops() int64 { return w.n.Load() }

// waitOps waits until the workload has made n statements.
func (w *standbyWorkload) waitOps(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for w.ops() < n {
		if time.Now().After(deadline) {
			w.stop(t)
			t.Fatalf("the workload made %d statements in 3 minutes; want %d", w.ops(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freezingPair starts, with yaml and a wal_sender_timeout of 5 s, the
// active daemon A, which freezes (SIGSTOP) at point of its first batch
// (FKMAT_TEST_FREEZE_AT), caught up and ready, and the standby B, waiting
// for A's slot; it returns them, their metrics addresses and the pid of
// A's walsender.
func freezingPair(t *testing.T, tc *testenv.Case, yaml, point string) (a *childRun, aAddr string, b *childRun, bAddr string, aWalsender int) {
	t.Helper()
	env := cliEnv(t, tc, yaml)
	env = withEnv(env, "FKMAT_SOURCE_URL", tc.DatabaseURL+"&wal_sender_timeout=5s")
	a, aAddr = startMetricsRun(t, withEnv(env, "FKMAT_TEST_FREEZE_AT", point), "--standby")
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	waitCaughtUp(t, tc, a.daemon)
	waitReady(t, a, aAddr)
	aWalsender = slotHolder(t, tc)
	b, bAddr = startMetricsRun(t, env, "--standby")
	waitLog(t, b, "standby: replication slot "+tc.Slot+" is held by fkmat pid "+strconv.Itoa(a.cmd.Process.Pid))
	return a, aAddr, b, bAddr, aWalsender
}

// TestStandbyFrozenMidBatch: the active daemon A freezes (SIGSTOP, by
// FKMAT_TEST_FREEZE_AT) at each point of a batch's commit: before its
// target write, with its rows written and the target transaction open
// (holding their locks), between the target commit and the Redis commit,
// and before the acknowledgement. The standby B takes the slot after
// wal_sender_timeout (5 s here), ends A's sessions, and applies changes
// at once, never waiting on A's locks. Thawed, A writes nothing and waits
// as a standby; the target equals the SQL join.
func TestStandbyFrozenMidBatch(t *testing.T) {
	for _, point := range []string{"commit", "target written", "target committed", "state committed"} {
		t.Run(point, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, shop,
				`INSERT INTO customers SELECT g, 'c' || g, NULL FROM generate_series(1, 30) g`,
				`INSERT INTO orders SELECT g, g % 35, g, 'n' FROM generate_series(1, 300) g`)
			cfg := daemonConfig(t, tc, leftJoinYAML)
			a, aAddr, b, bAddr, aWalsender := freezingPair(t, tc, leftJoinYAML, point)

			// A freezes at its first batch's point.
			w := startStandbyWorkload(t, tc)
			waitFor(t, time.Minute, "A to freeze at "+point, func() bool {
				stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.cmd.Process.Pid))
				return err == nil && strings.Contains(string(stat), ") T ")
			})
			frozen := time.Now()
			tk := waitTakeover(t, tc, b, bAddr, aWalsender, frozen)
			// B applies a change at once, A still frozen.
			sqlExec(t, tc, `INSERT INTO orders VALUES (99999, 1, 1, 'after the takeover')`)
			waitFor(t, time.Minute, "B to apply a change", func() bool {
				return queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE id = 99999`) == 1
			})
			applied := time.Since(frozen)
			t.Logf("A frozen at %q: B took the slot after %s, applied a change %s after the freeze", point, tk, applied.Round(10*time.Millisecond))
			if applied > 25*time.Second {
				t.Errorf("B applied its first change %s after A froze; want it within seconds of wal_sender_timeout (5 s)", applied)
			}
			var owner int
			if err := tc.Pool.QueryRow(context.Background(), `SELECT pid FROM fkmat.owner WHERE slot = $1`, tc.Slot).Scan(&owner); err != nil || owner != b.cmd.Process.Pid {
				t.Fatalf("the slot's owner is pid %d (%v), want B's %d", owner, err, b.cmd.Process.Pid)
			}

			// Thawed, A writes nothing and waits as a standby.
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			waitLog(t, a, "standby: replication slot "+tc.Slot+" is held by")
			w.waitOps(t, w.ops()+100)
			if err := tc.Pool.QueryRow(context.Background(), `SELECT pid FROM fkmat.owner WHERE slot = $1`, tc.Slot).Scan(&owner); err != nil || owner != b.cmd.Process.Pid {
				t.Fatalf("after A thawed the slot's owner is pid %d (%v), want B's %d", owner, err, b.cmd.Process.Pid)
			}
			if code, body := probe(aAddr, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "standby") {
				t.Errorf("thawed A's /readyz = %d %q; want 503 naming the standby", code, body)
			}
			w.stop(t)
			waitCaughtUp(t, tc, b.daemon)
			assertOracle(t, cfg)
			if err := b.term(t); err != nil {
				t.Fatalf("B after SIGTERM: %v\n%s", err, tail(b.stderr.String(), 4000))
			}
			if err := a.term(t); err != nil {
				t.Fatalf("A after SIGTERM: %v\n%s", err, tail(a.stderr.String(), 4000))
			}
		})
	}
}
