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
	want := []ColumnRef{{Name: "name", Alias: "customer_name"}, {Name: "tier", Alias: "tier"}}
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
		{"amount", ColumnRef{Name: "amount", Alias: "amount"}, false},
		{"name AS customer_name", ColumnRef{Name: "name", Alias: "customer_name"}, false},
		{"name as n", ColumnRef{Name: "name", Alias: "n"}, false},
		{`"Weird ""Col""; x" AS ok`, ColumnRef{Name: `Weird "Col"; x`, Alias: "ok"}, false},
		{`"a AS b"`, ColumnRef{Name: "a AS b", Alias: "a AS b"}, false},
		{`CamelCase`, ColumnRef{Name: "CamelCase", Alias: "CamelCase"}, false},
		{`"unterminated`, ColumnRef{}, true},
		{``, ColumnRef{}, true},
		{`x AS`, ColumnRef{}, true}, // no alias after AS
		{"amount * qty AS total", ColumnRef{Alias: "total", Expr: "amount * qty"}, false},
		{"lower(email) as email_lc", ColumnRef{Alias: "email_lc", Expr: "lower(email)"}, false},
		{"created::date AS day", ColumnRef{Alias: "day", Expr: "created::date"}, false},
		{`CAST(x AS text) AS "X t"`, ColumnRef{Alias: "X t", Expr: "CAST(x AS text)"}, false},
		{`coalesce(note, 'a AS b') AS n`, ColumnRef{Alias: "n", Expr: "coalesce(note, 'a AS b')"}, false},
		{`"Amount" * 2 AS double`, ColumnRef{Alias: "double", Expr: `"Amount" * 2`}, false},
		{"amount * qty", ColumnRef{}, true}, // an expression needs a name
		{"count(*)", ColumnRef{}, true},
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

// TestValidateRedisURLs checks that Validate accepts the four Redis
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

func TestParseListForm(t *testing.T) {
	t.Parallel()
	cfg, err := LoadConfig("testdata/nway.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	j := cfg.Joins[0]
	if !j.IsList() || len(j.Rights) != 3 {
		t.Fatalf("rights = %+v, want the list form with 3 entries", j.Rights)
	}
	for i, want := range []struct {
		alias, typ string
		parent     int
	}{{"customers", "left", -1}, {"products", "inner", -1}, {"regions", "left", 0}} {
		r := j.Rights[i]
		parent, err := j.ParentOf(i)
		if r.Alias() != want.alias || r.Type != want.typ || err != nil || parent != want.parent {
			t.Errorf("right[%d] = alias %q type %q parent %d (%v), want %q %q %d", i, r.Alias(), r.Type, parent, err, want.alias, want.typ, want.parent)
		}
	}
	if got := j.Rights[2].ForeignKey; len(got) != 1 || got[0] != "region_id" {
		t.Errorf("regions foreign_key = %v", got)
	}
	if tables := j.Tables(); len(tables) != 4 {
		t.Errorf("tables = %v, want 4", tables)
	}
}

// TestListFormErrors: every mistake in the list form is reported, each
// naming its fix; cycles and forward references are refused.
func TestListFormErrors(t *testing.T) {
	t.Parallel()
	head := "source: postgres://localhost/shop\nredis: redis://localhost:6379/0\njoins:\n  - name: j\n    type: left\n    target: {table: out}\n"
	for name, tc := range map[string]struct {
		yaml string
		want []string // in the Validate or parse error
	}{
		"forward from": {
			"    left: {table: orders}\n    right:\n      - {table: regions, from: customers, foreign_key: [region_id]}\n      - {table: customers, foreign_key: [customer_id]}\n",
			[]string{`right[0] (regions): from "customers" names an entry listed after this one`, `move "customers" above this entry`},
		},
		"cycle": {
			"    left: {table: orders}\n    right:\n      - {table: customers, from: regions, foreign_key: [customer_id]}\n      - {table: regions, from: customers, foreign_key: [region_id]}\n",
			[]string{`right[0] (customers): from "regions" closes a cycle: customers → regions → customers`, `make one of them reference the left table`},
		},
		"self from": {
			"    left: {table: orders}\n    right:\n      - {table: customers, from: customers, foreign_key: [customer_id]}\n",
			[]string{`names the entry itself`, `cycle`},
		},
		"unknown from": {
			"    left: {table: orders}\n    right:\n      - {table: customers, foreign_key: [customer_id]}\n      - {table: regions, from: custmers, foreign_key: [region_id]}\n",
			[]string{`from "custmers" names no table of this join: did you mean "customers" (right[0], table public.customers)?`},
		},
		"a misspelled table, named right by a later from": {
			"    left: {table: orders}\n    right:\n      - {table: custmers, foreign_key: [customer_id]}\n      - {table: regions, from: customers, foreign_key: [region_id]}\n",
			[]string{`right[1] (regions): from "customers" names no table of this join: did you mean "custmers" (right[0], table public.custmers)? If that entry's table is the misspelled name, fix it there`},
		},
		"a from far from any name": {
			"    left: {table: orders}\n    right:\n      - {table: customers, foreign_key: [customer_id]}\n      - {table: regions, from: zzz, foreign_key: [region_id]}\n",
			[]string{`from "zzz" names no table of this join; use the left table or an earlier entry: orders, customers`},
		},
		"duplicate as": {
			"    left: {table: orders}\n    right:\n      - {table: customers, foreign_key: [buyer_id]}\n      - {table: customers, foreign_key: [seller_id]}\n",
			[]string{`right[1] (customers): the name "customers" is taken by right[0]; give this entry a distinct ` + "`as`"},
		},
		"as clashes with left": {
			"    left: {table: orders}\n    right:\n      - {table: customers, as: orders, foreign_key: [customer_id]}\n",
			[]string{`the name "orders" is taken by the left table`},
		},
		"left foreign key": {
			"    left: {table: orders, foreign_key: [customer_id]}\n    right:\n      - {table: customers, foreign_key: [customer_id]}\n",
			[]string{"left.foreign_key belongs to the two-table form"},
		},
		"missing foreign key and bad type": {
			"    left: {table: orders}\n    right:\n      - {table: customers, type: outer}\n",
			[]string{"right[0] (customers): set foreign_key (the columns of public.orders that reference public.customers)",
				`type "outer" is not a join type`},
		},
		"key count": {
			"    left: {table: orders}\n    right:\n      - {table: customers, key: [id, region], foreign_key: [customer_id]}\n",
			[]string{"foreign_key has 1 columns but key has 2"},
		},
		"empty list": {
			"    left: {table: orders}\n    right: []\n",
			[]string{"right is an empty list"},
		},
		"target is a source": {
			"    left: {table: orders}\n    right:\n      - {table: out, foreign_key: [customer_id]}\n",
			[]string{"target.table public.out is a source table"},
		},
		"unknown key in an entry": {
			"    left: {table: orders}\n    right:\n      - {table: customers, foreignkey: [customer_id]}\n",
			[]string{`an entry of right has no key "foreignkey"`},
		},
		"list keys in the mapping form": {
			"    left: {table: orders, foreign_key: [customer_id]}\n    right: {table: customers, from: orders}\n",
			[]string{"right.from belongs to the list form of right"},
		},
		"non-equality condition": {
			"    left: {table: orders}\n    right:\n      - {table: customers, foreign_key: [customer_id], on: \"orders.amount > customers.limit\"}\n",
			[]string{`has no key "on"`, "conditions other than that equality", "not supported"},
		},
		"aggregate key": {
			"    left: {table: orders}\n    right:\n      - {table: customers, foreign_key: [customer_id]}\n    group_by: [customer_id]\n",
			[]string{`has no key "group_by"`, "aggregates are not supported"},
		},
		"unknown key in left": {
			"    left: {table: orders, typo: 1}\n    right:\n      - {table: customers, foreign_key: [customer_id]}\n",
			[]string{`left has no key "typo"`},
		},
		"too many entries": {
			"    left: {table: orders}\n    right:\n" + strings.Repeat("      - {table: customers, foreign_key: [customer_id]}\n", MaxEntries+1),
			[]string{"right has 256 entries, at most 255 are supported"},
		},
	} {
		cfg, err := ParseConfig([]byte(head + tc.yaml))
		if err == nil {
			cfg.ApplyDefaults()
			err = cfg.Validate()
		}
		var ce *ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: err = %v, want a *ConfigError", name, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error lacks %q:\n%v", name, w, err)
			}
		}
	}
}

