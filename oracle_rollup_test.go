package fkmat

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/sink"
)

// TestOracleRollups resolves a join with roll-ups of every aggregate and
// checks that its SQL (OracleSQL: the children grouped by parent, joined)
// equals the correlated subqueries that define the aggregates, written out
// by hand, on random data: parents without children, NULL and dangling
// foreign keys, NULL inputs, children the filter leaves out, ties of an
// order.
func TestOracleRollups(t *testing.T) {
	tc := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := rand.New(rand.NewPCG(rand.Uint64(), 5))
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := tc.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec(`CREATE TABLE regions (id int PRIMARY KEY, name text)`)
	exec(`CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int)`)
	exec(`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), qty int, status text,
		created timestamptz, score double precision)`)
	exec(`INSERT INTO regions SELECT g, 'r' || g FROM generate_series(1, 3) g`)
	exec(`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 5 = 0 THEN NULL ELSE 1 + g % 4 END FROM generate_series(1, 40) g`)
	for id := range 500 {
		var cust any = 1 + r.IntN(30) // 31-40 have none
		if r.IntN(10) == 0 {
			cust = 41 + r.IntN(5) // dangling
		}
		if r.IntN(12) == 0 {
			cust = nil
		}
		var amount any = fmt.Sprintf("%d.%02d", r.IntN(200)-20, r.IntN(100))
		if r.IntN(10) == 0 {
			amount = nil
		}
		exec(`INSERT INTO orders VALUES ($1, $2, $3::numeric, $4, $5, '2026-01-01'::timestamptz + $6 * interval '1 hour', $7)`,
			id, cust, amount, r.IntN(6), []any{"open", "paid", "cancelled", nil}[r.IntN(4)], r.IntN(30), r.Float64()*100)
	}
	cfg, err := config.ParseConfig([]byte(`
joins:
  - name: customer_stats
    type: left
    left: {table: customers, columns: [id, name], foreign_key: [region_id]}
    right: {table: regions, columns: [name AS region]}
    rollups:
      - table: orders
        foreign_key: [customer_id]
        where: "status <> 'cancelled'"
        aggregates: ["count(*) AS orders", "count(amount) AS priced", "sum(amount) AS revenue", "avg(amount) AS mean",
                     "sum(qty) AS items", "avg(qty) AS mean_qty", "min(amount) AS smallest", "max(created) AS last_order",
                     "max(status COLLATE \"C\") AS top_status", "bool_and(qty > 2) AS all_big", "bool_or(amount > 150) AS any_huge",
                     "sum(score) AS score",
                     "jsonb_agg(jsonb_build_object('id', id, 'amount', amount) ORDER BY created DESC LIMIT 3) AS recent",
                     "jsonb_agg(id ORDER BY created) AS all_ids"]
    target: {table: customer_stats}
`))
	if err != nil {
		t.Fatal(err)
	}
	plans, err := plan.Resolve(ctx, tc.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p := plans[0]
	var cols []string
	for _, c := range p.Target.Columns {
		cols = append(cols, c.Name+" "+c.Type)
	}
	want := "id bigint,name text,region text,orders bigint,priced bigint,revenue numeric,mean numeric,items bigint,mean_qty numeric," +
		"smallest numeric,last_order timestamp with time zone,top_status text,all_big boolean,any_huge boolean,score double precision,recent jsonb,all_ids jsonb"
	if got := strings.Join(cols, ","); got != want {
		t.Fatalf("target columns\n got  %s\n want %s", got, want)
	}
	sub := func(agg string) string {
		return "(SELECT " + agg + " FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled')"
	}
	spec := "SELECT c.id, c.name, g.name AS region, " + strings.Join([]string{
		sub("count(*)"), sub("count(amount)"), sub("sum(amount)"), sub("avg(amount)"), sub("sum(qty)"), sub("avg(qty)"),
		sub("min(amount)"), sub("max(created)"), sub(`max(status COLLATE "C")`), sub("bool_and(qty > 2)"), sub("bool_or(amount > 150)"),
		sub("sum(score)"),
		`(SELECT jsonb_agg(e ORDER BY k) FROM (SELECT jsonb_build_object('id', id, 'amount', amount) AS e,
			row_number() OVER (ORDER BY created DESC, id) AS k FROM orders o WHERE o.customer_id = c.id AND status <> 'cancelled') s WHERE k <= 3)`,
		sub("jsonb_agg(to_jsonb(id) ORDER BY created, id)"),
	}, ", ") + " FROM customers c LEFT JOIN regions g ON c.region_id = g.id"
	// Floating-point sums are compared rounded: both sides add in an
	// order of their own.
	round := func(q string) string {
		return "SELECT id, name, region, orders, priced, revenue, mean, items, mean_qty, smallest, last_order, top_status, all_big, any_huge, " +
			"round(score::numeric, 6), recent, all_ids FROM (" + q + ") q(id, name, region, orders, priced, revenue, mean, items, mean_qty, " +
			"smallest, last_order, top_status, all_big, any_huge, score, recent, all_ids)"
	}
	oracle := OracleSQL(p)
	var diff int
	if err := tc.Pool.QueryRow(ctx, "SELECT count(*) FROM (("+round(oracle)+" EXCEPT ALL "+round(spec)+") UNION ALL ("+
		round(spec)+" EXCEPT ALL "+round(oracle)+")) d").Scan(&diff); err != nil {
		t.Fatalf("%v\n%s", err, oracle)
	}
	var rows, withChildren int
	if err := tc.Pool.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE orders > 0) FROM ("+oracle+") o").Scan(&rows, &withChildren); err != nil {
		t.Fatal(err)
	}
	if diff != 0 || rows != 40 || withChildren == 0 || withChildren == rows {
		t.Fatalf("OracleSQL differs from the aggregates' definition in %d rows (%d rows, %d with children):\n%s", diff, rows, withChildren, oracle)
	}
}

