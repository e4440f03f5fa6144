package config

import (
	"errors"
	"strings"
	"testing"
)

const specExample = `
source: postgres://app:s3cret@localhost:5432/shop
redis:  redis://localhost:6379/0
slot: fkmat_shop
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      key: [id]
      foreign_key: [customer_id]
      columns: [id, customer_id, amount]
    right:
      table: public.customers
      key: [id]
      columns: [name AS customer_name, tier]
    target:
      table: public.orders_enriched
`

func TestParseSpecExample(t *testing.T) {
	t.Parallel()
	cfg, err := ParseConfig([]byte(specExample))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Target != cfg.Source || cfg.Publication != "fkmat_shop" {
		t.Fatalf("defaults: target=%q publication=%q", cfg.Target, cfg.Publication)
	}
	j := cfg.Joins[0]
	if j.Left.Table != (TableName{"public", "orders"}) || j.Target.Table.Name != "orders_enriched" {
		t.Fatalf("tables: %+v", j)
	}
	want := []ColumnRef{{"name", "customer_name"}, {"tier", "tier"}}
	if len(j.Right.Columns) != 2 || j.Right.Columns[0] != want[0] || j.Right.Columns[1] != want[1] {
		t.Fatalf("right columns = %+v, want %+v", j.Right.Columns, want)
	}
}

func TestParseColumnRef(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want ColumnRef
		err  bool
	}{
		{"amount", ColumnRef{"amount", "amount"}, false},
		{"name AS customer_name", ColumnRef{"name", "customer_name"}, false},
		{"name as n", ColumnRef{"name", "n"}, false},
		{`"Weird ""Col""; x" AS ok`, ColumnRef{`Weird "Col"; x`, "ok"}, false},
		{`"a AS b"`, ColumnRef{"a AS b", "a AS b"}, false},
		{`CamelCase`, ColumnRef{"CamelCase", "CamelCase"}, false},
		{`"unterminated`, ColumnRef{}, true},
		{``, ColumnRef{}, true},
		{`x AS`, ColumnRef{"x AS", "x AS"}, false}, // no alias after AS: the whole text is the name
	}
	for _, c := range cases {
		got, err := ParseColumnRef(c.in)
		if (err != nil) != c.err {
			t.Errorf("ParseColumnRef(%q) err = %v, want error %v", c.in, err, c.err)
			continue
		}
		if !c.err && got != c.want {
			t.Errorf("ParseColumnRef(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

func TestParseTableName(t *testing.T) {
	t.Parallel()
	cases := map[string]TableName{
		"orders":                   {"public", "orders"},
		"shop.orders":              {"shop", "orders"},
		`"My Schema"."Order.Line"`: {"My Schema", "Order.Line"},
	}
	for in, want := range cases {
		got, err := ParseTableName(in)
		if err != nil || got != want {
			t.Errorf("ParseTableName(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, bad := range []string{"a.b.c", "", "a..b", `"x"y`} {
		if _, err := ParseTableName(bad); err == nil {
			t.Errorf("ParseTableName(%q) succeeded, want error", bad)
		}
	}
}

func TestParseConfigErrors(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"malformed":   "joins: [\n  - name: x\n",
		"unknown key": "joins:\n  - name: x\n    typo: left\n",
	} {
		_, err := ParseConfig([]byte(in))
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: err = %v, want *ConfigError", name, err)
		}
	}
}

// TestValidateReportsEverything checks that all problems come back at once,
// each naming the fix.
func TestValidateReportsEverything(t *testing.T) {
	t.Parallel()
	cfg, err := ParseConfig([]byte(`
joins:
  - name: a
    type: outer
    left: {table: orders, foreign_key: [customer_id, region]}
    right: {table: customers, key: [id]}
    target: {table: out}
  - name: a
    type: inner
    left: {table: orders}
    right: {table: customers}
    target: {table: out}
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ApplyDefaults()
	err = cfg.Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Validate() = %v, want *ConfigError", err)
	}
	msg := err.Error()
	for _, want := range []string{
		"no source database", "no Redis", `type "outer" is not a join type; use`,
		"duplicate join name", "foreign_key has 2 columns but right.key has 1",
		"set left.foreign_key", "also the target of join",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Validate() message lacks %q:\n%s", want, msg)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://app:s3cret@db:5432/shop":     "postgres://app:xxxxx@db:5432/shop",
		"redis://:pw@localhost:6379/0":           "redis://:xxxxx@localhost:6379/0",
		"postgres://db/shop?password=s3cret&x=1": "postgres://db/shop?password=xxxxx&x=1",
		"postgres://app@db/shop":                 "postgres://app@db/shop",
	} {
		got := RedactURL(in)
		if got != want || strings.Contains(got, "s3cret") {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestValidateRedisURLs checks that Validate accepts the SPEC's four Redis
// URL forms (one server, a cluster; plain or TLS) and refuses others with
// the forms to use.
func TestValidateRedisURLs(t *testing.T) {
	t.Parallel()
	for raw, ok := range map[string]bool{
		"redis://localhost:6379/0":                        true,
		"rediss://:pw@cache.internal:6380/0":              true,
		"redis+cluster://10.0.0.1:7000,10.0.0.2:7000":     true,
		"rediss+cluster://u:pw@r1:7000,r2:7000,r3:7000/0": true,
		"http://localhost:6379":                           false,
		"redis-cluster://10.0.0.1:7000":                   false,
	} {
		cfg, err := ParseConfig([]byte("joins:\n  - name: a\n    type: inner\n    left: {table: orders, foreign_key: [customer_id]}\n    right: {table: customers, key: [id]}\n    target: {table: out}\n"))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Source, cfg.Redis = "postgres://db/shop", raw
		cfg.ApplyDefaults()
		err = cfg.Validate()
		if ok && err != nil {
			t.Errorf("Validate(redis %q) = %v, want nil", raw, err)
		}
		if !ok && (err == nil || !strings.Contains(err.Error(), "redis+cluster://")) {
			t.Errorf("Validate(redis %q) = %v, want an error naming the URL forms", raw, err)
		}
	}
	if got := RedactURL("rediss+cluster://u:s3cret@r1:7000,r2:7000"); strings.Contains(got, "s3cret") {
		t.Errorf("RedactURL kept the password: %q", got)
	}
}
