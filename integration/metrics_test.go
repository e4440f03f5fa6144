package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestMetricsEndpoints: /healthz, /readyz and /metrics of a running daemon
// report its progress.
func TestMetricsEndpoints(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'a', 't')`, `INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 50) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
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
	sqlExec(t, tc, `UPDATE customers SET name = 'b' WHERE id = 1`, `INSERT INTO orders VALUES (51, 1, 1, 'x')`)
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
	value := func(name string) float64 {
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			t.Fatalf("/metrics lacks %s:\n%s", name, body)
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	if v := value("fkmat_pipeline_changes_total"); v < 2 {
		t.Errorf("fkmat_pipeline_changes_total = %v, want >= 2", v)
	}
	if v := value("fkmat_join_fanout_rows_total"); v < 50 {
		t.Errorf("fkmat_join_fanout_rows_total = %v, want >= 50 (customer 1 has 50 orders)", v)
	}
	if v := value("fkmat_sink_rows_upserted_total"); v < 51 {
		t.Errorf("fkmat_sink_rows_upserted_total = %v, want >= 51", v)
	}
	if v := value("fkmat_ready"); v != 1 {
		t.Errorf("fkmat_ready = %v", v)
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
