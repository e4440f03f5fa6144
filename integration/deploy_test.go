package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
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
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/config"
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

// dashboardTarget is one query of a panel of the Grafana dashboard.
type dashboardTarget struct {
	Panel  string
	Expr   string `json:"expr"`
	Legend string `json:"legendFormat"`
}

// dashboardTargets returns every panel's queries of the Grafana dashboard,
// and the queries of its template variables.
func dashboardTargets(t *testing.T) (targets []dashboardTarget, variables []string) {
	t.Helper()
	var dash struct {
		Panels []struct {
			Title   string            `json:"title"`
			Targets []dashboardTarget `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal([]byte(deployFile(t, "grafana/fkmat.json")), &dash); err != nil {
		t.Fatalf("deploy/grafana/fkmat.json: %v", err)
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			q.Panel = p.Title
			targets = append(targets, q)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			variables = append(variables, fmt.Sprint(q["query"]))
		}
	}
	return targets, variables
}

// dashboardExprs returns the PromQL of every panel of the Grafana dashboard
// and of its template variables.
func dashboardExprs(t *testing.T) []string {
	t.Helper()
	targets, variables := dashboardTargets(t)
	out := variables
	for _, q := range targets {
		out = append(out, q.Expr)
	}
	return out
}

// referencedMetrics lists the metric families the texts name: fkmat's and
// the Go runtime's and process's (a histogram's or summary's _bucket, _sum
// and _count series count as the family).
func referencedMetrics(texts ...string) []string {
	seen := map[string]bool{}
	for _, s := range texts {
		for _, m := range regexp.MustCompile(`\b(?:fkmat|go|process)_[a-z_]+`).FindAllString(s, -1) {
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
		// FkmatDown fires for fkmat scraped under any job name (Kubernetes
		// pods found by their annotations), and not for other targets.
		cmd := exec.Command("promtool", "test", "rules", "alerts_test.yaml")
		cmd.Dir = "testdata"
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "SUCCESS") {
			t.Fatalf("promtool test rules: %v\n%s", err, out)
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
	t.Run("stop-timeouts", func(t *testing.T) {
		// systemd waits TimeoutStopSec after SIGTERM before it kills.
		m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)s$`).FindStringSubmatch(deployFile(t, "systemd/fkmat.service"))
		if m == nil {
			t.Fatal("the unit sets no TimeoutStopSec=<n>s")
		}
		if n, _ := strconv.Atoi(m[1]); time.Duration(n)*time.Second <= fkmat.ShutdownTimeout {
			t.Errorf("TimeoutStopSec=%ss: want more than fkmat.ShutdownTimeout (%s)", m[1], fkmat.ShutdownTimeout)
		}
	})
	t.Run("metrics-addresses", func(t *testing.T) {
		// Loopback where a host runs fkmat next to its Prometheus; the
		// image listens on every address (a container's port is reached
		// only where it is published).
		env := envFile(t, deployFile(t, "systemd/fkmat.env"))
		host, port, err := net.SplitHostPort(env["FKMAT_METRICS_ADDR"])
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() || port != "9187" {
			t.Errorf("deploy/systemd/fkmat.env: FKMAT_METRICS_ADDR=%q, want a loopback address on port 9187", env["FKMAT_METRICS_ADDR"])
		}
		b, err := os.ReadFile(filepath.Join("..", "scripts", "image.sh"))
		if err != nil {
			t.Fatal(err)
		}
		for _, change := range []string{"'ENV FKMAT_METRICS_ADDR=:9187'", "'EXPOSE 9187'"} {
			if !strings.Contains(string(b), "--change "+change) {
				t.Errorf("scripts/image.sh does not set %s (TestImage checks the built image)", change)
			}
		}
	})
	t.Run("runbooks", func(t *testing.T) {
		const prefix = "https://github.com/fkmat/fkmat/blob/main/docs/operations.md#"
		doc, err := os.ReadFile(filepath.Join("..", "docs", "operations.md"))
		if err != nil {
			t.Fatal(err)
		}
		anchors := markdownAnchors(string(doc))
		for _, r := range alertRules(t, deployFile(t, "prometheus/alerts.yaml")) {
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, prefix)
			switch {
			case !ok:
				t.Errorf("alert %s: runbook_url %q is not a section of %s", r.Alert, url, prefix)
			case !anchors[anchor]:
				t.Errorf("alert %s: runbook_url %q: docs/operations.md has no heading #%s", r.Alert, url, anchor)
			case anchor != strings.ToLower(r.Alert):
				t.Errorf("alert %s: runbook_url %q is not the alert's own section (#%s)", r.Alert, url, strings.ToLower(r.Alert))
			}
		}
	})
	t.Run("kubernetes", testKubernetesManifest)
}

// envFile parses a systemd environment file (KEY=value lines, # comments).
func envFile(t *testing.T, text string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("environment file line %q is not KEY=value", line)
		}
		env[k] = v
	}
	return env
}

