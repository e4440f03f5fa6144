package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// shop creates the example tables of the README.
const shop = `
CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text);
CREATE INDEX ON orders (customer_id);
`

// daemonConfig returns a config for tc with the given joins YAML.
func daemonConfig(t *testing.T, tc *testenv.Case, joins string) *config.Config {
	t.Helper()
	cfg, err := config.ParseConfig([]byte(joins))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Source = tc.DatabaseURL
	cfg.Redis = (&url.URL{Scheme: "redis", Host: tc.Env.RedisAddr, Path: "/0"}).String()
	cfg.Slot, cfg.Publication = tc.Slot, tc.Publication
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = testenv.DeleteKeys(ctx, tc.Redis, "fkmat:"+tc.Slot+":")
	})
	return cfg
}

// daemon is a running fkmat.Run.
type daemon struct {
	cancel context.CancelFunc
	done   chan error
}

func startDaemon(t *testing.T, cfg *config.Config, opts fkmat.Options) *daemon {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &daemon{cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- fkmat.Run(ctx, cfg, opts) }()
	t.Cleanup(func() { d.stop(t) })
	return d
}

// stop cancels the daemon and returns its error (nil for a clean shutdown).
func (d *daemon) stop(t *testing.T) error {
	t.Helper()
	if d.cancel == nil {
		return nil
	}
	d.cancel()
	d.cancel = nil
	select {
	case err := <-d.done:
		return err
	case <-time.After(45 * time.Second): // past the daemon's 30 s shutdown grace
		t.Fatal("daemon did not stop within 45 s")
		return nil
	}
}

// waitCaughtUp waits until the slot's confirmed_flush_lsn covers everything
// committed so far (once the slot's confirmed position covers a commit, the
// target reflects it) or the daemon fails.
func waitCaughtUp(t *testing.T, tc *testenv.Case, d *daemon) {
	t.Helper()
	waitCaughtUpMeta(t, tc, tc.Pool, d)
}

// waitCaughtUpMeta is waitCaughtUp with fkmat's metadata read from meta (the
// target database).
func waitCaughtUpMeta(t *testing.T, tc *testenv.Case, meta *pgxpool.Pool, d *daemon) {
	t.Helper()
	// A long backlog (the fault soak) is fine as long as the daemon moves:
	// it fails after 90 s without progress of confirmed_flush_lsn, or 20
	// minutes in all.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var target string
	if err := tc.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		t.Fatal(err)
	}
	var last string
	moved := time.Now()
	for {
		// The slot exists from the start of the backfill, at its consistent
		// point; the target is usable once every join is streaming.
		var ok *bool
		var confirmed *string
		var streaming bool
		err := tc.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn, confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $2`,
			target, tc.Slot).Scan(&ok, &confirmed)
		if err == nil {
			err = meta.QueryRow(ctx, `SELECT count(*) > 0 AND bool_and(phase = 'streaming') FROM fkmat.join_state WHERE slot = $1`,
				tc.Slot).Scan(&streaming)
		}
		if err == nil && ok != nil && *ok && streaming {
			return
		}
		if confirmed != nil && *confirmed != last {
			last, moved = *confirmed, time.Now()
		}
		if time.Since(moved) > 90*time.Second {
			t.Fatalf("not caught up with %s: confirmed_flush_lsn stayed at %s for 90 s", target, last)
		}
		select {
		case err := <-d.done:
			d.cancel = nil
			t.Fatalf("daemon stopped before catching up: %v", err)
		case <-ctx.Done():
			t.Fatalf("not caught up with %s within 20 minutes (confirmed %s)", target, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// assertOracle compares every target with its SQL join (fkmat verify).
func assertOracle(t *testing.T, cfg *config.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reports, err := fkmat.Verify(ctx, cfg, fkmat.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reports {
		if !r.Equal() || r.Expected != r.Actual {
			t.Errorf("join %s: expected %d rows, target has %d; missing %d, extra %d, different %d; e.g. %v",
				r.Join, r.Expected, r.Actual, r.Missing, r.Extra, r.Different, r.Examples)
		}
	}
}

func sqlExec(t *testing.T, tc *testenv.Case, sqls ...string) {
	t.Helper()
	for _, s := range sqls {
		if _, err := tc.Pool.Exec(context.Background(), s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}

const leftJoinYAML = `
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, amount]
    right:
      table: public.customers
      columns: [name AS customer_name, tier]
    target:
      table: public.orders_enriched
