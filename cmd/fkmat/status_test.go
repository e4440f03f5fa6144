package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata")

// statusNow is the clock of the status fixtures.
var statusNow = time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)

// streamingJoin is the status of a healthy streaming join.
func streamingJoin(name string) fkmat.JoinStatus {
	return fkmat.JoinStatus{Join: name, Target: "public." + name, Phase: "streaming", Slot: "fkmat_shop", SlotExists: true, SlotActive: true,
		ConfirmedFlushLSN: "1A/2B3C4D58", CurrentWALLSN: "1A/2B3C5000", LagBytes: 1704, CheckpointLSN: "1A/2B3C4D58",
		RedisCheckpoint: "1A/2B3C4D58", RedisState: "ok", TargetState: "ok", Metadata: "ok", TargetRows: 1234, Subscriptions: 1200,
		RetainedWALBytes: 12<<20 + 345678, WALStatus: "reserved", SafeWALSizeBytes: 3 << 30,
		Daemon: &fkmat.DaemonStatus{Host: "db-worker-1", PID: 4242, Version: "v1.2.0", StartedAt: statusNow.Add(-3*time.Hour - 12*time.Minute),
			HeartbeatAt: statusNow.Add(-4 * time.Second), LagSeconds: 0.12, Live: true}}
}

// statusFixtures are a report of each verdict, by golden file name.
func statusFixtures() map[string]fkmat.StatusReport {
	two := func(edit func(s *fkmat.JoinStatus, i int)) []fkmat.JoinStatus {
		st := []fkmat.JoinStatus{streamingJoin("orders_enriched"), streamingJoin("order_facts")}
		st[1].TargetRows, st[1].TargetRowsEstimated, st[1].Subscriptions = 12_345_678, true, 2_000_001
		st[1].Edges = []fkmat.EdgeStatus{{Entry: "public.orders", Subscriptions: 1_500_000}, {Entry: "customers", Subscriptions: 500_001},
			{Entry: "products", Subscriptions: 0}, {Entry: "regions", Subscriptions: 0}}
		for i := range st {
			edit(&st[i], i)
		}
		return st
	}
	stall := &fkmat.StallStatus{RestartLSN: "1A/2B3C4D58", LSN: "1A/2B3C4F00", Table: "public.orders", KeyColumns: "id",
		Error:       `join "orders_enriched": write target public.orders_enriched: ERROR: value too long for type character varying(20) (SQLSTATE 22001)`,
		Recurrences: 5, Since: statusNow.Add(-12 * time.Minute), UpdatedAt: statusNow.Add(-time.Minute),
		Fix: "fix the cause named in the error and start fkmat run again; if the change cannot be applied as it is, " +
			"fkmat backfill --force rebuilds the joins from a new snapshot, past the failing change " +
			"(until then the slot keeps the WAL from 1A/2B3C4D58 on the source's disk)"}
	stopped := func(s *fkmat.JoinStatus, _ int) {
		d := *s.Daemon
		d.HeartbeatAt, d.Live = statusNow.Add(-2*time.Hour), false
		s.Daemon, s.SlotActive = &d, false
		s.Problems = []string{`no fkmat run has streamed from replication slot "fkmat_shop" for 2h0m0s (last: v1.2.0 on db-worker-1, pid 4242); ` +
			`it retains 12 MiB of WAL on the source's disk: start fkmat run, or fkmat teardown if the join is no longer wanted`}
	}
	return map[string]fkmat.StatusReport{
		"ok": fkmat.SummarizeStatus(two(func(*fkmat.JoinStatus, int) {}), statusNow),
		"problem": fkmat.SummarizeStatus(two(func(s *fkmat.JoinStatus, i int) {
			if i == 0 {
				s.TargetState, s.TargetRows = "missing", -1
				s.Problems = []string{"target table public.orders_enriched does not exist; create it with fkmat migrate (or fkmat run)"}
			}
		}), statusNow),
		"stalled":     fkmat.SummarizeStatus(two(func(s *fkmat.JoinStatus, _ int) { s.Stall = stall }), statusNow),
		"not_running": fkmat.SummarizeStatus(two(stopped), statusNow),
	}
}

