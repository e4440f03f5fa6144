package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// goodYAML is a valid configuration; its source is a keyword/value
// connection string with a password.
const goodYAML = `source: host=localhost dbname=shop user=app password=s3cret
redis: redis://localhost:6379/0
joins:
  - name: orders_enriched
    type: left
    left: {table: public.orders, foreign_key: customer_id}
    right: {table: public.customers}
    target: {table: public.orders_enriched}
`

// TestBadInput: each bad input (a configuration, a flag, a command) exits
// 2 with a message that names the fix, and no message speaks of Go types.
// None of these reaches a database.
func TestBadInput(t *testing.T) {
	clearEnv(t)
	cases := []struct {
		name string
		yaml string // the file given by --config; "" for none
		env  map[string]string
		args []string // {file} is the file's path
		want []string
	}{{
		name: "unknown top-level key",
		yaml: "source: postgres://localhost/shop\nredis: redis://localhost:6379/0\njions:\n  - name: x\n",
		args: []string{"check", "--config", "{file}"},
		want: []string{"line 3", `the top level has no key "jions"`, "did you mean joins?", "allowed: source, target, redis, slot, publication, timezone, joins"},
	}, {
		name: "the configuration without -c",
		args: []string{"check", "fkmat.yaml"},
		want: []string{"`fkmat check` takes no argument \"fkmat.yaml\"; pass the configuration with -c: fkmat check -c fkmat.yaml (or set FKMAT_CONFIG)"},
	}, {
		name: "a word after a command",
		args: []string{"status", "now"},
		want: []string{"`fkmat status` takes no argument \"now\" (`fkmat status --help` lists its flags)"},
	}, {
		name: "a cycle of entries",
		yaml: "source: postgres://localhost/shop\nredis: redis://localhost:6379/0\njoins:\n  - name: j\n    type: left\n    left: {table: orders}\n" +
			"    right:\n      - {table: customers, from: regions, foreign_key: [customer_id]}\n      - {table: regions, from: customers, foreign_key: [region_id]}\n" +
			"    target: {table: out}\n",
		args: []string{"check", "-c", "{file}"},
		want: []string{`from "regions" closes a cycle: customers → regions → customers`},
	}, {
		name: "empty file",
		yaml: "# nothing yet\n",
		args: []string{"check", "-c", "{file}"},
		want: []string{"the file is empty", "joins:", "source: postgres://", "foreign_key: [customer_id]"},
	}, {
		name: "several columns without brackets",
		yaml: strings.Replace(goodYAML, "left: {table: public.orders, foreign_key: customer_id}",
			"left:\n      table: public.orders\n      foreign_key: customer_id, region_id", 1),
		args: []string{"check", "--config", "{file}"},
		want: []string{"line 8", `left.foreign_key "customer_id, region_id": write several columns as a list, e.g. [customer_id, region_id]`},
	}, {
		name: "a mapping where a list of columns goes",
		yaml: strings.Replace(goodYAML, "foreign_key: customer_id", "foreign_key: {a: b}", 1),
		args: []string{"check", "--config", "{file}"},
		want: []string{"line 6", "left.foreign_key must be a list of column names, e.g. [customer_id]"},
	}, {
		name: "tab indentation",
		yaml: "source: postgres://localhost/shop\njoins:\n\t- name: x\n",
		args: []string{"check", "--config", "{file}"},
		want: []string{"line 3", "indented with a tab", "indent with spaces"},
	}, {
		name: "malformed YAML",
		yaml: "joins:\n  - name: x\n    type: left\n   left: [",
		args: []string{"check", "--config", "{file}"},
		want: []string{"malformed YAML", "line", "check the indentation"},
	}, {
		name: "redis without a scheme",
		yaml: strings.Replace(goodYAML, "redis://localhost:6379/0", "127.0.0.1:6379", 1),
		args: []string{"check", "--config", "{file}"},
		want: []string{`redis "127.0.0.1:6379": not a URL`, "redis://127.0.0.1:6379/0"},
	}, {
		name: "postgres URL that cannot be parsed, password redacted",
		yaml: strings.Replace(goodYAML, "host=localhost dbname=shop user=app password=s3cret", "postgres://app:s3cret@db:notaport/shop", 1),
		args: []string{"check", "--config", "{file}"},
		want: []string{`source "postgres://app:xxxxx@db:notaport/shop"`, "invalid port", "postgres://app@localhost:5432/shop", "host=localhost port=5432"},
	}, {
		name: "postgres host without a scheme",
		yaml: strings.Replace(goodYAML, "host=localhost dbname=shop user=app password=s3cret", "db.internal:5432", 1),
		args: []string{"check", "--config", "{file}"},
		want: []string{`source "db.internal:5432": not a connection string`, "postgres://app@db.internal:5432/shop", "host=db.internal port=5432 dbname=shop"},
	}, {
		name: "every problem at once, of parsing and of validation",
		yaml: `source: postgres://localhost/shop
redis: redis://localhost:6379/0
slot: Bad-Slot
joins:
  - name: a
    type: outer
    left: {table: orders, foreign_key: [customer_id], colums: [id]}
    right:
      - {table: customers, foreignkey: [customer_id]}
    target: {tabel: out}
  - name: a
    type: inner
    left: {table: orders, foreign_key: [customer_id]}
    right: {table: customers, key: [[id]]}
    target: out2
`,
		args: []string{"check", "--config", "{file}"},
		want: []string{
			"problems:",
			`line 7: left has no key "colums"; did you mean columns?`,
			`line 9: an entry of right has no key "foreignkey"; did you mean foreign_key?`,
			`line 10: target has no key "tabel"; did you mean table?`,
			"line 14: each item of right.key must be a column name",
			"line 15: target must be a mapping of table, e.g. {table: out2}",
			`slot "Bad-Slot": use 1-63 lowercase letters, digits or underscores`,
			`join "a": type "outer" is not a join type; use` + " `type: inner` or `type: left`",
			`join "a": duplicate join name; give each join a unique name`,
		},
	}, {
		name: "a join key at the top level",
		yaml: "source: postgres://localhost/shop\nredis: redis://localhost:6379/0\nname: x\njoins:\n",
		args: []string{"check", "--config", "{file}"},
		want: []string{"line 3: name belongs to a join", "no joins: add at least one entry under `joins:`"},
	}, {
		name: "joins as a mapping",
		yaml: "source: postgres://localhost/shop\nredis: redis://localhost:6379/0\njoins:\n  name: x\n",
		args: []string{"check", "--config", "{file}"},
		want: []string{"line 4: joins must be a list", `"- "`},
	}, {
		name: "a key given twice",
		yaml: "source: postgres://localhost/shop\nsource: postgres://localhost/other\n" + strings.TrimPrefix(goodYAML, strings.SplitAfter(goodYAML, "\n")[0]),
		args: []string{"check", "--config", "{file}"},
		want: []string{"line 2: source is given twice in the top level (also on line 1); keep one"},
	}, {
		name: "foreign key under right in a two-table join",
		yaml: strings.Replace(goodYAML, "right: {table: public.customers}", "right: {table: public.customers, foreign_key: [customer_id]}", 1),
		args: []string{"check", "--config", "{file}"},
		want: []string{"line 7", "move it to left.foreign_key"},
	}, {
		name: "no configuration",
		args: []string{"check"},
		want: []string{"no join definition: pass --config FILE (or -c FILE) or set FKMAT_CONFIG"},
	}, {
		name: "missing file",
		args: []string{"check", "--config", "/nonexistent/fkmat.yaml"},
		want: []string{"read config file", "/nonexistent/fkmat.yaml", "--config"},
	}, {
		name: "bad log level",
		yaml: goodYAML,
		args: []string{"check", "--config", "{file}", "--log-level", "verbose"},
		want: []string{`--log-level "verbose": use debug, info, warn or error`},
	}, {
		name: "duration flag",
		args: []string{"run", "--verify-interval", "1hour"},
		want: []string{`--verify-interval "1hour": not a duration; write it like 90s, 5m or 1h30m`},
	}, {
		name: "duration from the environment",
		env:  map[string]string{"FKMAT_VERIFY_INTERVAL": "1hour"},
		args: []string{"run"},
		want: []string{`FKMAT_VERIFY_INTERVAL="1hour" (--verify-interval): not a duration; write it like 90s, 5m or 1h30m`},
	}, {
		name: "int flag",
		args: []string{"run", "--max-stall-restarts=many"},
		want: []string{`--max-stall-restarts "many": not a whole number; write it like 3`},
	}, {
		name: "bool flag",
		args: []string{"backfill", "--force=maybe"},
		want: []string{`--force "maybe": not true or false; write --force alone, or --force=false`},
	}, {
		name: "flag without its value",
		args: []string{"run", "--verify-interval"},
		want: []string{"--verify-interval needs a value, e.g. --verify-interval 5m"},
	}, {
		name: "negative duration",
		yaml: goodYAML,
		args: []string{"run", "--config", "{file}", "--grow-check-interval", "-1s"},
		want: []string{"--grow-check-interval -1s: use a positive duration"},
	}, {
		name: "bad --on-lost-state",
		yaml: goodYAML,
		args: []string{"run", "-c", "{file}", "--on-lost-state", "ignore"},
		want: []string{`--on-lost-state "ignore": use rebuild or refuse`},
	}, {
		name: "misspelled command",
		args: []string{"chek"},
		want: []string{`unknown command "chek"; did you mean check?`, "commands: check, migrate"},
	}, {
		name: "misspelled flag",
		args: []string{"status", "--jsn"},
		want: []string{"`fkmat status` has no flag --jsn; did you mean --json?", "`fkmat status --help` lists its flags"},
	}, {
		name: "unknown flag before the command",
		args: []string{"--no-such-flag", "check"},
		want: []string{"`fkmat` has no flag --no-such-flag (`fkmat --help` lists its flags)"},
	}, {
		name: "a command's flag before the command",
		args: []string{"--json", "status"},
		want: []string{"flag --json belongs to", "`fkmat status`", "put it after the command"},
	}, {
		name: "another command's flag",
		args: []string{"status", "--drop-target"},
		want: []string{"`fkmat status` has no flag --drop-target; it belongs to `fkmat teardown`"},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			args := []string{"fkmat"}
			for _, a := range c.args {
				if a == "{file}" {
					a = writeFile(t, c.yaml)
				}
				args = append(args, a)
			}
			var stdout, stderr bytes.Buffer
			code := run(args, &stdout, &stderr)
			msg := stderr.String()
			t.Logf("%s\n%s", strings.Join(args[1:], " "), msg)
			if code != exitUsage {
				t.Errorf("exit %d, want %d; stdout:\n%s", code, exitUsage, stdout.String())
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q", w)
				}
			}
			for _, leak := range []string{"fkmat.Config", "config.", "[]string", "!!str", "!!map", "unmarshal", "s3cret", "parse error", "Incorrect Usage"} {
				if strings.Contains(msg, leak) {
					t.Errorf("message holds %q", leak)
				}
			}
		})
	}
}

// clearEnv unsets the environment variables fkmat reads, for the test.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "FKMAT_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fkmat.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
