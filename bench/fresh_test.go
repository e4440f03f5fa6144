package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"
)

// freshRates are the rates (changes per second) benchFreshness writes at.
var freshRates = []int{1_000, 5_000, 30_000}

// benchFreshness measures how fresh W1's target is under a steady stream of
// amount updates (transactions of 10) at 1k, 5k and 30k changes/s, written
// while fkmat runs and a probe inserts a marker order every ProbeEvery ms
// and times it from its commit until the target shows it (p50, p95, p99).
// Beside each: fkmat's CPU per change, the writer's pace against the one
// asked (its slowdown), and where the batches' time went
// (fkmat_pipeline_batch_seconds per phase, per batch, and the changes per
// batch).
//
// With FKMAT_BENCH_FR_BASE=<an fkmat binary>, that build runs too,
// alternately with this tree's (base, tree, base, tree), each on a fresh
// database: the rows name which.
func benchFreshness(t *testing.T, s sizes, rep *report) {
	runs := []string{""}
	if base := os.Getenv("FKMAT_BENCH_FR_BASE"); base != "" {
		runs = []string{base, "", base, ""}
	}
	for i, bin := range runs {
		label := "tree"
		if bin != "" {
			label = "base"
		}
		freshnessRun(t, s, rep, bin, fmt.Sprintf("%s %d", label, i/2+1))
	}
	hotRollupFreshness(t, s, rep)
}

// hotRollupFreshness measures W9's roll-up with a hot parent: customer 1
// has FreshHot orders (10^5) among W1's, and amount updates of its orders
// go in at 5k changes/s while a probe inserts a marker order of customer 1
// every ProbeEvery ms and times it until the customer's count in the
// target includes it. It also checks that each change costs the parent's
// row one write per batch, not one per child: the target's row updates
// against the batches.
func hotRollupFreshness(t *testing.T, s sizes, rep *report) {
	const rate = 5_000
	w := w1(s)
	w.yaml, w.oracleTarget, w.oracleSQL = w9YAML, `SELECT * FROM customer_stats`, w9SQL
	d := newDB(t, w)
	d.exec(fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, 'gold' FROM generate_series(1, %d) g`, s.W1Customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, CASE WHEN g <= %d THEN 1 ELSE 1 + g %% %d END, g %% 1000, 'note' FROM generate_series(1, %d) g`,
			s.FreshHot, s.W1Customers, s.W1Orders+s.FreshHot),
		`VACUUM ANALYZE customers, orders`)
	d.backfill()
	p := d.run("fresh-hot")
	d.waitCaught(p)
	count := func() int64 {
		var n int64
		if err := d.Pool.QueryRow(context.Background(), `SELECT orders FROM customer_stats WHERE id = 1`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	base := count()
	// Updates of the hot parent's children: amounts only (its count stays).
	rng := rand.New(rand.NewPCG(4, 4))
	n := rate * s.FreshSeconds
	var txns []txn
	for u := 0; u < n; u += 10 {
		tx := txn{}
		for k := u; k < min(u+10, n); k++ {
			tx.stmts = append(tx.stmts, stmt{updateAmount, []any{int64(1 + rng.IntN(s.FreshHot)), fmt.Sprintf("%d.%02d", 2000+k/100, k%100)}})
			tx.changes++
		}
		txns = append(txns, tx)
	}
	stop, done := make(chan struct{}), make(chan []time.Duration, 1)
	var perr error
	go func() {
		var lat []time.Duration
		defer func() { done <- lat }()
		ctx := context.Background()
		for k := int64(1); ; k++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(s.ProbeEvery) * time.Millisecond):
			}
			start := time.Now()
			// Marker ids end in 1: W9's where keeps them.
			if _, perr = d.Pool.Exec(ctx, `INSERT INTO orders VALUES ($1, 1, 0, 'probe')`, -(10*k + 1)); perr != nil {
				return
			}
			for count() < base+k {
				time.Sleep(2 * time.Millisecond)
			}
			lat = append(lat, time.Since(start))
		}
	}()
	before := p.phaseTotals()
	upd0 := d.targetUpdates("customer_stats")
	took := d.write(txns, rate)
	d.waitCaught(p)
	close(stop)
	lat := <-done
	if perr != nil {
		t.Fatal(perr)
	}
	slices.Sort(lat)
	batches := p.phaseTotals()["count"] - before["count"]
	updates := d.targetUpdates("customer_stats") - upd0
	name := "FR roll-up hot parent"
	rep.row(name, fmt.Sprintf("%d children, their amounts updated at %d changes/s: commit → visible p50", s.FreshHot, rate), quantile(lat, 0.5).Seconds()*1e3, "ms",
		fmt.Sprintf("p95 %.0f ms, p99 %.0f ms, %d markers; writer at %.2fx the pace asked; %.0f batches, %d target row updates",
			quantile(lat, 0.95).Seconds()*1e3, quantile(lat, 0.99).Seconds()*1e3, len(lat), took.Seconds()/(float64(n)/float64(rate)), batches, updates), false)
	rep.row(name, "commit → visible p99", quantile(lat, 0.99).Seconds()*1e3, "ms", "", false)
	rep.target("roll-up hot parent: freshness p99 < 500 ms at 5k changes/s", quantile(lat, 0.99).Seconds()*1e3, "<", 500, "ms")
	p.stop()
	d.assertJoin("customer_stats")
}

