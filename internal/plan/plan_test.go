package plan_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/plan/plantest"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"

	"github.com/fkmat/fkmat/internal/testenv"
)

const shopSchema = `
CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier varchar(10));
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id integer, amount numeric(12,2), note text);
CREATE TABLE nopk (a int, b int);
CREATE TABLE regions (code numeric PRIMARY KEY, label text);
CREATE TABLE "Weird ""T""" ("Id" int PRIMARY KEY, "Cust; Id" bigint);
`

func resolveYAML(t *testing.T, tc *testenv.Case, yml string) ([]*plan.JoinPlan, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := config.ParseConfig([]byte(yml))
	if err != nil {
		t.Fatal(err)
	}
	return plan.Resolve(ctx, tc.Pool, cfg)
}

func TestResolve(t *testing.T) {
	tc := testenv.New(t)
	if _, err := tc.Pool.Exec(context.Background(), shopSchema); err != nil {
		t.Fatal(err)
	}

	t.Run("defaults from the catalog", func(t *testing.T) {
		plans, err := resolveYAML(t, tc, `
joins:
  - name: oe
    type: left
    left: {table: orders, foreign_key: [customer_id]}
    right: {table: customers}
    target: {table: orders_enriched}
`)
		if err != nil {
			t.Fatal(err)
		}
		p := plans[0]
		var got []string
		for _, c := range p.Target.Columns {
			got = append(got, c.Name+" "+c.Type)
		}
		want := "id bigint,customer_id integer,amount numeric(12,2),note text,name text,tier character varying(10)"
		if strings.Join(got, ",") != want {
			t.Fatalf("target columns = %s, want %s", strings.Join(got, ","), want)
		}
		if p.Target.KeyCount != 1 || p.Target.RightFrom != 4 {
			t.Fatalf("key count %d, right from %d", p.Target.KeyCount, p.Target.RightFrom)
		}
		if p.Spec.Type != join.Left || p.Spec.LeftValues != 3 || p.Spec.RightValues != 2 {
			t.Fatalf("spec = %+v", p.Spec)
		}
		if p.Fingerprint == "" {
			t.Fatal("no fingerprint")
		}
	})

	t.Run("aliases and quoted names", func(t *testing.T) {
		plans, err := resolveYAML(t, tc, `
joins:
  - name: w
    type: inner
    left: {table: '"Weird ""T"""', foreign_key: ['Cust; Id'], columns: ['"Id" AS key_id']}
    right: {table: customers, columns: [name AS customer_name]}
    target: {table: w_out}
`)
		if err != nil {
			t.Fatal(err)
		}
		cols := plans[0].Target.Columns
		if cols[0].Name != "key_id" || cols[1].Name != "customer_name" || len(cols) != 2 {
			t.Fatalf("columns = %+v", cols)
		}
	})

	t.Run("every problem at once", func(t *testing.T) {
		_, err := resolveYAML(t, tc, `
joins:
  - name: bad1
    type: left
    left: {table: nopk, foreign_key: [a]}
    right: {table: missing_table}
    target: {table: x1}
  - name: bad2
    type: left
    left: {table: orders, foreign_key: [Customer_ID], columns: [id, nosuch]}
    right: {table: customers}
    target: {table: x2}
  - name: bad3
    type: left
    left: {table: orders, foreign_key: [amount]}
    right: {table: customers}
    target: {table: x3}
  - name: bad4
    type: left
    left: {table: orders, foreign_key: [customer_id], columns: [id, note AS name]}
    right: {table: customers, columns: [name]}
    target: {table: x4}
`)
		var ce *config.ConfigError
		if !errors.As(err, &ce) {
			t.Fatalf("Resolve = %v, want *ConfigError", err)
		}
		msg := err.Error()
		for _, want := range []string{
			`right table public.missing_table does not exist`,
			`did you mean "customer_id"? names are case-sensitive`,
			`has no column "nosuch"`,
			`foreign key type numeric is not comparable with key type bigint`,
			`column "name" appears twice; give one of them an alias`,
		} {
			if !strings.Contains(msg, want) {
				t.Errorf("error lacks %q:\n%s", want, msg)
			}
		}
	})

	t.Run("table without primary key", func(t *testing.T) {
		_, err := resolveYAML(t, tc, `
joins:
  - name: np
    type: left
    left: {table: nopk, foreign_key: [b]}
    right: {table: customers}
    target: {table: x5}
`)
		if err == nil || !strings.Contains(err.Error(), "table public.nopk has no primary key; set left.key in the config") {
			t.Fatalf("Resolve = %v", err)
		}
	})
}

