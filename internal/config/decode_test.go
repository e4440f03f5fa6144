package config

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestParseShorthands: one column may be written without brackets, in
// every list of columns; aliases, empty values and comments read as YAML
// says.
func TestParseShorthands(t *testing.T) {
	t.Parallel()
	cfg, err := ParseConfig([]byte(`
source: host=localhost dbname=shop user=app
redis: redis://localhost:6379/0
slot:            # empty: the default
joins:
  - name: two
    type: left
    left: {table: &orders public.orders, key: id, foreign_key: customer_id, columns: amount}
    right: {table: customers, key: id, columns: name AS customer_name}
    target: {table: two_out}
  - name: more
    type: inner
    left: {table: *orders}
    right:
      - {table: customers, foreign_key: customer_id, key: id, columns: name}
    target: {table: more_out}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	two, more := cfg.Joins[0], cfg.Joins[1]
	if !slices.Equal(two.Left.Key, []string{"id"}) || !slices.Equal(two.Left.ForeignKey, []string{"customer_id"}) ||
		len(two.Left.Columns) != 1 || two.Left.Columns[0] != (ColumnRef{Name: "amount", Alias: "amount"}) {
		t.Errorf("left = %+v, want key [id], foreign_key [customer_id], columns [amount]", two.Left)
	}
	if !slices.Equal(two.Right.Key, []string{"id"}) || len(two.Right.Columns) != 1 || two.Right.Columns[0] != (ColumnRef{Name: "name", Alias: "customer_name"}) {
		t.Errorf("right = %+v, want key [id], columns [name AS customer_name]", two.Right)
	}
	if more.Left.Table != two.Left.Table {
		t.Errorf("the alias *orders gave left.table %s, want %s", more.Left.Table, two.Left.Table)
	}
	if r := more.Rights[0]; !slices.Equal(r.ForeignKey, []string{"customer_id"}) || !slices.Equal(r.Key, []string{"id"}) || len(r.Columns) != 1 {
		t.Errorf("entry = %+v, want foreign_key [customer_id], key [id], columns [name]", r)
	}
	if cfg.Slot != "fkmat_two" {
		t.Errorf("slot = %q, want the default fkmat_two", cfg.Slot)
	}
}

// TestParseProblems: every problem of a file comes back, each with its line
// and fix, and none speaks of Go types.
func TestParseProblems(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		yaml string
		want []string
	}{
		"empty":               {"", []string{"the file is empty", "joins:"}},
		"only comments":       {"# todo\n", []string{"the file is empty"}},
		"only ---":            {"---\n", []string{"the file is empty"}},
		"not a mapping":       {"- a\n- b\n", []string{"line 1: the top level must be a mapping of source, target, redis, slot, publication, timezone, joins"}},
		"tab":                 {"joins:\n  - name: a\n\ttype: left\n", []string{"line 3: indented with a tab", "indent with spaces"}},
		"malformed":           {"joins: [\n  - name: x\n", []string{"malformed YAML: line", "check the indentation"}},
		"two documents":       {"joins: []\n---\nsource: x\n", []string{"line 3: a second YAML document (after ---): keep one configuration per file"}},
		"misspelled top":      {"sorce: postgres://db/x\njoin: []\n", []string{`line 1: the top level has no key "sorce"; did you mean source?`, `line 2: the top level has no key "join"; did you mean joins?`}},
		"far from any key":    {"colour: red\n", []string{`the top level has no key "colour" (allowed: source, target, redis, slot, publication, timezone, joins)`}},
		"case and dashes":     {"joins:\n  - name: a\n    left: {Foreign-Key: [c]}\n", []string{"did you mean foreign_key?"}},
		"text as a list":      {"source: [a, b]\n", []string{"line 1: source must be a single value, e.g. postgres://"}},
		"table as a list":     {"joins:\n  - left: {table: [a]}\n", []string{"line 2: left.table must be a table name like public.orders"}},
		"bad table name":      {"joins:\n  - target: {table: a.b.c}\n", []string{`line 2: target.table: table "a.b.c": write it as schema.table`}},
		"right as text":       {"joins:\n  - right: customers\n", []string{"line 2: right must be a mapping (two tables, e.g. {table: public.customers}) or a list of entries"}},
		"entry as text":       {"joins:\n  - right: [customers]\n", []string{"line 2: an entry of right must be a mapping of table, key, columns, where, from, foreign_key, as, type, e.g. {table: customers, foreign_key: [customer_id]}"}},
		"left as text":        {"joins:\n  - left: orders\n", []string{"line 2: left must be a mapping of table, key, foreign_key, columns, where, e.g. {table: orders, foreign_key: [customer_id]}"}},
		"a join as text":      {"joins:\n  - orders\n", []string{"line 2: a join must be a mapping of name, type, left, right, rollups, target"}},
		"key twice":           {"joins:\n  - name: a\n    name: b\n", []string{"line 3: name is given twice in a join (also on line 2); keep one"}},
		"list key in a join":  {"joins:\n  - name: a\n    foreign_key: [c]\n", []string{"line 3: foreign_key belongs under left or right"}},
		"top key in a join":   {"joins:\n  - name: a\n    redis: redis://x\n", []string{"line 3: redis belongs at the top level of the file, not in a join"}},
		"merge key":           {"joins:\n  - name: a\n    <<: {type: left}\n", []string{"YAML merge keys (<<) are not supported"}},
		"bad column":          {"joins:\n  - left: {columns: [\"sum(x)\"]}\n", []string{`line 2: left.columns: column "sum(x)": name the expression`}},
		"column as a mapping": {"joins:\n  - left: {columns: [{a: b}]}\n", []string{"line 2: each item of left.columns must be a column name"}},
	} {
		_, err := ParseConfig([]byte(tc.yaml))
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: err = %v, want a *ConfigError", name, err)
			continue
		}
		msg := err.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: error lacks %q:\n%s", name, w, msg)
			}
		}
		for _, leak := range []string{"Config", "[]string", "!!", "unmarshal", "yaml:"} {
			if strings.Contains(msg, leak) {
				t.Errorf("%s: error holds %q:\n%s", name, leak, msg)
			}
		}
	}
}

// TestLoadReportsEverything: Load reports the file's problems and those of
// the result of the overrides together, and no key twice: a value that
// could not be read is not also reported missing.
func TestLoadReportsEverything(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "fkmat.yaml")
	yml := `redis: 127.0.0.1:6379
jions: []
joins:
  - name: a
    type: [left]
    left: {table: orders, foreign_key: {c: d}}
    right: {tabel: customers}
    target: out
`
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path, func(c *Config) { c.Source = "not a dsn" })
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Load = %v, want a *ConfigError", err)
	}
	want := []string{
		path + `: line 2: the top level has no key "jions"; did you mean joins?`,
		path + ": line 5: type must be a single value, e.g. left",
		path + ": line 6: left.foreign_key must be a list of column names, e.g. [customer_id]",
		path + `: line 7: right has no key "tabel"; did you mean table?`,
		path + ": line 8: target must be a mapping of table, e.g. {table: out}",
		`source "not a dsn": not a connection string`,
		`redis "127.0.0.1:6379": not a URL; write it like redis://127.0.0.1:6379/0`,
	}
	if len(ce.Problems) != len(want) {
		t.Errorf("problems:\n  %s\nwant %d problems:\n  %s", strings.Join(ce.Problems, "\n  "), len(want), strings.Join(want, "\n  "))
	}
	for i, w := range want {
		if i < len(ce.Problems) && !strings.HasPrefix(ce.Problems[i], w) {
			t.Errorf("problem %d = %q, want it to start %q", i, ce.Problems[i], w)
		}
	}
}

func TestClosest(t *testing.T) {
	t.Parallel()
	keys := []string{"table", "key", "foreign_key", "columns", "from", "as", "type"}
	for key, want := range map[string]string{
		"tabel": "table", "foreignkey": "foreign_key", "foreign-key": "foreign_key", "foriegn_key": "foreign_key",
		"foreign_keys": "foreign_key", "colums": "columns", "Columns": "columns", "keys": "key", "typ": "type",
		"fromm": "from", "alias": "", "on": "", "schema": "", "x": "",
	} {
		if got := closest(key, keys); got != want {
			t.Errorf("closest(%q) = %q, want %q", key, got, want)
		}
	}
}
