package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat/internal/testenv"
)

func TestMain(m *testing.M) {
	// Limits are measured without Docker's userland proxy in the path (it
	// caps decoding near half its real rate here): the servers run in the
	// host's network namespace, on loopback ports of their own.
	if os.Getenv("FKMAT_TEST_NETWORK") == "" {
		_ = os.Setenv("FKMAT_TEST_NETWORK", "host")
	}
	code := testenv.Main(m)
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// TestBench runs every workload against every contender and writes the
// results table. With FKMAT_BENCH=full (make bench) it uses the full sizes
// and writes bench/results/; otherwise it is the smoke run of make test:
// the same code at tiny sizes (seconds), results in a temporary directory,
// and the targets are not judged.
func TestBench(t *testing.T) {
	s, full := smokeSizes, os.Getenv("FKMAT_BENCH") == "full"
	if full {
		s = fullSizes
	}
	// FKMAT_BENCH_W4_ORDERS sizes the backfill (e.g. 10000000; customers
	// scale with it).
	if v, err := strconv.Atoi(os.Getenv("FKMAT_BENCH_W4_ORDERS")); err == nil && v > 0 {
		s.W4Customers = max(1, s.W4Customers*v/s.W4Orders)
		s.W4Orders = v
	}
	if testing.Short() {
		t.Skip("needs Docker")
	}
	rep := newReport(t, full, s)
	only := os.Getenv("FKMAT_BENCH_ONLY") // e.g. "W1,W4"
	for _, w := range []struct {
		name string
		run  func(t *testing.T, s sizes, rep *report)
	}{{"W1", benchW1}, {"W2", benchW2}, {"W3", benchW3}, {"W4", benchW4}, {"W5", benchW5}, {"W6", benchW6}, {"W7", benchW7}, {"W8", benchW8}, {"W1F", benchW1Filtered}, {"W7F", benchW7Filtered}, {"W9", benchW9}, {"FR", benchFreshness}} {
		if only != "" && !contains(only, w.name) {
			continue
		}
		if !t.Run(w.name, func(t *testing.T) { w.run(t, s, rep) }) {
			t.FailNow()
		}
	}
	rep.finish()
	// Only a whole full run replaces bench/results.
	dir := t.TempDir()
	if full && only == "" {
		dir = "results"
	}
	if err := rep.write(dir); err != nil {
		t.Fatal(err)
	}
	fmt.Print(rep.text())
}

func benchW1(t *testing.T, s sizes, rep *report) {
	w := w1(s)
	r := benchStream(t, w, s, 0, w1Paced(s))
	r.add(rep)
	benchProcs(t, w, r, rep)
	t.Run("cluster", func(t *testing.T) { benchCluster(t, w, r, rep) })
}

// benchProcs measures W1's catch-up once more with the daemon run with
// Go's default GOMAXPROCS (one per CPU), beside fkmat's default measured
// in this run (r): one on a machine of at most 2 CPUs, where fkmat shares
// its cores with Postgres and Redis and Go's idle threads looking for
// work take CPU the servers need.
func benchProcs(t *testing.T, w *workload, r *streamResult, rep *report) {
	d := newDB(t, w)
	procs := runtime.NumCPU()
	d.env = append(d.env, fmt.Sprintf("GOMAXPROCS=%d", procs))
	decode, catchUp, u := d.catchUp(w, "catchup_goprocs")
	n := float64(w.changes())
	name := w.name + " " + w.title
	share, base := decode.Seconds()/catchUp.Seconds(), r.decode.Seconds()/r.catchUp.Seconds()
	rep.row(name, fmt.Sprintf("fkmat catch-up, GOMAXPROCS=%d (Go's default)", procs), catchUp.Seconds(), "s",
		fmt.Sprintf("%.2fx the decode limit (%.2fx with fkmat's default); CPU per 1k changes: fkmat %.1f ms (%.1f), redis-server %.1f ms, walsender %.1f ms, target backends %.1f ms",
			share, base, 1e6*u.cpu/n, 1e6*r.catchUse.cpu/n, 1e6*u.redisCPU/n, 1e6*u.walsenderCPU/n, 1e6*u.backendCPU/n), true)
	rep.row(name, "catch-up share of the decode limit, fkmat's default GOMAXPROCS / Go's", base/share, "ratio",
		"same workload, same run, each against its own database's decode limit", false)
}

func benchW3(t *testing.T, s sizes, rep *report) {
	w := w3(s)
	r := benchStream(t, w, s, s.W3Orders, nil)
	r.add(rep)
}

// streamResult is what benchStream measured on one workload.
type streamResult struct {
	w                               *workload
	base, trig, live, decodeLive    time.Duration
	liveLat, pacedLat               []time.Duration
	pacedRate, pacedChanges         int
	liveUse, catchUse, backfillUse  usage
	decode, catchUp, writeLimit, mv time.Duration
	nodes                           []nodeState // the state after the catch-up
}

// benchStream measures a streaming workload (W1, W3) against each
// contender, each on a fresh database with the same setup:
//   - no maintenance: the writer alone, then REFRESH MATERIALIZED VIEW
//     CONCURRENTLY at the final size;
//   - row-level triggers maintaining trig_t;
//   - fkmat running while the writer writes (live), with the freshness
//     probe, then (paced) more writes at a fixed rate with the probe;
//   - catch-up: the workload written while fkmat is stopped, drained by a
//     bare pgoutput reader from a second slot (decode limit), then by fkmat;
//     then the same number of target rows upserted from the client (write
//     limit). pre is how many orders setup created.
func benchStream(t *testing.T, w *workload, s sizes, pre int, paced []txn) *streamResult {
	r := &streamResult{w: w}
	changes := w.changes()
	t.Logf("%s: %d transactions, %d row changes", w.name, len(w.txns), changes)

	{
		d := newDB(t, w)
		r.base = d.write(w.txns, 0)
		r.mv = d.refreshMV(s.Refreshes)
	}
	{
		// The floor of any logical-replication consumer: the same writes
		// while a bare pgoutput reader drains them.
		d := newDB(t, w)
		slot := d.Slot + "_bare"
		d.exec(`CREATE PUBLICATION `+pgx.Identifier{d.Publication}.Sanitize()+` FOR TABLE orders, customers`,
			fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, slot))
		type drained struct {
			n   int
			err error
		}
		done := make(chan drained, 1)
		go func() {
			n, _, _, err := d.drain(slot, len(w.txns))
			done <- drained{n, err}
		}()
		r.decodeLive = d.write(w.txns, 0)
		if got := <-done; got.err != nil || got.n != changes {
			t.Fatalf("bare reader saw %d changes (%v), want %d", got.n, got.err, changes)
		}
	}
	{
		d := newDB(t, w)
		d.installTriggers()
		r.trig = d.write(w.txns, 0)
		d.assertJoin("trig_t")
	}
	{
		d := newDB(t, w)
		r.backfillUse = d.backfill()
		p := d.run("live")
		d.waitCaught(p)
		pr := d.probe(time.Duration(s.ProbeEvery) * time.Millisecond)
		r.live = d.write(w.txns, 0)
		d.waitCaught(p)
		r.liveLat = pr.stop(t)
		if paced != nil {
			pr := d.probe(time.Duration(s.ProbeEvery) * time.Millisecond)
			d.write(paced, s.W1PacedRate)
			d.waitCaught(p)
			r.pacedLat = pr.stop(t)
			r.pacedRate, r.pacedChanges = s.W1PacedRate, len(paced)*10
		}
		r.liveUse = p.stop()
		d.assertJoin("orders_enriched")
	}
	{
		d := newDB(t, w)
		r.decode, r.catchUp, r.catchUse = d.catchUp(w, "catchup")
		r.nodes = d.stateNodes()
		r.writeLimit = d.writeLimit(w.targetWrites, w.orders, pre)
	}
	return r
}

