package join_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// benchRollupParents and benchRollupPerParent shape BenchmarkRollupApply's
// state as W9's catch-up (make bench): 10k customers with 30 orders each.
const (
	benchRollupParents   = 10_000
	benchRollupPerParent = 30
)

// benchOrder is an order's roll-up change: its key, its customer (1 + id
// mod the customers, as W1 spreads them) and its inputs (id, amount, the
// jsonb_agg's element).
func benchOrder(id, cents int) join.RollupChange {
	key := []join.Value{join.TextValue(strconv.Itoa(id))}
	amount := fmt.Sprintf("%d.%02d", cents/100, cents%100)
	return join.RollupChange{Kind: join.LeftUpsert, Key: key, Parent: []join.Value{join.TextValue(strconv.Itoa(1 + id%benchRollupParents))},
		Values: []join.Value{key[0], join.TextValue(amount), join.TextValue(fmt.Sprintf(`{"id": %d, "amount": %s}`, id, amount))}}
}

// BenchmarkRollupApply measures W9's roll-up engine alone (count(*),
// sum(amount), max(id) and the 5 newest orders as JSON) over an in-memory
// state of 300k orders: a batch of 10k changes per op, amount updates of
// random orders or new orders (one per customer), as W1's catch-up sends
// them. The state commits between ops, outside the timer.
func BenchmarkRollupApply(b *testing.B) {
	spec := join.RollupSpec{Name: "orders", Parent: []join.Family{join.FamilyInt}, Child: []join.Family{join.FamilyInt},
		ChildTypes: []string{"bigint"}, Inputs: []string{"bigint", "numeric", "jsonb"}, NotNull: []bool{true, false, false}, KeyInputs: []int{0},
		Aggregates: []join.RollupAggregate{{Func: "count", Input: -1}, {Func: "sum", Input: 1}, {Func: "max", Input: 0},
			{Func: "jsonb_agg", Input: 2, OrderBy: []int{0}, Desc: []bool{true}, Limit: 5}}}
	for _, kind := range []string{"updates", "inserts"} {
		b.Run(kind, func(b *testing.B) {
			ro, err := join.NewRollup(spec)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			store := jointest.NewStore()
			// The backfill: the orders in their customers' order.
			n := benchRollupParents * benchRollupPerParent
			var rows [][]join.Value
			for id := 1; id <= n; id++ {
				c := benchOrder(id, id%100_000)
				rows = append(rows, slices.Concat(c.Key, c.Parent, c.Values))
			}
			slices.SortStableFunc(rows, func(x, y []join.Value) int {
				px, _ := strconv.Atoi(x[1].Text)
				py, _ := strconv.Atoi(y[1].Text)
				return cmp.Compare(px, py)
			})
			ld := ro.Load()
			for page := range slices.Chunk(rows, 10_000) {
				m, _, err := ld.Page(page)
				if err != nil {
					b.Fatal(err)
				}
				if err := store.Apply(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			m, _ := ld.Finish()
			if err := store.Apply(ctx, m); err != nil {
				b.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 1))
			next, cents := n+1, 0
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				changes := make([]join.RollupChange, 0, 10_000)
				for range 10_000 {
					cents++
					if kind == "inserts" {
						changes = append(changes, benchOrder(next, cents))
						next++
						continue
					}
					changes = append(changes, benchOrder(1+r.IntN(n), 100_000+cents))
				}
				b.StartTimer()
				m, outs, err := ro.Apply(ctx, store, changes)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if len(outs) == 0 {
					b.Fatal("no parent changed")
				}
				if err := store.Apply(ctx, m); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}
