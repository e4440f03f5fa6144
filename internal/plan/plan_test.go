package plan_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/plan/plantest"
	"github.com/fkmat/fkmat/join"

	"github.com/fkmat/fkmat/internal/testenv"
)

const shopSchema = `
CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier varchar(10));
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id integer, amount numeric(12,2), note text);
CREATE TABLE nopk (a int, b int);
CREATE TABLE regions (code numeric PRIMARY KEY, label text);
CREATE TABLE "Weird ""T""" ("Id" int PRIMARY KEY, "Cust; Id" bigint);
`

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

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

	t.Run("rollups", func(t *testing.T) {
		plans, err := resolveYAML(t, tc, `
joins:
  - name: stats
    type: left
    left: {table: customers}
    rollups:
      - {table: orders, foreign_key: [customer_id], where: "amount > 0",
         aggregates: ["count(*) AS orders", "sum(amount) AS revenue", "avg(customer_id) AS c", "max(note COLLATE \"C\") AS last_note",
                      "jsonb_agg(note ORDER BY id DESC LIMIT 2) AS notes"]}
    target: {table: customer_stats}
`)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range plans[0].Target.Columns {
			got = append(got, c.Name+" "+c.Type)
		}
		want := "id bigint,name text,tier character varying(10),orders bigint,revenue numeric,c numeric,last_note text,notes jsonb"
		if strings.Join(got, ",") != want {
			t.Fatalf("target columns = %s, want %s", strings.Join(got, ","), want)
		}
		if n := plans[0].States(); n != 3 {
			t.Fatalf("%d states, want the customers', the roll-up's results' and its children's", n)
		}
		for yml, problem := range map[string]string{
			`{table: orders, foreign_key: [customer_id], aggregates: ["sum(note) AS n"]}`:    "sum of text is not supported",
			`{table: orders, foreign_key: [customer_id, id], aggregates: ["count(*) AS n"]}`: "foreign_key has 2 columns but the left table's key has 1",
			`{table: orders, foreign_key: [note], aggregates: ["count(*) AS n"]}`:            `foreign_key "note" -> left key`,
			`{table: orders, foreign_key: [customer_id], aggregates: ["count(nope) AS n"]}`:  "nope",
			`{table: orders, foreign_key: [customer_id], aggregates: ["count(*) AS id"]}`:    `output column "id" comes from`,
			`{table: customers, foreign_key: [id], aggregates: ["count(*) AS n"]}`:           "the table is also joined in this join",
		} {
			_, err := resolveYAML(t, tc, `
joins:
  - name: stats
    type: left
    left: {table: customers}
    rollups: [`+yml+`]
    target: {table: customer_stats}
`)
			if err == nil || !strings.Contains(err.Error(), problem) {
				t.Errorf("%s: %v, want a problem naming %q", yml, err, problem)
			}
		}
	})

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

// TestCarriedOfExample: each table of the n-way example carries its
// output columns, then the foreign keys of the entries referencing it that
// are not output (the customers' region_id, hidden, for the regions entry).
func TestCarriedOfExample(t *testing.T) {
	l := plan.CarriedOf(plantest.Wide())
	names := func(cols []plan.SourceColumn) (out []string) {
		for _, c := range cols {
			out = append(out, c.Name)
		}
		return out
	}
	for i, want := range [][]string{{"customer_id", "product_id", "amount"}, {"name", "region_id"}, {"title"}, {"name"}} {
		if got := names(l.Columns[i]); !slices.Equal(got, want) {
			t.Errorf("table %d carries %v, want %v", i, got, want)
		}
	}
	if want := []int{3, 1, 1, 1}; !slices.Equal(l.Shown, want) {
		t.Errorf("shown %v, want %v", l.Shown, want)
	}
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
	if tt.KeyCount != 1 || tt.RightFrom != 6 {
		t.Errorf("key count %d, right from %d; want 1, 6", tt.KeyCount, tt.RightFrom)
	}
	if fp := plan.Fingerprint(p); fp == plan.Fingerprint(&plan.JoinPlan{Name: p.Name, Type: p.Type, Left: p.Left, Target: tt}) {
		t.Error("the fingerprint ignores the entries")
	}
}

