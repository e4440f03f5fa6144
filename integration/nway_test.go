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
	"github.com/fkmat/fkmat/redisstore"
)

// nwayWideYAML is the README's example of a join of more than two tables, with
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

// TestNWayExample runs the daemon on the README's example of a join of
// more than two tables (a star and a chain: orders → customers, products;
// customers → regions), with customers joined twice through as: backfill,
// then changes of every table (a region rename fanning out to the orders of
// its customers, a customer moving region, NULL and dangling foreign keys,
// key changes, an unchanged TOASTed column, a product deleted under an inner
// entry, TRUNCATE of the inner entry's table and of the last entry's), a
// restart, status per entry, and teardown. After every phase the target
// equals the join's SQL.
func TestNWayExample(t *testing.T) {
	testenv.Race(t)
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

	// TRUNCATE of the inner entry's table empties the join's rows, and a
	// TRUNCATE of a left entry's table with an entry below it (regions
	// under customers) sets their columns to NULL: both without a rebuild.
	sqlExec(t, tc, `TRUNCATE products`, `INSERT INTO products SELECT g, 'q' || g FROM generate_series(1, 5) g`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if strings.Contains(logs.String(), "is lost") {
		t.Fatalf("a TRUNCATE of an inner entry's table rebuilt the join:\n%s", logs.String())
	}
	sqlExec(t, tc, `TRUNCATE regions`, `INSERT INTO regions VALUES (1, 'again')`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	sqlExec(t, tc, `TRUNCATE customers`, `INSERT INTO customers SELECT g, 'd' || g, 1, 'x' FROM generate_series(1, 30) g`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if strings.Contains(logs.String(), "is lost") {
		t.Errorf("a TRUNCATE of regions or customers rebuilt the join:\n%s", logs.String())
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
	var rep fkmat.StatusReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("status --json: %v\n%s%s", err, r.stdout, r.stderr)
	}
	st := rep.Joins
	if len(st) != 1 || len(st[0].Edges) != 5 || st[0].RedisState != "ok" {
		t.Fatalf("status = %+v", st)
	}
	// A state per table: the rows of orders reference customers,
	// products and sellers, the rows of customers regions.
	var sum int64
	for i, want := range []string{"public.orders", "customers", "products", "regions", "seller"} {
		e := st[0].Edges[i]
		if e.Entry != want || (e.Subscriptions > 0) != (i < 2) {
			t.Errorf("table %d = %+v, want %s with references only for orders and customers", i, e, want)
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
	if keys, err := tc.Redis.Keys(ctx, redisstore.Prefix(tc.Slot, "orders_wide")+"*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("teardown left %d keys (%v): %s", len(keys), err, strings.Join(keys[:min(len(keys), 5)], " "))
	}
}

// TestNWayFanOutPages: fan-outs through a middle table (a customer rename
// reaching its orders, with regions after customers; a region rename
// reaching the orders of its customers) larger than the walk's page, in a
// batch of small transactions and inside one large transaction. A fan-out
// writes no state, only the target, a page of root keys at a time. The
// target equals the join's SQL after each.
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
	opts := fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil)), PageSize: 50}
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

// TestNWaySchemasAndTypes: a chain and a star across three schemas, keyed
// by uuid and by a composite (text, int) key, with jsonb, array and enum
// columns, an entry of a partitioned table, and a self-referencing entry
// (a category's parent category): backfill, changes of every table, and
// the target equal to the SQL after each phase.
func TestNWaySchemasAndTypes(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, `
CREATE SCHEMA crm; CREATE SCHEMA geo;
CREATE TYPE crm.tier AS ENUM ('bronze', 'silver', 'gold');
CREATE TABLE geo.cities (country text, num int, name text, PRIMARY KEY (country, num));
CREATE TABLE crm.customers (id uuid PRIMARY KEY, name text, tier crm.tier, tags text[], prefs jsonb, country text, city_num int);
CREATE TABLE public.categories (id int PRIMARY KEY, label text, parent_id int REFERENCES public.categories);
CREATE TABLE public.sales (id bigint, day date, customer_id uuid, category_id int, amount numeric(10,2), PRIMARY KEY (id, day))
	PARTITION BY RANGE (day);
CREATE TABLE public.sales_2025 PARTITION OF public.sales FOR VALUES FROM ('2025-01-01') TO ('2026-01-01');
CREATE TABLE public.sales_2026 PARTITION OF public.sales FOR VALUES FROM ('2026-01-01') TO ('2027-01-01');
ALTER TABLE public.sales REPLICA IDENTITY USING INDEX sales_pkey;
INSERT INTO geo.cities VALUES ('fr', 1, 'Paris'), ('fr', 2, 'Lyon'), ('de', 1, 'Berlin');
INSERT INTO crm.customers SELECT md5(g::text)::uuid, 'c' || g, (ARRAY['bronze','silver','gold'])[1 + g % 3]::crm.tier,
	ARRAY['t' || g, 'x'], jsonb_build_object('n', g), CASE WHEN g % 2 = 0 THEN 'fr' ELSE 'de' END, 1 + g % 2 FROM generate_series(1, 30) g;
INSERT INTO public.categories VALUES (1, 'root', NULL), (2, 'books', 1), (3, 'comics', 2), (4, 'orphan', NULL);
INSERT INTO public.sales SELECT g, DATE '2025-06-01' + (g % 400), CASE WHEN g % 11 = 0 THEN NULL ELSE md5((1 + g % 33)::text)::uuid END,
	1 + g % 5, g FROM generate_series(1, 600) g;`)
	yml := `joins:
  - name: sales_wide
    type: left
    left:
      table: public.sales
    right:
      - table: crm.customers
        foreign_key: [customer_id]
        columns: [name AS customer_name, tier, tags, prefs]
      - table: geo.cities
        from: customers
        foreign_key: [country, city_num]
        columns: [name AS city]
      - table: public.categories
        type: inner
        foreign_key: [category_id]
        columns: [label]
      - table: public.categories
        as: parent
        from: categories
        foreign_key: [parent_id]
        columns: [label AS parent_label]
    target:
      table: public.sales_wide
`
	env := cliEnv(t, tc, yml)
	if r := runCLI(t, env, "check"); r.code != 0 {
		t.Fatalf("check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	cfg := daemonConfig(t, tc, yml)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	sqlExec(t, tc,
		`UPDATE geo.cities SET name = 'PARIS' WHERE country = 'fr' AND num = 1`,
		`UPDATE geo.cities SET num = 3 WHERE country = 'de' AND num = 1`, // a composite key change: its customers' city dangles
		`UPDATE crm.customers SET tags = tags || ARRAY['y'], prefs = prefs || '{"vip": true}', tier = 'gold' WHERE tier = 'bronze'`,
		`UPDATE crm.customers SET country = 'de', city_num = 3 WHERE name = 'c4'`,
		`UPDATE crm.customers SET id = gen_random_uuid() WHERE name = 'c5'`,
		`UPDATE public.categories SET parent_id = 3 WHERE id = 4`, // a category under another: its sales get a parent
		`UPDATE public.categories SET label = 'BOOKS' WHERE id = 2`,
		`DELETE FROM public.categories WHERE id = 5`,                                // no such row: nothing
		`UPDATE public.sales SET day = DATE '2026-03-01' WHERE id BETWEEN 1 AND 20`, // moves partition
		`UPDATE public.sales SET category_id = 3, amount = amount + 1 WHERE id BETWEEN 21 AND 40`,
		`DELETE FROM public.sales WHERE id BETWEEN 41 AND 50`,
		`INSERT INTO public.sales VALUES (9001, '2026-05-05', md5('7')::uuid, 4, 1), (9002, '2025-02-02', NULL, 9, 2)`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	if r := runCLI(t, env, "verify"); r.code != 0 {
		t.Fatalf("verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