`

// TestDaemonEndToEnd: backfill of existing rows, then streaming of inserts,
// fan-out updates, FK changes, NULL FKs and deletes on both sides; the target
// equals the SQL join after catching up, and a clean shutdown returns nil.
func TestDaemonEndToEnd(t *testing.T) {
	testenv.Race(t)
	for _, typ := range []string{"left", "inner"} {
		t.Run(typ, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, shop,
				`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 2 = 0 THEN 'gold' END FROM generate_series(1, 50) g`,
				`INSERT INTO orders SELECT g, CASE WHEN g % 10 = 0 THEN NULL ELSE g % 60 END, g * 1.5, 'n' FROM generate_series(1, 500) g`)
			cfg := daemonConfig(t, tc, leftJoinYAML)
			cfg.Joins[0].Type = typ
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			sqlExec(t, tc,
				`INSERT INTO orders SELECT g, g % 55, 1, 'x' FROM generate_series(501, 700) g`,
				`UPDATE customers SET name = name || '!' WHERE id % 3 = 0`,
				`UPDATE orders SET customer_id = customer_id + 1 WHERE id % 7 = 0`,
				`UPDATE orders SET customer_id = NULL WHERE id % 11 = 0`,
				`UPDATE orders SET customer_id = 5 WHERE customer_id IS NULL AND id % 4 = 0`,
				`UPDATE orders SET amount = amount + 1 WHERE id % 5 = 0`,
				`DELETE FROM customers WHERE id % 9 = 0`,
				`INSERT INTO customers VALUES (51, 'late', 'new'), (52, 'later', NULL)`,
				`DELETE FROM orders WHERE id % 13 = 0`,
				`BEGIN; UPDATE customers SET tier = 'x' WHERE id = 1; UPDATE orders SET customer_id = 1 WHERE id = 2; DELETE FROM orders WHERE id = 3; COMMIT`,
			)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			if err := d.stop(t); err != nil {
				t.Fatalf("clean shutdown returned %v", err)
			}
		})
	}
}

// TestDaemonRestartResumes: stop, write while stopped, start again: the
// daemon resumes from its checkpoint without a new backfill.
func TestDaemonRestartResumes(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'a', 't1'), (2, 'b', 't2')`,
		`INSERT INTO orders SELECT g, 1 + g % 2, g, 'n' FROM generate_series(1, 100) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE customers SET name = 'A' WHERE id = 1`, `INSERT INTO orders VALUES (101, 2, 1, 'x')`,
		`UPDATE orders SET customer_id = 3 WHERE id = 4`)
	var epoch1 string
	if err := tc.Pool.QueryRow(context.Background(), `SELECT epoch FROM fkmat.join_state`).Scan(&epoch1); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	var epoch2 string
	if err := tc.Pool.QueryRow(context.Background(), `SELECT epoch FROM fkmat.join_state`).Scan(&epoch2); err != nil {
		t.Fatal(err)
	}
	if epoch1 != epoch2 {
		t.Fatalf("restart ran a new backfill (epoch %s -> %s)", epoch1, epoch2)
	}
}

// TestDaemonLostRedisState: FLUSH of the join's keys is detected; with
// OnLostState=refuse the daemon stops with ErrLostState, with rebuild it
// backfills and converges.
func TestDaemonLostRedisState(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'a', 't1')`, `INSERT INTO orders VALUES (1, 1, 1, 'n')`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	if err := testenv.DeleteKeys(context.Background(), tc.Redis, "fkmat:"+tc.Slot+":"); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE customers SET name = 'changed' WHERE id = 1`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := fkmat.Run(ctx, cfg, fkmat.Options{OnLostState: fkmat.LostStateRefuse})
	if !errors.Is(err, fkmat.ErrLostState) {
		t.Fatalf("Run with lost state = %v, want ErrLostState", err)
	}
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	fmt.Fprintln(testWriter{t}, "rebuilt after lost state")
}

