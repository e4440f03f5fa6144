package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// nwayWideYAML is the SPEC's example of a join of more than two tables, with
// customers joined a second time through `as` (the order's seller).
const nwayWideYAML = `joins:
  - name: orders_wide
    type: left
    left:
      table: public.orders
      columns: [id, customer_id, product_id, amount]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        columns: [name AS customer_name]
      - table: public.products
        type: inner
        foreign_key: [product_id]
        columns: [title AS product_title]
      - table: public.regions
        from: customers
        foreign_key: [region_id]
        columns: [name AS region_name]
      - table: public.customers
        as: seller
        foreign_key: [seller_id]
        columns: [name AS seller_name]
    target:
      table: public.orders_wide
`

const nwaySchema = `
CREATE TABLE regions (id int PRIMARY KEY, name text);
CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int, bio text);
CREATE TABLE products (id bigint PRIMARY KEY, title text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, product_id bigint, amount numeric(12,2), seller_id bigint, note text);
ALTER TABLE customers ALTER COLUMN bio SET STORAGE EXTERNAL;
`

// TestNWaySpecExample runs the daemon on the SPEC's example of a join of
// more than two tables (a star and a chain: orders → customers, products;
// customers → regions), with customers joined twice through as: backfill,
// then changes of every table (a region rename fanning out to the orders of
// its customers, a customer moving region, NULL and dangling foreign keys,
// key changes, an unchanged TOASTed column, a product deleted under an inner
// entry, TRUNCATE of the inner entry's table and of the last entry's), a
// restart, status per entry, and teardown. After every phase the target
// equals the SPEC's SQL.
func TestNWaySpecExample(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, nwaySchema,
		`INSERT INTO regions VALUES (1, 'north'), (2, 'south'), (3, 'east')`,
		`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 7 = 0 THEN NULL ELSE 1 + g % 3 END, repeat('b', 3000) FROM generate_series(1, 60) g`,
		`INSERT INTO products SELECT g, 'p' || g FROM generate_series(1, 12) g`,
		`INSERT INTO orders SELECT g, CASE WHEN g % 19 = 0 THEN NULL ELSE 1 + g % 65 END, 1 + g % 14, g, 1 + g % 61, 'n'
			FROM generate_series(1, 2000) g`)
	cfg := daemonConfig(t, tc, nwayWideYAML)
	env := cliEnv(t, tc, nwayWideYAML)
	if r := runCLI(t, env, "check"); r.code != 0 {
		t.Fatalf("check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	logs := &syncBuffer{}
	opts := fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))}
	d := startDaemon(t, cfg, opts)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	sqlExec(t, tc,
		`UPDATE regions SET name = 'NORTH' WHERE id = 1`,  // fans out over the orders of its customers
		`UPDATE customers SET region_id = 3 WHERE id = 5`, // moves its orders' region
		`UPDATE customers SET region_id = NULL WHERE id = 8`,
		`UPDATE customers SET region_id = 99 WHERE id = 10`,   // dangling
		`UPDATE customers SET name = 'renamed' WHERE id = 12`, // a customer and a seller
		`UPDATE customers SET id = 1000 WHERE id = 13`,        // key change, bio unchanged (TOAST)
		`UPDATE regions SET id = 20 WHERE id = 2`,
		`DELETE FROM products WHERE id = 3`, // an inner entry: its orders leave
		`INSERT INTO products VALUES (13, 'new'), (3, 'back')`,
		`UPDATE orders SET customer_id = NULL WHERE id BETWEEN 1 AND 20`,
		`UPDATE orders SET product_id = 99 WHERE id BETWEEN 21 AND 30`, // dangling under inner: gone
		`UPDATE orders SET id = id + 10000 WHERE id BETWEEN 31 AND 40`,
		`UPDATE orders SET amount = amount + 1, seller_id = 12 WHERE id BETWEEN 41 AND 200`,
		`DELETE FROM customers WHERE id = 20`,
		`BEGIN; UPDATE regions SET name = 'N2' WHERE id = 1; UPDATE customers SET region_id = 1 WHERE id = 6; UPDATE regions SET name = 'N3' WHERE id = 1; COMMIT`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	// TRUNCATE of the inner entry's table empties the join's rows
	// without a rebuild. A TRUNCATE of a left entry's table before the
	// last entry changes every row of the later steps: the join is rebuilt.
	sqlExec(t, tc, `TRUNCATE products`, `INSERT INTO products SELECT g, 'q' || g FROM generate_series(1, 5) g`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if strings.Contains(logs.String(), "is lost") {
		t.Fatalf("a TRUNCATE of an inner entry's table rebuilt the join:\n%s", logs.String())
	}
	sqlExec(t, tc, `TRUNCATE regions`, `INSERT INTO regions VALUES (1, 'again')`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if !strings.Contains(logs.String(), "is lost") {
		t.Errorf("a TRUNCATE of regions (a left entry before the last) did not rebuild the join:\n%s", logs.String())
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}

	// Changes while stopped, then a restart.
	sqlExec(t, tc, `UPDATE customers SET name = 'while-stopped' WHERE id < 10`, `INSERT INTO orders VALUES (5000, 3, 2, 1, 4, 'x')`)
	d = startDaemon(t, cfg, opts)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, env, "status", "--json")
	var st []fkmat.JoinStatus
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s%s", err, r.stdout, r.stderr)
	}
	if len(st) != 1 || len(st[0].Edges) != 4 || st[0].RedisState != "ok" {
		t.Fatalf("status = %+v", st)
	}
	var sum int64
	for i, want := range []string{"customers", "products", "regions", "seller"} {
		e := st[0].Edges[i]
		if e.Entry != want || e.Subscriptions <= 0 {
			t.Errorf("edge %d = %+v, want %s with subscriptions", i, e, want)
		}
		sum += e.Subscriptions
	}
	if st[0].Subscriptions != sum {
		t.Errorf("subscriptions %d, the edges' sum %d", st[0].Subscriptions, sum)
	}
	if r := runCLI(t, env, "verify"); r.code != 0 {
		t.Fatalf("verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "teardown"); r.code != 0 {
		t.Fatalf("teardown: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if keys, err := tc.Redis.Keys(ctx, fkmat.RedisPrefix(tc.Slot, "orders_wide")+"*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("teardown left %d keys (%v): %s", len(keys), err, strings.Join(keys[:min(len(keys), 5)], " "))
	}
}

// TestNWayFanOutPages: a fan-out through an entry before the last (a
// customer rename reaching its orders, with regions after customers) larger
// than --chain-page-rows. In a batch of small transactions it cannot be
// written in pages, so the daemon applies the batch's transactions one at a
// time as large ones, writing each page of the fan-out's state as it goes
// (undone whole after a crash); in a large transaction it pages at once.
// The target equals the SPEC's SQL after each.
func TestNWayFanOutPages(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, nwaySchema,
		`INSERT INTO regions VALUES (1, 'north'), (2, 'south')`,
		`INSERT INTO customers SELECT g, 'c' || g, 1 + g % 2, repeat('b', 3000) FROM generate_series(1, 10) g`,
		`INSERT INTO products SELECT g, 'p' || g FROM generate_series(1, 5) g`,
		`INSERT INTO orders SELECT g, CASE WHEN g <= 600 THEN 1 ELSE 2 + g % 9 END, 1 + g % 5, g, 1 + g % 10, 'n'
			FROM generate_series(1, 900) g`)
	cfg := daemonConfig(t, tc, nwayWideYAML)
	logs := &syncBuffer{}
	opts := fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), ChainPageRows: 50}
	d := startDaemon(t, cfg, opts)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	// Small transactions, one of them reaching 600 orders through
	// customers (and 60 through the seller entry).
	sqlExec(t, tc,
		`INSERT INTO orders VALUES (2000, 1, 1, 5, 2, 'x')`,
		`UPDATE customers SET name = 'renamed' WHERE id = 1`,
		`UPDATE orders SET amount = amount + 1 WHERE id = 2000`,
		`UPDATE customers SET region_id = 2 WHERE id = 1`, // its orders move region
		`UPDATE regions SET name = 'NORTH' WHERE id = 1`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if !strings.Contains(logs.String(), "in pages") {
		t.Errorf("a fan-out of 600 rows through customers, pages of 50: the batch was not applied in pages:\n%s", logs.String())
	}
	// One transaction: the fan-out, changes of its rows before and after
	// it, and a key change of the customer.
	sqlExec(t, tc, `BEGIN;
		UPDATE orders SET amount = 0 WHERE id BETWEEN 1 AND 100;
		UPDATE customers SET name = 'again', region_id = 1 WHERE id = 1;
		DELETE FROM orders WHERE id BETWEEN 101 AND 150;
		UPDATE customers SET id = 100 WHERE id = 2;
		UPDATE orders SET customer_id = 100 WHERE id BETWEEN 151 AND 160;
		INSERT INTO orders SELECT g, 1, 1, g, 1, 'y' FROM generate_series(3000, 3100) g;
		COMMIT`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
