package join_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

func benchEngine(b *testing.B, dependents int) (*join.Engine, *jointest.Store) {
	b.Helper()
	spec := orderSpec(join.Left)
	store := jointest.NewStore()
	eng, err := join.NewEngine(spec, store)
	if err != nil {
		b.Fatal(err)
	}
	changes := []join.Change{ru("1", "alice")}
	for i := range dependents {
		changes = append(changes, lu(strconv.Itoa(1000+i), "1", "9.99"))
	}
	m, err := eng.Apply(context.Background(), changes, func(context.Context, join.Output) error { return nil })
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Apply(context.Background(), m); err != nil {
		b.Fatal(err)
	}
	return eng, store
}

// BenchmarkApplyLeftUpdate measures a batch of one left update through all
// stages (prefetch, sender, subscription side, resolver, output).
func BenchmarkApplyLeftUpdate(b *testing.B) {
	eng, _ := benchEngine(b, 100)
	changes := []join.Change{lu("1050", "1", "10.99")}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := eng.Apply(ctx, changes, func(context.Context, join.Output) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFanout10k measures a right update with 10,000 dependents, read
// and emitted in pages of DefaultPageSize; ns/op is for the whole fan-out.
func BenchmarkFanout10k(b *testing.B) {
	eng, _ := benchEngine(b, 10_000)
	changes := []join.Change{ru("1", "alicia")}
	ctx := context.Background()
	rows := 0
	b.ReportAllocs()
	for b.Loop() {
		rows = 0
		_, err := eng.Apply(ctx, changes, func(_ context.Context, o join.Output) error {
			rows += o.Rows()
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	if rows != 10_000 {
		b.Fatalf("fan-out emitted %d rows", rows)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/10_000, "ns/row")
}

// BenchmarkApplyLeftUpdates measures a batch of 1,000 left updates (values
// and foreign keys changing); ns/change is the amortized cost of one.
func BenchmarkApplyLeftUpdates(b *testing.B) {
	eng, _ := benchEngine(b, 1000)
	changes := make([]join.Change, 0, 1000)
	for i := range 1000 {
		fk := "1"
		if i%4 == 0 {
			fk = "2"
		}
		changes = append(changes, lu(strconv.Itoa(1000+i), fk, "10.99"))
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := eng.Apply(ctx, changes, func(context.Context, join.Output) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/change")
}
