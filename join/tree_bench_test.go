package join_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// BenchmarkGrandparentFanout measures, at the engine level with in-memory
// state, a fan-out through two levels against a two-table fan-out that
// writes as many rows: a region rename reaching 1,000 customers with 200
// orders each (orders → customers → regions, a join.Tree), and a customer
// rename reaching its 200,000 orders (orders → customers, a join.Engine,
// which the daemon runs for two tables). ns/op is for the whole fan-out;
// rows/op counts the target rows written.
//
//	go test -run '^$' -bench BenchmarkGrandparentFanout -benchtime 5x ./join
func BenchmarkGrandparentFanout(b *testing.B) {
	const customers, perCustomer = 1000, 200
	ctx := context.Background()
	v := func(s ...string) []join.Value {
		out := make([]join.Value, len(s))
		for i, x := range s {
			out[i] = join.TextValue(x)
		}
		return out
	}
	b.Run("two_tables", func(b *testing.B) {
		// orders(id; customer_id, amount) → customers(id; name)
		store := jointest.NewStore()
		e, err := join.NewEngine(join.Spec{Name: "bench", Type: join.Left, PK: ints(1), FK: ints(1), RightKey: ints(1),
			LeftValues: 2, RightValues: 1}, store)
		if err != nil {
			b.Fatal(err)
		}
		apply := func(changes []join.Change) int {
			rows := 0
			m, err := e.Apply(ctx, changes, func(_ context.Context, o join.Output) error {
				rows += o.Rows()
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			if err := store.Apply(ctx, m); err != nil {
				b.Fatal(err)
			}
			return rows
		}
		load := []join.Change{{Kind: join.RightUpsert, Right: join.RightRow{Key: v("1"), Values: v("ann")}}}
		for o := range customers * perCustomer {
			load = append(load, join.Change{Kind: join.LeftUpsert, Insert: true,
				Left: join.LeftRow{PK: v(strconv.Itoa(o)), FK: v("1"), Values: v("1", "9.99")}})
		}
		apply(load)
		b.ResetTimer()
		rows := 0
		for i := range b.N {
			rows = apply([]join.Change{{Kind: join.RightUpsert, Right: join.RightRow{Key: v("1"), Values: v("ann" + strconv.Itoa(i))}}})
		}
		b.ReportMetric(float64(rows), "rows/op")
		if rows != customers*perCustomer {
			b.Fatalf("the rename wrote %d rows, want %d", rows, customers*perCustomer)
		}
	})
	b.Run("grandparent", func(b *testing.B) {
		// orders(id; customer_id, amount) → customers(id; name, region_id) → regions(id; name)
		spec := join.TreeSpec{Name: "bench", Tables: []join.TreeTable{
			{Key: ints(1), Values: 2, From: -1},
			{Key: ints(1), Values: 1, From: 0, Type: join.Left},
			{Key: ints(1), Values: 1, From: 1, Type: join.Left},
		}}
		tree, err := join.NewTree(spec)
		if err != nil {
			b.Fatal(err)
		}
		store := newTreeStore(3)
		apply := func(changes []join.TreeChange) int {
			rows := 0
			m, err := tree.Apply(ctx, store, changes, func(_ context.Context, o join.Output) error {
				rows += o.Rows()
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			if err := store.apply(m); err != nil {
				b.Fatal(err)
			}
			return rows
		}
		load := []join.TreeChange{{Table: 2, Kind: join.TreeUpsert, Insert: true, Row: join.TreeRow{Key: v("1"), Values: v("north")}}}
		for c := range customers {
			load = append(load, join.TreeChange{Table: 1, Kind: join.TreeUpsert, Insert: true,
				Row: join.TreeRow{Key: v(strconv.Itoa(c)), Values: v("c" + strconv.Itoa(c)), FKs: [][]join.Value{v("1")}}})
			for k := range perCustomer {
				load = append(load, join.TreeChange{Table: 0, Kind: join.TreeUpsert, Insert: true,
					Row: join.TreeRow{Key: v(strconv.Itoa(c*perCustomer + k)), Values: v(strconv.Itoa(c), "9.99"), FKs: [][]join.Value{v(strconv.Itoa(c))}}})
			}
		}
		apply(load)
		b.ResetTimer()
		rows := 0
		for i := range b.N {
			rows = apply([]join.TreeChange{{Table: 2, Kind: join.TreeUpsert, Row: join.TreeRow{Key: v("1"), Values: v("north" + strconv.Itoa(i))}}})
		}
		b.ReportMetric(float64(rows), "rows/op")
		if rows != customers*perCustomer {
			b.Fatalf("the rename wrote %d rows, want %d", rows, customers*perCustomer)
		}
	})
}
