package integration

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/testenv"
)

// widenSchema has a column of every type whose widening fkmat follows, as
// keys, foreign keys and output columns, on every table of a two-table join
// and of a three-table chain.
const widenSchema = `
CREATE TABLE regions (id smallint PRIMARY KEY, name varchar(8));
CREATE TABLE customers (id integer PRIMARY KEY, region_id smallint, name varchar(10), since timestamp(0));
CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer, amount numeric(8,2), code varchar(5), at timestamptz(0));
INSERT INTO regions SELECT g, 'r' || g FROM generate_series(1, 4) g;
INSERT INTO customers SELECT g, 1 + g % 5, 'c' || g, timestamp '2026-01-01' + g * interval '1 hour' FROM generate_series(1, 40) g;
INSERT INTO orders SELECT g, 1 + g % 45, g * 1.25, 'k' || (g % 100), timestamptz '2026-02-01 00:00:00+00' + g * interval '1 minute'
	FROM generate_series(1, 2000) g;
`

const widenJoins = `
joins:
  - name: orders_wide
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, amount, code, at]
    right:
      table: public.customers
      columns: [name AS customer_name, since]
    target:
      table: public.orders_wide
  - name: orders_chain
    type: inner
    left:
      table: public.orders
      columns: [id, amount, code]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        columns: [name AS customer_name, since]
      - table: public.regions
        from: customers
        foreign_key: [region_id]
        type: left
        columns: [id AS region, name AS region_name]
    target:
      table: public.orders_chain
`