// TestChainOfExample lays out the n-way example as a join.Chain (the
// customers' region_id carried hidden for the regions step) and runs it:
// the target rows are the join's SQL, and a region rename reaches the
// orders of the customers in it.
func TestChainOfExample(t *testing.T) {
	l := plan.ChainOf(plantest.Wide())
	names := func(cols []plan.SourceColumn) (out []string) {
		for _, c := range cols {
			out = append(out, c.Name)
		}
		return out
	}
	for i, want := range [][]string{{"customer_id", "product_id", "amount"}, {"name", "region_id"}, {"title"}, {"name"}} {
		if got := names(l.Carried[i]); !slices.Equal(got, want) {
			t.Errorf("table %d carries %v, want %v", i-1, got, want)
		}
	}
	for i, want := range []struct{ left, right, fk int }{{3, 2, 0}, {5, 1, 1}, {6, 1, 4}} {
		s := l.Steps[i]
		if s.Spec.LeftValues != want.left || s.Spec.RightValues != want.right || !slices.Equal(s.FK, []int{want.fk}) {
			t.Errorf("step %d: %d left, %d right values, foreign key at %v; want %d, %d, [%d]",
				i, s.Spec.LeftValues, s.Spec.RightValues, s.FK, want.left, want.right, want.fk)
		}
	}
	if want := []int{0, 1, 2, 3, 4, 6, 7}; !slices.Equal(l.Out, want) {
		t.Fatalf("out = %v, want %v", l.Out, want)
	}

	var stores []*jointest.Store
	var readers []join.StateReader
	for range l.Steps {
		s := jointest.NewStore()
		stores, readers = append(stores, s), append(readers, s)
	}
	c, err := join.NewChain(l.Steps, readers, l.Out)
	if err != nil {
		t.Fatal(err)
	}
	v := jointest.Values
	left := func(pk string, vals ...string) join.Change {
		return join.Change{Table: 0, Kind: join.LeftUpsert, Left: join.LeftRow{PK: v(pk), Values: v(vals...)}}
	}
	right := func(table int, key string, vals ...string) join.Change {
		return join.Change{Table: table, Kind: join.RightUpsert, Right: join.RightRow{Key: v(key), Values: v(vals...)}}
	}
	rows := map[string][]join.Value{}
	apply := func(changes ...join.Change) {
		t.Helper()
		muts, err := c.Apply(context.Background(), changes, func(_ context.Context, o join.Output) error {
			for _, d := range o.Deletes {
				delete(rows, d[0].Text)
			}
			for _, r := range o.Upserts {
				rows[r[0].Text] = r
			}
			for _, u := range o.RightUpdates {
				for _, k := range u.Keys {
					rows[k[0].Text] = append(slices.Clone(rows[k[0].Text][:c.TargetRightFrom()]), u.Right...)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range muts {
			if err := stores[i].Apply(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	apply(right(3, "7", "north"), right(1, "1", "ann", "7"), right(1, "2", "bob", "NULL"),
		right(2, "10", "pen"), left("100", "1", "10", "5"), left("101", "2", "10", "6"),
		left("102", "3", "10", "7"), left("103", "1", "99", "8"))
	check := func(want map[string][]join.Value) {
		t.Helper()
		if len(rows) != len(want) {
			t.Fatalf("target %v, want %v", rows, want)
		}
		for k, w := range want {
			if !join.ValuesEqual(rows[k], w) {
				t.Errorf("row %s = %v, want %v", k, rows[k], w)
			}
		}
	}
	// Order 103's product does not exist: the inner products entry drops
	// it. Order 102's customer does not exist: its name and region are NULL.
	check(map[string][]join.Value{
		"100": v("100", "1", "10", "5", "ann", "pen", "north"),
		"101": v("101", "2", "10", "6", "bob", "pen", "NULL"),
		"102": v("102", "3", "10", "7", "NULL", "pen", "NULL"),
	})
	apply(right(3, "7", "NORTH"), right(1, "2", "bob", "7"))
	check(map[string][]join.Value{
		"100": v("100", "1", "10", "5", "ann", "pen", "NORTH"),
		"101": v("101", "2", "10", "6", "bob", "pen", "NORTH"),
		"102": v("102", "3", "10", "7", "NULL", "pen", "NULL"),
	})
}

// TestTargetOfListForm: the target of a list-form join holds the key, the
// left columns and every entry's columns in list order; the last entry's
// columns are the right part (RightUpdates), as the Chain projects them.
func TestTargetOfListForm(t *testing.T) {
	p := plantest.Wide()
	tt := plan.TargetTable(config.TableName{Schema: "public", Name: "orders_wide"}, p)
	var names []string
	for _, c := range tt.Columns {
		names = append(names, c.Name)
	}
	if want := []string{"id", "customer_id", "product_id", "amount", "customer_name", "product_title", "region_name"}; !slices.Equal(names, want) {
		t.Errorf("target columns %v, want %v", names, want)
	}
	c, err := join.NewChain(plan.ChainOf(p).Steps, []join.StateReader{jointest.NewStore(), jointest.NewStore(), jointest.NewStore()}, plan.ChainOf(p).Out)
	if err != nil {
		t.Fatal(err)
	}
	if tt.KeyCount != 1 || tt.RightFrom != 6 || c.TargetRightFrom() != tt.RightFrom {
		t.Errorf("key count %d, right from %d (chain %d); want 1, 6, 6", tt.KeyCount, tt.RightFrom, c.TargetRightFrom())
	}
	if fp := plan.Fingerprint(p); fp == plan.Fingerprint(&plan.JoinPlan{Name: p.Name, Type: p.Type, Left: p.Left, Target: tt}) {
		t.Error("the fingerprint ignores the entries")
	}
}