// golden compares got with testdata/status/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "status", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs (go test -run %s -update rewrites it):\ngot:\n%s\nwant:\n%s", path, t.Name(), got, want)
	}
}

// TestWriteStatus: the verdict first, then a block per join, the slot, the
// stall and the problems, all within 80 columns.
func TestWriteStatus(t *testing.T) {
	t.Parallel()
	for name, r := range statusFixtures() {
		var b bytes.Buffer
		if err := writeStatus(&b, r, statusNow); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		golden(t, name+".txt", out)
		if verdict := strings.ReplaceAll(r.Verdict, "_", " ") + ": "; !strings.HasPrefix(out, verdict) {
			t.Errorf("%s: the output does not start with %q:\n%s", name, verdict, out)
		}
		for _, line := range strings.Split(out, "\n") {
			if n := utf8.RuneCountInString(line); n > statusWidth {
				t.Errorf("%s: a line of %d columns: %q", name, n, line)
			}
		}
		if strings.Count(out, "\njoin ") != len(r.Joins) {
			t.Errorf("%s: want a block per join:\n%s", name, out)
		}
		for _, p := range r.Problems {
			if !strings.Contains(strings.Join(strings.Fields(out), " "), "problem: "+p) {
				t.Errorf("%s: problem %q is not shown:\n%s", name, p, out)
			}
		}
	}
}

// TestWriteStatusWide: --wide is the verdict and the table of every column,
// in bytes.
func TestWriteStatusWide(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := writeStatusWide(&b, statusFixtures()["problem"], statusNow); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	golden(t, "wide.txt", out)
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "problem: ") || !strings.HasPrefix(lines[2], "JOIN ") ||
		!strings.Contains(lines[2], "RETAINED_WAL") || !strings.Contains(lines[3], " 12928590 ") {
		t.Errorf("wide output:\n%s", out)
	}
}

// TestStatusJSON: --json is an object with the verdict, the shared slot and
// daemon, and the joins under their snake_case names.
func TestStatusJSON(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	if err := writeStatusJSON(&b, statusFixtures()["ok"]); err != nil {
		t.Fatal(err)
	}
	golden(t, "ok.json", b.String())
	var got map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"verdict", "summary", "ok", "slot", "daemon", "joins", "problems"} {
		if _, ok := got[key]; !ok {
			t.Errorf("no %q in %s", key, b.String())
		}
	}
	if _, ok := got["error"]; ok || got["verdict"] != "ok" || got["ok"] != true {
		t.Errorf("ok report: %s", b.String())
	}
	join := got["joins"].([]any)[0].(map[string]any)
	for _, key := range []string{"join", "target", "phase", "slot_exists", "confirmed_flush_lsn", "lag_bytes", "checkpoint_lsn",
		"redis_state", "target_rows", "subscriptions", "retained_wal_bytes", "wal_status", "daemon"} {
		if _, ok := join[key]; !ok {
			t.Errorf("no %q in a join: %v", key, join)
		}
	}
	if slot := got["slot"].(map[string]any); slot["name"] != "fkmat_shop" || slot["retained_wal_bytes"] != float64(12<<20+345678) {
		t.Errorf("slot = %v", slot)
	}
}

