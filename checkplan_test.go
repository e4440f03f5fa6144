package fkmat

import (
	"testing"

	"github.com/fkmat/fkmat/internal/plan"
)

// TestRollupParentBytes: a roll-up's bytes per parent count each
// aggregate's result and state: a jsonb_agg's elements up to its LIMIT or,
// without one, as many as a parent has children, and its window only with
// a LIMIT.
func TestRollupParentBytes(t *testing.T) {
	widths := map[string]int64{"id": 8, "amount": 6}
	r := &plan.RollupPlan{
		Inputs: []plan.SourceColumn{{Name: "id"}, {Name: "amount"}, {Name: "elem", Expr: "jsonb_build_object('id', id)"}},
		Aggregates: []plan.AggregatePlan{
			{Func: "count", Input: -1}, {Func: "sum", Input: 1}, {Func: "max", Input: 0},
			{Func: "jsonb_agg", Input: 2, OrderBy: []int{0}, Desc: []bool{true}, Limit: 5},
		},
	}
	// count 8+8, sum (6+4)+16, max 8+(8+20), jsonb_agg of 5: 5 x (32+4)
	// results and 5 x (32+20) of window.
	want := int64(16 + 26 + 36 + 5*36 + 5*52)
	if got := rollupParentBytes(r, widths, 10); got != want {
		t.Fatalf("10 children per parent: %d B, want %d", got, want)
	}
	// Fewer children than the LIMIT: as many elements as children.
	if got, want := rollupParentBytes(r, widths, 2), int64(16+26+36+2*36+2*52); got != want {
		t.Fatalf("2 children per parent: %d B, want %d", got, want)
	}
	// Without a LIMIT: every child's element, and no window.
	r.Aggregates[3].Limit = 0
	if got, want := rollupParentBytes(r, widths, 100), int64(16+26+36+100*36); got != want {
		t.Fatalf("no LIMIT, 100 children per parent: %d B, want %d", got, want)
	}
}
