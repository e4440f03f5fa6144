package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestMetricsEndpoints: /healthz, /readyz and /metrics of a running daemon
// report its progress. /metrics holds the Go runtime's and the process's
// series; what belongs to one join carries its join label (each join's
// counts its own work only), what belongs to the slot or the pipeline
// carries none.
func TestMetricsEndpoints(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'a', 't')`, `INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 50) g`,
		`CREATE TABLE regions (id bigint PRIMARY KEY, name text)`, `CREATE TABLE stores (id bigint PRIMARY KEY, region_id bigint, name text)`,
		`INSERT INTO regions VALUES (1, 'north')`)
	cfg := daemonConfig(t, tc, leftJoinYAML+`
  - name: stores_enriched
    type: left
    left: {table: public.stores, foreign_key: [region_id]}
    right: {table: public.regions, columns: [name AS region_name]}
    target: {table: public.stores_enriched}
`)
	bound := make(chan net.Addr, 1)
	d := startDaemon(t, cfg, fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { bound <- a }})
	var base string
	select {
	case a := <-bound:
		base = "http://" + a.String()
	case <-time.After(30 * time.Second):
		t.Fatal("metrics server not bound")
	}
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `UPDATE customers SET name = 'b' WHERE id = 1`, `INSERT INTO orders VALUES (51, 1, 1, 'x')`,
		`INSERT INTO stores VALUES (1, 1, 's1'), (2, 1, 's2'), (3, NULL, 's3')`)
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `DELETE FROM stores WHERE id = 2`)
	waitCaughtUp(t, tc, d)
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	_, body := get("/metrics")
	value := func(series string) float64 {
		v, ok := metricValue(body, series)
		if !ok || !strings.Contains(body, "\n"+series+" ") {
			t.Fatalf("/metrics lacks %s:\n%s", series, body)
		}
		return v
	}
	if v := value("fkmat_pipeline_changes_total"); v < 2 {
		t.Errorf("fkmat_pipeline_changes_total = %v, want >= 2", v)
	}
	if v := value(`fkmat_join_fanout_rows_total{join="orders_enriched"}`); v < 50 {
		t.Errorf("fkmat_join_fanout_rows_total{orders_enriched} = %v, want >= 50 (customer 1 has 50 orders)", v)
	}
	if v := value(`fkmat_sink_rows_upserted_total{join="orders_enriched"}`); v < 51 {
		t.Errorf("fkmat_sink_rows_upserted_total{orders_enriched} = %v, want >= 51", v)
	}
	// Each join counts its own rows: three stores written, one deleted,
	// no order deleted and no region changed.
	for series, want := range map[string]float64{
		`fkmat_sink_rows_upserted_total{join="stores_enriched"}`:  3,
		`fkmat_sink_rows_deleted_total{join="stores_enriched"}`:   1,
		`fkmat_sink_rows_deleted_total{join="orders_enriched"}`:   0,
		`fkmat_join_fanout_rows_total{join="stores_enriched"}`:    0,
		`fkmat_redis_wait_short_total{join="stores_enriched"}`:    0,
		`fkmat_redis_resizes_total{join="orders_enriched"}`:       0,
		`fkmat_verify_differences{join="orders_enriched"}`:        0,
		`fkmat_verify_rows_checked_total{join="stores_enriched"}`: 0,
	} {
		if v := value(series); v != want {
			t.Errorf("%s = %v, want %v", series, v, want)
		}
	}
	if v := value("fkmat_ready"); v != 1 {
		t.Errorf("fkmat_ready = %v", v)
	}
	// The per-join families have a sample for each join and nothing
	// without one; the others have no join label.
	perJoin := regexp.MustCompile(`(?m)^(fkmat_[a-z_]+)\{join="([^"]+)"\} `).FindAllStringSubmatch(body, -1)
	families := map[string][]string{}
	for _, m := range perJoin {
		families[m[1]] = append(families[m[1]], m[2])
	}
	for _, name := range []string{"fkmat_sink_rows_upserted_total", "fkmat_sink_rows_deleted_total", "fkmat_join_fanout_rows_total",
		"fkmat_join_stale_responses_total", "fkmat_join_inner_null_fk_drops_total", "fkmat_redis_wait_short_total",
		"fkmat_redis_resizes_total", "fkmat_redis_resize_seconds_total", "fkmat_verify_rows_checked_total", "fkmat_verify_differences"} {
		if got := strings.Join(families[name], ","); got != "orders_enriched,stores_enriched" {
			t.Errorf("%s has samples for joins %q, want orders_enriched,stores_enriched", name, got)
		}
		if regexp.MustCompile(`(?m)^` + name + ` `).MatchString(body) {
			t.Errorf("%s has a sample without a join label", name)
		}
	}
	for _, name := range []string{"fkmat_pipeline_changes_total", "fkmat_pipeline_batches_total", "fkmat_cdc_lag_bytes", "fkmat_lag_seconds",
		"fkmat_slot_retained_wal_bytes", "fkmat_verify_rounds_total", "fkmat_pipeline_restarts_total"} {
		if families[name] != nil {
			t.Errorf("%s has a join label: it is about the slot or the pipeline, not one join", name)
		}
	}
	// The Go runtime's and the process's collectors.
	for _, series := range []string{"go_goroutines", "go_memstats_heap_inuse_bytes", "go_memstats_next_gc_bytes", "go_gc_duration_seconds_count",
		"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"} {
		if v := value(series); v < 0 || (series == "process_resident_memory_bytes" && v < 1<<20) {
			t.Errorf("%s = %v", series, v)
		}
	}
	assertOracle(t, cfg)
}

