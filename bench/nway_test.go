package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fkmat/fkmat/redisstore"
)

// w6 (joins of more than two tables): one region with W6Customers
// customers of W6PerCustomer orders each, maintained as the chain orders →
// customers → regions; beside it, in the same database and the same
// daemon, a two-table join of as many payments, all of one account.
func w6(s sizes) *workload {
	n := s.W6Customers * s.W6PerCustomer
	return &workload{name: "W6", title: "n-way fan-out", orders: n, yaml: w6YAML, setup: []string{`
CREATE TABLE regions (id int PRIMARY KEY, name text);
CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2));
CREATE TABLE accounts (id bigint PRIMARY KEY, name text);
CREATE TABLE payments (id bigint PRIMARY KEY, account_id bigint, amount numeric(12,2));
INSERT INTO regions VALUES (1, 'north'), (2, 'south');
INSERT INTO accounts VALUES (1, 'account');`,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, 1 FROM generate_series(1, %d) g`, s.W6Customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + (g - 1) / %d, g %% 1000 FROM generate_series(1, %d) g`, s.W6PerCustomer, n),
		fmt.Sprintf(`INSERT INTO payments SELECT g, 1, g %% 1000 FROM generate_series(1, %d) g`, n),
		`VACUUM ANALYZE`}}
}

const w6YAML = `
joins:
  - name: orders_wide
    type: left
    left: {table: orders}
    right:
      - {table: customers, foreign_key: [customer_id], columns: [name AS customer_name]}
      - {table: regions, from: customers, foreign_key: [region_id], columns: [name AS region_name]}
    target: {table: orders_wide}
  - name: payments_wide
    type: left
    left: {table: payments, foreign_key: [account_id]}
    right: {table: accounts, columns: [name AS account_name]}
    target: {table: payments_wide}
`

// The SQL of each join, in the target's column order.
const (
	w6OrdersSQL = `SELECT o.id, o.customer_id, o.amount, c.name, r.name
	FROM orders o LEFT JOIN customers c ON o.customer_id = c.id LEFT JOIN regions r ON c.region_id = r.id`
	w6PaymentsSQL = `SELECT p.id, p.account_id, p.amount, a.name FROM payments p LEFT JOIN accounts a ON p.account_id = a.id`
)

