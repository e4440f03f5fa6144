package integration

import (
	"fmt"
	"testing"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/testenv"
)

// rollupYAML is the SPEC's customer_stats: customers with their region,
// their orders rolled up (a filter, every kind of aggregate) and their
// open tickets counted.
const rollupYAML = `
joins:
  - name: customer_stats
    type: left
    left:
      table: public.customers
      columns: [id, name]
    right:
      - table: public.regions
        foreign_key: [region_id]
        columns: [name AS region]
    rollups:
      - table: public.orders
        foreign_key: [customer_id]
        where: "status <> 'cancelled'"
        aggregates: ["count(*) AS orders", "count(coupon) AS with_coupon", "sum(amount) AS revenue", "avg(amount) AS mean",
                     "sum(qty) AS items", "avg(qty) AS mean_qty", "min(amount) AS smallest", "max(created) AS last_order",
                     "max(status COLLATE \"C\") AS top_status", "bool_and(qty > 1) AS all_multi", "bool_or(amount > 100) AS any_big",
                     "jsonb_agg(jsonb_build_object('id', id, 'amount', amount) ORDER BY created DESC LIMIT 3) AS recent",
                     "jsonb_agg(id ORDER BY id) AS ids"]
      - table: public.tickets
        foreign_key: [customer_id]
        where: "state = 'open'"
        aggregates: ["count(*) AS open_tickets"]
    target:
      table: public.customer_stats
`

// rollupSQL is what rollupYAML means, written out as the SPEC defines a
// roll-up: a correlated subquery per aggregate.
const rollupSQL = `SELECT c.id, c.name, g.name AS region,
	(SELECT count(*) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS orders,
	(SELECT count(coupon) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS with_coupon,
	(SELECT sum(amount) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS revenue,
	(SELECT avg(amount) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS mean,
	(SELECT sum(qty) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS items,
	(SELECT avg(qty) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS mean_qty,
	(SELECT min(amount) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS smallest,
	(SELECT max(created) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS last_order,
	(SELECT max(status COLLATE "C") FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS top_status,
	(SELECT bool_and(qty > 1) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS all_multi,
	(SELECT bool_or(amount > 100) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS any_big,
	(SELECT jsonb_agg(e ORDER BY k) FROM (SELECT jsonb_build_object('id', id, 'amount', amount) AS e,
		row_number() OVER (ORDER BY created DESC, id) AS k FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') s WHERE k <= 3) AS recent,
	(SELECT jsonb_agg(id ORDER BY id) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS ids,
	(SELECT count(*) FROM tickets k WHERE k.customer_id = c.id AND state = 'open') AS open_tickets
	FROM customers c LEFT JOIN regions g ON c.region_id = g.id`

