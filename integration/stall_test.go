package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/crash"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestStall: a change the pipeline cannot apply, the same way after every
// restart (here a row of a table added to the publication by hand, which no
// join uses), is a stall: logged at ERROR with the LSN and the table and
// never the row's values, fkmat_pipeline_stalled is 1, /readyz fails, fkmat
// status shows the error with its LSN, and after --max-stall-restarts
// recurrences run stops with ErrStalled naming the fix. The fix it names,
// backfill --force, gets the daemon going again, equal to the SQL join.
func TestStall(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold')`,
		`INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 20) g`,
		`CREATE TABLE audit (id bigint PRIMARY KEY, secret text)`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	logs := &syncBuffer{}
	var addr atomic.Value
	opts := fkmat.Options{
		Logger:      slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		MetricsAddr: "127.0.0.1:0", MaxStallRestarts: 3,
		MetricsBound: func(a net.Addr) { addr.Store(a.String()) },
	}
	d := startDaemon(t, cfg, opts)
	waitCaughtUp(t, tc, d)

	sqlExec(t, tc, fmt.Sprintf(`ALTER PUBLICATION %q ADD TABLE audit`, tc.Publication),
		`INSERT INTO audit VALUES (1, 'hunter2-secret-value')`,
		`INSERT INTO orders VALUES (100, 1, 1, 'after')`)
	var lsn string
	if err := tc.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}

	// While stalled: the metric and /readyz say so, and status shows it.
	get := metricsGetter(&addr)
	waitFor(t, 60*time.Second, "fkmat_pipeline_stalled 1", func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, "\nfkmat_pipeline_stalled 1\n")
	})
	// Every recurrence is a pipeline restart (the FkmatRestarting alert).
	if _, body := get("/metrics"); !regexp.MustCompile(`\nfkmat_pipeline_restarts_total [1-9]`).MatchString(body) {
		t.Errorf("fkmat_pipeline_restarts_total did not count the stall's restarts")
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "stalled") {
		t.Errorf("/readyz while stalled: %d %q", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := fkmat.Status(ctx, cfg, fkmat.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s := st[0].Stall; s == nil || s.Table != "public.audit" || s.LSN == "" || !strings.Contains(s.Error, "no join uses") {
		t.Fatalf("status while stalled: %+v", st[0].Stall)
	}

	var runErr error
	select {
	case runErr = <-d.done:
		d.cancel = nil
	case <-time.After(90 * time.Second):
		t.Fatal("run did not stop after 3 recurrences of the stall")
	}
	if !errors.Is(runErr, fkmat.ErrStalled) || !strings.Contains(runErr.Error(), "backfill --force") ||
		!strings.Contains(runErr.Error(), "public.audit") {
		t.Fatalf("run stopped with %v, want ErrStalled naming the table and fkmat backfill --force", runErr)
	}
	out := logs.String()
	if n := strings.Count(out, "pipeline stalled"); n < 3 {
		t.Errorf("%d stall log lines, want one per recurrence (3):\n%s", n, tail(out, 20))
	}
	if !strings.Contains(out, "table=public.audit") || !strings.Contains(out, "lsn=") {
		t.Errorf("the stall log lines lack the table or the LSN:\n%s", tail(out, 10))
	}
	if strings.Contains(out, "hunter2") {
		t.Error("a row value reached the log")
	}
	if confirmed := queryInt(t, tc, `SELECT (confirmed_flush_lsn >= $1::pg_lsn)::int FROM pg_replication_slots WHERE slot_name = $2`,
		lsn, tc.Slot); confirmed != 0 {
		t.Error("the slot acknowledged the change that was never applied")
	}

	// The fix the error names (the restarts already took audit out of the
	// publication again; the change made while it was in stays in the WAL).
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'audit'`, tc.Publication); n != 0 {
		t.Fatal("audit is still published")
	}
	if err := fkmat.BackfillIfNeeded(ctx, cfg, true, fkmat.Options{}); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, cfg, fkmat.Options{})
	sqlExec(t, tc, `UPDATE customers SET name = 'ann2'`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if st, err = fkmat.Status(ctx, cfg, fkmat.Options{}); err != nil || st[0].Stall != nil {
		t.Fatalf("status after the fix: %v, stall %+v", err, st[0].Stall)
	}
}

// TestStatusReadOnly: fkmat status with a role that may only read reports,
// instead of failing, a target database never migrated, a missing target
// and a target of the wrong shape, and creates nothing.
func TestStatusReadOnly(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold')`,
		`INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 20) g`)
	_, roURL := createRole(t, tc, "", `GRANT SELECT ON ALL TABLES IN SCHEMA public TO %[1]s`,
		`ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO %[1]s`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	roCfg := *cfg
	roCfg.Source, roCfg.Target = roURL, roURL
	ro := pgxIdent(t, roURL)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// Nothing exists yet: no schema, no target, no slot.
	st, err := fkmat.Status(ctx, &roCfg, fkmat.Options{})
	if err != nil {
		t.Fatalf("status before anything exists: %v", err)
	}
	if s := st[0]; s.Metadata != "missing" || s.TargetState != "missing" || s.SlotExists || s.Phase != "never_backfilled" {
		t.Fatalf("status before anything exists: %+v", s)
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_namespace WHERE nspname = 'fkmat'`); n != 0 {
		t.Fatal("status created fkmat's schema")
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_class WHERE relname = 'orders_enriched'`); n != 0 {
		t.Fatal("status created the target")
	}

	// Streaming, then the target given the wrong shape.
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `GRANT USAGE ON SCHEMA fkmat TO `+ro, `GRANT SELECT ON ALL TABLES IN SCHEMA fkmat TO `+ro,
		`GRANT SELECT ON orders_enriched TO `+ro)
	if st, err = fkmat.Status(ctx, &roCfg, fkmat.Options{}); err != nil {
		t.Fatal(err)
	}
	if s := st[0]; s.Metadata != "ok" || s.TargetState != "ok" || s.Phase != "streaming" || s.TargetRows != 20 || s.Subscriptions != 20 {
		t.Fatalf("status of a streaming join: %+v", s)
	}
	sqlExec(t, tc, `ALTER TABLE orders_enriched DROP COLUMN tier`)
	if st, err = fkmat.Status(ctx, &roCfg, fkmat.Options{}); err != nil {
		t.Fatal(err)
	}
	if s := st[0]; s.TargetState != "wrong_shape" || len(s.Problems) == 0 {
		t.Fatalf("status of a target of the wrong shape: %+v", s)
	}
	sqlExec(t, tc, `DROP TABLE orders_enriched`)
	if st, err = fkmat.Status(ctx, &roCfg, fkmat.Options{}); err != nil || st[0].TargetState != "missing" {
		t.Fatalf("status of a dropped target: %v %+v", err, st)
	}
}

// pgxIdent returns the quoted user name of a Postgres URL.
func pgxIdent(t *testing.T, pgURL string) string {
	t.Helper()
	u, err := url.Parse(pgURL)
	if err != nil {
		t.Fatal(err)
	}
	return pgx.Identifier{u.User.Username()}.Sanitize()
}

// TestShutdownCommitFails: a batch whose target commit fails after SIGTERM
// (its connection is terminated while it waits for a lock) makes run return
// an error instead of a clean exit, and the restart applies the batch.
func TestShutdownCommitFails(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold')`,
		`INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 20) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	logs := &syncBuffer{}
	d := startDaemon(t, cfg, fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	waitCaughtUp(t, tc, d)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	locker, err := tc.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Release()
	if _, err := locker.Exec(ctx, `BEGIN; LOCK TABLE orders_enriched IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `INSERT INTO orders VALUES (100, 1, 1, 'blocked')`)
	var pid int32
	waitFor(t, 30*time.Second, "the daemon's target write waiting for the lock", func() bool {
		err := tc.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND datname = current_database() AND pid <> pg_backend_pid() LIMIT 1`).Scan(&pid)
		return err == nil
	})
	d.cancel() // SIGTERM: the batch in hand is finished under its own deadline
	time.Sleep(200 * time.Millisecond)
	if _, err := tc.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	if _, err := locker.Exec(ctx, `ROLLBACK`); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		d.cancel = nil
		if err == nil {
			t.Fatalf("run returned nil although its last commit failed\n%s", tail(logs.String(), 10))
		}
		t.Logf("run returned: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after SIGTERM")
	}
	if !strings.Contains(logs.String(), "shutdown failed") {
		t.Errorf("the failed final commit was not logged:\n%s", tail(logs.String(), 10))
	}
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// TestRedisLoadingIsNoStall: a Redis that restarts and then answers LOADING
// for longer than the whole stall budget (--max-stall-restarts) while it
// reads its data back is a connection problem, not a stall. The daemon
// restarts its session on every failure meanwhile (more of them than the
// budget allows a stall), never says it is stalled (log, metric,
// /readyz), does not exit, and catches up once Redis is ready, equal to
// the SQL join.
func TestRedisLoadingIsNoStall(t *testing.T) {
	tc := testenv.New(t)
	rd := testenv.StartLocalRedis(t)
	// Filler keys, in a database of their own, make the reload slow with
	// key-load-delay (microseconds per key): 120k keys take about 28 s here.
	fill := rd.Client()
	defer fill.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := fill.Do(ctx, "SELECT", 15).Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 120_000; i += 10_000 {
		p := fill.Pipeline()
		p.Select(ctx, 15)
		for k := i; k < i+10_000; k++ {
			p.Set(ctx, fmt.Sprintf("filler:%d", k), "0123456789abcdef", 0)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}

	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 'gold' FROM generate_series(1, 20) g`,
		`INSERT INTO orders SELECT g, g % 20 + 1, g, 'n' FROM generate_series(1, 200) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	cfg.Redis = rd.URL()
	logs := &syncBuffer{}
	var addr atomic.Value
	const maxStalls = 2
	d := startDaemon(t, cfg, fkmat.Options{
		Logger:      slog.New(slog.NewTextHandler(logs, nil)),
		MetricsAddr: "127.0.0.1:0", MaxStallRestarts: maxStalls,
		MetricsBound: func(a net.Addr) { addr.Store(a.String()) },
	})
	waitCaughtUp(t, tc, d)
	get := metricsGetter(&addr)
	restarts := func() int {
		_, body := get("/metrics")
		m := regexp.MustCompile(`\nfkmat_pipeline_restarts_total (\d+)`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("no fkmat_pipeline_restarts_total in /metrics")
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	before := restarts()

	// Changes keep coming, so that the daemon needs Redis all along.
	writes, stopWrites := context.WithCancel(ctx)
	wrote := make(chan error, 1)
	go func() {
		id := 1000
		for writes.Err() == nil {
			id++
			if _, err := tc.Pool.Exec(writes, `INSERT INTO orders VALUES ($1, $2, $3, 'w')`, id, id%20+1, id); err != nil && writes.Err() == nil {
				wrote <- err
				return
			}
			if _, err := tc.Pool.Exec(writes, `UPDATE customers SET name = 'c' || $1::bigint WHERE id = $2`, id, id%20+1); err != nil && writes.Err() == nil {
				wrote <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		wrote <- nil
	}()
	defer stopWrites()

	if err := rd.Restart(ctx, "--key-load-delay", "150", "--loading-process-events-interval-bytes", "1024"); err != nil {
		t.Fatal(err)
	}
	probe := rd.Client()
	defer probe.Close()
	loadingSince := time.Now()
	for {
		err := probe.Ping(ctx).Err()
		if err == nil {
			break
		}
		if !strings.HasPrefix(err.Error(), "LOADING") {
			t.Fatalf("redis while loading: %v", err)
		}
		if _, body := get("/metrics"); !strings.Contains(body, "\nfkmat_pipeline_stalled 0\n") {
			t.Fatalf("fkmat_pipeline_stalled is not 0 while Redis loads:\n%s", tail(body, 2000))
		}
		if _, body := get("/readyz"); strings.Contains(body, "stall") {
			t.Fatalf("/readyz says stalled while Redis loads: %q", body)
		}
		select {
		case err := <-d.done:
			d.cancel = nil
			t.Fatalf("run stopped while Redis was loading: %v\n%s", err, tail(logs.String(), 3000))
		case err := <-wrote:
			t.Fatalf("source writes: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	loading := time.Since(loadingSince)
	during := restarts() - before
	t.Logf("redis answered LOADING for %s; the daemon restarted its session %d times meanwhile", loading.Round(time.Millisecond), during)
	if during <= maxStalls {
		t.Fatalf("only %d restarts while Redis loaded for %s: the test did not outlast the stall budget (%d); make the reload longer",
			during, loading.Round(time.Millisecond), maxStalls)
	}

	stopWrites()
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	out := logs.String()
	if strings.Contains(out, "pipeline stalled") {
		t.Errorf("a Redis loading its data was logged as a stall:\n%s", tail(out, 3000))
	}
	if !strings.Contains(out, "LOADING") {
		t.Errorf("the daemon's log never named LOADING:\n%s", tail(out, 3000))
	}
	select {
	case err := <-d.done:
		d.cancel = nil
		t.Fatalf("run stopped: %v", err)
	default:
	}
}

// metricsGetter returns a GET of a path of the daemon's metrics server,
// whose address MetricsBound stores in addr: the status code and body, or
// 0 while the server does not answer.
func metricsGetter(addr *atomic.Value) func(path string) (int, string) {
	return func(path string) (int, string) {
		a, _ := addr.Load().(string)
		resp, err := http.Get("http://" + a + path)
		if err != nil {
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
}

// TestPanicIsAStall: a panic in the stream's decoder, in the pipeline's
// join or in a batch's commit (injected where a transaction carries a
// poisoned row) does not kill the process. It becomes an error naming the
// transaction and its commit LSN, the pipeline restarts from its
// checkpoints, and the same panic again is a stall: fkmat_pipeline_stalled
// is 1, /readyz fails, fkmat status shows it, and after
// --max-stall-restarts recurrences run stops with ErrStalled. Nothing is
// acknowledged past it; once the cause is gone, run catches up, equal to
// the SQL join, and the stall is cleared.
func TestPanicIsAStall(t *testing.T) {
	for _, point := range []string{"decode", "join", "commit"} {
		t.Run(point, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold')`,
				`INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 20) g`)
			cfg := daemonConfig(t, tc, leftJoinYAML)
			poison := "poison-" + tc.Database
			// The poisoned transaction is found by its row where its changes
			// are in hand (a batch in its commit has released them), and
			// panics at point.
			var poisoned atomic.Uint64
			crash.SetTestHook(func(at string, arg any) {
				txns, _ := arg.([]*cdc.Txn)
				for _, txn := range txns {
					for _, c := range txn.Changes {
						for _, v := range c.New {
							if string(v.Data) == poison {
								poisoned.Store(uint64(txn.CommitLSN))
							}
						}
					}
					if at == point && poisoned.Load() == uint64(txn.CommitLSN) {
						var s []int
						_ = s[txn.Chunk+len(s)] // index out of range: a runtime error
					}
				}
			})
			t.Cleanup(func() { crash.SetTestHook(nil) })
			logs := &syncBuffer{}
			var addr atomic.Value
			opts := fkmat.Options{
				Logger:      slog.New(slog.NewTextHandler(logs, nil)),
				MetricsAddr: "127.0.0.1:0", MaxStallRestarts: 3,
				MetricsBound: func(a net.Addr) { addr.Store(a.String()) },
			}
			d := startDaemon(t, cfg, opts)
			waitCaughtUp(t, tc, d)
			if _, err := tc.Pool.Exec(context.Background(), `INSERT INTO orders VALUES (100, 1, 5, $1)`, poison); err != nil {
				t.Fatal(err)
			}
			var lsn string
			if err := tc.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
				t.Fatal(err)
			}
			get := metricsGetter(&addr)
			defer func() {
				if t.Failed() {
					t.Logf("log:\n%s", tail(logs.String(), 30))
				}
			}()
			waitFor(t, 60*time.Second, "fkmat_pipeline_stalled 1", func() bool {
				_, body := get("/metrics")
				if strings.Contains(body, "\nfkmat_pipeline_stalled 1\n") {
					return true
				}
				select {
				case err := <-d.done:
					d.cancel = nil
					t.Fatalf("run stopped before the stall showed: %v\n%s", err, tail(logs.String(), 20))
				default:
				}
				return false
			})
			if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "stalled") {
				t.Errorf("/readyz while stalled: %d %q", code, body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			st, err := fkmat.Status(ctx, cfg, fkmat.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s := st[0].Stall; s == nil || s.LSN == "" || !strings.Contains(s.Error, "panic") || !strings.Contains(s.Error, "xid") {
				t.Fatalf("status while stalled: %+v", st[0].Stall)
			}
			var runErr error
			select {
			case runErr = <-d.done:
				d.cancel = nil
			case <-time.After(90 * time.Second):
				t.Fatal("run did not stop after 3 recurrences of the panic")
			}
			if !errors.Is(runErr, fkmat.ErrStalled) || !strings.Contains(runErr.Error(), "index out of range") ||
				!strings.Contains(runErr.Error(), "in the transaction committed at") {
				t.Fatalf("run stopped with %v, want ErrStalled naming the panic and its transaction", runErr)
			}
			out := logs.String()
			if !strings.Contains(out, "panic recovered") || !strings.Contains(out, "goroutine") {
				t.Errorf("the panic and its stack are not logged:\n%s", tail(out, 10))
			}
			if confirmed := queryInt(t, tc, `SELECT (confirmed_flush_lsn >= $1::pg_lsn)::int FROM pg_replication_slots WHERE slot_name = $2`,
				lsn, tc.Slot); confirmed != 0 {
				t.Errorf("the slot acknowledged the transaction that panicked:\n%s", out)
			}

			// The bug fixed: run goes on from where it stopped.
			crash.SetTestHook(nil)
			d = startDaemon(t, cfg, fkmat.Options{})
			sqlExec(t, tc, `UPDATE customers SET name = 'ann2'`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			if st, err = fkmat.Status(ctx, cfg, fkmat.Options{}); err != nil || st[0].Stall != nil {
				t.Fatalf("status after the fix: %v, stall %+v", err, st[0].Stall)
			}
		})
	}
}