// TestStatusErrorJSON: fkmat status --json prints a JSON object on stdout
// when it cannot look too, with the exit code it has without --json.
func TestStatusErrorJSON(t *testing.T) {
	for _, env := range []string{"FKMAT_CONFIG", "FKMAT_SOURCE_URL", "FKMAT_TARGET_URL", "FKMAT_REDIS_URL", "FKMAT_MAX_INACTIVE",
		"FKMAT_LOG_LEVEL", "FKMAT_LOG_FORMAT"} {
		t.Setenv(env, "")
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("joins:\n  - name: x\n    type: outer\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1: the connection is refused at once.
	unreachable := writeConfig(t, "unreachable.yaml", "postgres://fkmat:s3cret@127.0.0.1:1/shop?connect_timeout=5")
	for _, c := range []struct {
		name     string
		args     []string
		code     int
		error    string // a substring of "error"
		problems bool
	}{
		{"bad config", []string{"--config", bad}, exitUsage, "configuration has", true},
		{"no config", nil, exitUsage, "no join definition", false},
		{"bad --max-inactive", []string{"--config", unreachable, "--max-inactive", "0s"}, exitUsage, "--max-inactive", false},
		{"bad --log-level", []string{"--config", unreachable, "--log-level", "loud"}, exitUsage, "--log-level", false},
		{"unreachable database", []string{"--config", unreachable}, exitFailure, "connect to source database", false},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"fkmat", "status", "--json"}, c.args...), &stdout, &stderr)
		var r fkmat.StatusReport
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Errorf("%s: stdout is not JSON (%v):\n%s", c.name, err, stdout.String())
			continue
		}
		if code != c.code || r.OK || r.Verdict != fkmat.VerdictError || !strings.Contains(r.Error, c.error) ||
			(len(r.Problems) > 0) != c.problems || r.Joins == nil {
			t.Errorf("%s: exit %d, %+v; want exit %d, ok false, an error with %q, problems %v", c.name, code, r, c.code, c.error, c.problems)
		}
		if strings.Contains(stdout.String()+stderr.String(), "s3cret") {
			t.Errorf("%s: an output holds the password:\n%s%s", c.name, stdout.String(), stderr.String())
		}
		// Without --json: nothing on stdout, the error on stderr, the same code.
		stdout.Reset()
		stderr.Reset()
		if code := run(append([]string{"fkmat", "status"}, c.args...), &stdout, &stderr); code != c.code || stdout.Len() != 0 ||
			!strings.Contains(stderr.String(), c.error) {
			t.Errorf("%s without --json: exit %d, stdout %q, stderr %q", c.name, code, stdout.String(), stderr.String())
		}
	}
}

// TestStatusUsageErrorJSON: a command line that does not parse prints JSON
// too when it has --json, wherever it is, with the error of the app's
// handler.
func TestStatusUsageErrorJSON(t *testing.T) {
	t.Parallel()
	next := func(_ *cli.Context, err error, _ bool) error {
		return &exitError{code: exitUsage, err: fmt.Errorf("fixed: %w", err)}
	}
	for _, args := range [][]string{{"--json", "--no-such-flag"}, {"--no-such-flag", "--json"}, {"--json", "--max-inactive", "soon"}, {"--no-such-flag"}} {
		var stdout bytes.Buffer
		cmd := statusCommand()
		cmd.OnUsageError = statusUsageError(next)
		app := &cli.App{Name: "fkmat", Writer: &stdout, ErrWriter: io.Discard, Commands: []*cli.Command{cmd},
			ExitErrHandler: func(*cli.Context, error) {}}
		err := app.Run(append([]string{"fkmat", "status"}, args...))
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != exitUsage || !strings.HasPrefix(err.Error(), "fixed: ") {
			t.Errorf("%v: %v, want exit %d with the error of the app's handler", args, err, exitUsage)
		}
		if !slices.Contains(args, "--json") {
			if stdout.Len() != 0 {
				t.Errorf("%v: stdout %q, want nothing", args, stdout.String())
			}
			continue
		}
		var r fkmat.StatusReport
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || r.OK || r.Verdict != fkmat.VerdictError || !strings.HasPrefix(r.Error, "fixed: ") {
			t.Errorf("%v: stdout %q (%v), want a JSON error", args, stdout.String(), err)
		}
	}
}