// TestWidenedColumns: every widening fkmat follows, of keys, foreign keys
// and output columns on every table of a two-table join and a three-table
// chain, made while the daemon streams (alone, in one transaction with rows
// of the old and the new type, and while the daemon is stopped): the
// daemon keeps running, widens the targets' columns before it writes a
// value of the new type, never rebuilds, and both targets end equal to
// their SQL joins with the new types.
func TestWidenedColumns(t *testing.T) {
	tc := testenv.New(t)
	enableWALInspect(t, tc)
	sqlExec(t, tc, widenSchema)
	cfg := daemonConfig(t, tc, widenJoins)
	logs := &syncBuffer{}
	opts := fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))}
	d := startDaemon(t, cfg, opts)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	epochs := stateEpochs(t, tc)

	steps := []struct {
		name string
		sql  []string
	}{{
		name: "integer keys and foreign keys to bigint",
		sql: []string{
			`ALTER TABLE customers ALTER COLUMN id TYPE bigint`,
			`ALTER TABLE orders ALTER COLUMN id TYPE bigint, ALTER COLUMN customer_id TYPE bigint`,
			`INSERT INTO customers VALUES (3000000000, 2, 'big', '2026-03-01')`,
			`INSERT INTO orders VALUES (5000000000, 3000000000, 1, 'b', now()), (5000000001, 7, 2, 'c', now())`,
			`UPDATE orders SET customer_id = 3000000000 WHERE id % 97 = 0`,
		},
	}, {
		name: "smallint key of the chain's last table to integer, in one transaction with rows of both types",
		sql: []string{
			`BEGIN; UPDATE regions SET name = 'before' WHERE id = 1; INSERT INTO customers VALUES (41, 3, 'c41', now());
			 ALTER TABLE regions ALTER COLUMN id TYPE integer; ALTER TABLE customers ALTER COLUMN region_id TYPE integer;
			 INSERT INTO regions VALUES (70000, 'far'); UPDATE customers SET region_id = 70000 WHERE id % 3 = 0; COMMIT`,
		},
	}, {
		name: "varchar longer and to text",
		sql: []string{
			`ALTER TABLE customers ALTER COLUMN name TYPE varchar(40)`,
			`ALTER TABLE orders ALTER COLUMN code TYPE text`,
			`ALTER TABLE regions ALTER COLUMN name TYPE varchar`,
			`UPDATE customers SET name = 'a name of thirty-two characters!' WHERE id % 4 = 0`, // fans out
			`UPDATE orders SET code = repeat('x', 300) WHERE id % 50 = 0`,
			`UPDATE regions SET name = 'a region with a long name' WHERE id = 2`,
		},
	}, {
		name: "numeric precision and scale, timestamp precision",
		sql: []string{
			`ALTER TABLE orders ALTER COLUMN amount TYPE numeric(14,4), ALTER COLUMN at TYPE timestamptz(3)`,
			`ALTER TABLE customers ALTER COLUMN since TYPE timestamp(6)`,
			`UPDATE orders SET amount = 1234567.1234, at = '2026-05-05 10:00:00.123+00' WHERE id % 31 = 0`,
			`UPDATE customers SET since = '2026-04-01 12:00:00.123456' WHERE id % 5 = 0`,
			`INSERT INTO orders VALUES (5000000002, 41, 0.0001, 'n', now())`,
		},
	}}
	followed := func() int { return strings.Count(logs.String(), "followed a widened column type") }
	for _, s := range steps {
		before := followed()
		sqlExec(t, tc, s.sql...)
		waitCaughtUp(t, tc, d)
		select {
		case err := <-d.done:
			d.cancel = nil
			t.Fatalf("%s: the daemon stopped: %v", s.name, err)
		default:
		}
		assertOracle(t, cfg)
		if followed() == before {
			t.Fatalf("%s: no target column was widened; logs:\n%s", s.name, logs.String())
		}
		t.Logf("%s: followed", s.name)
	}
	if strings.Contains(logs.String(), "pipeline failed") {
		t.Errorf("the pipeline failed on the way:\n%s", logs.String())
	}

	// Widened while the daemon is stopped: the next start widens the
	// targets before it streams the rows written meanwhile.
	if err := d.stop(t); err != nil {
		t.Fatalf("clean shutdown: %v", err)
	}
	sqlExec(t, tc, `INSERT INTO orders VALUES (5000000003, 2, 3, 'old type', now())`,
		`ALTER TABLE orders ALTER COLUMN amount TYPE numeric(20,6)`,
		`ALTER TABLE customers ALTER COLUMN name TYPE text`,
		`UPDATE orders SET amount = 12345678901234.123456 WHERE id % 13 = 0`,
		`UPDATE customers SET name = repeat('n', 100) WHERE id = 9`)
	// check knows run will widen the targets: no shape problem.
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	if err := fkmat.Check(cctx, cfg, fkmat.Options{}); err != nil {
		t.Fatalf("check before the start that widens the targets: %v", err)
	}
	before := followed()
	d = startDaemon(t, cfg, opts)
	waitCaughtUp(t, tc, d)
	if followed() == before {
		t.Fatalf("the start after the widenings widened no target column; logs:\n%s", logs.String())
	}
	assertOracle(t, cfg)
	if after := stateEpochs(t, tc); after != epochs {
		t.Errorf("a join was rebuilt (epochs %v, then %v): a widened type needs no rebuild", epochs, after)
	}
	for table, want := range map[string]string{
		"orders_wide":  "bigint,bigint,numeric(20,6),text,timestamp(3) with time zone,text,timestamp(6) without time zone",
		"orders_chain": "bigint,numeric(20,6),text,text,timestamp(6) without time zone,integer,character varying",
	} {
		var got string
		err := tc.Pool.QueryRow(context.Background(), `SELECT string_agg(format_type(atttypid, atttypmod), ',' ORDER BY attnum)
			FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, table).Scan(&got)
		if err != nil || got != want {
			t.Errorf("%s column types %q, %v; want %q", table, got, err, want)
		}
	}

	// A narrowing after the widenings (text back to varchar) is a type
	// change like any other: it stops the daemon, acknowledging nothing
	// of it, though rows of that narrower type were accepted before the
	// widening.
	sqlExec(t, tc, `ALTER TABLE customers ALTER COLUMN name TYPE varchar(200)`)
	end := commitTxn(t, tc, `UPDATE customers SET name = 'narrowed' WHERE id = 1`)
	select {
	case err := <-d.done:
		d.cancel = nil
		if !errors.Is(err, pipeline.ErrSchemaChanged) || !strings.Contains(err.Error(), "only when it widens") {
			t.Fatalf("after a narrowing: %v, want ErrSchemaChanged", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the daemon kept running after a joined column was narrowed; logs:\n%s", logs.String())
	}
	checkNotAcknowledged(t, tc, end)
	// check finds nothing wrong: the next run rebuilds the join beside
	// the others, and --plan says so.
	if err := fkmat.Check(cctx, cfg, fkmat.Options{}); err != nil {
		t.Fatalf("check after a narrowing: %v, want nil (run rebuilds the join)", err)
	}
	if rp, err := fkmat.Plan(cctx, cfg, fkmat.Options{}); err != nil || len(rp.Joins) == 0 || !strings.Contains(rp.Joins[0].Rebuild, "not maintained") {
		t.Fatalf("check --plan after a narrowing: %+v, %v; want a rebuild with the target not maintained", rp, err)
	}
}

// stateEpochs returns the state epoch of every join of tc's slot: a
// rebuild changes them.
func stateEpochs(t *testing.T, tc *testenv.Case) string {
	t.Helper()
	var epochs string
	err := tc.Pool.QueryRow(context.Background(), `SELECT string_agg(join_name || '=' || epoch, ',' ORDER BY join_name)
		FROM fkmat.join_state WHERE slot = $1`, tc.Slot).Scan(&epochs)
	if err != nil {
		t.Fatal(err)
	}
	return epochs
}

// TestWidenedColumnBehindReader: a reader holding the target while a
// column is widened makes the target's ALTER wait a bounded time and try
// again (no reader queues behind it for longer), and the widening goes
// through once the reader is gone, with the daemon running all along.
func TestWidenedColumnBehindReader(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, widenSchema)
	cfg := daemonConfig(t, tc, widenJoins)
	logs := &syncBuffer{}
	d := startDaemon(t, cfg, fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	waitCaughtUp(t, tc, d)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reader, err := tc.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Rollback(context.Background()) }()
	var n int
	if err := reader.QueryRow(ctx, `SELECT count(*) FROM orders_wide`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `ALTER TABLE orders ALTER COLUMN amount TYPE numeric(14,4)`, `UPDATE orders SET amount = 0.1234 WHERE id % 7 = 0`)
	waitFor(t, time.Minute, "the widening to wait for the reader", func() bool {
		return strings.Contains(logs.String(), "waits for its readers")
	})
	// Other readers are not queued behind the waiting ALTER for longer
	// than its lock timeout.
	start := time.Now()
	var m int
	if err := tc.Pool.QueryRow(ctx, `SELECT count(*) FROM orders_wide`).Scan(&m); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > 15*time.Second {
		t.Errorf("a reader waited %s behind the widening", waited)
	}
	if err := reader.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if !strings.Contains(logs.String(), "followed a widened column type") {
		t.Fatalf("the widening never went through:\n%s", logs.String())
	}
	select {
	case err := <-d.done:
		d.cancel = nil
		t.Fatalf("the daemon stopped: %v", err)
	default:
	}
	if err := d.stop(t); err != nil {
		t.Fatalf("clean shutdown: %v", err)
	}
}
