package integration

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/redisstore"
)

// shapeReader polls a target while its join is rebuilt beside it and
// checks the invariants of a rebuild: the target is never missing, never
// empty nor partial (its row count is always rows: the writers only
// update), and once a reader has seen the new definition's columns it never
// sees the old ones again.
type shapeReader struct {
	rows    int64
	newCols string

	mu        sync.Mutex
	errs      []string
	reads     int
	sawOld    int
	sawNew    int
	afterNew  bool
	stop      chan struct{}
	done      chan struct{}
	switched  chan struct{}
	closeOnce sync.Once
}

func readShapes(t *testing.T, pool *pgxpool.Pool, table string, rows int64, oldCols, newCols string) *shapeReader {
	t.Helper()
	r := &shapeReader{rows: rows, newCols: newCols, stop: make(chan struct{}), done: make(chan struct{}), switched: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			var n int64
			var cols string
			err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n)
			if err == nil {
				// By name, as a reader's next query sees the table.
				err = pool.QueryRow(ctx, `SELECT string_agg(a.attname, ',' ORDER BY a.attnum) FROM pg_attribute a
					JOIN pg_class c ON c.oid = a.attrelid WHERE c.relname = $1 AND c.relnamespace = 'public'::regnamespace
					AND a.attnum > 0 AND NOT a.attisdropped`, table).Scan(&cols)
			}
			cancel()
			r.mu.Lock()
			r.reads++
			switch {
			case err != nil:
				r.errs = append(r.errs, err.Error())
			case n != r.rows:
				r.errs = append(r.errs, fmt.Sprintf("saw %d rows, want %d", n, r.rows))
			case cols == newCols:
				r.sawNew++
				r.afterNew = true
				r.closeOnce.Do(func() { close(r.switched) })
			case cols == oldCols && r.afterNew:
				r.errs = append(r.errs, "saw the old columns after the new ones")
			case cols == oldCols:
				r.sawOld++
			default:
				r.errs = append(r.errs, "saw columns "+cols)
			}
			r.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return r
}

func (r *shapeReader) finish(t *testing.T) {
	t.Helper()
	close(r.stop)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) > 0 {
		t.Fatalf("a reader of the target saw %d violations in %d reads, first: %s", len(r.errs), r.reads, r.errs[0])
	}
	if r.sawOld == 0 || r.sawNew == 0 {
		t.Fatalf("the reader saw the old definition %d times and the new one %d times; the test did not watch the switch", r.sawOld, r.sawNew)
	}
	t.Logf("reader: %d reads, %d of the old definition, %d of the new one", r.reads, r.sawOld, r.sawNew)
}

// churn updates both tables of the shop in small transactions until
// stopped: the row count of a left join's target stays, every column moves.
func churn(t *testing.T, tc *testenv.Case, customers, orders int) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var failed atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(7, 9))
		for i := 0; ctx.Err() == nil; i++ {
			o, c := 1+rng.IntN(orders), 1+rng.IntN(customers)
			var q string
			switch i % 5 {
			case 0:
				q = fmt.Sprintf(`UPDATE orders SET customer_id = %d, amount = amount + 1, note = 'w%d' WHERE id = %d`, c, i, o)
			case 1:
				q = fmt.Sprintf(`UPDATE customers SET name = 'c%d', tier = CASE WHEN tier = 'gold' THEN NULL ELSE 'gold' END WHERE id = %d`, i, c)
			case 2:
				q = fmt.Sprintf(`BEGIN; UPDATE orders SET customer_id = NULL WHERE id = %d; UPDATE orders SET customer_id = %d, note = repeat('t', 3000) WHERE id = %d; COMMIT`, o, c, o)
			case 3:
				q = fmt.Sprintf(`UPDATE orders SET customer_id = %d WHERE id = %d`, customers+1000+i%7, o) // dangling
			case 4:
				q = fmt.Sprintf(`UPDATE orders SET amount = (amount * 2) %% 100000 WHERE id BETWEEN %d AND %d`, o, o+20)
			}
			if _, err := tc.Pool.Exec(ctx, q); err != nil && ctx.Err() == nil {
				failed.Store(err)
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
		if err, ok := failed.Load().(error); ok {
			t.Fatalf("writer: %v", err)
		}
	}
}

