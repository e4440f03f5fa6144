package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
)

// report is the results of one run: the table, the targets and where they
// were measured.
type report struct {
	mu      sync.Mutex
	Date    string            `json:"date"`
	Full    bool              `json:"full"`
	Machine map[string]string `json:"machine"`
	Sizes   sizes             `json:"sizes"`
	Rows    []row             `json:"rows"`
	Targets []target          `json:"targets"`
	rss     float64
}

// row is one figure of the table.
type row struct {
	Workload string  `json:"workload"`
	Measure  string  `json:"measure"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	Detail   string  `json:"detail,omitempty"`
	Chart    bool    `json:"-"`
}

// target is one of the benchmark's goals, judged on a ratio of this run.
type target struct {
	Goal  string  `json:"goal"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	Met   bool    `json:"met"`
}

func newReport(t *testing.T, full bool, s sizes) *report {
	env := testenv.Shared(t)
	ctx := context.Background()
	m := map[string]string{
		"go":    runtime.Version(),
		"cpus":  fmt.Sprint(runtime.NumCPU()),
		"cpu":   firstField("/proc/cpuinfo", "model name"),
		"mem":   firstField("/proc/meminfo", "MemTotal"),
		"os":    strings.TrimSpace(readFile("/etc/debian_version")),
		"linux": strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")),
	}
	var pg string
	if err := env.Admin().QueryRow(ctx, `SHOW server_version`).Scan(&pg); err == nil {
		m["postgres"] = pg
	}
	if info, err := env.RedisClient().Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
				m["redis"] = v
			}
		}
	}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m["commit"] = strings.TrimSpace(string(out))
	}
	m["setup"] = "Postgres and Redis in local Docker containers (test images) on the same machine; fkmat as a subprocess"
	return &report{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), Full: full, Machine: m, Sizes: s}
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func firstField(path, key string) string {
	for _, line := range strings.Split(readFile(path), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func (r *report) row(workload, measure string, value float64, unit, detail string, chart bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Rows = append(r.Rows, row{workload, measure, value, unit, detail, chart})
}

// target records a goal: value op limit.
func (r *report) target(goal string, value float64, op string, limit float64, unit string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	met := value <= limit
	if op == ">=" {
		met = value >= limit
	}
	r.Targets = append(r.Targets, target{goal, value, unit, met})
}

func contains(list, name string) bool {
	for _, f := range strings.Split(list, ",") {
		if strings.TrimSpace(f) == name {
			return true
		}
	}
	return false
}

func format(v float64, unit string) string {
	switch unit {
	case "s":
		if v < 10 {
			return fmt.Sprintf("%.3f s", v)
		}
		return fmt.Sprintf("%.1f s", v)
	case "ratio", "x":
		return fmt.Sprintf("%.2fx", v)
	case "MB":
		return fmt.Sprintf("%.0f MB", v)
	case "B":
		return fmt.Sprintf("%.1f B", v)
	case "ms":
		return fmt.Sprintf("%.1f ms", v)
	case "per change":
		return fmt.Sprintf("%.2f per change", v)
	default:
		return fmt.Sprintf("%.0f %s", v, unit)
	}
}

// text is the table as Markdown, printed and written as results.md.
func (r *report) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nfkmat bench, %s, %s CPUs (%s), %s, Postgres %s, Redis %s, %s, commit %s\n\n",
		r.Date, r.Machine["cpus"], r.Machine["cpu"], r.Machine["mem"], r.Machine["postgres"], r.Machine["redis"], r.Machine["go"], r.Machine["commit"])
	b.WriteString("| workload | measure | value | detail |\n|---|---|---:|---|\n")
	for _, x := range r.Rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", x.Workload, x.Measure, format(x.Value, x.Unit), x.Detail)
	}
	b.WriteString("\n| target | measured | met |\n|---|---:|---|\n")
	for _, x := range r.Targets {
		met := "yes"
		if !x.Met {
			met = "**no**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", x.Goal, format(x.Value, x.Unit), met)
	}
	return b.String()
}

// finish adds the targets judged over the whole run.
func (r *report) finish() {
	r.target("fkmat RSS ≤ 300 MB in all workloads", r.rss, "<=", 300, "MB")
}

// write stores results.json, results.md and results.svg in dir.
func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	md := r.text()
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"results.json": js, "results.md": []byte(md), "results.svg": []byte(r.svg())} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// svg draws one panel per workload: a horizontal bar per timed contender,
// each panel on its own linear scale.
func (r *report) svg() string {
	const width, labelW, barH, gap, panelGap = 960, 380, 18, 6, 36
	var panels []string
	byWorkload := map[string][]row{}
	for _, x := range r.Rows {
		if !x.Chart {
			continue
		}
		if _, ok := byWorkload[x.Workload]; !ok {
			panels = append(panels, x.Workload)
		}
		byWorkload[x.Workload] = append(byWorkload[x.Workload], x)
	}
	var b strings.Builder
	y := 40
	body := &strings.Builder{}
	for _, p := range panels {
		rows := byWorkload[p]
		var top float64
		for _, x := range rows {
			top = max(top, x.Value)
		}
		fmt.Fprintf(body, `<text x="10" y="%d" font-weight="bold">%s (seconds, shorter is better)</text>`+"\n", y, html.EscapeString(p))
		y += 10
		for _, x := range rows {
			w := 0.0
			if top > 0 {
				w = x.Value / top * float64(width-labelW-90)
			}
			color := "#9aa5b1"
			if strings.Contains(x.Measure, "fkmat") {
				color = "#2f6fdf"
			}
			fmt.Fprintf(body, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-8, y+barH-4, html.EscapeString(x.Measure))
			fmt.Fprintf(body, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y, w, barH, color)
			fmt.Fprintf(body, `<text x="%.1f" y="%d">%s</text>`+"\n", float64(labelW)+w+6, y+barH-4, html.EscapeString(format(x.Value, "s")))
			y += barH + gap
		}
		y += panelGap
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, y)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="20" font-size="14">fkmat bench %s — %s CPUs, %s (blue: fkmat)</text>`+"\n",
		html.EscapeString(r.Date), r.Machine["cpus"], html.EscapeString(r.Machine["cpu"]))
	b.WriteString(body.String())
	b.WriteString("</svg>\n")
	return b.String()
}