// TestRowsEqualApprox: a roll-up's floating-point sums and averages are
// compared within a relative 1e-9 (Postgres adds in row order, fkmat
// exactly), every other column exactly.
func TestRowsEqualApprox(t *testing.T) {
	s := func(v string) *string { return &v }
	p := &plan.JoinPlan{Rollups: []plan.RollupPlan{{Aggregates: []plan.AggregatePlan{
		{Func: "sum", Type: "double precision"}, {Func: "sum", Type: "numeric"}, {Func: "max", Type: "double precision"}}}}}
	for range 4 {
		p.Target.Columns = append(p.Target.Columns, sink.Column{})
	}
	approx := approxColumns(p)
	if fmt.Sprint(approx) != "[false true false false]" {
		t.Fatalf("approxColumns = %v", approx)
	}
	for _, c := range []struct {
		a, b []*string
		want bool
	}{
		{[]*string{s("1"), s("0.30000000000000004"), s("1.5"), s("2")}, []*string{s("1"), s("0.3"), s("1.5"), s("2")}, true},
		{[]*string{s("1"), s("0.3001"), s("1.5"), s("2")}, []*string{s("1"), s("0.3"), s("1.5"), s("2")}, false},
		{[]*string{s("1"), s("0.3"), s("1.5"), s("2.0000000000001")}, []*string{s("1"), s("0.3"), s("1.5"), s("2")}, false},
		{[]*string{s("1"), nil, s("1.5"), s("2")}, []*string{s("1"), s("0"), s("1.5"), s("2")}, false},
		{[]*string{s("1"), s("NaN"), s("1.5"), s("2")}, []*string{s("1"), s("NaN"), s("1.5"), s("2")}, true},
	} {
		if got := rowsEqual(c.a, c.b, approx); got != c.want {
			t.Errorf("rowsEqual(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
