package join_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// laggingStore persists each batch's mutations only when the next batch is
// persisted, reading through a join.Pending that overlays the batch not yet
// persisted, as the daemon does while a commit is in flight. Sometimes the
// commit "lands" at once and the overlay stays set, which must read the
// same. Batches that clear a side are persisted at once.
type laggingStore struct {
	*join.Pending
	inner *jointest.Store
	held  *join.Mutations
	r     *rand.Rand
	// overlaid counts batches read through a non-empty overlay.
	overlaid int
}

func (l *laggingStore) Apply(ctx context.Context, m join.Mutations) error {
	if err := l.flush(ctx); err != nil {
		return err
	}
	if err := l.Set(&m); err != nil {
		_ = l.Set(nil)
		return l.inner.Apply(ctx, m)
	}
	if !m.Empty() {
		l.overlaid++
	}
	if l.r.IntN(3) == 0 {
		return l.inner.Apply(ctx, m)
	}
	l.held = &m
	return nil
}

func (l *laggingStore) flush(ctx context.Context) error {
	if l.held == nil {
		return nil
	}
	m := l.held
	l.held = nil
	return l.inner.Apply(ctx, *m)
}

// TestPendingRandomBatches runs the random scenarios of TestRandomBatches
// with the state one batch behind, read through join.Pending: the target
// must still equal the SQL join after every batch, with no redundant write,
// and the state must match the source (read through the overlay, and once
// the last batch is persisted, directly).
func TestPendingRandomBatches(t *testing.T) {
	t.Parallel()
	seeds := 8
	if testing.Short() {
		seeds = 2
	}
	for _, typ := range []join.JoinType{join.Inner, join.Left} {
		for seed := range seeds {
			for _, page := range []int{1, 2, 1000} {
				t.Run(fmt.Sprintf("%s/seed%d/page%d", typ, seed, page), func(t *testing.T) {
					t.Parallel()
					sc := jointest.Scenario{
						Spec: join.Spec{Name: "p", Type: typ, PK: ints(1), FK: ints(1), RightKey: ints(1),
							LeftValues: 2, RightValues: 2, PageSize: page},
						Seed: uint64(seed), Batches: 200, MaxBatch: 40, TruncateOneIn: 300,
					}
					inner := jointest.NewStore()
					store := &laggingStore{Pending: join.NewPending(inner), inner: inner, r: rand.New(rand.NewPCG(uint64(seed), 11))}
					eng, err := jointest.Run(context.Background(), sc, store)
					if err != nil {
						t.Fatal(err)
					}
					if err := store.flush(context.Background()); err != nil {
						t.Fatal(err)
					}
					if err := inner.Check(sc.Spec); err != nil {
						t.Fatal(err)
					}
					if st := eng.Stats(); st.FanoutRows == 0 || store.overlaid < sc.Batches/2 {
						t.Errorf("scenario exercised too little: %+v, %d batches overlaid", st, store.overlaid)
					}
				})
			}
		}
	}
}