// catchUp backfills d, writes the workload while fkmat is stopped, drains
// it with a bare pgoutput reader from a second slot (the decode limit),
// then starts fkmat and times it until it has caught up; the target must
// then equal the SQL join, written with no more rows than it changed by.
func (d *db) catchUp(w *workload, what string) (decode, catchUp time.Duration, use usage) {
	t := d.b
	t.Helper()
	d.backfill()
	bare := d.Slot + "_bare"
	d.exec(fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, bare))
	d.write(w.txns, 0)
	d.exec(`CHECKPOINT`)
	n, commits, took := d.drainBare(bare, len(w.txns))
	if n != w.changes() || commits != len(w.txns) {
		t.Fatalf("bare reader saw %d changes in %d commits, want %d in %d", n, commits, w.changes(), len(w.txns))
	}
	p := d.run(what)
	catchUp = d.waitCaught(p).Sub(p.start)
	use = p.stop()
	d.assertJoin("orders_enriched")
	if written := int(use.upserted + use.deleted); written > w.targetWrites {
		t.Errorf("fkmat wrote %d target rows, more than the %d the SQL result changed by", written, w.targetWrites)
	}
	return took, catchUp, use
}

// benchCluster measures W1's catch-up with the state on a local Redis
// Cluster of 3 primaries and 3 replicas (redis-server processes on
// loopback, AOF on, like the shared server's), beside the one-node
// catch-up benchStream measured in this run: throughput, and keys and
// memory per primary.
func benchCluster(t *testing.T, w *workload, one *streamResult, rep *report) {
	c := testenv.NewCluster(t)
	d := newDB(t, w)
	d.useCluster(c)
	decode, catchUp, use := d.catchUp(w, "cluster")
	nodes := d.stateNodes()
	// The same with run --redis-wait-replicas 1: WAIT for a replica of
	// every primary written to before each batch is acknowledged.
	dw := newDB(t, w)
	dw.useCluster(c)
	dw.env = append(dw.env, "FKMAT_REDIS_WAIT_REPLICAS=1")
	decodeW, catchUpW, useW := dw.catchUp(w, "cluster_wait")

	n := float64(w.changes())
	name := w.name + " " + w.title
	rep.row(name, "fkmat catch-up, state on a 3-primary Redis Cluster", catchUp.Seconds(), "s",
		fmt.Sprintf("%.0f changes/s; decode limit in this database %.0f changes/s", n/catchUp.Seconds(), n/decode.Seconds()), true)
	rep.row(name, "cluster catch-up / decode limit", decode.Seconds()/catchUp.Seconds(), "ratio",
		fmt.Sprintf("one node: %.2f", one.decode.Seconds()/one.catchUp.Seconds()), false)
	rep.row(name, "cluster catch-up speed / one-node catch-up speed", one.catchUp.Seconds()/catchUp.Seconds(), "ratio",
		"same workload, same run", false)
	rep.row(name, "fkmat catch-up, cluster, run --redis-wait-replicas 1", catchUpW.Seconds(), "s",
		fmt.Sprintf("%.0f changes/s; decode limit in this database %.0f changes/s; %.0f writes not confirmed in time",
			n/catchUpW.Seconds(), n/decodeW.Seconds(), useW.waitShort), true)
	rep.row(name, "cluster catch-up speed with WAIT / without", catchUp.Seconds()/catchUpW.Seconds(), "ratio",
		fmt.Sprintf("share of the decode limit: %.2f with WAIT, %.2f without", decodeW.Seconds()/catchUpW.Seconds(), decode.Seconds()/catchUp.Seconds()), false)
	rep.row(name, "CPU per 1k changes (cluster catch-up), fkmat + 6 redis-servers", (use.cpu+use.redisCPU)/(n/1000), "s",
		fmt.Sprintf("fkmat %.1f ms, redis-servers %.1f ms", 1e6*use.cpu/n, 1e6*use.redisCPU/n), false)
	for _, s := range []struct {
		what  string
		nodes []nodeState
	}{{"one node", one.nodes}, {"cluster, per primary", nodes}} {
		var keys, mb, used []string
		total := 0.0
		for _, st := range s.nodes {
			keys = append(keys, strconv.Itoa(st.keys))
			mb = append(mb, fmt.Sprintf("%.1f", st.bytes/(1<<20)))
			used = append(used, fmt.Sprintf("%.1f", st.used/(1<<20)))
			total += st.bytes
		}
		rep.row(name, "state keys and MEMORY USAGE, "+s.what, total/(1<<20), "MB",
			fmt.Sprintf("keys %s; MB %s; used_memory MB %s", strings.Join(keys, " / "), strings.Join(mb, " / "), strings.Join(used, " / ")), false)
	}
}

