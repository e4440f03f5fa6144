package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fkmat/fkmat/redisstore"
)

// w7 (TPC-H): the TPC-H schema's tables and keys, generated in SQL at scale
// factor sf (lineitem 6M·sf rows, four per order), maintained as one join of
// eight entries: lineitem → orders (inner) → customer → nation → region (a
// four-level chain), part (inner), supplier, partsupp (a composite foreign
// key), and the supplier's nation through `as`. Beside it, in the same
// daemon, a two-table join of the same lineitems with a three-row
// return-flag table.
func w7(sf float64) *workload {
	n := func(base int) int { return max(1, int(float64(base)*sf)) }
	customers, suppliers, parts, orders := n(150_000), n(10_000), n(200_000), n(1_500_000)
	return &workload{name: "W7", title: "TPC-H, 8 entries", orders: 4 * orders, yaml: w7YAML, setup: []string{`
CREATE TABLE region (r_regionkey int PRIMARY KEY, r_name text, r_comment text);
CREATE TABLE nation (n_nationkey int PRIMARY KEY, n_name text, n_regionkey int, n_comment text);
CREATE TABLE customer (c_custkey bigint PRIMARY KEY, c_name text, c_nationkey int, c_mktsegment text, c_acctbal numeric(12,2));
CREATE TABLE supplier (s_suppkey bigint PRIMARY KEY, s_name text, s_nationkey int, s_acctbal numeric(12,2));
CREATE TABLE part (p_partkey bigint PRIMARY KEY, p_name text, p_brand text, p_type text, p_retailprice numeric(12,2));
CREATE TABLE partsupp (ps_partkey bigint, ps_suppkey bigint, ps_supplycost numeric(12,2), ps_availqty int, PRIMARY KEY (ps_partkey, ps_suppkey));
CREATE TABLE orders (o_orderkey bigint PRIMARY KEY, o_custkey bigint, o_orderdate date, o_totalprice numeric(12,2), o_orderstatus text);
CREATE TABLE lineitem (l_orderkey bigint, l_linenumber int, l_partkey bigint, l_suppkey bigint, l_quantity numeric(12,2),
	l_extendedprice numeric(12,2), l_discount numeric(12,2), l_shipdate date, l_returnflag text, PRIMARY KEY (l_orderkey, l_linenumber));
CREATE TABLE returnflag (flag text PRIMARY KEY, label text);
INSERT INTO region SELECT g, 'region ' || g, 'comment' FROM generate_series(0, 4) g;
INSERT INTO nation SELECT g, 'nation ' || g, g % 5, 'comment' FROM generate_series(0, 24) g;
INSERT INTO returnflag VALUES ('A', 'accepted'), ('N', 'none'), ('R', 'returned');`,
		fmt.Sprintf(`INSERT INTO customer SELECT g, 'Customer#' || g, g %% 25, 'SEGMENT' || g %% 5, g %% 10000 FROM generate_series(1, %d) g`, customers),
		fmt.Sprintf(`INSERT INTO supplier SELECT g, 'Supplier#' || g, g %% 25, g %% 10000 FROM generate_series(1, %d) g`, suppliers),
		fmt.Sprintf(`INSERT INTO part SELECT g, 'part ' || g, 'Brand#' || g %% 25, 'TYPE ' || g %% 150, 900 + g %% 1000 FROM generate_series(1, %d) g`, parts),
		// Four suppliers per part, as TPC-H's partsupp.
		fmt.Sprintf(`INSERT INTO partsupp SELECT p, 1 + (p + s * (%[2]d / 4 + 1)) %% %[2]d, (p * s) %% 1000, s FROM generate_series(1, %[1]d) p, generate_series(0, 3) s`,
			parts, suppliers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% %d, date '1995-01-01' + g %% 2000, g %% 100000, 'O' FROM generate_series(1, %d) g`, customers, orders),
		// Each lineitem's (part, supplier) is a partsupp row.
		fmt.Sprintf(`INSERT INTO lineitem SELECT o, l, 1 + (o * 7 + l) %% %[2]d, 1 + ((1 + (o * 7 + l) %% %[2]d) + (l %% 4) * (%[3]d / 4 + 1)) %% %[3]d,
			1 + l, (o + l) %% 100000, 0.05, date '1995-01-01' + o %% 2000, (array['A', 'N', 'R'])[1 + (o + l) %% 3]
			FROM generate_series(1, %[1]d) o, generate_series(1, 4) l`, orders, parts, suppliers),
		`VACUUM ANALYZE`}}
}

const w7YAML = `
joins:
  - name: lineitem_wide
    type: left
    left:
      table: lineitem
      columns: [l_orderkey, l_linenumber, l_partkey, l_suppkey, l_quantity, l_extendedprice, l_discount, l_shipdate]
    right:
      - {table: orders, type: inner, foreign_key: [l_orderkey], columns: [o_orderdate, o_totalprice]}
      - {table: customer, from: orders, foreign_key: [o_custkey], columns: [c_name, c_mktsegment]}
      - {table: nation, from: customer, foreign_key: [c_nationkey], columns: [n_name]}
      - {table: region, from: nation, foreign_key: [n_regionkey], columns: [r_name]}
      - {table: part, type: inner, foreign_key: [l_partkey], columns: [p_name, p_brand]}
      - {table: supplier, foreign_key: [l_suppkey], columns: [s_name]}
      - {table: partsupp, foreign_key: [l_partkey, l_suppkey], columns: [ps_supplycost]}
      - {table: nation, as: snation, from: supplier, foreign_key: [s_nationkey], columns: [n_name AS s_nation]}
    target: {table: lineitem_wide}
  - name: lineitem_flags
    type: left
    left: {table: lineitem, foreign_key: [l_returnflag], columns: [l_orderkey, l_linenumber, l_returnflag, l_quantity]}
    right: {table: returnflag, columns: [label]}
    target: {table: lineitem_flags}
`

// The SQL of each join, in the target's column order.
const (
	w7WideSQL = `SELECT l.l_orderkey, l.l_linenumber, l.l_partkey, l.l_suppkey, l.l_quantity, l.l_extendedprice, l.l_discount, l.l_shipdate,
		o.o_orderdate, o.o_totalprice, c.c_name, c.c_mktsegment, n.n_name, r.r_name, p.p_name, p.p_brand, s.s_name, ps.ps_supplycost, sn.n_name AS s_nation
	FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey LEFT JOIN customer c ON o.o_custkey = c.c_custkey
	LEFT JOIN nation n ON c.c_nationkey = n.n_nationkey LEFT JOIN region r ON n.n_regionkey = r.r_regionkey
	JOIN part p ON l.l_partkey = p.p_partkey LEFT JOIN supplier s ON l.l_suppkey = s.s_suppkey
	LEFT JOIN partsupp ps ON l.l_partkey = ps.ps_partkey AND l.l_suppkey = ps.ps_suppkey
	LEFT JOIN nation sn ON s.s_nationkey = sn.n_nationkey`
	w7WideTarget = `SELECT l_orderkey, l_linenumber, l_partkey, l_suppkey, l_quantity, l_extendedprice, l_discount, l_shipdate,
		o_orderdate, o_totalprice, c_name, c_mktsegment, n_name, r_name, p_name, p_brand, s_name, ps_supplycost, s_nation FROM lineitem_wide`
	w7FlagsSQL = `SELECT l.l_orderkey, l.l_linenumber, l.l_returnflag, l.l_quantity, f.label
	FROM lineitem l LEFT JOIN returnflag f ON l.l_returnflag = f.flag`
	w7FlagsTarget = `SELECT l_orderkey, l_linenumber, l_returnflag, l_quantity, label FROM lineitem_flags`
)

// w7ScaleFactor is the scale factor of W7: 0.1 in make bench,
// FKMAT_BENCH_W7_SF to change it (1 for the figures of a release), tiny in
// the smoke run.
func w7ScaleFactor(full bool) float64 {
	if v, err := strconv.ParseFloat(os.Getenv("FKMAT_BENCH_W7_SF"), 64); err == nil && v > 0 {
		return v
	}
	if full {
		return 0.1
	}
	return 0.001
}

// benchW7 measures the TPC-H join: the backfill against INSERT ... SELECT
// of both joins' SQL, the Redis memory per lineitem of each table's state,
// a region rename and customers changing nation (root rows written per
// second) against a flag rename of the two-table join in the same daemon,
// and fkmat's peak RSS; every target ends equal to its SQL.
func benchW7(t *testing.T, s sizes, rep *report) {
	sf := w7ScaleFactor(s.W1Orders >= fullSizes.W1Orders)
	w := w7(sf)
	name := fmt.Sprintf("%s %s (SF %g)", w.name, w.title, sf)
	d := newDB(t, w)
	lineitems := float64(d.int64(`SELECT count(*) FROM lineitem`))

	// INSERT ... SELECT of both joins, the floor of a backfill.
	start := time.Now()
	d.exec(`CREATE TABLE w7_floor_wide AS `+w7WideSQL, `CREATE TABLE w7_floor_flags AS `+w7FlagsSQL)
	floor := time.Since(start)
	d.exec(`DROP TABLE w7_floor_wide, w7_floor_flags`)
	planBytes, planSeconds := d.checkPlan()
	bf := d.backfill()
	d.assertQuery("lineitem_wide", w7WideTarget, w7WideSQL)
	d.assertQuery("lineitem_flags", w7FlagsTarget, w7FlagsSQL)
	rep.row(name, "backfill of both joins", bf.took.Seconds(), "s",
		fmt.Sprintf("%.0f lineitems; %.0f rows/s; peak RSS %.0f MB", lineitems, lineitems/bf.took.Seconds(), bf.peakRSSMB), true)
	rep.row(name, "INSERT ... SELECT of both joins' SQL", floor.Seconds(), "s", "", true)
	rep.row(name, "backfill CPU: fkmat, redis-server", bf.cpu, "s", fmt.Sprintf("redis-server %.1f s", bf.redisCPU), false)
	ratio := bf.took.Seconds() / floor.Seconds()
	rep.row(name, "backfill / INSERT ... SELECT", ratio, "x", "", false)

	// Redis memory per lineitem, per table of the tree and in all.
	var all float64
	tables := []string{"lineitem", "orders", "customer", "nation", "region", "part", "supplier", "partsupp", "snation"}
	for tab, table := range tables {
		k := d.redisKeysOf(redisstore.TablePrefix(d.Slot, "lineitem_wide", tab))
		rows := k.bytes[redisstore.KindLeft] + k.bytes[redisstore.KindSubs]
		all += rows
		rep.row(name, "Redis memory per lineitem, "+table+" (rows and references)", rows/lineitems, "B",
			k.encodingSummary(redisstore.KindLeft)+"; "+k.encodingSummary(redisstore.KindSubs), false)
	}
	rep.row(name, "Redis memory per lineitem, all of lineitem_wide", all/lineitems, "B", "", false)
	k := d.redisKeysOf(redisstore.Prefix(d.Slot, "lineitem_flags"))
	flagsBytes := k.bytes[redisstore.KindLeft] + k.bytes[redisstore.KindSubs] + k.bytes[redisstore.KindRight]
	rep.row(name, "Redis memory per lineitem, the two-table lineitem_flags", flagsBytes/lineitems, "B", "", false)
	rep.row(name, "check --plan: estimated Redis memory / MEMORY USAGE of both joins", planBytes/(all+flagsBytes), "x",
		fmt.Sprintf("estimate %.0f MB, real %.0f MB", planBytes/1e6, (all+flagsBytes)/1e6), false)
	rep.row(name, "check --plan: estimated backfill time / real", planSeconds/bf.took.Seconds(), "x",
		fmt.Sprintf("estimate %.1f s, real %.1f s", planSeconds, bf.took.Seconds()), false)

	// From run on joins never backfilled to caught up: the backfill, then
	// the stream from its consistent point, which decodes the rows written
	// into the targets meanwhile when they are in the source's database.
	// First with the targets in another database of the same server.
	other, pool := d.runToFreshInto("w7-fresh-other", d.Database+"_target")
	d.assertQueryIn(pool, "lineitem_wide", w7WideTarget, w7WideSQL)
	d.assertQueryIn(pool, "lineitem_flags", w7FlagsTarget, w7FlagsSQL)
	fresh := d.runToFresh("w7-fresh")
	d.assertQuery("lineitem_wide", w7WideTarget, w7WideSQL)
	d.assertQuery("lineitem_flags", w7FlagsTarget, w7FlagsSQL)
	for _, f := range []struct {
		where string
		r     freshRun
	}{{"targets in the source's database", fresh}, {"targets in another database", other}} {
		rep.row(name, "from run on empty to caught up, "+f.where, f.r.total.Seconds(), "s",
			fmt.Sprintf("backfill %.1f s, then streaming to caught up %.1f s", f.r.backfill.Seconds(), (f.r.total-f.r.backfill).Seconds()), true)
		rep.row(name, "from run on empty to caught up / INSERT ... SELECT, "+f.where, f.r.total.Seconds()/floor.Seconds(), "x", "", false)
	}
	w7Memory(d, rep, name, &fresh, lineitems, planBytes)

	p := d.run("w7")
	p.waitServing()
	d.waitCaught(p)
	rate := func(sql string, n int64) float64 {
		t.Helper()
		return float64(n) / p.writeRows(sql, n, 20*time.Minute).Seconds()
	}
	regions, flagRates, inRegion, flagged := w7FanOuts(t, d, p)
	moved := d.int64(`SELECT count(*) FROM lineitem_wide w JOIN orders o ON w.l_orderkey = o.o_orderkey WHERE o.o_custkey % 10 = 0`)
	nations := rate(`UPDATE customer SET c_nationkey = (c_nationkey + 1) % 25 WHERE c_custkey % 10 = 0`, moved)
	d.waitCaught(p)
	u := p.stop()
	d.assertQuery("lineitem_wide", w7WideTarget, w7WideSQL)
	d.assertQuery("lineitem_flags", w7FlagsTarget, w7FlagsSQL)
	rf := w7Refresh(d, sf)
	d.assertQuery("lineitem_wide", w7WideTarget, w7WideSQL)
	d.assertQuery("lineitem_flags", w7FlagsTarget, w7FlagsSQL)
	perCPU := rf.changes / (rf.u.cpu + rf.u.redisCPU + rf.u.walsenderCPU)
	rep.row(name, "TPC-H refresh stream: input changes per CPU-second of fkmat + redis-server + walsender", perCPU, "changes/s",
		fmt.Sprintf("%.0f changes in %d rounds of RF1, RF2 and price updates, caught up in %.1f s; CPU fkmat %.1f s, redis-server %.1f s, walsender %.1f s",
			rf.changes, rf.rounds, rf.u.took.Seconds(), rf.u.cpu, rf.u.redisCPU, rf.u.walsenderCPU), true)
	region, flags := median(regions), median(flagRates)
	rep.row(name, fmt.Sprintf("region rename through the chain, %d lineitems (median of 3)", inRegion), region, "rows/s",
		"runs (rows/s):"+listRates(regions), true)
	rep.row(name, fmt.Sprintf("a tenth of the customers change nation, %d lineitems", moved), nations, "rows/s", "", true)
	rep.row(name, fmt.Sprintf("two-table fan-out, a flag label renamed, %d lineitems, same daemon (median of 3)", flagged), flags, "rows/s",
		"runs (rows/s):"+listRates(flagRates), true)
	rep.row(name, "region rename / two-table fan-out, rows/s", region/flags, "x", "medians, measured alternately in one run", false)
	rep.row(name, "fkmat peak RSS, backfill", bf.peakRSSMB, "MB", "", false)
	rep.row(name, "fkmat peak RSS, run", u.peakRSSMB, "MB", "", false)
	rep.rss = max(rep.rss, u.peakRSSMB, bf.peakRSSMB)
	rep.target("W7 Redis per lineitem, all state of the 8-entry join", all/lineitems, "<=", 300, "B")
	rep.target("W7 backfill within 3x of INSERT ... SELECT of its SQL", ratio, "<=", 3, "x")
	rep.target("W7 from run on empty to caught up within 2x of INSERT ... SELECT", fresh.total.Seconds()/floor.Seconds(), "<=", 2, "x")
	rep.target("W7 Redis used_memory growth per lineitem, the 8-entry join", fresh.wideUsed, "<=", 250, "B")
	rep.target("W7 a fan-out through a 4-level chain at 0.6x a two-table fan-out or better", region/flags, ">=", 0.6, "x")
	if !math.IsNaN(perCPU) {
		rep.target("W7 TPC-H refresh stream: input changes per CPU-second of fkmat + redis-server + walsender", perCPU, ">=", 30_000, "changes/s")
	}
}

// median returns the median of xs (the upper one of an even count).
func median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// listRates formats rates as " 59102 57186 …".
func listRates(xs []float64) string {
	out := ""
	for _, x := range xs {
		out += fmt.Sprintf(" %.0f", x)
	}
	return out
}

// w7FanOuts runs W7's two fan-outs on p alternately, three of each: a
// region renamed (through the 4-level chain) and a return flag's label
// renamed (the two-table join of the same daemon). It returns each run's
// rows per second, and the target rows of each. Their medians are
// compared: one of each swung their ratio from 0.5 to 0.8 between runs on
// this machine.
func w7FanOuts(t *testing.T, d *db, p *daemon) (regions, flags []float64, inRegion, flagged int64) {
	t.Helper()
	// rate runs sql and returns the rows per second until p has written n
	// more target rows.
	rate := func(sql string, n int64) float64 {
		t.Helper()
		return float64(n) / p.writeRows(sql, n, 20*time.Minute).Seconds()
	}
	inRegion = d.int64(`SELECT count(*) FROM lineitem_wide WHERE r_name = 'region 1'`)
	flagged = d.int64(`SELECT count(*) FROM lineitem_flags WHERE l_returnflag = 'N'`)
	for r := range 3 {
		regions = append(regions, rate(fmt.Sprintf(`UPDATE region SET r_name = 'REGION ONE %d' WHERE r_regionkey = 1`, r), inRegion))
		flags = append(flags, rate(fmt.Sprintf(`UPDATE returnflag SET label = 'no flag %d' WHERE flag = 'N'`, r), flagged))
	}
	return regions, flags, inRegion, flagged
}

// w7Memory reports the Redis memory of both joins as INFO used_memory
// grew from run on empty to caught up (fresh), beside the MEMORY USAGE sum
// of their keys and check --plan's estimate (planBytes), and what a
// rebuild beside the running joins (backfill --force) leaves behind. It
// sets fresh.wideUsed: the growth per lineitem charged to lineitem_wide,
// in proportion to its share of the MEMORY USAGE sum.
func w7Memory(d *db, rep *report, name string, fresh *freshRun, lineitems, planBytes float64) {
	used := fresh.after.used - fresh.before.used
	var sum float64
	keys := 0
	for _, n := range d.stateNodes() {
		sum += n.bytes
		keys += n.keys
	}
	var wideSum float64
	for tab := range 9 { // lineitem_wide's tables
		for _, b := range d.redisKeysOf(redisstore.TablePrefix(d.Slot, "lineitem_wide", tab)).bytes {
			wideSum += b
		}
	}
	fresh.wideUsed = used * wideSum / sum / lineitems
	rep.row(name, "Redis used_memory growth per lineitem, both joins, from run on empty", used/lineitems, "B",
		fmt.Sprintf("%.0f MB: used_memory_dataset %+.0f MB, used_memory_overhead %+.0f MB (the keyspace's tables), over %d keys",
			used/1e6, (fresh.after.dataset-fresh.before.dataset)/1e6, (fresh.after.overhead-fresh.before.overhead)/1e6, keys), false)
	rep.row(name, "MEMORY USAGE sum per lineitem, both joins, same keys", sum/lineitems, "B",
		fmt.Sprintf("lineitem_wide %.0f MB, lineitem_flags %.0f MB", wideSum/1e6, (sum-wideSum)/1e6), false)
	rep.row(name, "used_memory growth / MEMORY USAGE sum", used/sum, "x", "", false)
	rep.row(name, "Redis used_memory growth per lineitem, lineitem_wide's share", fresh.wideUsed, "B",
		"the growth in proportion to its share of the MEMORY USAGE sum", false)
	rep.row(name, "check --plan: estimated Redis memory / used_memory growth, both joins", planBytes/used, "x",
		fmt.Sprintf("estimate %.0f MB, used_memory growth %.0f MB", planBytes/1e6, used/1e6), false)
	// A rebuild beside the running joins writes a new generation and
	// deletes the old one.
	d.backfill()
	after := d.settledMemory()
	rep.row(name, "Redis used_memory after a rebuild beside the joins / before it", (after.used-fresh.before.used)/used, "x",
		fmt.Sprintf("%.0f MB, %.0f MB before", (after.used-fresh.before.used)/1e6, used/1e6), false)
}

// refresh is what w7Refresh measured.
type refresh struct {
	rounds  int
	changes float64 // rows inserted, deleted and updated in the source
	u       usage   // the run that caught up with them
}

// w7Refresh writes a stream of TPC-H's refresh functions with fkmat
// stopped, then measures the run that catches up with it: rounds of RF1
// (new orders, SF x 1,500, with 1-7 lineitems each, in one transaction),
// RF2 (as many of the oldest orders and their lineitems deleted, in one
// transaction), a price update of 100 parts (a column outside the joins)
// and an account update of 10 suppliers. The input changes per CPU-second
// of fkmat, redis-server and the walsender compare with Feldera's
// published 26-28k input records per CPU-second on TPC-H q5 at SF 100.
func w7Refresh(d *db, sf float64) refresh {
	d.b.Helper()
	ctx := context.Background()
	n := func(base int) int { return max(1, int(float64(base)*sf)) }
	customers, suppliers, parts, orders, batch := n(150_000), n(10_000), n(200_000), n(1_500_000), n(1_500)
	next := d.int64(`SELECT max(o_orderkey) + 1 FROM orders`)
	oldest := d.int64(`SELECT min(o_orderkey) FROM orders`)
	rounds := max(2, orders/10/batch) // a tenth of the orders replaced
	var changes int64
	run := func(sqls ...string) {
		tx, err := d.Pool.Begin(ctx)
		if err != nil {
			d.b.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		for _, q := range sqls {
			tag, err := tx.Exec(ctx, q)
			if err != nil {
				d.b.Fatalf("%s: %v", q, err)
			}
			changes += tag.RowsAffected()
		}
		if err := tx.Commit(ctx); err != nil {
			d.b.Fatal(err)
		}
	}
	for r := range rounds {
		a, b := next, next+int64(batch)-1
		run(fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% %d, date '1998-08-01' + g %% 100, g %% 100000, 'O' FROM generate_series(%d, %d) g`, customers, a, b),
			fmt.Sprintf(`INSERT INTO lineitem SELECT o, l, 1 + (o * 7 + l) %% %[3]d, 1 + ((1 + (o * 7 + l) %% %[3]d) + (l %% 4) * (%[4]d / 4 + 1)) %% %[4]d,
				1 + l, (o + l) %% 100000, 0.05, date '1998-08-01' + o %% 100, (array['A', 'N', 'R'])[1 + (o + l) %% 3]
				FROM generate_series(%[1]d, %[2]d) o, generate_series(1, 1 + o %% 7) l`, a, b, parts, suppliers))
		next = b + 1
		c, e := oldest, oldest+int64(batch)-1
		run(fmt.Sprintf(`DELETE FROM lineitem WHERE l_orderkey BETWEEN %d AND %d`, c, e),
			fmt.Sprintf(`DELETE FROM orders WHERE o_orderkey BETWEEN %d AND %d`, c, e))
		oldest = e + 1
		run(fmt.Sprintf(`UPDATE part SET p_retailprice = p_retailprice + 1 WHERE p_partkey %% %d = %d`, max(1, parts/100), r%max(1, parts/100)),
			fmt.Sprintf(`UPDATE supplier SET s_acctbal = s_acctbal + 1 WHERE s_suppkey %% %d = %d`, max(1, suppliers/10), r%max(1, suppliers/10)))
	}
	p := d.run("w7-refresh")
	p.waitServing()
	d.waitCaught(p)
	return refresh{rounds: rounds, changes: float64(changes), u: p.stop()}
}
