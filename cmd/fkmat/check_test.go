package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckJSONErrors: `check --json` prints a JSON object on stdout in
// every case that fails before any database is reached — a configuration
// with problems (each listed), no configuration, an unknown flag — with the
// exit code of the run without --json.
func TestCheckJSONErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("jions: []\nslot: Bad-Slot\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		problems int
	}{
		{"config_problems", []string{"check", "--json", "-c", bad}, 2},
		{"no_config", []string{"check", "--json"}, 0},
		{"unknown_flag", []string{"check", "--json", "--bogus"}, 0},
		{"plan_with_config_problems", []string{"check", "--plan", "--json", "-c", bad}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("FKMAT_CONFIG", "")
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"fkmat"}, tc.args...), &stdout, &stderr)
			var res checkResult
			if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
				t.Fatalf("stdout is not JSON: %v\n%s\nstderr: %s", err, stdout.String(), stderr.String())
			}
			if code != exitUsage || res.OK || res.Error == "" || len(res.Problems) < tc.problems {
				t.Fatalf("exit %d, result %+v; want exit 2, ok false, an error and %d+ problems", code, res, tc.problems)
			}
			if strings.Contains(stdout.String(), "config.Config") {
				t.Fatalf("a Go type in the output: %s", stdout.String())
			}
		})
	}
}
