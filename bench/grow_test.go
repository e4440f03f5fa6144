package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/fkmat/fkmat/redisstore"
)

// w8 (a state that grows from empty): W8Customers customers in five
// regions and no orders when the joins start; W8Orders orders then arrive
// through the stream. Two joins of orders: the two-table orders →
// customers, and the chain orders → customers → regions.
func w8(s sizes) *workload {
	return &workload{name: "W8", title: "state grown from empty", orders: s.W8Orders, yaml: w8YAML, setup: []string{`
CREATE TABLE regions (id int PRIMARY KEY, name text);
CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text);
INSERT INTO regions SELECT g, 'region ' || g FROM generate_series(1, 5) g;`,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, 1 + g %% 5 FROM generate_series(1, %d) g`, s.W8Customers),
		`VACUUM ANALYZE`}}
}

const w8YAML = `
joins:
  - name: orders_customers
    type: left
    left: {table: orders, foreign_key: [customer_id]}
    right: {table: customers, columns: [name AS customer_name]}
    target: {table: orders_customers}
  - name: orders_regions
    type: left
    left: {table: orders}
    right:
      - {table: customers, foreign_key: [customer_id], columns: [name AS customer_name]}
      - {table: regions, from: customers, foreign_key: [region_id], columns: [name AS region_name]}
    target: {table: orders_regions}
`

// The SQL of each join, in the target's column order.
const (
	w8PairTarget = `SELECT id, customer_id, amount, note, customer_name FROM orders_customers`
	w8PairSQL    = `SELECT o.id, o.customer_id, o.amount, o.note, c.name FROM orders o LEFT JOIN customers c ON o.customer_id = c.id`
	w8TreeTarget = `SELECT id, customer_id, amount, note, customer_name, region_name FROM orders_regions`
	w8TreeSQL    = `SELECT o.id, o.customer_id, o.amount, o.note, c.name, r.name
	FROM orders o LEFT JOIN customers c ON o.customer_id = c.id LEFT JOIN regions r ON c.region_id = r.id`
)

// benchW8 measures the Redis state of joins started on an empty table
// that grows to W8Orders rows through the stream, three ways: grown
// without resizing (run --grow-check-interval 1000h, the layout of the
// backfill of the empty table), grown with run resizing the states (every
// 2 s), and backfilled at the full size (backfill --force); and how long
// the stream waited for the resizes.
func benchW8(t *testing.T, s sizes, rep *report) {
	w := w8(s)
	name := w.name + " " + w.title
	n := float64(s.W8Orders)
	d := newDB(t, w)
	env := d.env
	// perOrder returns the Redis bytes per order of both joins.
	perOrder := func() (pair, tree float64) {
		// backfill --force of streaming joins rebuilds them beside: a new
		// generation of their state.
		k := d.redisKeysOf(redisstore.StatePrefixes(d.Slot, "orders_customers", 0, d.generation("orders_customers"))[0])
		pair = k.bytes[redisstore.KindLeft] + k.bytes[redisstore.KindSubs] + k.bytes[redisstore.KindRight]
		for _, prefix := range redisstore.StatePrefixes(d.Slot, "orders_regions", 2, d.generation("orders_regions")) {
			k := d.redisKeysOf(prefix)
			tree += k.bytes[redisstore.KindLeft] + k.bytes[redisstore.KindSubs]
		}
		return pair / n, tree / n
	}
	// grow backfills the empty orders, runs the daemon with the grow check
	// interval while the orders arrive in transactions of 20k (each
	// session reports its statistics as a busy one does), and returns the
	// time until caught up and the resizes run did.
	grow := func(interval string) (took time.Duration, resizes, waited float64) {
		t.Helper()
		d.exec(`TRUNCATE orders; SELECT pg_stat_force_next_flush()`)
		d.env = env
		d.backfill()
		d.env = append(env, "FKMAT_GROW_CHECK_INTERVAL="+interval)
		p := d.run("w8-" + interval)
		p.waitServing()
		d.waitCaught(p)
		start := time.Now()
		for lo := 1; lo <= s.W8Orders; lo += 20_000 {
			d.exec(fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% %d, g %% 1000, 'order ' || g
				FROM generate_series(%d, %d) g; SELECT pg_stat_force_next_flush()`, s.W8Customers, lo, min(lo+19_999, s.W8Orders)))
		}
		d.waitCaught(p)
		took = time.Since(start)
		// Settled: no resize for three check intervals.
		if interval != "1000h" {
			last, since := p.metric("fkmat_redis_resizes_total"), time.Now()
			for time.Since(since) < 6*time.Second {
				if r := p.metric("fkmat_redis_resizes_total"); r != last {
					last, since = r, time.Now()
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		resizes, waited = p.metric("fkmat_redis_resizes_total"), p.metric("fkmat_redis_resize_seconds_total")
		p.stop()
		d.env = env
		d.assertQuery("orders_customers", w8PairTarget, w8PairSQL)
		d.assertQuery("orders_regions", w8TreeTarget, w8TreeSQL)
		return took, resizes, waited
	}

	fixedTook, _, _ := grow("1000h")
	fixedPair, fixedTree := perOrder()
	grownTook, resizes, waited := grow("2s")
	grownPair, grownTree := perOrder()
	d.backfill()
	d.assertQuery("orders_customers", w8PairTarget, w8PairSQL)
	d.assertQuery("orders_regions", w8TreeTarget, w8TreeSQL)
	backPair, backTree := perOrder()

	for _, j := range []struct {
		join                 string
		fixed, grown, filled float64
	}{{"two-table orders_customers", fixedPair, grownPair, backPair}, {"chain orders_regions", fixedTree, grownTree, backTree}} {
		rep.row(name, "Redis per order, "+j.join+": grown, not resized", j.fixed, "B", fmt.Sprintf("%.2fx the backfilled state", j.fixed/j.filled), false)
		rep.row(name, "Redis per order, "+j.join+": grown and resized", j.grown, "B", fmt.Sprintf("%.2fx the backfilled state", j.grown/j.filled), false)
		rep.row(name, "Redis per order, "+j.join+": backfilled", j.filled, "B", "", false)
	}
	rep.row(name, fmt.Sprintf("stream of %d orders into both joins, not resized", s.W8Orders), fixedTook.Seconds(), "s",
		fmt.Sprintf("%.0f orders/s", n/fixedTook.Seconds()), false)
	rep.row(name, fmt.Sprintf("stream of %d orders into both joins, resized", s.W8Orders), grownTook.Seconds(), "s",
		fmt.Sprintf("%.0f orders/s; %.0f resizes, the stream waited %.2f s for them", n/grownTook.Seconds(), resizes, waited), false)
}