// TestDaemonOldLayout: a state written by an older fkmat (layout v1, whose
// rows the lean v2 encoding cannot read) is never streamed from: refuse
// stops naming fkmat backfill --force, rebuild backfills it in the current
// layout and converges.
func TestDaemonOldLayout(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'a', 't1'), (2, 'b', 't2')`,
		`INSERT INTO orders SELECT g, 1 + g % 3, g, 'n' FROM generate_series(1, 50) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	runCaughtUp(t, tc, cfg, fkmat.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	meta := joinState(t, tc, "orders_enriched").MetaKey()
	layout, err := tc.Redis.HGet(ctx, meta, "layout").Result()
	if err != nil || !strings.HasPrefix(layout, "v2/") {
		t.Fatalf("layout = %q, %v; want v2", layout, err)
	}
	old := "v1/" + strings.TrimPrefix(layout, "v2/")
	if err := tc.Redis.HSet(ctx, meta, "layout", old).Err(); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE customers SET name = 'changed' WHERE id = 1`, `INSERT INTO orders VALUES (51, 2, 1, 'x')`)
	err = fkmat.Run(ctx, cfg, fkmat.Options{OnLostState: fkmat.LostStateRefuse})
	if !errors.Is(err, fkmat.ErrLostState) || !strings.Contains(err.Error(), "another layout ("+old+")") ||
		!strings.Contains(err.Error(), "fkmat backfill --force") {
		t.Fatalf("Run on the v1 layout = %v, want ErrLostState naming the layout and fkmat backfill --force", err)
	}
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if got, err := tc.Redis.HGet(ctx, meta, "layout").Result(); err != nil || got != layout {
		t.Errorf("layout after the rebuild = %q, %v; want %q", got, err, layout)
	}
}

// TestBackfillSizesState: the backfill sizes each side's Redis row buckets
// for the table's estimated rows (some 64 rows per bucket, so that they stay
// in the compact listpack encoding), summing the partitions of a
// partitioned table; the state works and converges.
func TestBackfillSizesState(t *testing.T) {
	for _, tt := range []struct {
		name, schema, analyze, layout string
	}{
		{"plain", shop, `ANALYZE orders`, "left_buckets=2048/right_buckets=1024"},
		{"partitioned", `CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text);