// TestDefinitionChangeOnline: a join whose definition changed is built
// beside the running one. `run` with the new configuration keeps the old
// target streaming while it builds, then switches the new one in; it never
// stops. A reader polling the target all along never sees it missing,
// empty or partial, sees the old columns until the switch and the new
// ones after it. Writers change both tables throughout. Each change ends
// equal to its SQL, with one target, no second slot and no state of the
// old generation left.
func TestDefinitionChangeOnline(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	const customers, orders = 2000, 40000
	sqlExec(t, tc, shop,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, %d) g`, customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, CASE WHEN g %% 10 = 0 THEN NULL ELSE g %% %d END, g, 'n' || g FROM generate_series(1, %d) g`, customers+100, orders))
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	const (
		oldCols = "id,customer_id,amount,customer_name,tier"
		newCols = "id,customer_id,amount,note,customer_name,tier"
	)
	steps := []struct {
		what     string
		yml      string
		old, new string
		before   []string // SQL before the change
	}{
		{what: "a column added", yml: widerJoinYAML, old: oldCols, new: newCols},
		{what: "a column removed", yml: leftJoinYAML, old: newCols, new: oldCols},
		{what: "an entry added", yml: chainJoinYAML, old: oldCols, new: oldCols + ",region_name", before: []string{
			`CREATE TABLE regions (id int PRIMARY KEY, name text)`,
			`INSERT INTO regions SELECT g, 'r' || g FROM generate_series(1, 20) g`,
			`ALTER TABLE customers ADD COLUMN region_id int`,
			`UPDATE customers SET region_id = id % 25 WHERE id % 3 <> 0`}},
		{what: "an entry removed", yml: leftJoinYAML, old: oldCols + ",region_name", new: oldCols},
	}
	for _, s := range steps {
		sqlExec(t, tc, s.before...)
		next := daemonConfig(t, tc, s.yml)
		// Until run has built the new definition, verify says so, rather
		// than comparing the old target with the new SQL.
		if _, err := fkmat.Verify(context.Background(), next, fkmat.Options{}); !errors.Is(err, fkmat.ErrDefinitionPending) {
			t.Fatalf("%s: verify before run = %v, want ErrDefinitionPending", s.what, err)
		} else if !strings.Contains(err.Error(), "fkmat status") {
			t.Fatalf("%s: verify before run: %v; want it to say where the rebuild shows", s.what, err)
		}
		stopWriters := churn(t, tc, customers, orders)
		r := readShapes(t, tc.Pool, "orders_enriched", orders, s.old, s.new)
		d := startDaemon(t, next, fkmat.Options{Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))})
		select {
		case <-r.switched:
		case err := <-d.done:
			d.cancel = nil
			t.Fatalf("%s: run stopped: %v", s.what, err)
		case <-time.After(3 * time.Minute):
			t.Fatalf("%s: the new definition was not switched in within 3 minutes", s.what)
		}
		// Streams on after the switch.
		time.Sleep(200 * time.Millisecond)
		stopWriters()
		waitCaughtUp(t, tc, d)
		r.finish(t)
		assertOracle(t, next)
		assertRebuildClean(t, tc, "orders_enriched")
		if err := d.stop(t); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
	}
}

// chainJoinYAML is leftJoinYAML with the customer's region as a third
// table (a join of more than two tables).
const chainJoinYAML = `
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      columns: [id, customer_id, amount]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        columns: [name AS customer_name, tier]
      - table: public.regions
        from: customers
        foreign_key: [region_id]
        columns: [name AS region_name]
    target:
      table: public.orders_enriched
`