func (r *streamResult) add(rep *report) {
	w, n := r.w, float64(r.w.changes())
	name := w.name + " " + w.title
	rate := func(d time.Duration) float64 { return n / d.Seconds() }
	rep.row(name, "writer alone (no maintenance)", r.base.Seconds(), "s", fmt.Sprintf("%.0f changes/s", rate(r.base)), true)
	rep.row(name, "writer with fkmat running", r.live.Seconds(), "s", fmt.Sprintf("%.2fx slower", r.live.Seconds()/r.base.Seconds()), true)
	rep.row(name, "writer with a bare pgoutput reader draining", r.decodeLive.Seconds(), "s", fmt.Sprintf("%.2fx slower (floor of any logical-decoding consumer)", r.decodeLive.Seconds()/r.base.Seconds()), true)
	rep.row(name, "writer with row-level triggers", r.trig.Seconds(), "s", fmt.Sprintf("%.2fx slower", r.trig.Seconds()/r.base.Seconds()), true)
	rep.row(name, "fkmat catch-up (start to caught up)", r.catchUp.Seconds(), "s", fmt.Sprintf("%.0f changes/s", rate(r.catchUp)), true)
	rep.row(name, "decode limit (bare pgoutput reader)", r.decode.Seconds(), "s", fmt.Sprintf("%.0f changes/s", rate(r.decode)), true)
	rep.row(name, fmt.Sprintf("write limit (%d rows upserted, batches of 10k)", w.targetWrites), r.writeLimit.Seconds(), "s",
		fmt.Sprintf("%.0f rows/s", float64(w.targetWrites)/r.writeLimit.Seconds()), true)
	rep.row(name, "REFRESH MATERIALIZED VIEW CONCURRENTLY", r.mv.Seconds(), "s", fmt.Sprintf("per refresh at %d rows", w.orders), true)
	rep.row(name, "catch-up / write limit", r.writeLimit.Seconds()/r.catchUp.Seconds(), "ratio", "share of the write limit's speed", false)
	rep.row(name, "catch-up / decode limit", r.decode.Seconds()/r.catchUp.Seconds(), "ratio", "share of the decode limit's speed", false)
	rep.row(name, "freshness p50 / p99, live (writer unthrottled)", quantile(r.liveLat, 0.5).Seconds(), "s",
		fmt.Sprintf("p99 %.3f s, %d markers, writer at %.0f changes/s", quantile(r.liveLat, 0.99).Seconds(), len(r.liveLat), rate(r.live)), false)
	if r.pacedLat != nil {
		rep.row(name, fmt.Sprintf("freshness p50 / p99 at %d changes/s", r.pacedRate), quantile(r.pacedLat, 0.5).Seconds(), "s",
			fmt.Sprintf("p99 %.3f s, %d markers over %d changes", quantile(r.pacedLat, 0.99).Seconds(), len(r.pacedLat), r.pacedChanges), false)
	}
	per1k := func(sec float64) float64 { return sec / (n / 1000) }
	u := r.catchUse
	rep.row(name, "CPU per 1k changes (catch-up), fkmat + redis-server", per1k(u.cpu+u.redisCPU), "s",
		fmt.Sprintf("fkmat %.1f ms, redis-server %.1f ms, walsender %.1f ms, target backends %.1f ms",
			1000*per1k(u.cpu), 1000*per1k(u.redisCPU), 1000*per1k(u.walsenderCPU), 1000*per1k(u.backendCPU)), false)
	// What fkmat allocated, per change: the catch-up daemon's whole life
	// (its start-up is a few hundred KB).
	rep.row(name, "fkmat allocations per change (catch-up)", u.allocBytes/n, "B",
		fmt.Sprintf("%.1f allocations per change; %.0f MB in all", u.allocs/n, u.allocBytes/1e6), false)
	// Each stage's busy fraction of the catch-up: the pipeline runs three
	// stages at once (prepare: collect, map, join; target: write, verify,
	// target commit; state: Redis commit), so the one near 1 bounds it.
	// Collect is mostly waiting for the decoder while fkmat keeps up.
	busy := func(phases ...string) (frac, usPerChange float64) {
		for _, ph := range phases {
			frac += u.phases[ph]
		}
		return frac / r.catchUp.Seconds(), 1e6 * frac / n
	}
	var per []string
	for _, ph := range pipelinePhases {
		f, us := busy(ph)
		per = append(per, fmt.Sprintf("%s %.2f (%.1f µs)", ph, f, us))
	}
	prep, prepUS := busy("collect", "map", "join")
	tgt, tgtUS := busy("write", "verify", "target_commit")
	state, stateUS := busy("redis_commit")
	rep.row(name, "pipeline stages busy during the catch-up, the busiest of prepare / target / state", max(prep, tgt, state), "ratio",
		fmt.Sprintf("prepare %.2f (%.1f µs per change), target %.2f (%.1f µs), state %.2f (%.1f µs); by phase: %s",
			prep, prepUS, tgt, tgtUS, state, stateUS, strings.Join(per, ", ")), false)
	var calls, usec float64
	var cmds []string
	for _, c := range slices.SortedFunc(maps.Keys(u.redisCmds), func(a, b string) int {
		return cmp.Compare(u.redisCmds[b].calls, u.redisCmds[a].calls)
	}) {
		st := u.redisCmds[c]
		calls += st.calls
		switch c {
		case "exec", "eval", "evalsha", "fcall":
			// Their time holds the commands they ran, counted on their own.
		default:
			usec += st.usec
		}
		if st.calls/n >= 0.01 {
			cmds = append(cmds, fmt.Sprintf("%s %.2f (%.2f µs)", c, st.calls/n, st.usec/n))
		}
	}
	rep.row(name, "Redis commands per change (catch-up)", calls/n, "per change",
		fmt.Sprintf("%.2f µs of command time per change (redis-server CPU %.2f µs); by command, calls and µs per change (EXEC's and scripts' time holds their commands'): %s",
			usec/n, 1e6*u.redisCPU/n, strings.Join(cmds, ", ")), false)
	rep.row(name, "fkmat target rows written (catch-up)", r.catchUse.upserted+r.catchUse.deleted, "rows",
		fmt.Sprintf("SQL result changed by %d", w.targetWrites), false)
	peak := max(r.liveUse.peakRSSMB, r.catchUse.peakRSSMB, r.backfillUse.peakRSSMB)
	rep.row(name, "fkmat peak RSS", peak, "MB", "max of backfill, live and catch-up", false)
	rep.rss = max(rep.rss, peak)

	share := r.decode.Seconds() / r.catchUp.Seconds()
	// The decoder's time per change, which no stage should exceed: the
	// prepare stage's work is map and join (collect waits for the decoder).
	decodeUS := 1e6 * r.decode.Seconds() / n
	_, mapUS := busy("map", "join")
	busiest := max(mapUS, tgtUS, stateUS)
	rep.row(name, "busiest stage's work per change / the decoder's", busiest/decodeUS, "ratio",
		fmt.Sprintf("%.1f µs per change (map and join %.1f, target %.1f, state %.1f) against the decode limit's %.1f µs per change",
			busiest, mapUS, tgtUS, stateUS, decodeUS), false)
	switch w.name {
	case "W1":
		w1Decode = rate(r.decode)
		rep.target("W1 catch-up ≥ 0.7x the decode limit", share, ">=", 0.7, "x")
		rep.target("W1's busiest pipeline stage ≤ the decoder's time per change", busiest/decodeUS, "<=", 1, "x")
		if r.pacedLat != nil {
			rep.target(fmt.Sprintf("freshness p99 ≤ 250 ms at %d changes/s", r.pacedRate), quantile(r.pacedLat, 0.99).Seconds(), "<=", 0.25, "s")
		}
		rep.target("fkmat + redis-server CPU ≤ 10 ms per 1k W1 changes", 1000*per1k(u.cpu+u.redisCPU), "<=", 10, "ms")
		rep.target("fkmat allocations ≤ 1 KB per W1 change", u.allocBytes/n/1024, "<=", 1, "KB")
	case "W3":
		rep.target("W3 catch-up ≥ 0.5x the decode limit", share, ">=", 0.5, "x")
	}
}