// TestLagSeconds: while the daemon works through a backlog, fkmat_lag_seconds
// counts from the source commit of the last transaction it applied (or,
// before one, the first it received): transactions committed 3 s before the
// daemon starts show a lag of at least 3 s; once it has caught up the lag is
// 0, in /metrics and in fkmat status.
func TestLagSeconds(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 10) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `INSERT INTO orders VALUES (1, 1, 1, 'first')`)
	committed := time.Now()
	time.Sleep(3 * time.Second)
	for i := 0; i < 40; i++ {
		sqlExec(t, tc, fmt.Sprintf(`INSERT INTO orders SELECT g, g %% 11, g, 'n' FROM generate_series(%d, %d) g`, 2+i*2500, 1+(i+1)*2500))
	}
	bound := make(chan net.Addr, 1)
	d = startDaemon(t, cfg, fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { bound <- a },
		SlotCheckInterval: 200 * time.Millisecond})
	m := boundScraper(t, bound)
	maxLag := 0.0
	waitFor(t, 60*time.Second, "a lag of 3 s or more during the catch-up", func() bool {
		if v, ok := metricValue(m.body(), "fkmat_lag_seconds"); ok {
			maxLag = max(maxLag, v)
		}
		return maxLag >= 3
	})
	if maxLag > time.Since(committed).Seconds()+1 {
		t.Fatalf("lag %.1f s, more than the %.1f s since the first waiting commit", maxLag, time.Since(committed).Seconds())
	}
	waitCaughtUp(t, tc, d)
	waitFor(t, 10*time.Second, "no lag once caught up", func() bool {
		v, ok := metricValue(m.body(), "fkmat_lag_seconds")
		return ok && v == 0
	})
	if v, ok := metricValue(m.body(), "fkmat_last_applied_commit_timestamp_seconds"); !ok || v < float64(committed.Unix()) {
		t.Fatalf("fkmat_last_applied_commit_timestamp_seconds = %v (present %v), want after %d", v, ok, committed.Unix())
	}
	waitFor(t, 10*time.Second, "status showing no lag", func() bool {
		st, err := fkmat.Status(context.Background(), cfg, fkmat.Options{})
		return err == nil && st[0].Daemon != nil && st[0].Daemon.Live && st[0].Daemon.LagSeconds == 0 && st[0].Daemon.LastCommitTime != nil
	})
	assertOracle(t, cfg)
}
