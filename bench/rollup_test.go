package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/redisstore"
)

// w9YAML is W9's join: each customer with its orders rolled up (a filter
// keeping 90% of them, a count, a sum, a max and the 5 latest orders as
// JSON), over W1's tables.
const w9YAML = `
joins:
  - name: customer_stats
    type: left
    left: {table: customers, columns: [id, name, tier]}
    rollups:
      - table: orders
        foreign_key: [customer_id]
        where: "id % 10 <> 0"
        aggregates: ["count(*) AS orders", "sum(amount) AS revenue", "max(id) AS last_order",
                     "jsonb_agg(jsonb_build_object('id', id, 'amount', amount) ORDER BY id DESC LIMIT 5) AS recent"]
    target: {table: customer_stats}
`

// w9SQL is what w9YAML means, written out.
const w9SQL = `SELECT c.id, c.name, c.tier,
	(SELECT count(*) FROM orders o WHERE o.customer_id = c.id AND id % 10 <> 0),
	(SELECT sum(amount) FROM orders o WHERE o.customer_id = c.id AND id % 10 <> 0),
	(SELECT max(id) FROM orders o WHERE o.customer_id = c.id AND id % 10 <> 0),
	(SELECT jsonb_agg(jsonb_build_object('id', id, 'amount', amount) ORDER BY id DESC) FROM
		(SELECT id, amount FROM orders o WHERE o.customer_id = c.id AND id % 10 <> 0 ORDER BY id DESC LIMIT 5) s)
	FROM customers c`

// w9ScalarYAML is W9 without its jsonb_agg.
var w9ScalarYAML = strings.Replace(w9YAML, `,
                     "jsonb_agg(jsonb_build_object('id', id, 'amount', amount) ORDER BY id DESC LIMIT 5) AS recent"`, "", 1)

var w9ScalarSQL = w9SQL[:strings.Index(w9SQL, ",\n\t(SELECT jsonb_agg")] + "\n\tFROM customers c"

// benchW9 measures W1's orders and changes rolled up into their customers
// (W9) beside W1's two-table join, alternately (W1, W9, W9 without its
// jsonb_agg, then again), each on a fresh database: the catch-up's CPU of
// fkmat and redis-server per change, and the Redis state (INFO used_memory
// growth over the backfill and catch-up). Then the backfill of W9 at its
// own size (W9Orders orders over W9Customers customers), beside the
// INSERT … SELECT … GROUP BY of its SQL. FKMAT_BENCH_W9=backfill runs the
// backfill alone, FKMAT_BENCH_W9=catchup the catch-up alone.
func benchW9(t *testing.T, s sizes, rep *report) {
	if os.Getenv("FKMAT_BENCH_W9") != "backfill" {
		benchW9CatchUp(t, s, rep)
	}
	if os.Getenv("FKMAT_BENCH_W9") != "catchup" {
		benchW9Backfill(t, s, rep)
	}
}