// benchW2 (hot fan-out): the hot renames with fkmat running, against the
// same renames with row-level triggers and with no maintenance.
func benchW2(t *testing.T, s sizes, rep *report) {
	w := w2(s)
	name := w.name + " " + w.title
	var base, trigPer, mv time.Duration
	{
		d := newDB(t, w)
		base = d.write(w.txns, 0)
		mv = d.refreshMV(s.Refreshes)
	}
	{
		d := newDB(t, w)
		d.installTriggers()
		trigPer = d.write(w.txns[:s.W2TriggerUpdates], 0) / time.Duration(s.W2TriggerUpdates)
		d.assertJoin("trig_t")
	}
	d := newDB(t, w)
	bf := d.backfill()
	p := d.run("live")
	d.waitCaught(p)
	up0, del0 := p.metric("fkmat_sink_rows_upserted_total"), p.metric("fkmat_sink_rows_deleted_total")
	start := time.Now()
	d.write(w.txns, 0)
	took := d.waitCaught(p).Sub(start)
	u := p.stop()
	d.assertJoin("orders_enriched")
	written := u.upserted + u.deleted - up0 - del0
	if written > float64(w.targetWrites) {
		t.Errorf("fkmat wrote %.0f target rows, more than the %d the SQL result changed by", written, w.targetWrites)
	}
	// Catch-up: the renames written while fkmat is stopped, drained first by
	// a bare reader (the decode limit), then by fkmat.
	var decode, catchUp time.Duration
	var catchRows float64
	{
		d := newDB(t, w)
		d.backfill()
		bare := d.Slot + "_bare"
		d.exec(fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, bare))
		d.write(w.txns, 0)
		if n, commits, took := d.drainBare(bare, len(w.txns)); n != w.changes() || commits != len(w.txns) {
			t.Fatalf("bare reader saw %d changes in %d commits, want %d in %d", n, commits, w.changes(), len(w.txns))
		} else {
			decode = took
		}
		p := d.run("catchup")
		catchUp = d.waitCaught(p).Sub(p.start)
		cu := p.stop()
		catchRows = cu.upserted + cu.deleted
		d.assertJoin("orders_enriched")
	}
	trigAll := trigPer * time.Duration(len(w.txns))
	rep.row(name, fmt.Sprintf("%d renames, writer alone", len(w.txns)), base.Seconds(), "s", "no maintenance", true)
	rep.row(name, "fkmat: first rename to caught up", took.Seconds(), "s",
		fmt.Sprintf("%.0f target rows written (SQL result changed by %d)", written, w.targetWrites), true)
	rep.row(name, "fkmat catch-up (start to caught up)", catchUp.Seconds(), "s",
		fmt.Sprintf("the renames written while fkmat was stopped; decode limit %.3f s (%.3fx)", decode.Seconds(), decode.Seconds()/catchUp.Seconds()), true)
	rep.row(name, "row-level triggers, all renames", trigAll.Seconds(), "s",
		fmt.Sprintf("%.2f s per rename, %d measured, extrapolated", trigPer.Seconds(), s.W2TriggerUpdates), true)
	rep.row(name, "REFRESH MATERIALIZED VIEW CONCURRENTLY", mv.Seconds(), "s", fmt.Sprintf("per refresh at %d rows", w.orders), true)
	rep.row(name, "fkmat peak RSS", max(u.peakRSSMB, bf.peakRSSMB), "MB", "backfill and run", false)
	rep.rss = max(rep.rss, u.peakRSSMB, bf.peakRSSMB)
	rep.target("W2 ≥ 10x faster than triggers", trigAll.Seconds()/took.Seconds(), ">=", 10, "x")
	// Decoding W2's 200 renames takes milliseconds: its catch-up is the
	// fan-out. As the figures of 2026-12-02 measure it, the catch-up's rate in target rows
	// is compared with the decode limit's rate in changes, W1's in this run.
	if w1Decode > 0 {
		rowRate := catchRows / catchUp.Seconds()
		rep.row(name, "fkmat catch-up in target rows/s vs W1's decode limit", rowRate/w1Decode, "ratio",
			fmt.Sprintf("%.0f rows/s against %.0f changes/s decoded in W1", rowRate, w1Decode), false)
		rep.target("W2 catch-up ≥ 0.5x the decode limit (target rows/s vs W1's decoded changes/s)", rowRate/w1Decode, ">=", 0.5, "x")
	}
}

