package join_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// laggingStore persists each batch's mutations only when depth later
// batches are held, reading through a chain of join.Pending overlays (the
// oldest held batch nearest the store), as the daemon does while commits
// are in flight: with depth 2, one batch's state commit and the next one's
// target commit. Sometimes the oldest commit "lands" at once while its
// overlay stays set, which must read the same. Batches that clear a side
// are persisted at once, after the ones held.
type laggingStore struct {
	*join.Pending // the top of the chain: the engine's reader
	chain         []*join.Pending
	inner         *jointest.Store
	held          []*join.Mutations
	// landed is set when the oldest held batch is already persisted (its
	// overlay still set).
	landed bool
	r      *rand.Rand
	// overlaid counts batches read through a non-empty overlay.
	overlaid int
	// recycle, when set, gets each batch's mutations once they are
	// persisted and no overlay shows them (join.Engine.Recycle).
	recycle func(*join.Mutations, []join.Output)
}

func newLaggingStore(inner *jointest.Store, depth int, r *rand.Rand) *laggingStore {
	l := &laggingStore{inner: inner, r: r}
	var base join.StateReader = inner
	for range depth {
		p := join.NewPending(base)
		l.chain = append(l.chain, p)
		base = p
	}
	l.Pending = l.chain[depth-1]
	return l
}

func (l *laggingStore) Apply(ctx context.Context, m join.Mutations) error {
	if m.ClearLeft || m.ClearRight {
		if err := l.flush(ctx, len(l.held)); err != nil {
			return err
		}
		if err := l.inner.Apply(ctx, m); err != nil {
			return err
		}
		if l.recycle != nil {
			l.recycle(&m, nil)
		}
		return nil
	}
	if len(l.held) == len(l.chain) {
		if err := l.flush(ctx, 1); err != nil {
			return err
		}
	}
	if !m.Empty() {
		l.overlaid++
	}
	l.held = append(l.held, &m)
	if err := l.set(); err != nil {
		return err
	}
	if !l.landed && l.r.IntN(3) == 0 {
		// The oldest commit lands; its overlay stays until the next batch.
		l.landed = true
		return l.inner.Apply(ctx, *l.held[0])
	}
	return nil
}

// set overlays the held batches, the oldest nearest the store.
func (l *laggingStore) set() error {
	for i, p := range l.chain {
		var m *join.Mutations
		if i < len(l.held) {
			m = l.held[i]
		}
		if err := p.Set(m); err != nil {
			return err
		}
	}
	return nil
}

// flush persists the n oldest held batches.
func (l *laggingStore) flush(ctx context.Context, n int) error {
	var done []*join.Mutations
	for range n {
		m, landed := l.held[0], l.landed
		l.held, l.landed = l.held[1:], false
		done = append(done, m)
		if landed {
			continue
		}
		if err := l.inner.Apply(ctx, *m); err != nil {
			return err
		}
	}
	if err := l.set(); err != nil {
		return err
	}
	if l.recycle != nil {
		for _, m := range done {
			l.recycle(m, nil)
		}
	}
	return nil
}

// TestPendingRandomBatches runs the random scenarios of TestRandomBatches
// with the state one and two batches behind, read through join.Pending: the
// target
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
			for _, c := range []struct{ page, depth int }{{1, 1}, {2, 1}, {1000, 1}, {1, 2}, {2, 2}, {1000, 2}} {
				page := c.page
				t.Run(fmt.Sprintf("%s/seed%d/page%d/behind%d", typ, seed, page, c.depth), func(t *testing.T) {
					t.Parallel()
					sc := jointest.Scenario{
						Spec: join.Spec{Name: "p", Type: typ, PK: ints(1), FK: ints(1), RightKey: ints(1),
							LeftValues: 2, RightValues: 2, PageSize: page},
						Seed: uint64(seed), Batches: 200, MaxBatch: 40, TruncateOneIn: 300,
					}
					inner := jointest.NewStore()
					store := newLaggingStore(inner, c.depth, rand.New(rand.NewPCG(uint64(seed), 11)))
					// Each batch's containers go back to the engine, as the
					// daemon's do: later batches fill them.
					sc.Configure = func(e *join.Engine) { store.recycle = e.Recycle }
					eng, err := jointest.Run(context.Background(), sc, store)
					if err != nil {
						t.Fatal(err)
					}
					if err := store.flush(context.Background(), len(store.held)); err != nil {
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
