package integration

import (
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// deployFile returns the contents of a file under deploy/.
func deployFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// dashboardExprs returns the PromQL of every panel of the Grafana dashboard.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(deployFile(t, "grafana/fkmat.json")), &dash); err != nil {
		t.Fatalf("deploy/grafana/fkmat.json: %v", err)
	}
	var out []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			out = append(out, q.Expr)
		}
	}
	return out
}

// referencedMetrics lists the fkmat metric families the texts name (a
// histogram's _bucket, _sum and _count series count as the histogram).
func referencedMetrics(texts ...string) []string {
	seen := map[string]bool{}
	for _, s := range texts {
		for _, m := range regexp.MustCompile(`\bfkmat_[a-z_]+`).FindAllString(s, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if strings.HasSuffix(m, "_seconds"+suffix) {
					m = strings.TrimSuffix(m, suffix)
				}
			}
			seen[m] = true
		}
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// TestDeployFiles validates the deployment artefacts with the tools that
// read them: the alert rules with promtool, the systemd unit with
// systemd-analyze verify (pointed at a built binary). make test installs
// both tools.
func TestDeployFiles(t *testing.T) {
	t.Run("promtool", func(t *testing.T) {
		if _, err := exec.LookPath("promtool"); err != nil {
			t.Skip("promtool not installed (make test installs the Debian prometheus package)")
		}
		out, err := exec.Command("promtool", "check", "rules", filepath.Join("..", "deploy", "prometheus", "alerts.yaml")).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool check rules: %v\n%s", err, out)
		}
	})
	t.Run("systemd-analyze", func(t *testing.T) {
		if _, err := exec.LookPath("systemd-analyze"); err != nil {
			t.Skip("systemd-analyze not installed (make test installs systemd)")
		}
		unit := deployFile(t, "systemd/fkmat.service")
		if !strings.Contains(unit, "ExecStart=/usr/local/bin/fkmat ") || !strings.Contains(unit, "EnvironmentFile=/etc/fkmat/fkmat.env") {
			t.Fatal("the unit does not run /usr/local/bin/fkmat with /etc/fkmat/fkmat.env")
		}
		for _, key := range []string{"Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict", "DynamicUser=yes"} {
			if !strings.Contains(unit, "\n"+key+"\n") {
				t.Errorf("the unit lacks %s", key)
			}
		}
		// verify checks that the executable exists: point it at a real one.
		unit = strings.ReplaceAll(unit, "/usr/local/bin/fkmat", fkmatBinary(t))
		env, err := filepath.Abs(filepath.Join("..", "deploy", "systemd", "fkmat.env"))
		if err != nil {
			t.Fatal(err)
		}
		unit = strings.ReplaceAll(unit, "EnvironmentFile=/etc/fkmat/fkmat.env", "EnvironmentFile="+env)
		path := filepath.Join(t.TempDir(), "fkmat.service")
		if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
		}
	})
}

// TestDashboardMetrics scrapes /metrics of a daemon under a workload: every
// metric the Grafana dashboard and the alert rules reference exists, and
// the ones that count work move while it works (TestStall checks that
// fkmat_pipeline_restarts_total counts restarts).
func TestDashboardMetrics(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 20) g`,
		`INSERT INTO orders SELECT g, g % 21, g, 'n' FROM generate_series(1, 400) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	bound := make(chan net.Addr, 1)
	logs := &syncBuffer{}
	d := startDaemon(t, cfg, fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { bound <- a },
		SlotCheckInterval: 200 * time.Millisecond, SummaryInterval: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	m := boundScraper(t, bound)
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `UPDATE customers SET name = 'warm' WHERE id = 1`)
	waitCaughtUp(t, tc, d)
	before := m.body()

	for i := 0; i < 20; i++ {
		sqlExec(t, tc, `UPDATE customers SET name = name || 'x' WHERE id = `+strconv.Itoa(1+i%20),
			`INSERT INTO orders VALUES (`+strconv.Itoa(1000+i)+`, 3, 1, 'w')`, `DELETE FROM orders WHERE id = `+strconv.Itoa(10+i))
	}
	waitCaughtUp(t, tc, d)
	after := m.body()

	alerts := deployFile(t, "prometheus/alerts.yaml")
	names := referencedMetrics(append(dashboardExprs(t), alerts)...)
	if len(names) < 15 {
		t.Fatalf("the dashboard and the alerts reference only %d fkmat metrics: %v", len(names), names)
	}
	// Exported only when the server limits the slot (TestSlotSafety checks
	// it there); the shared test server does not.
	conditional := map[string]bool{"fkmat_slot_safe_wal_size_bytes": true}
	for _, name := range names {
		if !conditional[name] && !strings.Contains(after, "\n# TYPE "+name+" ") {
			t.Errorf("%s is referenced by deploy/ but not exported", name)
		}
	}
	for _, series := range []string{"fkmat_pipeline_changes_total", "fkmat_pipeline_transactions_total", "fkmat_pipeline_batches_total",
		"fkmat_sink_rows_upserted_total", "fkmat_sink_rows_deleted_total", "fkmat_join_fanout_rows_total",
		`fkmat_pipeline_batch_seconds_count{phase="total"}`, `fkmat_pipeline_batch_seconds_count{phase="target_commit"}`} {
		b, _ := metricValue(before, series)
		a, ok := metricValue(after, series)
		if !ok || a <= b {
			t.Errorf("%s did not move under the workload: %v, then %v (present %v)", series, b, a, ok)
		}
	}
	for series, want := range map[string]float64{"fkmat_ready": 1, "fkmat_pipeline_stalled": 0, `fkmat_slot_wal_status{status="reserved"}`: 1,
		`fkmat_slot_wal_status{status="lost"}`: 0, "fkmat_lag_seconds": 0} {
		if v, ok := metricValue(after, series); !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	// The summary line, every SummaryInterval (a minute by default), with
	// the batches of the last change.
	waitFor(t, 10*time.Second, "a summary line with work in it", func() bool {
		return regexp.MustCompile(`msg=summary changes_per_second=[0-9.e+]+ batches=[1-9]\d* lag_seconds=\S+ lag_bytes=\d+`).MatchString(logs.String())
	})
	if v, _ := metricValue(after, "fkmat_slot_retained_wal_bytes"); v <= 0 {
		t.Errorf("fkmat_slot_retained_wal_bytes = %v, want > 0", v)
	}
	assertOracle(t, cfg)
}