// TestFromNames: from takes an as name or a table name; a name
// matches first, and a table name reaches an entry renamed by as when no
// name matches it; two such entries are ambiguous.
func TestFromNames(t *testing.T) {
	t.Parallel()
	head := "source: postgres://localhost/shop\nredis: redis://localhost:6379/0\njoins:\n  - name: j\n    type: left\n    target: {table: out}\n    left: {table: orders}\n    right:\n"
	for name, tc := range map[string]struct {
		entries string
		parent  int // of the last entry; -2: an error containing err
		err     string
	}{
		"as name":                              {"      - {table: customers, as: buyer, foreign_key: [buyer_id]}\n      - {table: regions, from: buyer, foreign_key: [region_id]}\n", 0, ""},
		"table name of an entry renamed by as": {"      - {table: customers, as: buyer, foreign_key: [buyer_id]}\n      - {table: regions, from: customers, foreign_key: [region_id]}\n", 0, ""},
		"schema-qualified":                     {"      - {table: customers, as: buyer, foreign_key: [buyer_id]}\n      - {table: regions, from: public.customers, foreign_key: [region_id]}\n", 0, ""},
		"the name wins over a renamed entry":   {"      - {table: customers, as: seller, foreign_key: [seller_id]}\n      - {table: customers, foreign_key: [customer_id]}\n      - {table: regions, from: customers, foreign_key: [region_id]}\n", 1, ""},
		"two renamed entries":                  {"      - {table: customers, as: seller, foreign_key: [seller_id]}\n      - {table: customers, as: buyer, foreign_key: [customer_id]}\n      - {table: regions, from: customers, foreign_key: [region_id]}\n", -2, "ambiguous"},
		"the left table":                       {"      - {table: customers, foreign_key: [customer_id]}\n      - {table: regions, from: orders, foreign_key: [region_id]}\n", -1, ""},
	} {
		cfg, err := ParseConfig([]byte(head + tc.entries))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		j := cfg.Joins[0]
		last := len(j.Rights) - 1
		parent, err := j.ParentOf(last)
		switch {
		case tc.parent == -2 && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: parent %d, %v; want an error saying %q", name, parent, err, tc.err)
		case tc.parent != -2 && (err != nil || parent != tc.parent):
			t.Errorf("%s: parent %d, %v; want %d", name, parent, err, tc.parent)
		}
	}
}
