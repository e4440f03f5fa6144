package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// rollupYAML is customer_stats: customers with their region,
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

// rollupSQL is what rollupYAML means, written out as a roll-up is defined:
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
		// Tickets of customer 31 too, which does not exist yet: the
		// tickets' results, computed by the children's load, wait for it.
		`INSERT INTO tickets SELECT g, CASE WHEN g % 13 = 0 THEN 31 ELSE 1 + g % 20 END, CASE WHEN g % 3 = 0 THEN 'closed' ELSE 'open' END
			FROM generate_series(1, 60) g`)
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
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned %v", partitioned), func(t *testing.T) { rollups(t, partitioned) })
	}
}

func rollups(t *testing.T, partitioned bool) {
	tc := testenv.New(t)
	rollupSchema(t, tc, partitioned)
	cfg := daemonConfig(t, tc, rollupYAML)
	checkRollupPlan(t, tc, rollupYAML, 5)
	// max(id) and the latest by id share one: id is the key.
	checkRollupPlan(t, tc, `
joins:
  - name: customer_stats
    type: left
    left: {table: public.customers, columns: [id, name]}
    rollups:
      - table: public.orders
        foreign_key: [customer_id]
        where: "status <> 'cancelled'"
        aggregates: ["max(id) AS last_id", "jsonb_agg(amount ORDER BY id DESC LIMIT 2) AS latest"]
    target: {table: public.customer_stats}
`, 1)
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
	if partitioned {
		// Partitions leave and come back with their rows, without a row
		// change in the WAL; one is dropped with its rows.
		sqlExec(t, tc, `ALTER TABLE orders DETACH PARTITION orders_b`)
		check("partition detached")
		sqlExec(t, tc, `ALTER TABLE orders ATTACH PARTITION orders_b FOR VALUES FROM (200) TO (MAXVALUE)`)
		check("partition attached")
		sqlExec(t, tc, `CREATE TABLE orders_z (LIKE orders)`,
			`INSERT INTO orders_z SELECT g, 1 + g % 30, g, 2, 'open', now(), NULL, NULL FROM generate_series(-300, -1) g`,
			`ALTER TABLE orders DETACH PARTITION orders_a`,
			`CREATE TABLE orders_a2 PARTITION OF orders FOR VALUES FROM (0) TO (200)`,
			`INSERT INTO orders_a2 SELECT * FROM orders_a WHERE id >= 0`,
			`ALTER TABLE orders ATTACH PARTITION orders_z FOR VALUES FROM (MINVALUE) TO (0)`)
		check("a filled table attached")
		sqlExec(t, tc, `DROP TABLE orders_a`, `DROP TABLE orders_a2`)
		check("partition dropped")
		sqlExec(t, tc, `CREATE TABLE orders_a3 PARTITION OF orders FOR VALUES FROM (0) TO (200)`)
	}
	sqlExec(t, tc, `TRUNCATE orders`)
	check("truncate orders")
	sqlExec(t, tc, `INSERT INTO orders SELECT g, 1 + g % 31, g, 2, 'open', now(), NULL, NULL FROM generate_series(1, 50) g`)
	check("orders again")
	sqlExec(t, tc, `TRUNCATE customers`)
	check("truncate customers")
	sqlExec(t, tc, `INSERT INTO customers SELECT g, 'again ' || g, 1 FROM generate_series(1, 10) g`)
	check("customers again")
}

