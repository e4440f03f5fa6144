package redisstore

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// replayingStore adapts a Store to jointest.StateStore: every batch is
// committed at the next LSN and then committed again (a replay, which must
// change nothing), every seventh is applied once more at a new LSN (which
// must change nothing either, though its mutations are then not net), and
// garbage is swept now and then. After each batch the subscription counter
// must equal the subscriptions in Redis.
type replayingStore struct {
	*Store
	t   *testing.T
	lsn wal.LSN
}

func (s *replayingStore) Apply(ctx context.Context, m join.Mutations) error {
	s.lsn++
	for range 2 {
		if err := s.Commit(ctx, m, s.lsn); err != nil {
			return err
		}
	}
	if s.lsn%7 == 0 {
		s.lsn++
		if err := s.Commit(ctx, m, s.lsn); err != nil {
			return err
		}
	}
	if m.ClearLeft || m.ClearRight || s.lsn%25 == 0 {
		if _, err := s.Sweep(ctx); err != nil {
			return err
		}
	}
	// Not subsCount: Apply may run off the test's goroutine (the failover
	// test), where t.Fatal would end the goroutine and hang the test.
	return checkSubs(ctx, s.Store, fmt.Sprintf("after the commit at %d", s.lsn))
}

// TestJoinScenarios runs the join package's random scenarios over Redis: after
// every batch the target must equal the SQL join of the source and the state
// read back from Redis must match the source.
func TestJoinScenarios(t *testing.T) {
	t.Parallel()
	tc := testenv.New(t)
	ints := []join.Family{join.FamilyInt}
	text := []join.Family{join.FamilyText}
	shapes := []struct {
		name        string
		pk, fk, key []join.Family
	}{
		{"int", ints, ints, ints},
		{"text", text, text, text},
		{"composite", []join.Family{join.FamilyInt, join.FamilyText}, []join.Family{join.FamilyText, join.FamilyInt},
			[]join.Family{join.FamilyText, join.FamilyInt}},
	}
	for _, typ := range []join.JoinType{join.Inner, join.Left} {
		for _, sh := range shapes {
			for seed := range 2 {
				for _, page := range []int{2, 1000} {
					name := fmt.Sprintf("%s/%s/seed%d/page%d", typ, sh.name, seed, page)
					t.Run(name, func(t *testing.T) {
						t.Parallel()
						ctx := context.Background()
						cfg := Config{Prefix: fmt.Sprintf("%s:%s:%s:%d:%d", tc.RedisPrefix, typ, sh.name, seed, page)}
						if page == 2 {
							cfg.SubShards, cfg.RowShards, cfg.PageSize = 2, 2, 3
						}
						s, err := Open(ctx, tc.Redis, cfg)
						if err != nil {
							t.Fatal(err)
						}
						if err := s.Init(ctx, NewEpoch(), name, Size{}); err != nil {
							t.Fatal(err)
						}
						sc := jointest.Scenario{
							Spec: join.Spec{Name: "p", Type: typ, PK: sh.pk, FK: sh.fk, RightKey: sh.key,
								LeftValues: 2, RightValues: 2, PageSize: page},
							Seed: uint64(seed), Batches: 100, MaxBatch: 40, TruncateOneIn: 100,
						}
						if _, err := jointest.Run(ctx, sc, &replayingStore{Store: s, t: t}); err != nil {
							t.Fatal(err)
						}
					})
				}
			}
		}
	}
}

// TestJoinScenariosChunked runs the random scenarios with most batches
// treated as one large source transaction, applied in chunks (engine Apply
// and CommitPartial per chunk, each chunk reading what the previous ones
// wrote) and then finished. Now and then the process "dies" after some of
// the chunks, before the target commit: Recover must bring Redis back to the
// checkpoint exactly (raw keys compared, the subscription counter included),
// and the replayed transaction must leave the target equal to the SQL join
// and the state equal to the source. Some chunks are sent twice (a retry).
// After every step the subscription counter must equal the subscriptions in
// Redis, and after every batch the left rows of the source with a foreign
// key.
func TestJoinScenariosChunked(t *testing.T) {
	t.Parallel()
	tc := testenv.New(t)
	ints := []join.Family{join.FamilyInt}
	shapes := []struct {
		name        string
		pk, fk, key []join.Family
	}{
		{"int", ints, ints, ints},
		{"composite", []join.Family{join.FamilyInt, join.FamilyText}, []join.Family{join.FamilyText, join.FamilyInt},
			[]join.Family{join.FamilyText, join.FamilyInt}},
	}
	for _, typ := range []join.JoinType{join.Inner, join.Left} {
		for _, sh := range shapes {
			for seed := range 3 {
				name := fmt.Sprintf("%s/%s/seed%d", typ, sh.name, seed)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					ctx := context.Background()
					cfg := Config{Prefix: fmt.Sprintf("%s:chunked:%s:%s:%d", tc.RedisPrefix, typ, sh.name, seed),
						SubShards: 2, RowShards: 2, PageSize: 3}
					s, err := Open(ctx, tc.Redis, cfg)
					if err != nil {
						t.Fatal(err)
					}
					if err := s.Init(ctx, NewEpoch(), name, Size{}); err != nil {
						t.Fatal(err)
					}
					spec := join.Spec{Name: "p", Type: typ, PK: sh.pk, FK: sh.fk, RightKey: sh.key,
						LeftValues: 2, RightValues: 2, PageSize: 2}
					runChunked(t, s, spec, uint64(seed))
				})
			}
		}
	}
}

