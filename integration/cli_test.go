package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// fkmatBinary builds cmd/fkmat once per test binary.
func fkmatBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fkmat-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "fkmat")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/fkmat/fkmat/cmd/fkmat").CombinedOutput()
		if err != nil {
			buildErr = errors.New(string(out))
		}
	})
	if buildErr != nil {
		t.Fatalf("build fkmat: %v", buildErr)
	}
	return binPath
}

// cliEnv writes the joins YAML to a file and returns the environment that
// points fkmat at the test's database and Redis.
func cliEnv(t *testing.T, tc *testenv.Case, joins string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fkmat.yaml")
	yml := "slot: " + tc.Slot + "\npublication: " + tc.Publication + "\n" + joins
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = testenv.DeleteKeys(ctx, tc.Redis, "fkmat:"+tc.Slot+":")
	})
	return append(os.Environ(),
		"FKMAT_CONFIG="+path,
		"FKMAT_SOURCE_URL="+tc.DatabaseURL,
		"FKMAT_REDIS_URL="+(&url.URL{Scheme: "redis", Host: tc.Env.RedisAddr, Path: "/0"}).String(),
	)
}

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, fkmatBinary(t), args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run fkmat %v: %v", args, err)
	}
	return r
}

// TestCLI drives the binary as the README describes: check, migrate, run with
// SIGTERM (exit 0 within 10 s), status --json, verify (0, then 1 after the
// target is tampered with), usage and configuration errors (exit 2),
// teardown, and no password in any output.
func TestCLI(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold'), (2, 'bob', NULL)`,
		`INSERT INTO orders SELECT g, 1 + g % 3, g, 'n' FROM generate_series(1, 30) g`)
	env := cliEnv(t, tc, leftJoinYAML)
	var outputs []string
	keep := func(r result) result { outputs = append(outputs, r.stdout, r.stderr); return r }

	if r := keep(runCLI(t, env, "check")); r.code != 0 {
		t.Fatalf("check: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := keep(runCLI(t, env, "migrate", "--log-format", "json")); r.code != 0 {
		t.Fatalf("migrate: exit %d\n%s", r.code, r.stderr)
	}

	// run, then SIGTERM once caught up.
	cmd := exec.Command(fkmatBinary(t), "run", "--log-format", "json", "--log-level", "debug")
	cmd.Env = env
	var runErr bytes.Buffer
	cmd.Stderr = &runErr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{done: make(chan error, 1)}
	go func() { d.done <- cmd.Wait() }()
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `UPDATE customers SET name = 'ANN' WHERE id = 1`, `INSERT INTO orders VALUES (31, 2, 1, 'x')`)
	waitCaughtUp(t, tc, d)
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		if err != nil {
			t.Fatalf("run after SIGTERM: %v\n%s", err, runErr.String())
		}
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("run did not exit within 10 s of SIGTERM\n%s", runErr.String())
	}
	t.Logf("run exited %.2fs after SIGTERM", time.Since(start).Seconds())
	outputs = append(outputs, runErr.String())
	for _, line := range strings.Split(strings.TrimSpace(runErr.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Fatalf("--log-format json printed a non-JSON line: %q", line)
		}
	}

	r := keep(runCLI(t, env, "status", "--json"))
	var rep fkmat.StatusReport
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || len(rep.Joins) != 1 {
		t.Fatalf("status --json: exit %d, %q", r.code, r.stdout)
	}
	// The daemon stopped a moment ago, within --max-inactive: not running,
	// and no problem. 31 orders, all with a customer_id: 31 subscriptions.
	st := rep.Joins
	if !rep.OK || rep.Verdict != fkmat.VerdictNotRunning || rep.Slot == nil || rep.Slot.RetainedWALBytes <= 0 || rep.Daemon == nil ||
		st[0].Phase != "streaming" || st[0].TargetRows != 31 || !st[0].SlotExists || st[0].RedisState != "ok" || st[0].Subscriptions != 31 ||
		st[0].Daemon == nil || st[0].WALStatus != "reserved" || st[0].RetainedWALBytes <= 0 {
		t.Fatalf("status = %+v", rep)
	}
	// Past --max-inactive, a slot nobody streams from is a problem, and
	// status exits 1.
	r = keep(runCLI(t, env, "status", "--max-inactive", "1ms"))
	if r.code != 1 || !strings.HasPrefix(r.stdout, "not running: last seen ") ||
		!strings.Contains(r.stdout, "problem: no fkmat run has streamed from replication slot") ||
		!strings.Contains(r.stdout, "join orders_enriched\n  phase:      built, not streaming: no fkmat run streams it\n") ||
		!strings.Contains(r.stdout, "  daemon:     fkmat ") {
		t.Fatalf("status with the slot inactive: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r = keep(runCLI(t, env, "status", "--wide")); r.code != 0 || !strings.Contains(r.stdout, "RETAINED_WAL") {
		t.Fatalf("status --wide: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := keep(runCLI(t, env, "verify")); r.code != 0 || !strings.Contains(r.stdout, "equal") {
		t.Fatalf("verify: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	sqlExec(t, tc, `UPDATE orders_enriched SET customer_name = 'tampered' WHERE id = 5`, `DELETE FROM orders_enriched WHERE id = 6`)
	r = keep(runCLI(t, env, "verify"))
	if r.code != 1 || !strings.Contains(r.stdout, "missing 1, extra 0, different 1") {
		t.Fatalf("verify after tampering: exit %d\n%s", r.code, r.stdout)
	}

	// Usage and configuration problems exit 2 with a message naming the fix.
	if r := keep(runCLI(t, env, "status", "--no-such-flag")); r.code != 2 {
		t.Fatalf("unknown flag: exit %d", r.code)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("joins:\n  - name: x\n    type: outer\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := keep(runCLI(t, env, "check", "--config", bad)); r.code != 2 || !strings.Contains(r.stderr, "use `type: inner` or `type: left`") {
		t.Fatalf("bad config: exit %d\n%s", r.code, r.stderr)
	}

	if r := keep(runCLI(t, env, "teardown", "--drop-target")); r.code != 0 {
		t.Fatalf("teardown: exit %d\n%s", r.code, r.stderr)
	}
	var slots int
	if err := tc.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("slot after teardown: %d, %v", slots, err)
	}
	for _, o := range outputs {
		if strings.Contains(o, tc.Env.Password) {
			t.Fatalf("an output contains the database password:\n%s", o)
		}
	}
}

// sharedTablesYAML has a left and an inner join of the same two tables and
// a self-referencing join: every table is used by several joins or on both
// sides of one.
const sharedTablesYAML = `
joins:
  - name: orders_left
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, amount]
    right:
      table: public.customers
    target:
      table: public.orders_left
  - name: orders_inner
    type: inner
    left:
      table: orders
      foreign_key: [customer_id]
    right:
      table: customers
      columns: [name]
    target:
      table: public.orders_inner
  - name: customers_referrers
    type: left
    left:
      table: public.customers
      foreign_key: [referred_by]
      columns: [id, name]
    right:
      table: public.customers
      columns: [name AS referrer]
    target:
      table: public.customers_referrers
`

// TestCommandsOnSharedTables runs every command through the binary on a
// configuration whose joins share tables (and one whose left and right
// table are the same): check, migrate, backfill, run, status, verify and
// teardown all accept it.
func TestCommandsOnSharedTables(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `ALTER TABLE customers ADD COLUMN referred_by bigint`,
		`INSERT INTO customers SELECT g, 'c' || g, 't', CASE WHEN g > 1 THEN g / 2 END FROM generate_series(1, 20) g`,
		`INSERT INTO orders SELECT g, g % 23, g, 'n' FROM generate_series(1, 80) g`)
	env := cliEnv(t, tc, sharedTablesYAML)
	ok := func(args ...string) result {
		t.Helper()
		r := runCLI(t, env, args...)
		if r.code != 0 {
			t.Fatalf("fkmat %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
		}
		return r
	}
	ok("check")
	ok("migrate")
	ok("backfill")
	p := startCLIDaemon(t, env)
	waitCaughtUp(t, tc, p.d)
	sqlExec(t, tc, `UPDATE customers SET name = 'renamed' WHERE id IN (2, 3)`, `UPDATE orders SET customer_id = 2 WHERE id < 10`,
		`UPDATE customers SET id = 99 WHERE id = 20`)
	waitCaughtUp(t, tc, p.d)
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !p.wait(15*time.Second) || p.err != nil {
		t.Fatalf("run after SIGTERM: exited %v, %v\n%s", p.exited, p.err, tail(p.stderr.String(), 20))
	}
	var rep fkmat.StatusReport
	if r := ok("status", "--json"); json.Unmarshal([]byte(r.stdout), &rep) != nil || len(rep.Joins) != 3 {
		t.Fatalf("status --json: %q", r.stdout)
	}
	if r := ok("verify"); strings.Count(r.stdout, "equal") < 3 {
		t.Fatalf("verify:\n%s", r.stdout)
	}
	ok("teardown", "--drop-target")
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot); n != 0 {
		t.Fatal("teardown left the slot")
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_class WHERE relname IN ('orders_left', 'orders_inner', 'customers_referrers')`); n != 0 {
		t.Fatal("teardown --drop-target left targets")
	}
}
