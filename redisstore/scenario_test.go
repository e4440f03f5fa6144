package redisstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// replayingStore adapts a Store to jointest.StateStore: every batch is
// committed at the next LSN and then committed again (a replay, which must
// change nothing), and garbage is swept now and then.
type replayingStore struct {
	*Store
	lsn uint64
}

func (s *replayingStore) Apply(ctx context.Context, m join.Mutations) error {
	s.lsn++
	for range 2 {
		if err := s.Commit(ctx, m, s.lsn); err != nil {
			return err
		}
	}
	if m.ClearLeft || m.ClearRight || s.lsn%25 == 0 {
		if _, err := s.Sweep(ctx); err != nil {
			return err
		}
	}
	return nil
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
						if err := s.Init(ctx, NewEpoch(), name); err != nil {
							t.Fatal(err)
						}
						sc := jointest.Scenario{
							Spec: join.Spec{Name: "p", Type: typ, PK: sh.pk, FK: sh.fk, RightKey: sh.key,
								LeftValues: 2, RightValues: 2, PageSize: page},
							Seed: uint64(seed), Batches: 100, MaxBatch: 40, TruncateOneIn: 100,
						}
						if _, err := jointest.Run(ctx, sc, &replayingStore{Store: s}); err != nil {
							t.Fatal(err)
						}
					})
				}
			}
		}
	}
}
