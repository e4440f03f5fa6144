package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestHelp: every command's --help fits 80 columns (but a word longer than
// a line), says each default once, ends with examples; teardown's says
// the replication position is lost and offers --dry-run.
func TestHelp(t *testing.T) {
	clearEnv(t)
	for _, cmd := range []string{"", "check", "migrate", "backfill", "run", "status", "verify", "teardown", "completion", "man", "version"} {
		args := []string{"fkmat", "--help"}
		if cmd != "" {
			args = []string{"fkmat", cmd, "--help"}
		}
		var out, errw bytes.Buffer
		if code := run(args, &out, &errw); code != 0 {
			t.Fatalf("fkmat %s --help: exit %d\n%s", cmd, code, errw.String())
		}
		help := out.String()
		for _, line := range strings.Split(help, "\n") {
			if len(line) > helpWidth && strings.Contains(strings.TrimSpace(line), " ") {
				t.Errorf("fkmat %s --help: a line of %d characters: %q", cmd, len(line), line)
			}
			if strings.Count(line, "default") > 1 {
				t.Errorf("fkmat %s --help: a default said twice: %q", cmd, line)
			}
		}
		if strings.Contains(help, "(default: false)") {
			t.Errorf("fkmat %s --help says (default: false)", cmd)
		}
		if cmd != "" && !strings.Contains(help, "Examples:\n      fkmat "+cmd) {
			t.Errorf("fkmat %s --help has no example:\n%s", cmd, help)
		}
	}
	var out, errw bytes.Buffer
	run([]string{"fkmat", "teardown", "--help"}, &out, &errw)
	for _, want := range []string{"replication position", "is lost", "--dry-run"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("teardown --help lacks %q:\n%s", want, out.String())
		}
	}
}

// TestTeardownDryRun: --dry-run lists what teardown would drop, the lost
// replication position first, and connects to nothing.
func TestTeardownDryRun(t *testing.T) {
	clearEnv(t)
	var out, errw bytes.Buffer
	code := run([]string{"fkmat", "teardown", "-c", writeFile(t, goodYAML), "--dry-run", "--drop-target"}, &out, &errw)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, errw.String())
	}
	for _, want := range []string{`replication slot "fkmat_orders_enriched"`, "its position in the WAL is lost", `publication "fkmat_orders_enriched"`,
		`the Redis keys under "fkmat:fkmat_orders_enriched:"`, `target table public.orders_enriched of join "orders_enriched"`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dry run lacks %q:\n%s", want, out.String())
		}
	}
}