// runChunked drives the chunked scenario of TestJoinScenariosChunked.
func runChunked(t *testing.T, s *Store, spec join.Spec, seed uint64) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	g := jointest.NewGenerator(spec, seed, 40, 12)
	g.TruncateOneIn = 60
	tgt := jointest.NewTarget(spec)
	eng, err := join.NewEngine(spec, s)
	if err != nil {
		t.Fatal(err)
	}
	emit := func(_ context.Context, o join.Output) error { return tgt.Apply(o) }
	apply := func(changes []join.Change) join.Mutations {
		t.Helper()
		tgt.Begin()
		m, err := eng.Apply(ctx, cloneChanges(changes), emit)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	var lsn wal.LSN
	var chunked, crashed int
	for batch := range 80 {
		changes := g.Batch(1 + r.IntN(40))
		lsn++
		commitPartial := func(m join.Mutations) {
			t.Helper()
			for range 1 + btoi(r.IntN(4) == 0) {
				if err := s.CommitPartial(ctx, m, lsn); err != nil {
					t.Fatalf("batch %d: %v", batch, err)
				}
				subsCount(t, s, fmt.Sprintf("batch %d, after a chunk", batch))
			}
		}
		if r.IntN(4) == 0 {
			if err := s.Commit(ctx, apply(changes), lsn); err != nil {
				t.Fatalf("batch %d: %v", batch, err)
			}
		} else {
			chunked++
			chunks := slices.Collect(slices.Chunk(changes, 1+r.IntN(8)))
			if r.IntN(3) == 0 {
				crashed++
				// Sweep first: Recover restores the generations, not the
				// garbage a sweep would have deleted.
				if _, err := s.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
				before, rows := dump(t, s, false), maps.Clone(tgt.Rows)
				done := r.IntN(len(chunks) + 1)
				for _, c := range chunks[:done] {
					commitPartial(apply(c))
				}
				if r.IntN(2) == 0 { // a new process, or the stream restarting the transaction
					if s, err = Open(ctx, s.rdb, s.Config()); err != nil {
						t.Fatal(err)
					}
					if eng, err = join.NewEngine(spec, s); err != nil {
						t.Fatal(err)
					}
				}
				rolledBack, err := s.Recover(ctx)
				if err != nil || rolledBack != (done > 0) {
					t.Fatalf("batch %d: Recover after %d of %d chunks = %t, %v", batch, done, len(chunks), rolledBack, err)
				}
				if d := diffDumps(dump(t, s, false), before); d != "" {
					t.Fatalf("batch %d: raw state after Recover from %d of %d chunks: %s", batch, done, len(chunks), d)
				}
				subsCount(t, s, fmt.Sprintf("batch %d, after Recover", batch))
				tgt.Rows = rows // the target transaction was rolled back too
			}
			for _, c := range chunks {
				commitPartial(apply(c))
			}
			if err := s.FinishPartial(ctx, lsn); err != nil {
				t.Fatalf("batch %d: %v", batch, err)
			}
		}
		if n, want := subsCount(t, s, fmt.Sprintf("batch %d", batch)), sourceSubs(spec, g.Src); n != want {
			t.Fatalf("batch %d: %d subscriptions, the source has %d left rows with a foreign key", batch, n, want)
		}
		if err := tgt.Diff(g.Src.Join()); err != nil {
			t.Fatalf("batch %d: %v", batch, err)
		}
		if err := g.CheckState(ctx, s, spec.PageSize); err != nil {
			t.Fatalf("batch %d: check state: %v", batch, err)
		}
		if batch%10 == 0 {
			if _, err := s.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d batches, %d in chunks, %d of them recovered and replayed", 80, chunked, crashed)
}

// sourceSubs returns the number of subscriptions the source implies: its
// left rows whose foreign key has no NULL.
func sourceSubs(spec join.Spec, src *jointest.Source) int64 {
	var n int64
	for _, row := range src.Left {
		if _, err := join.EncodeKey(spec.FK, row.FK); err == nil {
			n++
		}
	}
	return n
}

// cloneChanges deep-copies changes: Apply owns the values it is given, and a
// replayed transaction must start from the original changes.
func cloneChanges(changes []join.Change) []join.Change {
	out := make([]join.Change, len(changes))
	for i, c := range changes {
		c.Left = join.LeftRow{PK: slices.Clone(c.Left.PK), FK: slices.Clone(c.Left.FK), Values: slices.Clone(c.Left.Values)}
		c.Right = join.RightRow{Key: slices.Clone(c.Right.Key), Values: slices.Clone(c.Right.Values)}
		out[i] = c
	}
	return out
}
