package integration

import (
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
