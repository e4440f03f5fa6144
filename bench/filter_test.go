package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
)

// w1FilteredYAML is W1's join with a filter keeping half of the orders
// and a computed column.
const w1FilteredYAML = `
joins:
  - name: orders_enriched
    type: left
    left: {table: orders, foreign_key: [customer_id], where: "id % 2 = 0",
           columns: [id, customer_id, amount, note, "amount * 2 AS amount2"]}
    right: {table: customers}
    target: {table: orders_enriched}
`

// benchW1Filtered measures W1's catch-up with w1FilteredYAML beside plain
// W1, alternately (plain, filtered, plain, filtered), each on a fresh
// database: the cost per change of the filter and the expression (CPU of
// fkmat and redis-server, and the catch-up time), and the Redis state
// (INFO used_memory growth over the backfill and catch-up).
func benchW1Filtered(t *testing.T, s sizes, rep *report) {
	type result struct {
		catchUp, cpu, mem float64
	}
	measure := func(filtered bool) result {
		w := w1(s)
		if filtered {
			w.yaml = w1FilteredYAML
			w.oracleTarget = `SELECT id, customer_id, amount, note, amount2, name, tier FROM orders_enriched`
			w.oracleSQL = `SELECT o.id, o.customer_id, o.amount, o.note, o.amount * 2, c.name, c.tier
				FROM orders o LEFT JOIN customers c ON o.customer_id = c.id WHERE o.id % 2 = 0`
		}
		d := newDB(t, w)
		mem0 := d.redisInfo("memory", "used_memory")
		_, catchUp, u := d.catchUp(w, "catchup")
		mem := d.redisInfo("memory", "used_memory") - mem0
		// The next run measures its own state only.
		if err := testenv.DeleteKeys(context.Background(), d.Redis, "fkmat:"+d.Slot+":"); err != nil {
			t.Fatal(err)
		}
		return result{catchUp.Seconds(), u.cpu + u.redisCPU, mem}
	}
	var plain, filtered []result
	for range 2 {
		plain = append(plain, measure(false))
		filtered = append(filtered, measure(true))
	}
	n := float64(w1(s).changes())
	name := "W1 insert/update"
	var cpuRatio, timeRatio, memRatio float64
	for i := range plain {
		cpuRatio += filtered[i].cpu / plain[i].cpu / float64(len(plain))
		timeRatio += filtered[i].catchUp / plain[i].catchUp / float64(len(plain))
		memRatio += filtered[i].mem / plain[i].mem / float64(len(plain))
	}
	rep.row(name, "filtered (half the orders) + an expression: CPU per change / plain", cpuRatio, "ratio",
		fmt.Sprintf("fkmat + redis-server CPU per 1k changes: plain %.1f / %.1f ms, filtered %.1f / %.1f ms (A B A B)",
			1e6*plain[0].cpu/n, 1e6*plain[1].cpu/n, 1e6*filtered[0].cpu/n, 1e6*filtered[1].cpu/n), false)
	rep.row(name, "filtered + an expression: catch-up time / plain", timeRatio, "ratio",
		fmt.Sprintf("plain %.2f / %.2f s, filtered %.2f / %.2f s", plain[0].catchUp, plain[1].catchUp, filtered[0].catchUp, filtered[1].catchUp), false)
	rep.row(name, "filtered + an expression: Redis used_memory growth / plain", memRatio, "ratio",
		fmt.Sprintf("plain %.1f / %.1f MB, filtered %.1f / %.1f MB", plain[0].mem/1e6, plain[1].mem/1e6, filtered[0].mem/1e6, filtered[1].mem/1e6), false)
	rep.target("W1 with a 50% filter and an expression: CPU per change ≤ 1.2x plain", cpuRatio, "<=", 1.2, "x")
	rep.target("W1 with a 50% filter and an expression: Redis state ≤ 0.55x plain", memRatio, "<=", 0.55, "x")
}

// w7FilteredYAML is W7's join with a filter on a dimension of the chain
// (a nation left out: its customers' lineitems keep no nation nor region)
// and two computed columns, one on the fact table and one on a dimension.
var w7FilteredYAML = strings.NewReplacer(
	"columns: [l_orderkey, l_linenumber, l_partkey, l_suppkey, l_quantity, l_extendedprice, l_discount, l_shipdate]",
	`columns: [l_orderkey, l_linenumber, l_partkey, l_suppkey, l_quantity, l_extendedprice, l_discount, l_shipdate, "l_extendedprice * (1 - l_discount) AS revenue"]`,
	"columns: [c_name, c_mktsegment]}", `columns: [c_name, c_mktsegment, "lower(c_name) AS c_name_lc"]}`,
	"foreign_key: [c_nationkey], columns: [n_name]}", `foreign_key: [c_nationkey], where: "n_name <> 'nation 6'", columns: [n_name]}`,
).Replace(w7YAML)

