package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseAggregate(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Aggregate
	}{
		{"count(*) AS orders", Aggregate{Func: "count", Arg: "*", Alias: "orders"}},
		{"COUNT(coupon) as with_coupon", Aggregate{Func: "count", Arg: "coupon", Alias: "with_coupon"}},
		{"sum(amount * qty) AS revenue", Aggregate{Func: "sum", Arg: "amount * qty", Alias: "revenue"}},
		{`max(created) AS "Last Order"`, Aggregate{Func: "max", Arg: "created", Alias: "Last Order"}},
		{"bool_or(status = 'late') AS any_late", Aggregate{Func: "bool_or", Arg: "status = 'late'", Alias: "any_late"}},
		{"jsonb_agg(jsonb_build_object('id', id, 'amount', amount) ORDER BY id) AS recent",
			Aggregate{Func: "jsonb_agg", Arg: "jsonb_build_object('id', id, 'amount', amount)", Alias: "recent", OrderBy: []OrderItem{{Column: "id"}}}},
		{"jsonb_agg(id ORDER BY created DESC, id desc LIMIT 5) AS last5",
			Aggregate{Func: "jsonb_agg", Arg: "id", Alias: "last5", OrderBy: []OrderItem{{Column: "created", Desc: true}, {Column: "id", Desc: true}}, Limit: 5}},
		{"jsonb_agg(note ORDER BY \"Order Date\" ASC) AS notes",
			Aggregate{Func: "jsonb_agg", Arg: "note", Alias: "notes", OrderBy: []OrderItem{{Column: "Order Date"}}}},
		// ORDER BY inside a nested call belongs to it.
		{"sum(coalesce(amount, 0)) AS total", Aggregate{Func: "sum", Arg: "coalesce(amount, 0)", Alias: "total"}},
	} {
		got, err := ParseAggregate(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseAggregate(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		again, err := ParseAggregate(got.String())
		if err != nil || !reflect.DeepEqual(again, got) {
			t.Errorf("%q: String() = %q reads back as %+v, %v", c.in, got.String(), again, err)
		}
	}
	for in, want := range map[string]string{
		"count(*)":                                  "name its output column with AS",
		"total AS t":                                "write a call of count, sum",
		"median(amount) AS m":                       "median is not an aggregate fkmat maintains",
		"summ(amount) AS m":                         "did you mean sum?",
		"sum(*) AS s":                               "only count takes *",
		"sum() AS s":                                "sum needs an argument",
		"count(DISTINCT status) AS s":               "DISTINCT is not supported",
		"jsonb_agg(id) AS ids":                      "jsonb_agg needs an order",
		"jsonb_agg(id ORDER BY id LIMIT 0) AS":      "name its output column with AS",
		"jsonb_agg(id ORDER BY id LIMIT 0) AS ids":  "give a positive whole number",
		"jsonb_agg(id ORDER BY lower(name)) AS ids": "order by the child's columns",
		"max(created ORDER BY id) AS m":             "ORDER BY only orders jsonb_agg",
		"sum(amount) FILTER (WHERE x) AS s":         "write a call of",
		"sum(amount) + 1 AS s":                      "write a call of",
	} {
		if _, err := ParseAggregate(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseAggregate(%q) = %v, want an error naming %q", in, err, want)
		}
	}
}

func TestParseRollups(t *testing.T) {
	const file = `
source: postgres://localhost/shop
redis: redis://localhost:6379/0
joins:
  - name: customer_stats
    type: left
    left:
      table: public.customers
      columns: [id, name]
    rollups:
      - table: public.orders
        foreign_key: [customer_id]
        where: "status <> 'cancelled'"
        aggregates: ["count(*) AS orders", "sum(amount) AS revenue",
                     "jsonb_agg(jsonb_build_object('id', id) ORDER BY id) AS recent"]
      - table: sales.tickets
        foreign_key: customer_id
        aggregates: "count(*) AS open_tickets"
    target:
      table: public.customer_stats
`
	cfg, probs := parse([]byte(file))
	if len(probs) > 0 {
		t.Fatal(probs)
	}
	cfg.ApplyDefaults()
	if p := cfg.problems(); len(p) > 0 {
		t.Fatalf("a join of a left table and roll-ups only: %v", p)
	}
	j := cfg.Joins[0]
	if len(j.Rollups) != 2 || j.Rollups[0].Table != (TableName{"public", "orders"}) || j.Rollups[0].Where != "status <> 'cancelled'" ||
		len(j.Rollups[0].Aggregates) != 3 || j.Rollups[1].ForeignKey[0] != "customer_id" || j.Rollups[1].Aggregates[0].Alias != "open_tickets" {
		t.Fatalf("rollups = %+v", j.Rollups)
	}
	if got := j.Tables(); !reflect.DeepEqual(got, []TableName{{"public", "customers"}, {"public", "orders"}, {"sales", "tickets"}}) {
		t.Errorf("Tables() = %v: the child tables are published too", got)
	}

	for name, c := range map[string]struct{ yaml, want string }{
		"no foreign key": {"rollups: [{table: orders, aggregates: [\"count(*) AS n\"]}]", "roll-up public.orders: set foreign_key"},
		"no aggregates":  {"rollups: [{table: orders, foreign_key: [customer_id]}]", "roll-up public.orders: set aggregates"},
		"no table":       {"rollups: [{foreign_key: [customer_id], aggregates: [\"count(*) AS n\"]}]", "rollups[0]: set table"},
		"columns":        {"rollups: [{table: orders, foreign_key: [c], columns: [id], aggregates: [\"count(*) AS n\"]}]", "a roll-up has no columns"},
		"bad aggregate":  {"rollups: [{table: orders, foreign_key: [c], aggregates: [\"avg(x)\"]}]", "name its output column with AS"},
		"not a list":     {"rollups: {table: orders}", "rollups must be a list of child tables"},
		"no right":       {"", "set right.table (or roll child tables up with rollups:)"},
	} {
		file := "source: postgres://localhost/shop\nredis: redis://localhost:6379/0\njoins:\n  - name: j\n    type: left\n    left: {table: customers}\n    target: {table: stats}\n"
		if c.yaml != "" {
			file += "    " + c.yaml + "\n"
		}
		cfg, probs := parse([]byte(file))
		if cfg != nil {
			cfg.ApplyDefaults()
			probs = append(probs, cfg.problems()...)
		}
		if !strings.Contains(strings.Join(probs, "\n"), c.want) {
			t.Errorf("%s: problems %q, want one naming %q", name, probs, c.want)
		}
	}
}
