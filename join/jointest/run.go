package jointest

import (
	"context"
	"fmt"

	"github.com/fkmat/fkmat/join"
)

// Scenario configures Run.
type Scenario struct {
	Spec    join.Spec
	Seed    uint64
	Batches int
	// MaxBatch bounds the random number of changes per batch (at least 1).
	MaxBatch int
	// LeftKeys and RightKeys size the key domains (defaults 40 and 12).
	LeftKeys, RightKeys int
	// TruncateOneIn is passed to the Generator.
	TruncateOneIn int
	// Configure, if set, is called with the new engine before the first batch.
	Configure func(*join.Engine)
}

// Run drives random batches through a new engine over store (which must
// start empty) and checks after each batch that the target equals the SQL
// join of the source, that no target write was redundant, and that the
// stored state matches the source. It returns the engine for its Stats.
func Run(ctx context.Context, sc Scenario, store StateStore) (*join.Engine, error) {
	eng, err := join.NewEngine(sc.Spec, store)
	if err != nil {
		return nil, err
	}
	if sc.Configure != nil {
		sc.Configure(eng)
	}
	if sc.LeftKeys == 0 {
		sc.LeftKeys = 40
	}
	if sc.RightKeys == 0 {
		sc.RightKeys = 12
	}
	g := NewGenerator(sc.Spec, sc.Seed, sc.LeftKeys, sc.RightKeys)
	g.TruncateOneIn = sc.TruncateOneIn
	tgt := NewTarget(sc.Spec)
	for i := range sc.Batches {
		changes := g.Batch(1 + g.r.IntN(max(sc.MaxBatch, 1)))
		if err := runBatch(ctx, eng, store, tgt, changes); err != nil {
			return eng, fmt.Errorf("seed %d batch %d (%d changes): %w", sc.Seed, i, len(changes), err)
		}
		if err := tgt.Diff(g.Src.Join()); err != nil {
			return eng, fmt.Errorf("seed %d batch %d: %w", sc.Seed, i, err)
		}
		if err := g.CheckState(ctx, store, eng.Spec().PageSize); err != nil {
			return eng, fmt.Errorf("seed %d batch %d: check state: %w", sc.Seed, i, err)
		}
	}
	return eng, nil
}

// runBatch applies one batch to the engine, the target and the store.
func runBatch(ctx context.Context, eng *join.Engine, store StateStore, tgt *Target, changes []join.Change) error {
	tgt.Begin()
	var outs []join.Output
	m, err := eng.Apply(ctx, changes, func(_ context.Context, o join.Output) error {
		outs = append(outs, o)
		return tgt.Apply(o)
	})
	if err != nil {
		return err
	}
	if err := store.Apply(ctx, m); err != nil {
		return err
	}
	// The outputs are written: their containers go back to the engine, as
	// the daemon's do.
	eng.Recycle(nil, outs)
	return nil
}