// w1Decode is W1's decode limit in changes/s, once W1 ran in this bench.
var w1Decode float64

// benchW4 (backfill): orders over customers already present, then fkmat
// backfill, next to INSERT INTO … SELECT … LEFT JOIN into a table of the
// same shape, in the same database.
// checkPlan runs `fkmat check --plan --json` and returns its estimates of
// the Redis state's bytes and the backfill's seconds, all joins together.
func (d *db) checkPlan() (bytes, seconds float64) {
	d.b.Helper()
	out, err := d.command("check", "--plan", "--json").Output()
	var res struct {
		Plan struct {
			RedisBytes      float64 `json:"redis_bytes_estimate"`
			BackfillSeconds float64 `json:"backfill_seconds_estimate"`
		} `json:"plan"`
	}
	if err != nil || json.Unmarshal(out, &res) != nil || res.Plan.RedisBytes <= 0 {
		d.b.Fatalf("fkmat check --plan --json: %v\n%s", err, out)
	}
	if os.Getenv("FKMAT_BENCH_PLAN_LOG") != "" {
		d.b.Logf("check --plan --json:\n%s", out)
	}
	return res.Plan.RedisBytes, res.Plan.BackfillSeconds
}

func benchW4(t *testing.T, s sizes, rep *report) {
	w := &workload{name: "W4", title: "backfill", orders: s.W4Orders, setup: []string{schema,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['bronze','silver','gold'])[1 + g %% 3] FROM generate_series(1, %d) g`, s.W4Customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, CASE WHEN g %% 50 = 0 THEN NULL ELSE 1 + g %% %d END, (g %% 1000) * 0.25, md5(g::text) FROM generate_series(1, %d) g`,
			s.W4Customers+s.W4Customers/20, s.W4Orders),
		`VACUUM ANALYZE customers, orders`}}
	name := w.name + " " + w.title
	d := newDB(t, w)
	d.exec(`CREATE TABLE limit_t (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text, name text, tier text)`)
	start := time.Now()
	d.exec(`INSERT INTO limit_t ` + joinSQL)
	limit := time.Since(start)
	d.assertJoin("limit_t")

	planBytes, planSeconds := d.checkPlan()
	mem0 := d.redisInfo("memory", "used_memory")
	u := d.backfill()
	mem := d.redisInfo("memory", "used_memory") - mem0
	d.assertJoin("orders_enriched")
	keys := d.redisKeys()
	byKind := keys.bytes
	subs := float64(d.int64(`SELECT count(*) FROM orders WHERE customer_id IS NOT NULL`))
	n := float64(s.W4Orders)
	rep.row(name, "INSERT INTO … SELECT … LEFT JOIN (limit)", limit.Seconds(), "s", fmt.Sprintf("%.0f rows/s", n/limit.Seconds()), true)
	rep.row(name, "fkmat backfill (target + Redis state)", u.took.Seconds(), "s",
		fmt.Sprintf("%.0f rows/s, %.2fx the limit's time", n/u.took.Seconds(), u.took.Seconds()/limit.Seconds()), true)
	rep.row(name, "CPU during the backfill", u.cpu, "s", fmt.Sprintf("fkmat; redis-server %.2f s", u.redisCPU), false)
	rep.row(name, "CPU per 1k rows, fkmat + redis-server", 1000*(u.cpu+u.redisCPU)/n, "s",
		fmt.Sprintf("fkmat %.2f ms, redis-server %.2f ms, at %d rows", 1e6*u.cpu/n, 1e6*u.redisCPU/n, s.W4Orders), false)
	rep.row(name, "fkmat peak RSS", u.peakRSSMB, "MB", "", false)
	rep.row(name, "Redis memory per left row (INFO used_memory delta)", mem/n, "B", fmt.Sprintf("all state, %.0f MB in all", mem/1e6), false)
	rep.row(name, "check --plan: estimated Redis memory / INFO used_memory delta", planBytes/mem, "x",
		fmt.Sprintf("estimate %.0f MB, real %.0f MB", planBytes/1e6, mem/1e6), false)
	rep.row(name, "check --plan: estimated backfill time / real", planSeconds/u.took.Seconds(), "x",
		fmt.Sprintf("estimate %.1f s, real %.1f s", planSeconds, u.took.Seconds()), false)
	rep.row(name, "Redis memory per subscription (MEMORY USAGE)", byKind['s']/subs, "B",
		fmt.Sprintf("%.0f subscriptions; %s", subs, keys.encodingSummary('s')), false)
	rep.row(name, "Redis memory per left row, row only (MEMORY USAGE)", byKind['l']/n, "B", keys.encodingSummary('l'), false)
	rep.row(name, "Redis memory per right row (MEMORY USAGE)", byKind['r']/float64(s.W4Customers), "B", keys.encodingSummary('r'), false)
	floor, floorCPU := d.redisFloor(s.W4Orders, int(subs), d.leftBuckets())
	rep.row(name, "Redis floor: same HSETs + ZADDs from a bare pipelined client", floor.Seconds(), "s",
		fmt.Sprintf("redis-server CPU %.2f s (one command per row and per subscription, as the state layout needs)", floorCPU), true)
	rep.rss = max(rep.rss, u.peakRSSMB)
	rep.target("W4 backfill within 2x of INSERT … SELECT", u.took.Seconds()/limit.Seconds(), "<=", 2, "x")
	rep.target("Redis memory ≤ 100 B per left row, all state", mem/n, "<=", 100, "B")
	rep.target("Redis memory ≤ 20 B per subscription", byKind['s']/subs, "<=", 20, "B")
}