// TestStored: a plan rebuilt from its stored definition is the plan (same
// fingerprint, replica identities and partitioning read again), for both
// forms; a definition whose column the source renamed or retyped since is
// stale, and says which column.
func TestStored(t *testing.T) {
	tc := testenv.New(t)
	ctx := context.Background()
	if _, err := tc.Pool.Exec(ctx, shopSchema+`ALTER TABLE customers ADD COLUMN region numeric;`); err != nil {
		t.Fatal(err)
	}
	plans, err := resolveYAML(t, tc, `
joins:
  - name: oe
    type: left
    left: {table: orders, foreign_key: [customer_id]}
    right: {table: customers, columns: [name, tier]}
    target: {table: orders_enriched}
  - name: chain
    type: inner
    left: {table: orders, columns: [id, amount]}
    right:
      - {table: customers, foreign_key: [customer_id], columns: [name]}
      - {table: regions, from: customers, foreign_key: [region], columns: [label]}
    target: {table: orders_chain}
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		got, stale, err := plan.Stored(ctx, tc.Pool, p.Name, plan.Definition(p))
		if err != nil || stale != "" {
			t.Fatalf("%s: stored = %v, %q", p.Name, err, stale)
		}
		if got.Fingerprint != p.Fingerprint || got.Left.Replica != p.Left.Replica || len(got.Edges) != len(p.Edges) || fmt.Sprint(got.Spec) != fmt.Sprint(p.Spec) {
			t.Errorf("%s: stored plan %+v differs from %+v", p.Name, got, p)
		}
	}
	for _, c := range []struct{ ddl, want string }{
		{`ALTER TABLE customers RENAME COLUMN region TO region_code`, "column region of public.customers"}, // the chain's foreign key
		{`ALTER TABLE customers ALTER COLUMN tier TYPE text`, "column tier of public.customers"},
	} {
		if _, err := tc.Pool.Exec(ctx, c.ddl); err != nil {
			t.Fatal(err)
		}
		var stales []string
		for _, p := range plans {
			_, stale, err := plan.Stored(ctx, tc.Pool, p.Name, plan.Definition(p))
			if err != nil {
				t.Fatal(err)
			}
			stales = append(stales, stale)
		}
		if !slices.Contains(stales, c.want) {
			t.Errorf("after %s: stale = %q, want one %q", c.ddl, stales, c.want)
		}
	}
}

// TestResolveWhilePartitionsChange: partitions created and dropped while
// the plan is resolved never make a partitioned table with a primary key
// look as if a partition had none (the leaves and their keys are read in
// one snapshot; read apart, a partition dropped in between showed no key).
func TestResolveWhilePartitionsChange(t *testing.T) {
	tc := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := tc.Pool.Exec(ctx, `
		CREATE TABLE customers (id bigint PRIMARY KEY, name text);
		CREATE TABLE orders (id bigint, customer_id bigint, PRIMARY KEY (id)) PARTITION BY RANGE (id);
		CREATE TABLE orders_base PARTITION OF orders FOR VALUES FROM (0) TO (1000);`); err != nil {
		t.Fatal(err)
	}
	const yml = `
joins:
  - name: oc
    type: left
    left: {table: orders, foreign_key: [customer_id]}
    right: {table: customers}
    target: {table: orders_customers}
`
	stop := make(chan struct{})
	churned := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				churned <- nil
				return
			default:
			}
			lo := 1000 * (1 + i%8)
			if _, err := tc.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE orders_p%d PARTITION OF orders FOR VALUES FROM (%d) TO (%d)`, i, lo, lo+1000)); err != nil {
				churned <- err
				return
			}
			if _, err := tc.Pool.Exec(ctx, fmt.Sprintf(`DROP TABLE orders_p%d`, i)); err != nil {
				churned <- err
				return
			}
		}
	}()
	resolved := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && resolved < 2000; resolved++ {
		if _, err := resolveYAML(t, tc, yml); err != nil {
			close(stop)
			<-churned
			t.Fatalf("resolve %d, while partitions came and went: %v", resolved, err)
		}
	}
	close(stop)
	if err := <-churned; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d resolves while partitions came and went", resolved)
}
