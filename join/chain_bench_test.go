package join_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// BenchmarkGrandparentFanout measures, at the engine level with in-memory
// state, the grandparent fan-out against a two-table fan-out that
// writes as many rows: a region rename reaching 1,000 customers with 200
// orders each (orders → customers → regions, a join.Chain), and a customer
// rename reaching its 200,000 orders (orders → customers, one join.Engine).
// ns/op is for the whole fan-out; rows/op counts the target rows written.
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
	left := func(t int, pk string, vals ...string) join.Change {
		return join.Change{Table: t, Kind: join.LeftUpsert, Insert: true, Left: join.LeftRow{PK: v(pk), Values: v(vals...)}}
	}
	right := func(t int, key string, vals ...string) join.Change {
		return join.Change{Table: t, Kind: join.RightUpsert, Right: join.RightRow{Key: v(key), Values: v(vals...)}}
	}
	run := func(b *testing.B, steps []join.ChainStep, out []int, load []join.Change, rename func(i int) join.Change) {
		var stores []*jointest.Store
		var readers []join.StateReader
		for range steps {
			s := jointest.NewStore()
			stores, readers = append(stores, s), append(readers, s)
		}
		c, err := join.NewChain(steps, readers, out)
		if err != nil {
			b.Fatal(err)
		}
		apply := func(changes []join.Change) int {
			rows := 0
			muts, err := c.Apply(ctx, changes, func(_ context.Context, o join.Output) error {
				rows += o.Rows()
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
			for i, m := range muts {
				if err := stores[i].Apply(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			return rows
		}
		apply(load)
		b.ResetTimer()
		rows := 0
		for i := range b.N {
			rows = apply([]join.Change{rename(i)})
		}
		b.ReportMetric(float64(rows), "rows/op")
		if rows != customers*perCustomer {
			b.Fatalf("the rename wrote %d rows, want %d", rows, customers*perCustomer)
		}
	}
	spec := func(typ join.JoinType, leftValues, rightValues int) join.Spec {
		return join.Spec{Name: "bench", Type: typ, PK: ints(1), FK: ints(1), RightKey: ints(1), LeftValues: leftValues, RightValues: rightValues}
	}
	b.Run("two_tables", func(b *testing.B) {
		// orders(id; customer_id, amount) → customers(id; name)
		load := []join.Change{right(1, "1", "ann")}
		for o := range customers * perCustomer {
			load = append(load, left(0, strconv.Itoa(o), "1", "9.99"))
		}
		run(b, []join.ChainStep{{Spec: spec(join.Left, 2, 1), FK: []int{0}}}, []int{0, 1, 2, 3}, load,
			func(i int) join.Change { return right(1, "1", "ann"+strconv.Itoa(i)) })
	})
	b.Run("grandparent", func(b *testing.B) {
		// orders(id; customer_id, amount) → customers(id; name, region_id) → regions(id; name)
		load := []join.Change{right(2, "1", "north")}
		for c := range customers {
			load = append(load, right(1, strconv.Itoa(c), "c"+strconv.Itoa(c), "1"))
			for k := range perCustomer {
				load = append(load, left(0, strconv.Itoa(c*perCustomer+k), strconv.Itoa(c), "9.99"))
			}
		}
		steps := []join.ChainStep{{Spec: spec(join.Left, 2, 2), FK: []int{0}}, {Spec: spec(join.Left, 4, 1), FK: []int{3}}}
		run(b, steps, []int{0, 1, 2, 3, 5}, load, func(i int) join.Change { return right(2, "1", "north"+strconv.Itoa(i)) })
	})
}
