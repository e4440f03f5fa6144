package join_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// TestRandomBatches checks, over many random change sequences, that the
// target maintained from the engine's outputs equals the SQL join recomputed
// from the source tables after every batch, with no redundant write, and that
// the persisted state matches the source.
func TestRandomBatches(t *testing.T) {
	t.Parallel()
	shapes := []struct {
		name        string
		pk, fk, key []join.Family
	}{
		{"int", ints(1), ints(1), ints(1)},
		{"text", []join.Family{join.FamilyText}, []join.Family{join.FamilyText}, []join.Family{join.FamilyText}},
		{"composite", []join.Family{join.FamilyInt, join.FamilyText}, []join.Family{join.FamilyText, join.FamilyInt},
			[]join.Family{join.FamilyText, join.FamilyInt}},
	}
	seeds := 8
	if testing.Short() {
		seeds = 2
	}
	for _, typ := range []join.JoinType{join.Inner, join.Left} {
		for _, sh := range shapes {
			for seed := range seeds {
				for _, page := range []int{2, 1000} {
					shuffle := page == 2 // out-of-order resolution, safe thanks to the hash check
					t.Run(fmt.Sprintf("%s/%s/seed%d/page%d", typ, sh.name, seed, page), func(t *testing.T) {
						t.Parallel()
						sc := jointest.Scenario{
							Spec: join.Spec{Name: "p", Type: typ, PK: sh.pk, FK: sh.fk, RightKey: sh.key,
								LeftValues: 2, RightValues: 2, PageSize: page},
							Seed: uint64(seed), Batches: 150, MaxBatch: 40, TruncateOneIn: 150,
						}
						if shuffle {
							r := rand.New(rand.NewPCG(uint64(seed), 7))
							sc.Configure = func(e *join.Engine) {
								join.SetReorder(e, func(q []join.Response) {
									r.Shuffle(len(q), func(i, j int) { q[i], q[j] = q[j], q[i] })
								})
							}
						}
						store := jointest.NewStore()
						eng, err := jointest.Run(context.Background(), sc, store)
						if err != nil {
							t.Fatal(err)
						}
						if err := store.Check(sc.Spec); err != nil {
							t.Fatal(err)
						}
						if st := eng.Stats(); st.Responses == 0 || st.FanoutRows == 0 || (shuffle && st.StaleResponses == 0) {
							t.Errorf("scenario exercised too little: %+v", st)
						}
					})
				}
			}
		}
	}
}

func ints(n int) []join.Family {
	f := make([]join.Family, n)
	for i := range f {
		f[i] = join.FamilyInt
	}
	return f
}