// checkRollupPlan: check --plan counts, for the orders' roll-up of yaml, a
// reference per kept order in each of its sorted sets, as the roll-up
// shares them (rollupYAML's five: max(created), min(amount), max(status),
// the 3 latest by created, and the ids by id, none ordered like another).
func checkRollupPlan(t *testing.T, tc *testenv.Case, yaml string, sets int64) {
	t.Helper()
	sqlExec(t, tc, `ANALYZE`)
	r := runCLI(t, cliEnv(t, tc, yaml), "check", "--plan", "--json")
	if r.code != 0 {
		t.Fatalf("check --plan --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var res struct {
		Plan fkmat.RunPlan `json:"plan"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || len(res.Plan.Joins) != 1 {
		t.Fatalf("check --plan --json: %v\n%s", err, r.stdout)
	}
	for _, tb := range res.Plan.Joins[0].Tables {
		if tb.Table == "roll-up public.orders" {
			if tb.Kept <= 0 || tb.References != sets*tb.Kept {
				t.Fatalf("check --plan: the orders' roll-up has %d references for %d kept orders, want %d each", tb.References, tb.Kept, sets)
			}
			return
		}
	}
	t.Fatalf("check --plan lists no roll-up of public.orders: %+v", res.Plan.Joins[0].Tables)
}

// readmeBlock returns the body of the first fenced block of lang after the
// heading that starts with heading in the README.
func readmeBlock(t *testing.T, heading, lang string) string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "\n"+heading)
	if i < 0 {
		t.Fatalf("README has no heading %q", heading)
	}
	s = s[i:]
	start := strings.Index(s, "```"+lang+"\n")
	if start < 0 {
		t.Fatalf("README: no %s block after %q", lang, heading)
	}
	s = s[start+len(lang)+4:]
	return s[:strings.Index(s, "```")]
}

// TestReadmeRollupExample runs the README's roll-up example as written
// (its file and its SQL) through the backfill, a parent inserted after
// its children, changes of every table and continuous verification.
func TestReadmeRollupExample(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc,
		`CREATE TABLE regions (id int PRIMARY KEY, name text)`,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int)`,
		`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), status text, created timestamptz)`,
		`CREATE TABLE tickets (id int PRIMARY KEY, customer_id bigint, state text)`,
		`INSERT INTO regions SELECT g, 'R' || g FROM generate_series(1, 3) g`,
		`INSERT INTO customers SELECT g, 'C' || g, 1 + g % 4 FROM generate_series(1, 50) g`,
		`INSERT INTO orders SELECT g, 1 + g % 45, g * 1.5, CASE WHEN g % 6 = 0 THEN 'cancelled' ELSE 'paid' END,
			timestamptz '2026-02-01' + (g % 30) * interval '1 day' FROM generate_series(1, 500) g`,
		`INSERT INTO tickets SELECT g, 1 + g % 30, CASE WHEN g % 2 = 0 THEN 'open' ELSE 'closed' END FROM generate_series(1, 80) g`,
		// Orders and tickets of customer 51, which exists only later:
		// its aggregates, computed by the backfill's load of the
		// children, wait for it.
		`INSERT INTO orders SELECT g, 51, g, 'paid', timestamptz '2026-03-01' + g * interval '1 hour' FROM generate_series(1001, 1008) g`,
		`INSERT INTO tickets VALUES (1001, 51, 'open')`)
	cfg := daemonConfig(t, tc, readmeBlock(t, "### Roll-ups", "yaml"))
	d := startDaemon(t, cfg, fkmat.Options{VerifyInterval: time.Second})
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `INSERT INTO customers VALUES (51, 'late', 2)`)
	waitCaughtUp(t, tc, d)
	assertSQL(t, tc, "customer_stats", readmeBlock(t, "### Roll-ups", "sql"))
	sqlExec(t, tc, `UPDATE orders SET status = 'cancelled' WHERE id % 7 = 0`, `UPDATE orders SET customer_id = 48 WHERE id % 11 = 0`,
		`DELETE FROM orders WHERE id % 13 = 0`, `INSERT INTO orders VALUES (900, 49, 3, 'paid', now())`,
		`UPDATE tickets SET state = 'open' WHERE id % 5 = 0`, `UPDATE regions SET name = 'North' WHERE id = 1`)
	waitCaughtUp(t, tc, d)
	assertSQL(t, tc, "customer_stats", readmeBlock(t, "### Roll-ups", "sql"))
	assertOracle(t, cfg)
	if cols := columnTypes(t, tc, "customer_stats"); cols != "id bigint,name text,region text,orders bigint,revenue numeric,"+
		"last_order timestamp with time zone,recent jsonb,open_tickets bigint" {
		t.Errorf("target columns %s", cols)
	}
}

// TestRollupKilledAndChanged: kill -9 while transactions move children
// between parents and across the filter (5 kills), then the SQL; then a
// changed roll-up (an aggregate added) is built beside the running join
// and switched in.
func TestRollupKilledAndChanged(t *testing.T) {
	tc := testenv.New(t)
	rollupSchema(t, tc, false)
	sqlExec(t, tc, `INSERT INTO orders SELECT g, 1 + g % 30, g % 500, g % 5, CASE WHEN g % 4 = 0 THEN 'cancelled' ELSE 'paid' END,
		now() - (g % 100) * interval '1 minute', NULL, NULL FROM generate_series(1000, 40000) g`)
	env := cliEnv(t, tc, rollupYAML)
	cfg := daemonConfig(t, tc, rollupYAML)
	p := startCLIDaemon(t, env)
	waitCaughtUp(t, tc, p.d)
	p = killRounds(t, tc, env, p, func(i int) []string {
		return []string{fmt.Sprintf(`UPDATE orders SET customer_id = 1 + (customer_id + %d) %% 33 WHERE id %% 5 = %d`, i+1, i),
			fmt.Sprintf(`UPDATE orders SET status = CASE WHEN status = 'cancelled' THEN 'paid' ELSE 'cancelled' END WHERE id %% 7 = %d`, i),
			fmt.Sprintf(`DELETE FROM orders WHERE id %% 101 = %d`, i)}
	}, func(i int) string { return fmt.Sprintf(`UPDATE orders SET amount = amount + 1 WHERE id %% 97 = %d`, i) })
	waitCaughtUp(t, tc, p.d)
	assertSQL(t, tc, "customer_stats", rollupSQL)
	assertOracle(t, cfg)

	changed := strings.Replace(rollupYAML, `"count(*) AS orders",`, `"count(*) AS orders", "max(qty) AS top_qty",`, 1)
	next := daemonConfig(t, tc, changed)
	p = switchDefinition(t, tc, p, changed, next, "the changed roll-up")
	waitCaughtUp(t, tc, p.d)
	assertSQL(t, tc, "customer_stats", strings.Replace(rollupSQL, ` AS orders,`,
		` AS orders, (SELECT max(qty) FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') AS top_qty,`, 1))
	assertOracle(t, next)
}