// TestTargetConstraintStalls: a CHECK constraint added to the target that
// a change violates needs a person, and may pass once they act: run does
// not exit; it retries from its checkpoints, shows the stall (status,
// /readyz, fkmat.stall) and goes on once the constraint is dropped, equal
// to the SQL join.
func TestTargetConstraintStalls(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold')`,
		`INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 20) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	var addr atomic.Value
	d := startDaemon(t, cfg, fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { addr.Store(a.String()) }})
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `ALTER TABLE orders_enriched ADD CONSTRAINT small CHECK (amount < 1000)`,
		`UPDATE orders SET amount = 5000 WHERE id = 3`)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	get := metricsGetter(&addr)
	waitFor(t, time.Minute, "the stall", func() bool {
		select {
		case err := <-d.done:
			d.cancel = nil
			t.Fatalf("run stopped on a constraint of the target: %v", err)
		default:
		}
		st, err := fkmat.Status(ctx, cfg, fkmat.Options{})
		return err == nil && st[0].Stall != nil && strings.Contains(st[0].Stall.Error, "23514")
	})
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "stalled") {
		t.Errorf("/readyz while stalled: %d %q", code, body)
	}
	sqlExec(t, tc, `ALTER TABLE orders_enriched DROP CONSTRAINT small`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	waitFor(t, time.Minute, "the stall cleared", func() bool {
		st, err := fkmat.Status(ctx, cfg, fkmat.Options{})
		return err == nil && st[0].Stall == nil
	})
}

// TestErrorClassesThroughServer: a grant revoked on the target needs a
// person and may pass once they act: run stalls (status shows it) and goes
// on once the grant is back. A session the server ends for idling in a
// transaction (idle_in_transaction_session_timeout, here 300 ms from the
// URL, while a batch's target transaction waits) is retried at once and is
// no stall. Both end equal to the SQL join.
func TestErrorClassesThroughServer(t *testing.T) {
	t.Run("revoked grant", func(t *testing.T) {
		tc := testenv.New(t)
		sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold'), (2, 'bob', NULL)`,
			`INSERT INTO orders SELECT g, 1 + g % 3, g, 'n' FROM generate_series(1, 30) g`)
		role, roleURL := createRole(t, tc, "REPLICATION", minimalGrants(tc)...)
		cfg := daemonConfig(t, tc, leftJoinYAML)
		cfg.Source, cfg.Target = roleURL, roleURL
		d := startDaemon(t, cfg, fkmat.Options{MaxStallRestarts: 100})
		waitCaughtUp(t, tc, d)
		q := pgx.Identifier{role}.Sanitize()
		sqlExec(t, tc, `REVOKE INSERT, UPDATE ON orders_enriched FROM `+q, `UPDATE customers SET name = 'ANN' WHERE id = 1`)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		waitFor(t, time.Minute, "the stall", func() bool {
			select {
			case err := <-d.done:
				d.cancel = nil
				t.Fatalf("run stopped on a revoked grant: %v", err)
			default:
			}
			st, err := fkmat.Status(ctx, cfg, fkmat.Options{})
			return err == nil && st[0].Stall != nil && strings.Contains(st[0].Stall.Error, "42501")
		})
		sqlExec(t, tc, `GRANT INSERT, UPDATE ON orders_enriched TO `+q)
		waitCaughtUp(t, tc, d)
		assertOracle(t, cfg)
	})
	t.Run("idle in transaction timeout", func(t *testing.T) {
		tc := testenv.New(t)
		sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold'), (2, 'bob', NULL)`,
			`INSERT INTO orders SELECT g, 1 + g % 3, g, 'n' FROM generate_series(1, 30) g`)
		cfg := daemonConfig(t, tc, leftJoinYAML)
		cfg.Target = tc.DatabaseURL + "&idle_in_transaction_session_timeout=300ms"
		// The first batch's target transaction waits a second with its
		// rows written.
		var once sync.Once
		crash.SetTestHook(func(at string, _ any) {
			if at == "target written" {
				once.Do(func() { time.Sleep(time.Second) })
			}
		})
		t.Cleanup(func() { crash.SetTestHook(nil) })
		logs := &syncBuffer{}
		d := startDaemon(t, cfg, fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
		waitCaughtUp(t, tc, d)
		sqlExec(t, tc, `UPDATE customers SET name = 'ANN' WHERE id = 1`, `INSERT INTO orders VALUES (31, 2, 1, 'x')`)
		waitCaughtUp(t, tc, d)
		assertOracle(t, cfg)
		out := logs.String()
		if !strings.Contains(out, "cannot reach a server, or it is not ready") || strings.Contains(out, "pipeline stalled") {
			t.Errorf("the session the server ended was not retried as a connection loss:\n%s", tail(out, 10))
		}
	})
}
