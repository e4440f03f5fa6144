package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/testenv"
)

// assertSQL compares the target with want, the join's SQL written out by
// hand (not fkmat's own), in both directions.
func assertSQL(t *testing.T, tc *testenv.Case, target, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var missing, extra int
	var examples []string
	err := tc.Pool.QueryRow(ctx, `WITH w AS (`+want+`), t AS (SELECT * FROM `+target+`),
		m AS (SELECT * FROM w EXCEPT ALL SELECT * FROM t), x AS (SELECT * FROM t EXCEPT ALL SELECT * FROM w)
		SELECT (SELECT count(*) FROM m), (SELECT count(*) FROM x),
			coalesce((SELECT array_agg(e) FROM ((SELECT 'missing ' || left(m::text, 100) AS e FROM m LIMIT 3)
				UNION ALL (SELECT 'extra ' || left(x::text, 100) FROM x LIMIT 3)) s), '{}')`).Scan(&missing, &extra, &examples)
	if err != nil {
		t.Fatalf("compare %s with its SQL: %v", target, err)
	}
	if missing+extra > 0 {
		t.Errorf("%s differs from its SQL: %d rows missing, %d extra; e.g. %s", target, missing, extra, strings.Join(examples, "; "))
	}
}

// filterChainYAML is a chain orders -> customers -> regions with a filter
// and an expression on every table.
const filterChainYAML = `
joins:
  - name: orders_wide
    type: left
    left:
      table: public.orders
      where: "status <> 'draft'"
      columns: [id, customer_id, amount, "amount * qty AS total", "created::date AS day", "upper(note) AS note_uc"]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        where: "deleted_at IS NULL"
        columns: [name AS customer_name, "lower(email) AS email_lc"]
      - table: public.regions
        from: customers
        foreign_key: [region_id]
        where: "active"
        columns: ["name || '/' || code AS region", "md5(descr) AS descr_md5"]
    target:
      table: public.orders_wide
  - name: orders_inner
    type: inner
    left:
      table: public.orders
      where: "qty > 1 OR note IS NULL"
      foreign_key: [customer_id]
      columns: [id, "coalesce(qty, 0) * 2 AS qty2"]
    right:
      table: public.customers
      where: "deleted_at IS NULL AND email LIKE '%@x.org'"
      columns: ["length(name) AS name_len"]
    target:
      table: public.orders_inner
`

// filterChainSQL is what filterChainYAML means, written out.
const filterChainSQL = `SELECT o.id, o.customer_id, o.amount, o.amount * o.qty AS total, (o.created AT TIME ZONE 'UTC')::date AS day,
	upper(o.note) AS note_uc, c.name AS customer_name, lower(c.email) AS email_lc, r.name || '/' || r.code AS region, md5(r.descr) AS descr_md5
	FROM (SELECT * FROM orders WHERE status <> 'draft') o
	LEFT JOIN (SELECT * FROM customers WHERE deleted_at IS NULL) c ON o.customer_id = c.id
	LEFT JOIN (SELECT * FROM regions WHERE active) r ON c.region_id = r.id`

const filterInnerSQL = `SELECT o.id, coalesce(o.qty, 0) * 2 AS qty2, length(c.name) AS name_len
	FROM (SELECT * FROM orders WHERE qty > 1 OR note IS NULL) o
	JOIN (SELECT * FROM customers WHERE deleted_at IS NULL AND email LIKE '%@x.org') c ON o.customer_id = c.id`

func filterChainSchema(t *testing.T, tc *testenv.Case) { filterSchema(t, tc, false) }