// targetUpdates returns the rows of table the target's UPDATEs changed so
// far, as pg_stat_user_tables counts them: read until it holds still for a
// second (a backend reports its counts when idle, within a second).
func (d *db) targetUpdates(table string) int64 {
	read := func() int64 {
		var n int64
		if err := d.Pool.QueryRow(context.Background(), `SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&n); err != nil {
			d.b.Fatal(err)
		}
		return n
	}
	n := read()
	for range 10 {
		time.Sleep(time.Second)
		if m := read(); m != n {
			n = m
			continue
		}
		break
	}
	return n
}

func freshnessRun(t *testing.T, s sizes, rep *report, bin, label string) {
	w := w1(s)
	d := newDB(t, w)
	d.bin = bin
	d.exec(fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, 'gold' FROM generate_series(1, %d) g`, s.W1Customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% %d, g %% 1000, 'note' FROM generate_series(1, %d) g`, s.W1Customers, s.W1Orders),
		`VACUUM ANALYZE customers, orders`)
	d.backfill()
	p := d.run("fresh")
	d.waitCaught(p)
	name := "FR freshness"
	if len(label) > 0 && label != "tree 1" {
		name += " (" + label + ")"
	}
	rng := rand.New(rand.NewPCG(3, 3))
	base := 0
	for _, rate := range freshRates {
		n := rate * s.FreshSeconds
		txns := amountTxns(rng, s.W1Orders, n, 1_000_000+base)
		base += n
		before := p.phaseTotals()
		cpu0, err := processCPU(p.cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		pr := d.probe(time.Duration(s.ProbeEvery) * time.Millisecond)
		took := d.write(txns, rate)
		d.waitCaught(p)
		lat := pr.stop(t)
		cpu, err := processCPU(p.cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		after := p.phaseTotals()
		batches := after["count"] - before["count"]
		var stages string
		for _, ph := range pipelinePhases {
			if ms := 1e3 * (after[ph] - before[ph]) / max(batches, 1); ms >= 0.05 {
				stages += fmt.Sprintf(", %s %.1f", ph, ms)
			}
		}
		rep.row(name, fmt.Sprintf("commit → visible at %d changes/s: p50", rate), quantile(lat, 0.5).Seconds()*1e3, "ms",
			fmt.Sprintf("p95 %.0f ms, p99 %.0f ms, %d markers; fkmat CPU %.1f ms per 1k changes; writer at %.2fx the pace asked; %.0f batches of %.0f changes, ms per batch%s",
				quantile(lat, 0.95).Seconds()*1e3, quantile(lat, 0.99).Seconds()*1e3, len(lat), 1e6*(cpu-cpu0)/float64(n),
				took.Seconds()/(float64(n)/float64(rate)), batches, float64(n)/max(batches, 1), stages), false)
		rep.row(name, fmt.Sprintf("commit → visible at %d changes/s: p99", rate), quantile(lat, 0.99).Seconds()*1e3, "ms", "", false)
		if name != "FR freshness" {
			continue
		}
		switch rate {
		case 5_000:
			rep.target("freshness p50 ≤ 20 ms at 5k changes/s", quantile(lat, 0.5).Seconds()*1e3, "<=", 20, "ms")
			rep.target("freshness p99 ≤ 100 ms at 5k changes/s", quantile(lat, 0.99).Seconds()*1e3, "<=", 100, "ms")
		case 30_000:
			rep.target("freshness p99 ≤ 250 ms at 30k changes/s", quantile(lat, 0.99).Seconds()*1e3, "<=", 250, "ms")
		}
	}
	p.stop()
	d.assertJoin("orders_enriched")
}

// phaseTotals returns the seconds batches spent per phase so far
// (fkmat_pipeline_batch_seconds_sum), and their count ("count").
func (p *daemon) phaseTotals() map[string]float64 {
	out := map[string]float64{"count": p.metricOr(`fkmat_pipeline_batch_seconds_count\{phase="total"\}`, 0)}
	for _, ph := range pipelinePhases {
		out[ph] = p.metricOr(`fkmat_pipeline_batch_seconds_sum\{phase="`+ph+`"\}`, 0)
	}
	return out
}