// assertRebuildClean checks what a rebuild must not leave behind: a second
// slot, a shadow table, a build record, and Redis state of a generation
// other than the join's.
func assertRebuildClean(t *testing.T, tc *testenv.Case, join string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		slots := queryInt(t, tc, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE $1`, tc.Slot+"_%")
		shadows := queryInt(t, tc, `SELECT count(*) FROM pg_class WHERE relname LIKE $1`, join+"_fkmat_%")
		builds := queryInt(t, tc, `SELECT count(*) FROM fkmat.build WHERE slot = $1`, tc.Slot)
		gen := queryInt(t, tc, `SELECT generation FROM fkmat.join_state WHERE slot = $1 AND join_name = $2`, tc.Slot, join)
		var other []string
		keys, err := tc.Redis.Keys(ctx, "fkmat:"+tc.Slot+":"+join+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		want := redisstore.GenerationPrefix(tc.Slot, join, int(gen))
		for _, k := range keys {
			if !strings.HasPrefix(k, want+":") && !strings.HasPrefix(k, want+"~t") {
				other = append(other, k)
			}
		}
		if slots == 0 && shadows == 0 && builds == 0 && len(other) == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("left behind: %d second slots, %d shadow tables, %d build records, %d keys of other generations (e.g. %v)",
				slots, shadows, builds, len(other), other[:min(3, len(other))])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// startRun starts `fkmat run` (the binary) with env and returns it with
// its log.
func startRun(t *testing.T, env []string) (*exec.Cmd, *daemon, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(fkmatBinary(t), "run")
	cmd.Env = env
	logs := &syncBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	return cmd, d, logs
}

// waitRebuild waits until status shows the rebuild beside the running join
// in phase, running.
func waitRebuild(t *testing.T, env []string, d *daemon, logs *syncBuffer, phase string) *fkmat.BuildStatus {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if b := statusBuild(t, env); b != nil && b.Beside && b.Running && b.Phase == phase {
			return b
		}
		select {
		case err := <-d.done:
			t.Fatalf("run stopped before the rebuild was %s: %v\n%s", phase, err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed the rebuild %s\n%s", phase, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// oldTargetStreams changes a customer's name to name and waits until the
// target shows it, while run goes on.
func oldTargetStreams(t *testing.T, tc *testenv.Case, d *daemon, logs *syncBuffer, name string) {
	t.Helper()
	if _, err := tc.Pool.Exec(context.Background(), `UPDATE customers SET name = $1 WHERE id = 1`, name); err != nil {
		t.Fatal(err)
	}
	for queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE customer_name = $1`, name) == 0 {
		select {
		case err := <-d.done:
			t.Fatalf("run stopped: %v\n%s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// killRun kill -9s a run started by startRun and waits for it.
func killRun(t *testing.T, cmd *exec.Cmd, d *daemon) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-d.done
}

// TestDefinitionChangeKilled: kill -9 of run while it builds a changed
// definition beside the running join, once while loading and once while
// catching up, each time with the old target streaming meanwhile (a change
// made during the build reaches it). The next run builds again and
// switches; the target ends equal to the SQL, with one target, no second
// slot and no state of another generation left.
func TestDefinitionChangeKilled(t *testing.T) {
	tc := testenv.New(t)
	const customers, orders = 2000, 60000
	sqlExec(t, tc, shop,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, %d) g`, customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, CASE WHEN g %% 10 = 0 THEN NULL ELSE g %% %d END, g, 'n' || g FROM generate_series(1, %d) g`, customers+100, orders))
	cfg := daemonConfig(t, tc, leftJoinYAML)
	runCaughtUp(t, tc, cfg, fkmat.Options{})
	wider := daemonConfig(t, tc, widerJoinYAML)
	env := cliEnv(t, tc, widerJoinYAML)
	ctx := context.Background()
	stopWriters := churn(t, tc, customers, orders)
	defer func() {
		if stopWriters != nil {
			stopWriters()
		}
	}()

	// Killed while loading: a transaction running on the source holds the
	// second slot's creation (it waits for running transactions).
	holder, err := tc.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	cmd, d, logs := startRun(t, env)
	b := waitRebuild(t, env, d, logs, "loading")
	if !strings.Contains(b.Reason, "columns added: note") {
		t.Errorf("the rebuild's reason %q does not name the added column", b.Reason)
	}
	if r := runCLI(t, env, "status"); r.code != 0 || !strings.Contains(r.stdout, "rebuild:") || !strings.Contains(r.stdout, "streams the old definition") {
		t.Errorf("status during the rebuild:\n%s%s", r.stdout, r.stderr)
	}
	// The old target streams meanwhile.
	oldTargetStreams(t, tc, d, logs, "during-build")
	if cols := targetColumns(t, tc, "orders_enriched"); cols != "id,customer_id,amount,customer_name,tier" {
		t.Fatalf("the target has columns %s during the build", cols)
	}
	killRun(t, cmd, d)
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Killed while catching up: a lock on the shadow, taken as soon as the
	// load has filled it, holds the catch-up's writes (no transaction id:
	// the second slot's creation does not wait for it).
	cmd, d, logs = startRun(t, env)
	var shadow string
	for {
		err := tc.Pool.QueryRow(ctx, `SELECT relname FROM pg_class WHERE relname LIKE 'orders_enriched_fkmat_new_%'`).Scan(&shadow)
		if err == nil && queryInt(t, tc, `SELECT count(*) FROM `+shadow) == orders {
			break
		}
		select {
		case err := <-d.done:
			t.Fatalf("run stopped: %v\n%s", err, logs.String())
		default:
		}
		time.Sleep(time.Millisecond)
	}
	blocker, err := tc.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	if _, err := blocker.Exec(ctx, `LOCK TABLE `+shadow+` IN SHARE MODE`); err != nil {
		t.Fatalf("lock the shadow %s: %v", shadow, err)
	}
	waitRebuild(t, env, d, logs, "catching up")
	oldTargetStreams(t, tc, d, logs, "during-catch-up")
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot+"_rebuild"); n != 1 {
		t.Fatalf("%d second slots while catching up", n)
	}
	killRun(t, cmd, d)
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// Killed while switching: a reader holds the target, and the swap
	// waits for it (5 s at a time).
	reader, err := tc.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Rollback(ctx) }()
	if _, err := reader.Exec(ctx, `SELECT count(*) FROM orders_enriched`); err != nil {
		t.Fatal(err)
	}
	cmd, d, logs = startRun(t, env)
	waitRebuild(t, env, d, logs, "switching")
	for !strings.Contains(logs.String(), "switching at the marker") {
		select {
		case err := <-d.done:
			t.Fatalf("run stopped: %v\n%s", err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	time.Sleep(500 * time.Millisecond) // into the swap's wait for the reader
	killRun(t, cmd, d)
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if cols := targetColumns(t, tc, "orders_enriched"); cols != "id,customer_id,amount,customer_name,tier" {
		t.Fatalf("the target has columns %s after a kill before the switch committed", cols)
	}

	// The next run builds again and switches.
	r := readShapes(t, tc.Pool, "orders_enriched", orders, "id,customer_id,amount,customer_name,tier", "id,customer_id,amount,note,customer_name,tier")
	cmd, d, logs = startRun(t, env)
	select {
	case <-r.switched:
	case err := <-d.done:
		t.Fatalf("run stopped: %v\n%s", err, logs.String())
	case <-time.After(3 * time.Minute):
		t.Fatalf("not switched within 3 minutes\n%s", logs.String())
	}
	stopWriters()
	stopWriters = nil
	waitCaughtUp(t, tc, d)
	r.finish(t)
	assertOracle(t, wider)
	assertRebuildClean(t, tc, "orders_enriched")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := <-d.done; err != nil {
		t.Fatalf("run after SIGTERM: %v\n%s", err, logs.String())
	}
}

// TestLayoutChangeRebuiltBeside: a Redis state laid out otherwise than
// this fkmat makes it (here other sub_shards; an upgrade that changes the
// layout takes the same path) serves while the join is rebuilt beside it
// in the new layout, instead of being taken for lost: the target keeps
// streaming, a reader never sees it partial, and the join switches to the
// new state once it has caught up.
func TestLayoutChangeRebuiltBeside(t *testing.T) {
	tc := testenv.New(t)
	const customers, orders = 2000, 40000
	sqlExec(t, tc, shop,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, %d) g`, customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, CASE WHEN g %% 10 = 0 THEN NULL ELSE g %% %d END, g, 'n' || g FROM generate_series(1, %d) g`, customers+100, orders))
	cfg := daemonConfig(t, tc, leftJoinYAML)
	runCaughtUp(t, tc, cfg, fkmat.Options{SubShards: 8})
	layout := func() string {
		t.Helper()
		gen := queryInt(t, tc, `SELECT generation FROM fkmat.join_state WHERE slot = $1`, tc.Slot)
		s, err := redisstore.Open(context.Background(), tc.Redis, redisstore.Config{Prefix: redisstore.GenerationPrefix(tc.Slot, "orders_enriched", int(gen))})
		if err != nil {
			t.Fatal(err)
		}
		meta, err := s.Meta(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return meta.Layout
	}
	if l := layout(); !strings.Contains(l, "sub_shards=8/") {
		t.Fatalf("layout %s, want sub_shards=8", l)
	}
	stopWriters := churn(t, tc, customers, orders)
	r := readTarget(t, tc.Pool, "orders_enriched")
	d := startDaemon(t, cfg, fkmat.Options{SubShards: 32, Logger: slog.New(slog.NewTextHandler(testWriter{t}, nil))})
	deadline := time.Now().Add(2 * time.Minute)
	for queryInt(t, tc, `SELECT generation FROM fkmat.join_state WHERE slot = $1`, tc.Slot) == 0 {
		select {
		case err := <-d.done:
			d.cancel = nil
			t.Fatalf("run stopped: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the join was not switched to the new layout within 2 minutes")
		}
	}
	stopWriters()
	waitCaughtUp(t, tc, d)
	r.finish(t, "a layout change", orders)
	if l := layout(); !strings.Contains(l, "sub_shards=32/") {
		t.Fatalf("layout after the switch %s, want sub_shards=32", l)
	}
	assertOracle(t, cfg)
	assertRebuildClean(t, tc, "orders_enriched")
}