// benchW9CatchUp is W9's catch-up beside W1's. With
// FKMAT_BENCH_W9_BASE=<an fkmat binary>, each W9 run is preceded by one of
// that build (W1, W9 base, W9, W9 without jsonb_agg base, W9 without
// jsonb_agg, twice), and the log gives both builds' CPU per change.
func benchW9CatchUp(t *testing.T, s sizes, rep *report) {
	type result struct {
		catchUp, cpu, mem float64
	}
	base := os.Getenv("FKMAT_BENCH_W9_BASE")
	measure := func(yaml, sql, bin string) result {
		w := w1(s)
		if yaml != "" {
			w.yaml, w.oracleTarget, w.oracleSQL = yaml, `SELECT * FROM customer_stats`, sql
		}
		d := newDB(t, w)
		d.bin = bin
		mem0 := d.redisInfo("memory", "used_memory")
		_, catchUp, u := d.catchUp(w, "catchup")
		mem := d.redisInfo("memory", "used_memory") - mem0
		d.logW9Keys(yaml != "")
		if err := testenv.DeleteKeys(context.Background(), d.Redis, "fkmat:"+d.Slot+":"); err != nil {
			t.Fatal(err)
		}
		what := "W1"
		switch yaml {
		case w9YAML:
			what = "W9"
		case w9ScalarYAML:
			what = "W9 without jsonb_agg"
		}
		if bin != "" {
			what += " (base)"
		}
		t.Logf("%s: catch-up %.2f s, CPU fkmat %.2f s, redis-server %.2f s, %.1f ms per 1k changes",
			what, catchUp.Seconds(), u.cpu, u.redisCPU, 1e6*(u.cpu+u.redisCPU)/float64(w1(s).changes()))
		return result{catchUp.Seconds(), u.cpu + u.redisCPU, mem}
	}
	var plain, rolled, scalar []result
	for range 2 {
		plain = append(plain, measure("", "", ""))
		if base != "" {
			measure(w9YAML, w9SQL, base)
		}
		rolled = append(rolled, measure(w9YAML, w9SQL, ""))
		if base != "" {
			measure(w9ScalarYAML, w9ScalarSQL, base)
		}
		scalar = append(scalar, measure(w9ScalarYAML, w9ScalarSQL, ""))
	}
	n := float64(w1(s).changes())
	ratio := func(rs []result, f func(result) float64) float64 {
		var r float64
		for i := range rs {
			r += f(rs[i]) / f(plain[i]) / float64(len(rs))
		}
		return r
	}
	cpu := func(r result) float64 { return r.cpu }
	mem := func(r result) float64 { return r.mem }
	name := "W9 roll-up"
	rep.row(name, "count, sum, max + jsonb_agg of 5: CPU per change / W1's two-table join", ratio(rolled, cpu), "ratio",
		fmt.Sprintf("fkmat + redis-server CPU per 1k changes: W1 %.1f / %.1f ms, W9 %.1f / %.1f ms (A B A B)",
			1e6*plain[0].cpu/n, 1e6*plain[1].cpu/n, 1e6*rolled[0].cpu/n, 1e6*rolled[1].cpu/n), false)
	rep.row(name, "count, sum, max (no jsonb_agg): CPU per change / W1", ratio(scalar, cpu), "ratio",
		fmt.Sprintf("W9 without jsonb_agg %.1f / %.1f ms per 1k changes", 1e6*scalar[0].cpu/n, 1e6*scalar[1].cpu/n), false)
	rep.row(name, "catch-up time / W1", ratio(rolled, func(r result) float64 { return r.catchUp }), "ratio",
		fmt.Sprintf("W1 %.2f / %.2f s, W9 %.2f / %.2f s", plain[0].catchUp, plain[1].catchUp, rolled[0].catchUp, rolled[1].catchUp), false)
	rep.row(name, "Redis used_memory growth / W1", ratio(rolled, mem), "ratio",
		fmt.Sprintf("W1 %.1f / %.1f MB, W9 %.1f / %.1f MB, W9 without jsonb_agg %.1f / %.1f MB",
			plain[0].mem/1e6, plain[1].mem/1e6, rolled[0].mem/1e6, rolled[1].mem/1e6, scalar[0].mem/1e6, scalar[1].mem/1e6), false)
	rep.target("W9 roll-up without jsonb_agg: CPU per change ≤ 1.3x W1", ratio(scalar, cpu), "<=", 1.3, "x")
	rep.target("W9 roll-up with jsonb_agg: CPU per change ≤ 2x W1", ratio(rolled, cpu), "<=", 2, "x")
	rep.target("W9 roll-up: Redis ≤ 1.5x W1's two-table state", ratio(rolled, mem), "<=", 1.5, "x")
}