// markdownAnchors returns the anchors GitHub gives the headings of a
// Markdown text: lower case, punctuation dropped, spaces as hyphens.
func markdownAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
		}
		heading, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
		if fenced || !ok || !strings.HasPrefix(line, "#") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return anchors
}

// k8sContainer is what testKubernetesManifest reads of a container.
type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Args    []string `yaml:"args"`
	EnvFrom []struct {
		SecretRef struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Env []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

// k8sProbe is an HTTP probe; its port is a number or a port's name.
type k8sProbe struct {
	HTTPGet struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// k8sObject is what testKubernetesManifest reads of a ConfigMap, a Secret
// or a Deployment.
type k8sObject struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	Spec       struct {
		Replicas *int `yaml:"replicas"`
		Strategy struct {
			Type string `yaml:"type"`
		} `yaml:"strategy"`
		Template struct {
			Spec struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				SecurityContext               struct {
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
					RunAsUser    int  `yaml:"runAsUser"`
				} `yaml:"securityContext"`
				Containers []k8sContainer `yaml:"containers"`
				Volumes    []struct {
					Name      string `yaml:"name"`
					ConfigMap *struct {
						Name string `yaml:"name"`
					} `yaml:"configMap"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// testKubernetesManifest checks deploy/kubernetes/fkmat.yaml: one replica
// replaced by Recreate (one fkmat per slot), a grace period longer than
// fkmat's shutdown, probes on /healthz and /readyz at the metrics port the
// pod listens on, a non-root user, memory for the ~300 MB fkmat needs, the
// URLs from the Secret and a join definition from the ConfigMap that
// fkmat's configuration loader accepts.
func testKubernetesManifest(t *testing.T) {
	dec := yaml.NewDecoder(strings.NewReader(deployFile(t, "kubernetes/fkmat.yaml")))
	objects := map[string]k8sObject{}
	for {
		var o k8sObject
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("deploy/kubernetes/fkmat.yaml: %v", err)
		}
		objects[o.Kind+"/"+o.Metadata.Name] = o
	}
	d, ok := objects["Deployment/fkmat"]
	if !ok {
		t.Fatalf("no Deployment fkmat among %v", slices.Collect(maps.Keys(objects)))
	}
	if replicas := d.Spec.Replicas; replicas == nil || *replicas != 1 || d.Spec.Strategy.Type != "Recreate" {
		n := "unset"
		if replicas != nil {
			n = strconv.Itoa(*replicas)
		}
		t.Errorf("replicas %s, strategy %q: want 1 and Recreate (two fkmat on one slot contend for it)", n, d.Spec.Strategy.Type)
	}
	pod := d.Spec.Template.Spec
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= fkmat.ShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds %d: want more than fkmat.ShutdownTimeout (%s)", pod.TerminationGracePeriodSeconds, fkmat.ShutdownTimeout)
	}
	if !pod.SecurityContext.RunAsNonRoot || pod.SecurityContext.RunAsUser != 65532 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and the image's user 65532", pod.SecurityContext)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if c.Image != "fkmat:latest" {
		t.Errorf("image %q, want fkmat:latest", c.Image)
	}
	ports := map[string]int{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	listen := ":9187" // the image's FKMAT_METRICS_ADDR
	standby := false
	for _, e := range c.Env {
		switch e.Name {
		case "FKMAT_METRICS_ADDR":
			listen = e.Value
		case "FKMAT_STANDBY":
			standby = e.Value == "true"
		}
	}
	if !standby {
		t.Errorf("FKMAT_STANDBY is not true: a replacement pod whose node was lost would exit after --slot-busy-timeout and crash-loop")
	}
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		t.Fatalf("FKMAT_METRICS_ADDR %q: %v", listen, err)
	}
	for path, p := range map[string]*k8sProbe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil {
			t.Errorf("no probe on %s", path)
			continue
		}
		probePort := fmt.Sprint(p.HTTPGet.Port)
		if n, ok := ports[probePort]; ok {
			probePort = strconv.Itoa(n)
		}
		if p.HTTPGet.Path != path || probePort != port {
			t.Errorf("probe %s:%v, want %s on the metrics port %s", p.HTTPGet.Path, p.HTTPGet.Port, path, port)
		}
	}
	limit, request := k8sBytes(t, c.Resources.Limits["memory"]), k8sBytes(t, c.Resources.Requests["memory"])
	if limit < 300e6 || request > limit || request == 0 {
		t.Errorf("memory request %d, limit %d: fkmat needs about 300 MB (docs/operations.md)", request, limit)
	}

	var secret k8sObject
	for _, e := range c.EnvFrom {
		secret = objects["Secret/"+e.SecretRef.Name]
	}
	for _, k := range []string{"FKMAT_SOURCE_URL", "FKMAT_REDIS_URL"} {
		if secret.StringData[k] == "" {
			t.Errorf("the container's Secret has no %s", k)
		}
	}
	// The configuration file: --config names a file of the mounted
	// ConfigMap, which fkmat loads.
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 == len(c.Args) || c.Args[len(c.Args)-1] != "run" {
		t.Fatalf("args %q: want --config FILE ... run", c.Args)
	}
	var cm k8sObject
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil && filepath.Dir(c.Args[i+1]) == m.MountPath {
				cm = objects["ConfigMap/"+v.ConfigMap.Name]
			}
		}
	}
	yml, ok := cm.Data[filepath.Base(c.Args[i+1])]
	if !ok {
		t.Fatalf("--config %s is not a key of a mounted ConfigMap", c.Args[i+1])
	}
	path := filepath.Join(t.TempDir(), "fkmat.yaml")
	if err := os.WriteFile(path, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.LoadConfig(path)
	if err != nil {
		t.Fatalf("the ConfigMap's %s: %v", filepath.Base(path), err)
	}
	cfg.Source, cfg.Redis = secret.StringData["FKMAT_SOURCE_URL"], secret.StringData["FKMAT_REDIS_URL"]
	// The source URL names the CA the manifest mounts: a CA of the test's
	// in its place.
	const mounted = "/etc/fkmat-ca/ca.crt"
	if !strings.Contains(cfg.Source, "sslmode=verify-full") || !strings.Contains(cfg.Source, "sslrootcert="+mounted) {
		t.Errorf("the source URL %s does not verify the server against the mounted CA", cfg.Source)
	}
	ca := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(ca, newCA(t, "deploy").certPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Source = strings.Replace(cfg.Source, mounted, ca, 1)
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Errorf("the ConfigMap's fkmat.yaml with the Secret's URLs: %v", err)
	}
}

// k8sBytes parses a Kubernetes memory quantity such as 256Mi or 1G.
func k8sBytes(t *testing.T, q string) int64 {
	t.Helper()
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"", 1}} {
		if n, err := strconv.ParseInt(strings.TrimSuffix(q, u.suffix), 10, 64); strings.HasSuffix(q, u.suffix) && err == nil {
			return n * u.mult
		}
	}
	t.Errorf("memory quantity %q", q)
	return 0
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
	if len(names) < 25 {
		t.Fatalf("the dashboard and the alerts reference only %d metrics: %v", len(names), names)
	}
	// Exported only when the server limits the slot (TestSlotSafety checks
	// it there); the shared test server does not. The backfill's progress
	// only while run backfills (TestMetricsLabels), a rebuild's phase only
	// while one runs.
	conditional := map[string]bool{"fkmat_slot_safe_wal_size_bytes": true,
		"fkmat_backfill_rows_done": true, "fkmat_backfill_rows_total": true, "fkmat_rebuild_phase": true}
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
	checkPerJoinUse(t, after, alerts)
	assertOracle(t, cfg)
}

// checkPerJoinUse: every dashboard query of a series with a join label (as
// the daemon exports them in body) keeps the join apart (by (join), a
// {{join}} legend), the join variable lists them, and every alert on one
// names the join.
func checkPerJoinUse(t *testing.T, body, alerts string) {
	t.Helper()
	perJoin := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^(fkmat_[a-z_]+)\{join="`).FindAllStringSubmatch(body, -1) {
		perJoin[m[1]] = true
	}
	if len(perJoin) < 8 {
		t.Fatalf("only %d metrics have a join label: %v", len(perJoin), perJoin)
	}
	targets, variables := dashboardTargets(t)
	shown := map[string]bool{}
	for _, q := range targets {
		for _, name := range referencedMetrics(q.Expr) {
			if !perJoin[name] {
				continue
			}
			shown[name] = true
			if !strings.Contains(q.Expr, "by (join)") || !strings.Contains(q.Legend, "{{join}}") {
				t.Errorf("dashboard panel %q: %s is per join, but %q (legend %q) does not keep the joins apart", q.Panel, name, q.Expr, q.Legend)
			}
		}
	}
	for name := range perJoin {
		if !shown[name] {
			t.Errorf("the dashboard does not show the per-join %s", name)
		}
	}
	joinVariable := false
	for _, v := range variables {
		for _, name := range referencedMetrics(v) {
			joinVariable = joinVariable || (perJoin[name] && strings.HasSuffix(v, ", join)"))
		}
	}
	if !joinVariable {
		t.Errorf("the dashboard has no join variable over a per-join metric: %q", variables)
	}
	for _, r := range alertRules(t, alerts) {
		for _, name := range referencedMetrics(r.Expr) {
			if perJoin[name] && !strings.Contains(r.Annotations["summary"]+r.Annotations["description"], "$labels.join") {
				t.Errorf("alert %s is on the per-join %s but does not name the join", r.Alert, name)
			}
		}
	}
}

// alertRule is one rule of deploy/prometheus/alerts.yaml.
type alertRule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Annotations map[string]string `yaml:"annotations"`
}

// alertRules parses the alert rules.
func alertRules(t *testing.T, text string) []alertRule {
	t.Helper()
	var f struct {
		Groups []struct {
			Rules []alertRule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal([]byte(text), &f); err != nil {
		t.Fatalf("deploy/prometheus/alerts.yaml: %v", err)
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("deploy/prometheus/alerts.yaml has no rules")
	}
	return out
}