// filterSchema is filterChainSchema, with orders range-partitioned on
// their key when partitioned (a key change may move a row across
// partitions).
func filterSchema(t *testing.T, tc *testenv.Case, partitioned bool) {
	orders := `CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, amount numeric(12,2), qty int, status text,
			created timestamptz, note text)`
	if partitioned {
		orders += ` PARTITION BY RANGE (id)`
	}
	sqlExec(t, tc,
		`CREATE TABLE regions (id int PRIMARY KEY, name text, code text, active boolean, descr text)`,
		`CREATE TABLE customers (id int PRIMARY KEY, name text, email text, region_id int, deleted_at timestamptz)`,
		orders)
	if partitioned {
		sqlExec(t, tc, `CREATE TABLE orders_a PARTITION OF orders FOR VALUES FROM (MINVALUE) TO (150)`,
			`CREATE TABLE orders_b PARTITION OF orders FOR VALUES FROM (150) TO (1100)`,
			`CREATE TABLE orders_c PARTITION OF orders FOR VALUES FROM (1100) TO (MAXVALUE)`)
	}
	sqlExec(t, tc,
		`INSERT INTO regions SELECT g, 'R' || g, 'c' || g, g % 3 <> 0, (SELECT string_agg(md5(g::text || i), '') FROM generate_series(1, 300) i)
			FROM generate_series(1, 6) g`,
		`INSERT INTO customers SELECT g, 'Cust ' || g, 'C' || g || CASE WHEN g % 2 = 0 THEN '@X.org' ELSE '@x.org' END,
			CASE WHEN g % 7 = 0 THEN NULL ELSE 1 + g % 7 END, CASE WHEN g % 5 = 0 THEN now() END FROM generate_series(1, 40) g`,
		`INSERT INTO orders SELECT g, CASE WHEN g % 11 = 0 THEN NULL ELSE 1 + g % 45 END, g * 1.25, CASE WHEN g % 9 = 0 THEN NULL ELSE g % 4 END,
			CASE g % 4 WHEN 0 THEN 'draft' WHEN 1 THEN 'paid' ELSE 'open' END, timestamptz '2026-03-01 23:30:00+00' + g * interval '37 minutes',
			CASE WHEN g % 13 = 0 THEN (SELECT string_agg(md5(g::text || i), '') FROM generate_series(1, 300) i)
				WHEN g % 6 = 0 THEN NULL ELSE 'n' || g END
			FROM generate_series(1, 300) g`)
}

// TestFiltersAndExpressions: a chain and a two-table join, each table with
// a filter and an expression, through the backfill and every change kind:
// rows entering and leaving their filters, staying out, key and FK
// changes, deletes, unchanged TOASTed values, NULLs in the filters'
// columns, several changes of a row in one transaction, TRUNCATE; and a
// restart. Each step ends equal to the SQL written out.
func TestFiltersAndExpressions(t *testing.T) {
	for _, partitioned := range []bool{false, true} {
		t.Run(fmt.Sprintf("partitioned %v", partitioned), func(t *testing.T) { filtersAndExpressions(t, partitioned) })
	}
}