// logW9Keys logs where the Redis bytes of W1's join or W9's (rolled) are,
// by state and kind: MEMORY USAGE, and the keys' encodings.
func (d *db) logW9Keys(rolled bool) {
	d.b.Helper()
	prefixes := []string{redisstore.Prefix(d.Slot, "orders_enriched")}
	if rolled {
		prefixes = nil
		for tab := range 3 {
			prefixes = append(prefixes, redisstore.TablePrefix(d.Slot, "customer_stats", tab))
		}
	}
	for _, prefix := range prefixes {
		k := d.redisKeysOf(prefix)
		for _, kind := range []byte{redisstore.KindLeft, redisstore.KindRight, redisstore.KindSubs} {
			if k.bytes[kind] > 0 {
				d.b.Logf("%s %c: %.1f MB, %s", prefix, kind, k.bytes[kind]/1e6, k.encodingSummary(kind))
			}
		}
	}
}

// benchW9Backfill is W9's backfill beside the SQL's INSERT … SELECT.
func benchW9Backfill(t *testing.T, s sizes, rep *report) {
	name := "W9 roll-up"

	// The backfill, of W9Orders orders over W9Customers customers.
	w := w1(s)
	w.yaml, w.oracleTarget, w.oracleSQL = w9YAML, `SELECT * FROM customer_stats`, w9SQL
	d := newDB(t, w)
	d.exec(fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['bronze', 'silver', 'gold'])[1 + g %% 3] FROM generate_series(1, %d) g`, s.W9Customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% %d, (g %% 1000) + (g %% 100) / 100.0, 'note ' || md5(g::text) FROM generate_series(1, %d) g`, s.W9Customers, s.W9Orders),
		`VACUUM ANALYZE customers, orders`)
	d.exec(`CREATE TABLE limit_t AS ` + w9SQL + ` LIMIT 0`)
	start := time.Now()
	d.exec(`INSERT INTO limit_t SELECT c.id, c.name, c.tier, coalesce(g.n, 0), g.revenue, g.last, g.recent FROM customers c LEFT JOIN
		(SELECT customer_id, count(*) AS n, sum(amount) AS revenue, max(id) AS last,
			jsonb_agg(jsonb_build_object('id', id, 'amount', amount) ORDER BY id DESC) FILTER (WHERE k <= 5) AS recent
		 FROM (SELECT o.*, row_number() OVER (PARTITION BY customer_id ORDER BY id DESC) AS k FROM orders o WHERE id % 10 <> 0) o
		 GROUP BY customer_id) g ON g.customer_id = c.id`)
	limit := time.Since(start)
	planBytes, planSeconds := d.checkPlan()
	mem0 := d.settledMemory()
	u := d.backfill()
	mem := d.settledMemory().used - mem0.used
	d.assertJoin("customer_stats")
	d.logW9Keys(true)
	rep.row(name, "check --plan: estimated Redis memory / INFO used_memory growth of the backfill", planBytes/mem, "x",
		fmt.Sprintf("estimate %.0f MB, used_memory growth %.0f MB", planBytes/1e6, mem/1e6), false)
	rep.row(name, "check --plan: estimated backfill time / real", planSeconds/u.took.Seconds(), "x",
		fmt.Sprintf("estimate %.1f s, real %.1f s", planSeconds, u.took.Seconds()), false)
	rep.row(name, "INSERT INTO … SELECT … GROUP BY of its SQL (limit)", limit.Seconds(), "s",
		fmt.Sprintf("%d orders over %d customers", s.W9Orders, s.W9Customers), true)
	rep.row(name, "fkmat backfill (target + Redis state)", u.took.Seconds(), "s",
		fmt.Sprintf("%.2fx the limit's time; fkmat CPU %.1f s, redis-server %.1f s; peak RSS %.0f MB",
			u.took.Seconds()/limit.Seconds(), u.cpu, u.redisCPU, u.peakRSSMB), true)
	rep.target("W9 roll-up backfill within 2x of its INSERT … SELECT … GROUP BY", u.took.Seconds()/limit.Seconds(), "<=", 2, "x")
}