// benchW6 measures, through the daemon in one run, a grandparent fan-out (a
// region rename reaching every order of its customers) against a two-table
// fan-out writing as many rows (an account rename reaching its payments),
// alternately, W6Rounds times each; then a fan-out through the
// intermediate entry (every customer renamed in one transaction: the
// customers step passes all orders on to the regions step, in pages); and
// the Redis memory of each entry's state next to the two-table join's.
func benchW6(t *testing.T, s sizes, rep *report) {
	w := w6(s)
	name := w.name + " " + w.title
	n := w.orders
	d := newDB(t, w)
	bf := d.backfill()
	d.assertQuery("orders_wide", `SELECT id, customer_id, amount, customer_name, region_name FROM orders_wide`, w6OrdersSQL)
	d.assertQuery("payments_wide", `SELECT id, account_id, amount, account_name FROM payments_wide`, w6PaymentsSQL)

	// Redis memory per table of the tree (its rows and its references),
	// all of it per order, and the two-table join's per left row.
	var all float64
	for tab, entry := range []string{"orders", "customers", "regions"} {
		k := d.redisKeysOf(redisstore.TablePrefix(d.Slot, "orders_wide", tab))
		rows := []float64{float64(n), float64(s.W6Customers), 2}[tab]
		rep.row(name, "Redis memory, "+entry+": per row", k.bytes[redisstore.KindLeft]/rows, "B", k.encodingSummary(redisstore.KindLeft), false)
		if tab < 2 {
			rep.row(name, "Redis memory, "+entry+": references per row", k.bytes[redisstore.KindSubs]/rows, "B", k.encodingSummary(redisstore.KindSubs), false)
		}
		all += k.bytes[redisstore.KindLeft] + k.bytes[redisstore.KindSubs]
	}
	rep.row(name, "Redis memory, all tables: per order", all/float64(n), "B", "", false)
	k := d.redisKeysOf(redisstore.Prefix(d.Slot, "payments_wide"))
	rep.row(name, "Redis memory, two-table accounts: per left row", (k.bytes[redisstore.KindLeft]+k.bytes[redisstore.KindSubs])/float64(n), "B", "", false)

	// fanOut runs sql and returns the time until p has written n more
	// target rows.
	fanOut := func(p *daemon, sql string) time.Duration {
		t.Helper()
		return p.writeRows(sql, int64(n), 10*time.Minute)
	}
	p := d.run("nway")
	p.waitServing()
	d.waitCaught(p)
	var chain, two []time.Duration
	for r := range s.W6Rounds {
		chain = append(chain, fanOut(p, fmt.Sprintf(`UPDATE regions SET name = 'north %d' WHERE id = 1`, r)))
		two = append(two, fanOut(p, fmt.Sprintf(`UPDATE accounts SET name = 'account %d' WHERE id = 1`, r)))
	}
	d.waitCaught(p)
	u := p.stop()
	writes := u.upserted + u.deleted
	d.assertQuery("orders_wide", `SELECT id, customer_id, amount, customer_name, region_name FROM orders_wide`, w6OrdersSQL)
	d.assertQuery("payments_wide", `SELECT id, account_id, amount, account_name FROM payments_wide`, w6PaymentsSQL)

	slices.Sort(chain)
	slices.Sort(two)
	ratio := median(chain).Seconds() / median(two).Seconds()
	list := func(ds []time.Duration) string {
		out := ""
		for _, d := range ds {
			out += fmt.Sprintf(" %.3f", d.Seconds())
		}
		return out
	}
	rep.row(name, fmt.Sprintf("region rename → %d customers → %d orders each (median of %d)", s.W6Customers, s.W6PerCustomer, len(chain)),
		median(chain).Seconds(), "s", fmt.Sprintf("%d target rows; runs (s):%s", n, list(chain)), true)
	rep.row(name, fmt.Sprintf("two-table fan-out of %d rows, same daemon (median of %d)", n, len(two)),
		median(two).Seconds(), "s", "an account rename over its payments; runs (s):"+list(two), true)
	rep.row(name, "grandparent / two-table fan-out time", ratio, "x", "medians, measured alternately in one run", false)
	rep.row(name, "fkmat peak RSS, backfill", bf.peakRSSMB, "MB", "", false)
	rep.row(name, "fkmat peak RSS, run (the fan-outs above)", u.peakRSSMB, "MB", "", false)
	rep.rss = max(rep.rss, u.peakRSSMB, bf.peakRSSMB)

	// A fan-out through the middle table: every customer renamed in one
	// transaction, each customer reaching its orders, in a fresh daemon
	// whose peak RSS is its own.
	{
		p := d.run("nway-customers")
		p.waitServing()
		d.waitCaught(p)
		took := fanOut(p, `UPDATE customers SET name = 'customer renamed ' || id`)
		d.waitCaught(p)
		u := p.stop()
		writes += u.upserted + u.deleted
		d.assertQuery("orders_wide", `SELECT id, customer_id, amount, customer_name, region_name FROM orders_wide`, w6OrdersSQL)
		rep.row(name, "every customer renamed in one transaction", took.Seconds(), "s",
			fmt.Sprintf("%d target rows; peak RSS %.0f MB", n, u.peakRSSMB), true)
		rep.rss = max(rep.rss, u.peakRSSMB)
	}
	if want := float64((2*s.W6Rounds + 1) * n); writes > want {
		t.Errorf("fkmat wrote %.0f target rows, more than the %.0f the SQL results changed by", writes, want)
	}
	rep.target("W6 grandparent fan-out within 2x of a two-table fan-out of as many rows", ratio, "<=", 2, "x")
}