func filtersAndExpressions(t *testing.T, partitioned bool) {
	tc := testenv.New(t)
	filterSchema(t, tc, partitioned)
	cfg := daemonConfig(t, tc, filterChainYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	check := func(step string) {
		t.Helper()
		waitCaughtUp(t, tc, d)
		t.Logf("step %s", step)
		assertSQL(t, tc, "orders_wide", filterChainSQL)
		assertSQL(t, tc, "orders_inner", filterInnerSQL)
		assertOracle(t, cfg)
	}
	check("backfill")
	for i, step := range [][]string{
		{`UPDATE orders SET status = 'paid' WHERE id % 8 = 0`},                                                 // enter the filter
		{`UPDATE orders SET status = 'draft' WHERE id % 10 = 1`},                                               // leave it
		{`UPDATE orders SET amount = amount + 1 WHERE status = 'draft'`},                                       // stay out
		{`UPDATE orders SET qty = NULL WHERE id % 7 = 2`, `UPDATE orders SET status = NULL WHERE id % 17 = 3`}, // NULLs in filters
		{`UPDATE orders SET id = id + 1000 WHERE id % 12 = 5`},                                                 // key changes
		{`UPDATE orders SET customer_id = 1 + (customer_id + 3) % 45 WHERE id % 5 = 1`},                        // FK changes
		{`UPDATE orders SET qty = qty + 1 WHERE id % 13 = 0`},                                                  // TOASTed note unchanged
		{`UPDATE orders SET status = 'draft' WHERE id % 26 = 0`, `UPDATE orders SET status = 'paid' WHERE id % 26 = 13`},
		{`UPDATE customers SET deleted_at = now() WHERE id % 6 = 1`},             // right rows leave
		{`UPDATE customers SET deleted_at = NULL WHERE id % 10 = 5`},             // and enter
		{`UPDATE customers SET email = upper(email) WHERE id % 4 = 1`},           // the inner join's filter
		{`UPDATE customers SET name = name || '!' WHERE deleted_at IS NOT NULL`}, // stay out
		{`UPDATE customers SET id = id + 100 WHERE id = 3`},                      // a right key change
		{`UPDATE regions SET active = NOT active WHERE id % 2 = 0`},              // a chain's last table
		{`UPDATE regions SET code = 'z' || code`},
		{`BEGIN; INSERT INTO orders VALUES (5000, 2, 10, 3, 'draft', now(), 'a');
		  UPDATE orders SET status = 'paid' WHERE id = 5000; UPDATE orders SET qty = 5 WHERE id = 5000;
		  UPDATE orders SET status = 'draft' WHERE id = 4; UPDATE orders SET status = 'open' WHERE id = 4;
		  UPDATE customers SET deleted_at = now() WHERE id = 2; UPDATE customers SET deleted_at = NULL WHERE id = 2; COMMIT`},
		{`DELETE FROM orders WHERE id % 9 = 4`, `DELETE FROM customers WHERE id % 9 = 8`, `DELETE FROM regions WHERE id = 5`},
		{`INSERT INTO orders SELECT g, 1 + g % 45, g, g % 3, CASE WHEN g % 2 = 0 THEN 'draft' ELSE 'paid' END, now(), NULL FROM generate_series(6000, 6100) g`},
		{`INSERT INTO customers VALUES (200, 'new', 'n@x.org', 2, NULL), (201, 'gone', 'g@x.org', 2, now())`},
	} {
		sqlExec(t, tc, step...)
		check(fmt.Sprint(i))
	}
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE orders SET status = CASE status WHEN 'draft' THEN 'paid' ELSE 'draft' END WHERE id % 3 = 0`,
		`UPDATE customers SET deleted_at = CASE WHEN deleted_at IS NULL THEN now() END WHERE id % 4 = 0`)
	d = startDaemon(t, cfg, fkmat.Options{})
	check("restart")
	sqlExec(t, tc, `TRUNCATE regions`)
	check("truncate regions")
	sqlExec(t, tc, `TRUNCATE orders`)
	check("truncate orders")
}

// TestFilterCheckRefuses: check refuses, exit 2, what fkmat cannot follow
// in a where or an expression, naming the fix; and accepts the stable
// functions whose value depends on the row and on the settings fkmat fixes.
func TestFilterCheckRefuses(t *testing.T) {
	tc := testenv.New(t)
	filterChainSchema(t, tc)
	sqlExec(t, tc, `CREATE FUNCTION stable_fn(int) RETURNS int LANGUAGE sql STABLE AS 'SELECT $1'`,
		`CREATE FUNCTION immutable_fn(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 + 1'`)
	join := func(where, column string) string {
		return fmt.Sprintf(`
joins:
  - name: j
    type: left
    left: {table: public.orders, foreign_key: [customer_id], where: %q, columns: [id, %q]}
    right: {table: public.customers, columns: [name]}
    target: {table: public.j}
`, where, column)
	}
	for _, c := range []struct{ name, where, column, want string }{
		{"volatile", "random() < 0.5", "amount", `calls random(), which is VOLATILE`},
		{"clock", "created < now()", "amount", `calls now(), which reads the clock, the transaction, the session or the catalog`},
		{"current_timestamp", "true", "current_timestamp - created AS age", `reads the clock or the session`},
		{"current_user", "note <> current_user", "amount", `reads the clock or the session`},
		{"subquery", "customer_id IN (SELECT id FROM customers)", "amount", `holds a subquery`},
		{"aggregate", "true", "sum(amount) AS s", `holds an aggregate`},
		{"window", "true", "row_number() OVER () AS n", `holds a window function`},
		{"another table", "customers.name <> ''", "amount", `reads table "customers": a where or an expression reads only its own table's columns`},
		{"unknown column", "stauts <> 'draft'", "amount", `table public.orders has no column "stauts"`},
		{"not boolean", "amount + 1", "amount", `is of type numeric, not boolean`},
		{"stable user function", "stable_fn(qty) > 1", "amount", `calls stable_fn(integer), which is STABLE`},
		{"set-returning", "true", "generate_series(1, qty) AS g", `returns a set of rows`},
		{"system column", "xmin <> '0'", "amount", `reads a system column`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, cliEnv(t, tc, join(c.where, c.column)), "check")
			if r.code != 2 || !strings.Contains(r.stderr+r.stdout, c.want) {
				t.Fatalf("check: exit %d\n%s%s\nwant it to say %s", r.code, r.stdout, r.stderr, c.want)
			}
		})
	}
	// Stable functions that depend on the row and on the fixed settings
	// only, immutable user functions, casts and operators are accepted.
	r := runCLI(t, cliEnv(t, tc, join("created::date > '2026-01-01' AND immutable_fn(qty) > 1",
		"jsonb_build_object('id', id, 'at', created) AS doc")), "check")
	if r.code != 0 {
		t.Fatalf("check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// check --plan shows what a filter keeps, from the statistics, and
	// the state it saves: 3 of 4 orders are not drafts.
	sqlExec(t, tc, `ANALYZE orders`)
	r = runCLI(t, cliEnv(t, tc, join("status <> 'draft'", "amount")), "check", "--plan")
	// (The rows counted may include inserts whose statistics arrive after
	// ANALYZE's; the planner's selectivity does not.)
	if r.code != 0 || !regexp.MustCompile(`where status <> 'draft' on public.orders: keeps ~\d+ of \d+ rows \(75%`).MatchString(r.stdout) ||
		!strings.Contains(r.stdout, "state saved ~") {
		t.Fatalf("check --plan: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestFilterKilledAndChanged: kill -9 of run while batches move rows
// across the filters, then a filter changed in the file, built beside the
// running join and switched in; each ends equal to the SQL written out.
func TestFilterKilledAndChanged(t *testing.T) {
	tc := testenv.New(t)
	filterChainSchema(t, tc)
	sqlExec(t, tc, `INSERT INTO orders SELECT g, 1 + g % 45, g, g % 5, CASE WHEN g % 3 = 0 THEN 'draft' ELSE 'paid' END, now(), NULL
		FROM generate_series(1000, 40000) g`)
	env := cliEnv(t, tc, filterChainYAML)
	cfg := daemonConfig(t, tc, filterChainYAML)
	p := startCLIDaemon(t, env)
	waitCaughtUp(t, tc, p.d)
	// Rows enter and leave the filters of both joins, in large
	// transactions and small ones.
	p = killRounds(t, tc, env, p, func(i int) []string {
		return []string{fmt.Sprintf(`UPDATE orders SET status = CASE WHEN status = 'draft' THEN 'paid' ELSE 'draft' END, qty = coalesce(qty, 0) + 1
			WHERE id %% 5 = %d`, i),
			fmt.Sprintf(`UPDATE customers SET deleted_at = CASE WHEN deleted_at IS NULL THEN now() END WHERE id %% 4 = %d`, i%4),
			fmt.Sprintf(`UPDATE regions SET active = NOT active WHERE id = %d`, 1+i)}
	}, func(i int) string { return fmt.Sprintf(`UPDATE orders SET status = 'open' WHERE id %% 97 = %d`, i) })
	waitCaughtUp(t, tc, p.d)
	assertSQL(t, tc, "orders_wide", filterChainSQL)
	assertSQL(t, tc, "orders_inner", filterInnerSQL)
	assertOracle(t, cfg)

	// A changed where is a definition change: built beside, switched in.
	changed := strings.Replace(filterChainYAML, `where: "status <> 'draft'"`, `where: "status = 'paid'"`, 1)
	next := daemonConfig(t, tc, changed)
	p = switchDefinition(t, tc, p, changed, next, "the changed filter")
	waitCaughtUp(t, tc, p.d)
	assertSQL(t, tc, "orders_wide", strings.Replace(filterChainSQL, "status <> 'draft'", "status = 'paid'", 1))
	assertSQL(t, tc, "orders_inner", filterInnerSQL)
	assertOracle(t, next)
}

// killRounds runs five rounds of: the statements of round i, a random
// pause, kill -9 of the daemon p (noting whether it had changes not yet
// acknowledged), the statement after(i) while it is down, and a restart.
// It returns the last daemon, and fails the test when no kill landed with
// changes pending: it would prove nothing.
func killRounds(t *testing.T, tc *testenv.Case, env []string, p *cliDaemon, round func(i int) []string, after func(i int) string) *cliDaemon {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	pending := 0
	for i := range 5 {
		sqlExec(t, tc, round(i)...)
		time.Sleep(time.Duration(r.IntN(300)) * time.Millisecond)
		var behind bool
		if err := tc.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn() > confirmed_flush_lsn
			FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot).Scan(&behind); err == nil && behind {
			pending++
		}
		p.mustRun("before kill -9")
		p.kill()
		sqlExec(t, tc, after(i))
		p = startCLIDaemon(t, env)
	}
	t.Logf("%d of 5 kills landed with changes not yet acknowledged", pending)
	if pending == 0 {
		t.Error("no kill landed while the daemon had changes to apply: the test proves nothing")
	}
	return p
}

// switchDefinition kills the daemon p and starts it with the changed
// configuration (next, as a config), which verify says is pending before
// then; it returns the new daemon once the changed definition, built
// beside the running join while orders change, is switched in.
func switchDefinition(t *testing.T, tc *testenv.Case, p *cliDaemon, changed string, next *config.Config, what string) *cliDaemon {
	t.Helper()
	if _, err := fkmat.Verify(context.Background(), next, fkmat.Options{}); !errors.Is(err, fkmat.ErrDefinitionPending) {
		t.Fatalf("verify before run = %v, want ErrDefinitionPending", err)
	}
	p.kill()
	p = startCLIDaemon(t, cliEnv(t, tc, changed))
	deadline := time.Now().Add(3 * time.Minute)
	for {
		sqlExec(t, tc, `UPDATE orders SET qty = qty + 1 WHERE id % 50 = 7`)
		if _, err := fkmat.Verify(context.Background(), next, fkmat.Options{}); !errors.Is(err, fkmat.ErrDefinitionPending) {
			return p
		}
		p.mustRun("wait for the switch")
		if time.Now().After(deadline) {
			t.Fatalf("%s was not switched in within 3 minutes", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// readmeFilterYAML is the README's example of filters and computed
// columns.
const readmeFilterYAML = `
joins:
  - name: orders_wide
    type: left
    left:
      table: public.orders
      where: "status <> 'draft'"
      columns: [id, customer_id, amount, "amount * qty AS total", "created::date AS day"]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        where: "deleted_at IS NULL"
        columns: [name AS customer_name, "lower(email) AS email_lc"]
    target:
      table: public.orders_wide
`

// TestReadmeFilterExample runs the README's example, with the file's
// timezone: created::date on a timestamptz is the date in that zone, in
// the backfill and in the stream alike; the target has the expressions'
// types.
func TestReadmeFilterExample(t *testing.T) {
	tc := testenv.New(t)
	filterChainSchema(t, tc)
	cfg := daemonConfig(t, tc, readmeFilterYAML)
	cfg.TimeZone = "Asia/Tokyo"
	bound := make(chan net.Addr, 1)
	d := startDaemon(t, cfg, fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { bound <- a },
		VerifyInterval: time.Second})
	m := boundScraper(t, bound)
	metric := func(name string) float64 {
		v, _ := metricValue(m.body(), name)
		return v
	}
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `UPDATE orders SET created = created + interval '1 hour', status = 'open' WHERE id % 3 = 0`,
		`INSERT INTO orders VALUES (9000, 1, 5, 2, 'paid', '2026-05-01 15:30:00+00', NULL)`, // 00:30 on May 2nd in Tokyo
		`UPDATE customers SET deleted_at = now() WHERE id % 4 = 0`)
	waitCaughtUp(t, tc, d)
	want := `SELECT o.id, o.customer_id, o.amount, o.amount * o.qty AS total, (o.created AT TIME ZONE 'Asia/Tokyo')::date AS day,
		c.name AS customer_name, lower(c.email) AS email_lc
		FROM (SELECT * FROM orders WHERE status <> 'draft') o
		LEFT JOIN (SELECT * FROM customers WHERE deleted_at IS NULL) c ON o.customer_id = c.id`
	assertSQL(t, tc, "orders_wide", want)
	assertOracle(t, cfg)
	if n := queryInt(t, tc, `SELECT count(*) FROM orders_wide WHERE id = 9000 AND day = '2026-05-02'`); n != 1 {
		t.Errorf("order 9000's day is not May 2nd in Tokyo")
	}
	if cols := columnTypes(t, tc, "orders_wide"); cols != "id bigint,customer_id integer,amount numeric(12,2),total numeric,day date,customer_name text,email_lc text" {
		t.Errorf("target columns %s", cols)
	}
	// Continuous verification compares with the same filters and
	// expressions: no difference, until a draft order is slipped into the
	// target behind the daemon's back.
	rounds := metric("fkmat_verify_rounds_total")
	waitFor(t, time.Minute, "two verification rounds", func() bool { return metric("fkmat_verify_rounds_total") >= rounds+2 })
	if v := metric("fkmat_verify_differences"); v != 0 {
		t.Fatalf("continuous verification found %v differences in a correct target", v)
	}
	draft := queryInt(t, tc, `SELECT min(id) FROM orders WHERE status = 'draft'`)
	sqlExec(t, tc, fmt.Sprintf(`INSERT INTO orders_wide (id) VALUES (%d)`, draft))
	waitFor(t, time.Minute, "the draft order found extra", func() bool { return metric("fkmat_verify_differences") == 1 })
}

// columnTypes lists a table's columns with their types.
func columnTypes(t *testing.T, tc *testenv.Case, table string) string {
	t.Helper()
	var s string
	if err := tc.Pool.QueryRow(context.Background(), `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ',' ORDER BY attnum)
		FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, table).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSessionSettings: a source database whose defaults change how values
// read as text (DateStyle SQL, DMY; IntervalStyle sql_standard;
// extra_float_digits 0; a TimeZone west of UTC) joins the same as any: the
// stream's text, the backfill's and the target's sessions all use fkmat's
// fixed settings, and created::date uses the file's timezone (UTC).
func TestSessionSettings(t *testing.T) {
	tc := testenv.New(t)
	db := pgx.Identifier{tc.Database}.Sanitize()
	sqlExec(t, tc, `ALTER DATABASE `+db+` SET DateStyle = 'SQL, DMY'`, `ALTER DATABASE `+db+` SET IntervalStyle = 'sql_standard'`,
		`ALTER DATABASE `+db+` SET extra_float_digits = 0`, `ALTER DATABASE `+db+` SET TimeZone = 'America/New_York'`,
		`CREATE TABLE kinds (id int PRIMARY KEY, label text)`,
		`CREATE TABLE events (id bigint PRIMARY KEY, kind_id int, day date, took interval, ratio float8, at timestamptz)`,
		`INSERT INTO kinds SELECT g, 'k' || g FROM generate_series(1, 5) g`,
		`INSERT INTO events SELECT g, 1 + g % 5, date '2026-01-02' + g, g * interval '1 day 2 hours 3 minutes', 1.0 / (g + 7),
			timestamptz '2026-03-01 03:30:00+00' + g * interval '5 hours' FROM generate_series(1, 200) g`)
	yml := `
joins:
  - name: events_kinds
    type: left
    left: {table: public.events, foreign_key: [kind_id], where: "day > '2026-02-01'",
           columns: [id, day, took, ratio, at, "at::date AS at_day", "took * 2 AS took2"]}
    right: {table: public.kinds, columns: [label]}
    target: {table: public.events_kinds}
`
	cfg := daemonConfig(t, tc, yml)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `UPDATE events SET day = day + 40, took = took + interval '1 minute', ratio = ratio / 3 WHERE id % 3 = 0`,
		`INSERT INTO events SELECT g, 2, date '2026-12-31', interval '-1 year 2 mons', 1e-300 * g, timestamptz '2026-06-30 23:59:59.999999+00'
			FROM generate_series(1000, 1010) g`)
	waitCaughtUp(t, tc, d)
	assertSQL(t, tc, "events_kinds", `SELECT e.id, e.day, e.took, e.ratio, e.at, (e.at AT TIME ZONE 'UTC')::date AS at_day, e.took * 2 AS took2, k.label
		FROM (SELECT * FROM events WHERE day > '2026-02-01') e LEFT JOIN kinds k ON e.kind_id = k.id`)
	assertOracle(t, cfg)
}