const (
	w7FilteredSQL = `SELECT l.l_orderkey, l.l_linenumber, l.l_partkey, l.l_suppkey, l.l_quantity, l.l_extendedprice, l.l_discount, l.l_shipdate,
		l.l_extendedprice * (1 - l.l_discount), o.o_orderdate, o.o_totalprice, c.c_name, c.c_mktsegment, lower(c.c_name), n.n_name, r.r_name,
		p.p_name, p.p_brand, s.s_name, ps.ps_supplycost, sn.n_name AS s_nation
	FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey LEFT JOIN customer c ON o.o_custkey = c.c_custkey
	LEFT JOIN (SELECT * FROM nation WHERE n_name <> 'nation 6') n ON c.c_nationkey = n.n_nationkey LEFT JOIN region r ON n.n_regionkey = r.r_regionkey
	JOIN part p ON l.l_partkey = p.p_partkey LEFT JOIN supplier s ON l.l_suppkey = s.s_suppkey
	LEFT JOIN partsupp ps ON l.l_partkey = ps.ps_partkey AND l.l_suppkey = ps.ps_suppkey
	LEFT JOIN nation sn ON s.s_nationkey = sn.n_nationkey`
	w7FilteredTarget = `SELECT l_orderkey, l_linenumber, l_partkey, l_suppkey, l_quantity, l_extendedprice, l_discount, l_shipdate, revenue,
		o_orderdate, o_totalprice, c_name, c_mktsegment, c_name_lc, n_name, r_name, p_name, p_brand, s_name, ps_supplycost, s_nation FROM lineitem_wide`
)

// benchW7Filtered measures W7's fan-out through its chain against the
// two-table fan-out of the same daemon, with w7FilteredYAML and with W7's
// own join, one after the other in one run: the filter and the
// expressions must keep the chain's ratio.
func benchW7Filtered(t *testing.T, s sizes, rep *report) {
	sf := w7ScaleFactor(s.W1Orders >= fullSizes.W1Orders)
	name := fmt.Sprintf("W7 TPC-H, 8 entries (SF %g)", sf)
	ratio := func(yaml, target, sql string) (float64, float64, float64) {
		w := w7(sf)
		w.yaml = yaml
		d := newDB(t, w)
		d.backfill()
		d.assertQuery("lineitem_wide", target, sql)
		p := d.run("w7")
		p.waitServing()
		d.waitCaught(p)
		regions, flags, _, _ := w7FanOuts(t, d, p)
		d.waitCaught(p)
		p.stop()
		d.assertQuery("lineitem_wide", target, sql)
		d.assertQuery("lineitem_flags", w7FlagsTarget, w7FlagsSQL)
		// The next database starts on an empty Redis: the daemon's sweep
		// scans the whole keyspace when it starts, and would take longer
		// in each run than in the one before.
		if err := testenv.DeleteKeys(context.Background(), d.Redis, "fkmat:"+d.Slot+":"); err != nil {
			t.Fatal(err)
		}
		return median(regions) / median(flags), median(regions), median(flags)
	}
	// Alternately, plain and filtered, twice: the fan-out rates of one
	// database swing between runs on a loaded machine.
	var plains, filtereds []float64
	detail := ""
	for range 2 {
		plain, pr, pf := ratio(w7YAML, w7WideTarget, w7WideSQL)
		filtered, fr, ff := ratio(w7FilteredYAML, w7FilteredTarget, w7FilteredSQL)
		plains, filtereds = append(plains, plain), append(filtereds, filtered)
		detail += fmt.Sprintf("; plain %.2fx (%.0f / %.0f rows/s), filtered %.2fx (%.0f / %.0f)", plain, pr, pf, filtered, fr, ff)
	}
	plain, filtered := (plains[0]+plains[1])/2, (filtereds[0]+filtereds[1])/2
	rep.row(name, "filter on nation + 2 expressions: chain fan-out / two-table fan-out", filtered, "x",
		"region rename / flag rename rows/s, medians of 3 per database, A B A B"+detail, false)
	rep.target("W7 with a filter on a dimension and 2 expressions keeps the chain's fan-out ratio (filtered / plain)", filtered/plain, ">=", 0.9, "x")
}