func rollupSchema(t *testing.T, tc *testenv.Case, partitioned bool) {
	orders := `CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), qty int, status text,
		created timestamptz, coupon text, note text)`
	if partitioned {
		orders += ` PARTITION BY RANGE (id)`
	}
	sqlExec(t, tc,
		`CREATE TABLE regions (id int PRIMARY KEY, name text)`,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int)`,
		`CREATE TABLE tickets (id int PRIMARY KEY, customer_id bigint, state text)`,
		orders)
	if partitioned {
		sqlExec(t, tc, `CREATE TABLE orders_a PARTITION OF orders FOR VALUES FROM (MINVALUE) TO (200)`,
			`CREATE TABLE orders_b PARTITION OF orders FOR VALUES FROM (200) TO (MAXVALUE)`)
	}
	sqlExec(t, tc,
		`INSERT INTO regions SELECT g, 'R' || g FROM generate_series(1, 4) g`,
		`INSERT INTO customers SELECT g, 'Cust ' || g, CASE WHEN g % 6 = 0 THEN NULL ELSE 1 + g % 5 END FROM generate_series(1, 30) g`,
		// Customers 26-30 have no orders; 31-33 do not exist (dangling);
		// some orders have no customer.
		`INSERT INTO orders SELECT g, CASE WHEN g % 17 = 0 THEN NULL ELSE 1 + g % 33 END, CASE WHEN g % 10 = 0 THEN NULL ELSE g * 0.75 END,
			g % 4, CASE g % 5 WHEN 0 THEN 'cancelled' WHEN 1 THEN 'paid' ELSE 'open' END,
			timestamptz '2026-01-01 00:00:00+00' + (g % 40) * interval '1 hour', CASE WHEN g % 3 = 0 THEN 'c' || g END,
			CASE WHEN g % 11 = 0 THEN (SELECT string_agg(md5(g::text || i), '') FROM generate_series(1, 300) i) END
			FROM generate_series(1, 400) g`,
		`INSERT INTO tickets SELECT g, 1 + g % 20, CASE WHEN g % 3 = 0 THEN 'closed' ELSE 'open' END FROM generate_series(1, 60) g`)
}

// TestRollups: a join of customers with their region, their orders rolled
// up and their open tickets counted, through the backfill and every
// transition of a child (inserted, updated, moved to another parent,
// entering and leaving the filter, a NULL or dangling parent, key changes,
// several changes in one transaction, the extreme of a min or max deleted,
// an unchanged TOASTed value), of a parent (inserted after its children,
// deleted, re-keyed), a restart, and TRUNCATE of the child and of the parent
// table, plain and with the orders partitioned. Each step ends equal to the
// aggregates' SQL written out by hand and to verify.
func TestRollups(t *testing.T) {
	plan.EnableRollups()
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned %v", partitioned), func(t *testing.T) { rollups(t, partitioned) })
	}
}

func rollups(t *testing.T, partitioned bool) {
	tc := testenv.New(t)
	rollupSchema(t, tc, partitioned)
	cfg := daemonConfig(t, tc, rollupYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	check := func(step string) {
		t.Helper()
		waitCaughtUp(t, tc, d)
		t.Logf("step %s", step)
		assertSQL(t, tc, "customer_stats", rollupSQL)
		assertOracle(t, cfg)
	}
	check("backfill")
	for i, step := range [][]string{
		{`INSERT INTO orders VALUES (1000, 26, 5.5, 2, 'paid', now(), NULL, NULL)`},                                        // a first child
		{`UPDATE orders SET amount = amount + 1 WHERE id % 7 = 1`},                                                         // updated
		{`UPDATE orders SET customer_id = 1 + (customer_id + 4) % 30 WHERE id % 9 = 2`},                                    // moved
		{`UPDATE orders SET status = 'cancelled' WHERE id % 8 = 3`},                                                        // leave the filter
		{`UPDATE orders SET status = 'paid' WHERE id % 10 = 5 AND status = 'cancelled'`},                                   // enter it
		{`UPDATE orders SET customer_id = NULL WHERE id % 23 = 4`, `UPDATE orders SET customer_id = 99 WHERE id % 29 = 6`}, // NULL, dangling
		{`UPDATE orders SET id = id + 2000 WHERE id % 13 = 7`},                                                             // key changes
		{`UPDATE orders SET qty = qty + 1 WHERE id % 11 = 0`},                                                              // TOASTed note unchanged
		{`DELETE FROM orders WHERE (customer_id, amount) IN (SELECT customer_id, min(amount) FROM orders WHERE status <> 'cancelled' GROUP BY 1)`},
		{`DELETE FROM orders WHERE (customer_id, created) IN (SELECT customer_id, max(created) FROM orders WHERE status <> 'cancelled' GROUP BY 1)`},
		{`BEGIN; INSERT INTO orders VALUES (3000, 5, 1, 1, 'open', now(), 'x', NULL); UPDATE orders SET customer_id = 6 WHERE id = 3000;
		  UPDATE orders SET status = 'cancelled' WHERE id = 3000; UPDATE orders SET status = 'paid', amount = 1000 WHERE id = 3000;
		  DELETE FROM orders WHERE id = 1; INSERT INTO orders VALUES (1, 7, 2, 2, 'open', now(), NULL, NULL); COMMIT`},
		{`INSERT INTO customers VALUES (31, 'late', 1)`}, // a parent after its children
		{`DELETE FROM customers WHERE id IN (2, 3)`},     // parents deleted
		{`UPDATE customers SET id = 40 WHERE id = 4`},    // a parent re-keyed: it has no children now
		{`UPDATE customers SET id = 3 WHERE id = 5`},     // and one that takes a key with children
		{`UPDATE regions SET name = name || '!'`},        // the right entry
		{`UPDATE tickets SET state = 'closed' WHERE id % 4 = 0`, `DELETE FROM tickets WHERE id % 7 = 0`},
	} {
		sqlExec(t, tc, step...)
		check(fmt.Sprint(i))
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE orders SET status = CASE status WHEN 'cancelled' THEN 'paid' ELSE 'cancelled' END WHERE id % 3 = 0`,
		`INSERT INTO orders SELECT g, 1 + g % 31, g, 3, 'open', now(), NULL, NULL FROM generate_series(5000, 5200) g`)
	d = startDaemon(t, cfg, fkmat.Options{})
	check("restart")
	sqlExec(t, tc, `TRUNCATE orders`)
	check("truncate orders")
	sqlExec(t, tc, `INSERT INTO orders SELECT g, 1 + g % 31, g, 2, 'open', now(), NULL, NULL FROM generate_series(1, 50) g`)
	check("orders again")
	sqlExec(t, tc, `TRUNCATE customers`)
	check("truncate customers")
	sqlExec(t, tc, `INSERT INTO customers SELECT g, 'again ' || g, 1 FROM generate_series(1, 10) g`)
	check("customers again")
}