// TestRollupsOnCluster: the roll-ups with their state on a 3+3 Redis
// Cluster, under a random workload of child changes (inserts, moves
// between parents, the filter entered and left, deletes, key changes)
// through a slot migration and a primary failover; equal to the SQL after
// each.
func TestRollupsOnCluster(t *testing.T) {
	cl := testenv.NewCluster(t)
	tc := testenv.New(t)
	rollupSchema(t, tc, false)
	cfg := daemonConfig(t, tc, rollupYAML)
	cfg.Redis = cl.URL()
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertSQL(t, tc, "customer_stats", rollupSQL)
	ctx := context.Background()
	during := func(what string, seed uint64, event func() error) {
		t.Helper()
		stop := make(chan struct{})
		done := make(chan error, 1)
		go func() { done <- rollupWorkload(tc, seed, stop) }()
		time.Sleep(300 * time.Millisecond)
		eerr := event()
		time.Sleep(300 * time.Millisecond)
		close(stop)
		if err := <-done; err != nil {
			t.Fatalf("workload during %s: %v", what, err)
		}
		if eerr != nil {
			t.Fatalf("%s: %v", what, eerr)
		}
		waitCaughtUp(t, tc, d)
		assertSQL(t, tc, "customer_stats", rollupSQL)
		assertOracle(t, cfg)
	}
	prims, err := cl.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	during("slot migration", 1, func() error { return cl.Reshard(ctx, prims[0].ID, prims[1].ID, 2000) })
	during("primary failover", 2, func() error { return cl.FailPrimary(ctx, prims[2].Addr) })
	if err := d.stop(t); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

// rollupWorkload runs random changes of the roll-ups' children until stop
// is closed.
func rollupWorkload(tc *testenv.Case, seed uint64, stop <-chan struct{}) error {
	r := rand.New(rand.NewPCG(seed, 45))
	next := 10_000 + int(seed)*100_000
	for n := 0; ; n++ {
		select {
		case <-stop:
			return nil
		default:
		}
		o, c := 1+r.IntN(400), 1+r.IntN(33)
		var q string
		switch r.IntN(7) {
		case 0, 1:
			next++
			q = fmt.Sprintf(`INSERT INTO orders VALUES (%d, %d, %d.25, %d, 'open', now(), NULL, NULL)`, next, c, r.IntN(500), r.IntN(5))
		case 2:
			q = fmt.Sprintf(`UPDATE orders SET customer_id = %d WHERE id = %d`, c, o)
		case 3:
			q = fmt.Sprintf(`UPDATE orders SET status = CASE status WHEN 'cancelled' THEN 'paid' ELSE 'cancelled' END WHERE id = %d`, o)
		case 4:
			q = fmt.Sprintf(`DELETE FROM orders WHERE id = %d`, o)
		case 5:
			next++
			q = fmt.Sprintf(`UPDATE orders SET id = %d WHERE id = %d`, next, o)
		case 6:
			q = fmt.Sprintf(`UPDATE tickets SET state = CASE state WHEN 'open' THEN 'closed' ELSE 'open' END WHERE id = %d`, 1+r.IntN(60))
		}
		if _, err := tc.Pool.Exec(context.Background(), q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
		if n%50 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestRollupHotParent: a parent with 10^5 children, all inserted, then
// all updated, then all moved to another parent, each in one transaction
// (streamed in some 40 chunks): the parents' aggregates stay equal to the
// SQL, and each transaction writes each parent's row once, not once per
// chunk or per child. The metrics count the roll-up's child changes and
// parents updated.
func TestRollupHotParent(t *testing.T) {
	tc := testenv.New(t)
	rollupSchema(t, tc, false)
	cfg := daemonConfig(t, tc, rollupYAML)
	bound := make(chan net.Addr, 1)
	d := startDaemon(t, cfg, fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { bound <- a }})
	m := boundScraper(t, bound)
	metric := func(name string) float64 {
		// The pipeline's counters show once it is attached.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if v, ok := metricValue(m.body(), name+`{join="customer_stats",rollup="public.orders"}`); ok {
				return v
			}
			if time.Now().After(deadline) {
				t.Fatalf("/metrics has no %s for the orders' roll-up", name)
			}
		}
	}
	waitCaughtUp(t, tc, d)
	changes0, parents0 := metric("fkmat_rollup_child_changes_total"), metric("fkmat_rollup_parents_updated_total")
	updates := func() int64 {
		// Updates alone: the backfill's inserts may be counted late.
		return int64(queryInt(t, tc, `SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'customer_stats'`))
	}
	for _, step := range []string{
		`INSERT INTO orders SELECT g, 7, g % 1000, g % 5, CASE WHEN g % 10 = 0 THEN 'cancelled' ELSE 'paid' END,
			now() - (g % 5000) * interval '1 second', NULL, NULL FROM generate_series(100000, 199999) g`,
		`UPDATE orders SET amount = amount + 1 WHERE customer_id = 7`,
		`UPDATE orders SET customer_id = 8 WHERE customer_id = 7`,
	} {
		before := updates()
		sqlExec(t, tc, step)
		waitCaughtUp(t, tc, d)
		assertSQL(t, tc, "customer_stats", rollupSQL)
		// pg_stat counters lag: wait for the transaction's count.
		var wrote int64
		for range 50 {
			if wrote = updates() - before; wrote > 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("%.40s…: %d target row writes", step, wrote)
		if wrote > 2 {
			t.Errorf("a transaction of 10^5 children of one or two parents wrote the target %d times", wrote)
		}
	}
	changes, parents := metric("fkmat_rollup_child_changes_total")-changes0, metric("fkmat_rollup_parents_updated_total")-parents0
	t.Logf("metrics: %.0f child changes, %.0f parents updated, %.0f sorted sets read", changes, parents, metric("fkmat_rollup_set_reads_total"))
	// The updates of cancelled orders (10%) never reach the roll-up: they
	// stay out of its filter.
	if changes < 270_000 || changes > 300_000 || parents < 4 || parents > 200 {
		t.Errorf("the roll-up's metrics counted %.0f child changes (want 270000-300000) and %.0f parents updated (4 in the last chunks, plus one per chunk before)", changes, parents)
	}
	assertOracle(t, cfg)
}

// TestRollupSchemaChangeThenBigTransaction: the child table changes shape
// while run streams (a column added, one of the roll-up's inputs widened
// from integer to bigint: its sum becomes numeric and the target's column
// follows, its expression bool_and(qty > 1) reads the wider values), then
// one transaction changes 10^5 children of many parents (updates, moves,
// rows leaving the filter, deletes), with the new shape announced inside
// it; after a restart, another shape change and a big transaction. The
// parents' aggregates end equal to the SQL.
func TestRollupSchemaChangeThenBigTransaction(t *testing.T) {
	tc := testenv.New(t)
	rollupSchema(t, tc, false)
	sqlExec(t, tc, `INSERT INTO orders SELECT g, 1 + g % 30, g % 500, g % 7, CASE WHEN g % 9 = 0 THEN 'cancelled' ELSE 'paid' END,
		timestamptz '2026-01-01 00:00:00+00' + (g % 900) * interval '1 minute', NULL, NULL FROM generate_series(10000, 130000) g`)
	cfg := daemonConfig(t, tc, rollupYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `UPDATE orders SET qty = qty + 1 WHERE id % 1000 = 0`)
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `ALTER TABLE orders ADD COLUMN channel text; ALTER TABLE orders ALTER COLUMN qty TYPE bigint`,
		`BEGIN; UPDATE orders SET qty = qty + 5000000000, channel = 'web' WHERE id >= 10000 AND id % 2 = 0;
		 UPDATE orders SET customer_id = 1 + (customer_id + 3) % 30 WHERE id % 5 = 1;
		 UPDATE orders SET status = 'cancelled' WHERE id % 13 = 0;
		 DELETE FROM orders WHERE id % 17 = 0; COMMIT`)
	waitCaughtUp(t, tc, d)
	assertSQL(t, tc, "customer_stats", rollupSQL)
	if err := d.stop(t); err != nil {
		t.Fatalf("clean shutdown: %v", err)
	}
	sqlExec(t, tc, `ALTER TABLE orders DROP COLUMN channel; ALTER TABLE orders ADD COLUMN region int`,
		`BEGIN; UPDATE orders SET amount = amount + 1, region = 1 WHERE id % 3 = 0;
		 INSERT INTO orders SELECT g, 1 + g % 31, 1, 1, 'paid', now(), NULL, NULL, 2 FROM generate_series(200000, 240000) g; COMMIT`)
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertSQL(t, tc, "customer_stats", rollupSQL)
	assertOracle(t, cfg)
}

// TestRollupFrozenMidBatch: the active daemon A, keeping the roll-ups,
// freezes (SIGSTOP) in a batch of child changes: with its target rows
// written and their transaction open, and between its target commit and
// its Redis commit. The standby B takes the slot after wal_sender_timeout,
// and applies the batch again from the Redis state A left; thawed, A
// writes nothing. The parents' aggregates end equal to the SQL.
func TestRollupFrozenMidBatch(t *testing.T) {
	for _, point := range []string{"target written", "target committed"} {
		t.Run(point, func(t *testing.T) {
			tc := testenv.New(t)
			rollupSchema(t, tc, false)
			cfg := daemonConfig(t, tc, rollupYAML)
			a, _, b, bAddr, aWalsender := freezingPair(t, tc, rollupYAML, point)

			stop := make(chan struct{})
			done := make(chan error, 1)
			go func() { done <- rollupWorkload(tc, 7, stop) }()
			waitFor(t, time.Minute, "A to freeze at "+point, func() bool {
				stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.cmd.Process.Pid))
				return err == nil && strings.Contains(string(stat), ") T ")
			})
			waitTakeover(t, tc, b, bAddr, aWalsender, time.Now())
			if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			waitLog(t, a, "standby: replication slot "+tc.Slot+" is held by")
			time.Sleep(300 * time.Millisecond) // more changes, B applying
			close(stop)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			waitCaughtUp(t, tc, b.daemon)
			assertSQL(t, tc, "customer_stats", rollupSQL)
			assertOracle(t, cfg)
			if err := b.term(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}