CREATE TABLE orders (id bigint, customer_id bigint, amount numeric(12,2), note text, PRIMARY KEY (id)) PARTITION BY RANGE (id);
CREATE TABLE orders_a PARTITION OF orders FOR VALUES FROM (MINVALUE) TO (40000);
CREATE TABLE orders_b PARTITION OF orders FOR VALUES FROM (40000) TO (MAXVALUE);`, `ANALYZE orders_a, orders_b`, "left_buckets=2048/right_buckets=1024"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := testenv.New(t)
			// Each session's pending table statistics are flushed before
			// ANALYZE sets the live rows: flushed after it (Postgres 15
			// flushes them once the session idles, at most every second),
			// they would be added to its count, and the state sized for
			// 140k orders (seen once under CI load).
			sqlExec(t, tc, tt.schema,
				`INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 500) g; SELECT pg_stat_force_next_flush()`,
				`INSERT INTO orders SELECT g, 1 + g % 600, g, 'n' FROM generate_series(1, 70000) g; SELECT pg_stat_force_next_flush()`,
				`ANALYZE customers`, tt.analyze)
			cfg := daemonConfig(t, tc, leftJoinYAML)
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			sqlExec(t, tc, `UPDATE customers SET name = 'x' WHERE id = 7`, `UPDATE orders SET customer_id = 7 WHERE id = 50000`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			m, err := joinState(t, tc, "orders_enriched").Meta(context.Background())
			layout := m.Layout
			if err != nil || !strings.HasPrefix(layout, "v2/") || !strings.HasSuffix(layout, tt.layout) {
				t.Errorf("layout = %q, %v; want v2 with %s", layout, err, tt.layout)
			}
		})
	}
}

// TestStatusRedisLayout: status shows the state's layout, says when a state
// outgrew its buckets (here one bucket for 600 rows) and when it has
// another layout, each with the fix.
func TestStatusRedisLayout(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'a', 't1')`,
		`INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 600) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	opts := fkmat.Options{SubShards: 4, RowShards: 1}
	runCaughtUp(t, tc, cfg, opts)
	assertOracle(t, cfg)
	ctx := context.Background()
	st, err := fkmat.Status(ctx, cfg, opts)
	if err != nil || len(st) != 1 {
		t.Fatalf("status = %+v, %v", st, err)
	}
	if s := st[0]; s.RedisLayout != "v2/sub_shards=4/left_buckets=1/right_buckets=1" || s.RedisState != "ok" ||
		!strings.Contains(strings.Join(s.Problems, "\n"), "outgrew its 1 left-row buckets (some 600 rows each") ||
		!strings.Contains(strings.Join(s.Problems, "\n"), "fkmat backfill --force") {
		t.Errorf("status of an outgrown state = %+v", s)
	}
	meta := joinState(t, tc, "orders_enriched").MetaKey()
	if err := tc.Redis.HSet(ctx, meta, "layout", "v1/sub_shards=4/row_shards=1").Err(); err != nil {
		t.Fatal(err)
	}
	st, err = fkmat.Status(ctx, cfg, opts)
	if err != nil || len(st) != 1 || st[0].RedisState != "other_layout" ||
		!strings.Contains(strings.Join(st[0].Problems, "\n"), "has another layout (v1/sub_shards=4/row_shards=1)") {
		t.Errorf("status of a v1 state = %+v, %v", st, err)
	}
}

// runCaughtUp runs the daemon until it caught up with the source, and
// stops it cleanly.
func runCaughtUp(t *testing.T, tc *testenv.Case, cfg *config.Config, opts fkmat.Options) {
	t.Helper()
	d := startDaemon(t, cfg, opts)
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// TestDaemonRedisAheadOfTarget: a target restored from an older backup (its
// checkpoint behind Redis') is detected as foreign state, never streamed
// from (which would skip changes).
func TestDaemonRedisAheadOfTarget(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'a', 't1')`, `INSERT INTO orders VALUES (1, 1, 1, 'n')`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `INSERT INTO orders VALUES (2, 1, 2, 'n')`)
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	// "Restore" an older target: lose the last row and move the checkpoint back.
	sqlExec(t, tc, `DELETE FROM orders_enriched WHERE id = 2`, `UPDATE fkmat.checkpoint SET lsn = '0/1'`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := fkmat.Run(ctx, cfg, fkmat.Options{OnLostState: fkmat.LostStateRefuse})
	if !errors.Is(err, fkmat.ErrLostState) || !strings.Contains(err.Error(), "ahead of the target") {
		t.Fatalf("Run = %v, want ErrLostState (redis ahead of the target)", err)
	}
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// TestDaemonLostStateWhileRunning: the join's Redis keys vanish under a
// running daemon (FLUSHALL, eviction). The next batch's reads see empty
// state; nothing computed from it may reach the target: with refuse, the
// daemon stops with the target exactly as before the loss.
func TestDaemonLostStateWhileRunning(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold'), (2, 'bob', 'silver')`,
		`INSERT INTO orders SELECT g, 1 + g % 2, g, 'n' FROM generate_series(1, 20) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{OnLostState: fkmat.LostStateRefuse})
	waitCaughtUp(t, tc, d)
	snapshot := func() string {
		var s string
		if err := tc.Pool.QueryRow(context.Background(), `SELECT md5(string_agg(t::text, ',' ORDER BY id)) FROM orders_enriched t`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := snapshot()
	if err := joinState(t, tc, "orders_enriched").Drop(context.Background()); err != nil {
		t.Fatal(err)
	}
	// With the state gone, these would be resolved against nothing: order 3
	// would lose its customer's columns.
	sqlExec(t, tc, `UPDATE orders SET amount = amount + 1 WHERE id = 3`, `UPDATE customers SET name = 'ANN' WHERE id = 1`)
	select {
	case err := <-d.done:
		d.cancel = nil
		if !errors.Is(err, fkmat.ErrLostState) {
			t.Fatalf("daemon stopped with %v, want ErrLostState", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("daemon did not notice the lost state")
	}
	if after := snapshot(); after != before {
		t.Fatal("rows computed from the lost state reached the target")
	}
	// A rebuild converges.
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}
