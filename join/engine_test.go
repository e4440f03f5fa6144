package join_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
)

// Value notation in these tests: "~" is NULL, "@" is unchanged TOAST.
func val(s string) join.Value {
	switch s {
	case "~":
		return join.NullValue()
	case "@":
		return join.ToastValue()
	}
	return join.TextValue(s)
}

func vals(ss ...string) []join.Value {
	vs := make([]join.Value, len(ss))
	for i, s := range ss {
		vs[i] = val(s)
	}
	return vs
}

// The unit-test join: orders(id PK, customer_id FK, amount) joined to
// customers(id, name); left values are customer_id and amount.
func orderSpec(typ join.JoinType) join.Spec {
	return join.Spec{Name: "orders_enriched", Type: typ, PK: ints(1), FK: ints(1), RightKey: ints(1),
		LeftValues: 2, RightValues: 1}
}

// lu is a left upsert of order id with customer fk and amount.
func lu(id, fk, amount string) join.Change {
	return join.Change{Kind: join.LeftUpsert, Left: join.LeftRow{PK: vals(id), FK: vals(fk), Values: vals(fk, amount)}}
}

func ld(id string) join.Change {
	return join.Change{Kind: join.LeftDelete, Left: join.LeftRow{PK: vals(id)}}
}

// lk is a key change of order from to id with customer fk and amount ("@"
// for an unchanged TOAST value, taken from the old key's row).
func lk(from, id, fk, amount string) join.Change {
	return join.Change{Kind: join.LeftKeyChange, OldKey: vals(from),
		Left: join.LeftRow{PK: vals(id), FK: vals(fk), Values: vals(fk, amount)}}
}

// rk is a key change of customer from to id with name.
func rk(from, id, name string) join.Change {
	return join.Change{Kind: join.RightKeyChange, OldKey: vals(from), Right: join.RightRow{Key: vals(id), Values: vals(name)}}
}

func ru(id, name string) join.Change {
	return join.Change{Kind: join.RightUpsert, Right: join.RightRow{Key: vals(id), Values: vals(name)}}
}

func rd(id string) join.Change {
	return join.Change{Kind: join.RightDelete, Right: join.RightRow{Key: vals(id)}}
}

var (
	lt = join.Change{Kind: join.LeftTruncate}
	rt = join.Change{Kind: join.RightTruncate}
)

// harness runs batches through an engine over an in-memory store and target,
// checking after each that the target equals the SQL join of the source.
type harness struct {
	t     *testing.T
	spec  join.Spec
	store *jointest.Store
	src   *jointest.Source
	tgt   *jointest.Target
	eng   *join.Engine
}

func newHarness(t *testing.T, spec join.Spec) *harness {
	t.Helper()
	h := &harness{t: t, spec: spec, store: jointest.NewStore(), src: jointest.NewSource(spec), tgt: jointest.NewTarget(spec)}
	var err error
	if h.eng, err = join.NewEngine(spec, h.store); err != nil {
		t.Fatal(err)
	}
	return h
}

// batch applies changes and returns the emitted outputs in notation.
func (h *harness) batch(changes ...join.Change) []string {
	h.t.Helper()
	outs, m, err := h.apply(changes...)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.store.Apply(context.Background(), m); err != nil {
		h.t.Fatalf("apply mutations: %v", err)
	}
	for _, c := range changes {
		if err := h.src.Apply(c); err != nil {
			h.t.Fatal(err)
		}
	}
	if err := h.tgt.Diff(h.src.Join()); err != nil {
		h.t.Fatal(err)
	}
	if err := h.store.Check(h.spec); err != nil {
		h.t.Fatal(err)
	}
	return outs
}

// apply runs the engine only, applying outputs to the target.
func (h *harness) apply(changes ...join.Change) ([]string, join.Mutations, error) {
	var outs []string
	h.tgt.Begin()
	m, err := h.eng.Apply(context.Background(), changes, func(_ context.Context, o join.Output) error {
		outs = append(outs, format(o))
		return h.tgt.Apply(o)
	})
	return outs, m, err
}

// format renders an output as "TRUNCATE", "NULLRIGHT", "-pk" and "+row" items.
func format(o join.Output) string {
	var parts []string
	if o.Truncate {
		parts = append(parts, "TRUNCATE")
	}
	if o.NullRight {
		parts = append(parts, "NULLRIGHT")
	}
	for _, pk := range o.Deletes {
		parts = append(parts, "-"+formatValues(pk))
	}
	for _, row := range o.Upserts {
		parts = append(parts, "+"+formatValues(row))
	}
	for _, u := range o.RightUpdates {
		for _, pk := range u.Keys {
			parts = append(parts, "="+formatValues(pk)+":"+formatValues(u.Right))
		}
	}
	return strings.Join(parts, " ")
}

func formatValues(vs []join.Value) string {
	ss := make([]string, len(vs))
	for i, v := range vs {
		switch {
		case v.Null:
			ss[i] = "~"
		case v.Toast:
			ss[i] = "@"
		default:
			ss[i] = v.Text
		}
	}
	return strings.Join(ss, "|")
}

// TestEngineCases covers every sender case and right-side change for both
// join types. Setup: customers 1=alice, 2=bob; orders 10->1 and 12 with a
// NULL customer.
func TestEngineCases(t *testing.T) {
	t.Parallel()
	setup := []join.Change{ru("1", "alice"), ru("2", "bob"), lu("10", "1", "5"), lu("12", "~", "8")}
	tests := []struct {
		name         string
		batch        []join.Change
		inner, left  []string
		innerDrops   uint64 // inner-join NULL FK drops during the batch
		noDependents bool   // the batch must not read subscriptions
	}{
		{name: "insert matched", batch: []join.Change{lu("11", "1", "7")},
			inner: []string{"+11|1|7|alice"}, left: []string{"+11|1|7|alice"}},
		{name: "insert with missing right row", batch: []join.Change{lu("11", "9", "7")},
			left: []string{"+11|9|7|~"}},
		{name: "insert with NULL FK", batch: []join.Change{lu("11", "~", "7")},
			left: []string{"+11|~|7|~"}, innerDrops: 1},
		{name: "refresh: same FK, changed value", batch: []join.Change{lu("10", "1", "6")},
			inner: []string{"+10|1|6|alice"}, left: []string{"+10|1|6|alice"}},
		{name: "NULL versus empty string", batch: []join.Change{lu("10", "1", "")},
			inner: []string{"+10|1||alice"}, left: []string{"+10|1||alice"}},
		{name: "FK change", batch: []join.Change{lu("10", "2", "5")},
			inner: []string{"+10|2|5|bob"}, left: []string{"+10|2|5|bob"}},
		{name: "FK change to missing right row", batch: []join.Change{lu("10", "9", "5")},
			inner: []string{"-10"}, left: []string{"+10|9|5|~"}},
		{name: "FK becomes NULL", batch: []join.Change{lu("10", "~", "5")},
			inner: []string{"-10"}, left: []string{"+10|~|5|~"}, innerDrops: 1},
		{name: "FK from NULL to a value", batch: []join.Change{lu("12", "2", "8")},
			inner: []string{"+12|2|8|bob"}, left: []string{"+12|2|8|bob"}},
		{name: "NULL FK row updated", batch: []join.Change{lu("12", "~", "9")},
			left: []string{"+12|~|9|~"}, innerDrops: 1},
		{name: "delete", batch: []join.Change{ld("10")},
			inner: []string{"-10"}, left: []string{"-10"}},
		{name: "delete NULL FK row", batch: []join.Change{ld("12")},
			left: []string{"-12"}},
		{name: "delete of a never-existing row", batch: []join.Change{ld("99")}, noDependents: true},
		{name: "no-op update", batch: []join.Change{lu("10", "1", "5")}, noDependents: true},
		{name: "update then revert", batch: []join.Change{lu("10", "1", "6"), lu("10", "1", "5")}},
		{name: "insert then delete", batch: []join.Change{lu("11", "1", "7"), ld("11")}},
		{name: "delete then reinsert", batch: []join.Change{ld("10"), lu("10", "1", "5")}},
		{name: "move away and back", batch: []join.Change{lu("10", "2", "5"), lu("10", "1", "5")}},
		{name: "TOAST value filled", batch: []join.Change{lu("10", "@", "6")},
			inner: []string{"+10|1|6|alice"}, left: []string{"+10|1|6|alice"}},
		{name: "TOAST no-op", batch: []join.Change{lu("10", "@", "@")}, noDependents: true},
		{name: "right update", batch: []join.Change{ru("1", "alicia")},
			inner: []string{"=10:alicia"}, left: []string{"=10:alicia"}},
		{name: "right update changing nothing", batch: []join.Change{ru("1", "alice")}, noDependents: true},
		{name: "right TOAST update", batch: []join.Change{{Kind: join.RightUpsert, Right: join.RightRow{Key: vals("1"), Values: vals("@")}}},
			noDependents: true},
		{name: "right updated three times", batch: []join.Change{ru("1", "a"), ru("1", "b"), ru("1", "c")},
			inner: []string{"=10:c"}, left: []string{"=10:c"}},
		{name: "right update and revert", batch: []join.Change{ru("1", "a"), ru("1", "alice")}},
		{name: "right delete", batch: []join.Change{rd("1")},
			inner: []string{"-10"}, left: []string{"=10:~"}},
		{name: "right delete of a never-existing row", batch: []join.Change{rd("99")}, noDependents: true},
		{name: "right delete and reinsert", batch: []join.Change{rd("1"), ru("1", "alice")}},
		{name: "right insert for a waiting subscriber", batch: []join.Change{lu("11", "9", "7"), ru("9", "zed")},
			inner: []string{"+11|9|7|zed"}, left: []string{"+11|9|7|zed"}},
		{name: "right insert before its subscriber", batch: []join.Change{ru("9", "zed"), lu("11", "9", "7")},
			inner: []string{"+11|9|7|zed"}, left: []string{"+11|9|7|zed"}},
		{name: "left and right change together", batch: []join.Change{lu("10", "1", "6"), ru("1", "al")},
			inner: []string{"+10|1|6|al"}, left: []string{"+10|1|6|al"}},
		{name: "move to a key deleted later", batch: []join.Change{lu("10", "2", "5"), rd("2")},
			inner: []string{"-10"}, left: []string{"+10|2|5|~"}},
		{name: "key change", batch: []join.Change{lk("10", "20", "1", "5")},
			inner: []string{"-10 +20|1|5|alice"}, left: []string{"-10 +20|1|5|alice"}},
		{name: "key change with TOASTed values", batch: []join.Change{lk("10", "20", "@", "@")},
			inner: []string{"-10 +20|1|5|alice"}, left: []string{"-10 +20|1|5|alice"}},
		{name: "key change and FK change", batch: []join.Change{lk("10", "20", "2", "@")},
			inner: []string{"-10 +20|2|5|bob"}, left: []string{"-10 +20|2|5|bob"}},
		{name: "key change and FK change in two updates", batch: []join.Change{lk("10", "20", "@", "@"), lu("20", "2", "@")},
			inner: []string{"-10 +20|2|5|bob"}, left: []string{"-10 +20|2|5|bob"}},
		{name: "key changed twice", batch: []join.Change{lk("10", "20", "@", "@"), lk("20", "30", "@", "7")},
			inner: []string{"-10 +30|1|7|alice"}, left: []string{"-10 +30|1|7|alice"}},
		{name: "key changed back", batch: []join.Change{lk("10", "20", "@", "@"), lk("20", "10", "@", "@")}},
		{name: "key change of a NULL FK row", batch: []join.Change{lk("12", "22", "@", "@")},
			left: []string{"-12 +22|~|8|~"}, innerDrops: 1},
		{name: "key change onto a deleted key", batch: []join.Change{ld("12"), lk("10", "12", "@", "@")},
			inner: []string{"-10 +12|1|5|alice"}, left: []string{"-10 +12|1|5|alice"}},
		{name: "insert, then its key changed", batch: []join.Change{lu("11", "2", "7"), lk("11", "21", "@", "@")},
			inner: []string{"+21|2|7|bob"}, left: []string{"+21|2|7|bob"}},
		{name: "right key change", batch: []join.Change{rk("1", "3", "alice")},
			inner: []string{"-10"}, left: []string{"=10:~"}},
		{name: "right key change with a TOASTed value, then a subscriber", batch: []join.Change{
			{Kind: join.RightKeyChange, OldKey: vals("1"), Right: join.RightRow{Key: vals("3"), Values: vals("@")}}, lu("11", "3", "7")},
			inner: []string{"-10", "+11|3|7|alice"}, left: []string{"=10:~", "+11|3|7|alice"}},
		{name: "right key change to a dangling FK", batch: []join.Change{lu("11", "9", "7"), rk("2", "9", "@")},
			inner: []string{"+11|9|7|bob"}, left: []string{"+11|9|7|bob"}},
		{name: "right key changed and back", batch: []join.Change{rk("1", "3", "@"), rk("3", "1", "@")}},
		{name: "left truncate", batch: []join.Change{lt},
			inner: []string{"TRUNCATE"}, left: []string{"TRUNCATE"}},
		{name: "right truncate", batch: []join.Change{rt},
			inner: []string{"TRUNCATE"}, left: []string{"NULLRIGHT"}},
		{name: "left truncate mid-batch", batch: []join.Change{lu("11", "2", "7"), lt, lu("10", "1", "5"), ru("1", "al")},
			inner: []string{"+11|2|7|bob", "TRUNCATE", "+10|1|5|al"},
			left:  []string{"+11|2|7|bob", "TRUNCATE", "+10|1|5|al"}},
		{name: "right truncate mid-batch", batch: []join.Change{lu("11", "2", "7"), rt, ru("1", "al"), lu("13", "2", "1")},
			inner: []string{"+11|2|7|bob", "TRUNCATE", "+10|1|5|al"},
			left:  []string{"+11|2|7|bob", "NULLRIGHT", "=10:al", "+13|2|1|~"}},
		{name: "right truncate then reinsert", batch: []join.Change{rt, ru("1", "alice"), ru("2", "bob")},
			inner: []string{"TRUNCATE", "+10|1|5|alice"}, left: []string{"NULLRIGHT", "=10:alice"}},
		{name: "left truncate then refill", batch: []join.Change{lt, lu("10", "1", "5"), lu("12", "~", "8")},
			inner: []string{"TRUNCATE", "+10|1|5|alice"}, left: []string{"TRUNCATE", "+10|1|5|alice +12|~|8|~"},
			innerDrops: 1},
	}
	for _, tt := range tests {
		for _, typ := range []join.JoinType{join.Inner, join.Left} {
			t.Run(typ.String()+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, orderSpec(typ))
				h.batch(setup...)
				before, calls := h.eng.Stats(), h.store.Calls
				got := h.batch(tt.batch...)
				want := tt.left
				if typ == join.Inner {
					want = tt.inner
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("outputs = %q, want %q", got, want)
				}
				if drops := h.eng.Stats().InnerNullFKDrops - before.InnerNullFKDrops; typ == join.Inner && drops != tt.innerDrops {
					t.Errorf("inner NULL FK drops = %d, want %d", drops, tt.innerDrops)
				}
				if tt.noDependents && h.store.Calls.Dependents != calls.Dependents {
					t.Errorf("read dependents %d times", h.store.Calls.Dependents-calls.Dependents)
				}
			})
		}
	}
}

// TestStaleResponse is the example of KIP-213 (seed 002): with right Y|bar,
// A|Y,1 then A|Y,2 in one batch, the response computed for A|Y,1 is
// discarded as stale and the output is exactly one upsert A|Y,2,bar.
func TestStaleResponse(t *testing.T) {
	t.Parallel()
	for _, typ := range []join.JoinType{join.Inner, join.Left} {
		t.Run(typ.String(), func(t *testing.T) {
			t.Parallel()
			spec := join.Spec{Name: "kip213", Type: typ, PK: textFam, FK: textFam, RightKey: textFam,
				LeftValues: 1, RightValues: 1}
			h := newHarness(t, spec)
			h.batch(join.Change{Kind: join.RightUpsert, Right: join.RightRow{Key: vals("Y"), Values: vals("bar")}})
			// Resolve newest first, as a pipelined resolver might.
			join.SetReorder(h.eng, func(q []join.Response) {
				for i, j := 0, len(q)-1; i < j; i, j = i+1, j-1 {
					q[i], q[j] = q[j], q[i]
				}
			})
			a := func(v string) join.Change {
				return join.Change{Kind: join.LeftUpsert, Left: join.LeftRow{PK: vals("A"), FK: vals("Y"), Values: vals(v)}}
			}
			got := h.batch(a("1"), a("2"))
			if want := []string{"+A|2|bar"}; !reflect.DeepEqual(got, want) {
				t.Errorf("outputs = %q, want %q", got, want)
			}
			if st := h.eng.Stats(); st.StaleResponses != 1 {
				t.Errorf("stale responses = %d, want 1", st.StaleResponses)
			}
		})
	}
}

var textFam = []join.Family{join.FamilyText}

func TestToastWithoutState(t *testing.T) {
	t.Parallel()
	tests := []join.Change{
		lu("11", "1", "@"),
		lu("11", "@", "7"),
		{Kind: join.RightUpsert, Right: join.RightRow{Key: vals("5"), Values: vals("@")}},
	}
	for _, c := range tests {
		h := newHarness(t, orderSpec(join.Left))
		if _, _, err := h.apply(c); !errors.Is(err, join.ErrNoToastState) {
			t.Errorf("apply %s with TOAST and no state: %v, want ErrNoToastState", c.Kind, err)
		}
	}
}

// TestToastWithoutStatePartitioned: in a partitioned table, a row without
// state may have come with a partition the daemon has not written yet: an
// update with unchanged-TOAST values of it is skipped and counted, and
// emits nothing; with full values it is stored.
func TestToastWithoutStatePartitioned(t *testing.T) {
	t.Parallel()
	tests := []join.Change{
		lu("11", "1", "@"),
		lu("11", "@", "7"),
		keyChange(lu("11", "1", "@"), "12"),
		{Kind: join.RightUpsert, Right: join.RightRow{Key: vals("5"), Values: vals("@")}},
		{Kind: join.RightKeyChange, OldKey: vals("6"), Right: join.RightRow{Key: vals("5"), Values: vals("@")}},
	}
	for _, c := range tests {
		spec := orderSpec(join.Left)
		spec.LeftPartitioned, spec.RightPartitioned = true, true
		h := newHarness(t, spec)
		outs, m, err := h.apply(c)
		if err != nil || len(outs) != 0 || !m.Empty() {
			t.Errorf("apply %s with TOAST and no state: outputs %q, mutations %+v, %v; want nothing", c.Kind, outs, m, err)
		}
		if n := h.eng.Stats().AbsentToastSkips; n != 1 {
			t.Errorf("apply %s with TOAST and no state: %d skips counted, want 1", c.Kind, n)
		}
	}
	spec := orderSpec(join.Left)
	spec.LeftPartitioned = true
	h := newHarness(t, spec)
	if got := h.batch(ru("1", "alice"), lu("11", "1", "full")); len(got) == 0 {
		t.Error("an update with full values of a row without state emitted nothing")
	}
}

// keyChange turns left upsert c into a change of key old to c's key.
func keyChange(c join.Change, old string) join.Change {
	c.Kind, c.OldKey = join.LeftKeyChange, vals(old)
	return c
}

// TestFanoutPages checks that a right change with more dependents than a
// page is resolved and emitted a page at a time.
func TestFanoutPages(t *testing.T) {
	t.Parallel()
	spec := orderSpec(join.Left)
	spec.PageSize = 2
	h := newHarness(t, spec)
	h.batch(ru("1", "alice"), lu("10", "1", "1"), lu("11", "1", "1"), lu("12", "1", "1"), lu("13", "1", "1"), lu("14", "1", "1"))
	before := h.eng.Stats()
	got := h.batch(ru("1", "al"), lu("15", "1", "1"), lu("16", "1", "1"))
	want := []string{
		"=10:al =11:al", "=12:al =13:al", "=14:al", // stored dependents, right columns only, a page each
		"+15|1|1|al +16|1|1|al", // rows changed in the batch, settled last
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("outputs = %q, want %q", got, want)
	}
	if n := h.eng.Stats().FanoutRows - before.FanoutRows; n != 7 {
		t.Errorf("fan-out rows = %d, want 7", n)
	}
}

// TestCompositeKeys joins on a two-column foreign key with a two-column
// primary key, including NULL in one FK column and key values that are
// prefixes of each other.
func TestCompositeKeys(t *testing.T) {
	t.Parallel()
	two := []join.Family{join.FamilyText, join.FamilyInt}
	for _, typ := range []join.JoinType{join.Inner, join.Left} {
		t.Run(typ.String(), func(t *testing.T) {
			t.Parallel()
			spec := join.Spec{Name: "c", Type: typ, PK: two, FK: two, RightKey: two, LeftValues: 1, RightValues: 1}
			h := newHarness(t, spec)
			left := func(pk1, pk2, fk1, fk2, v string) join.Change {
				return join.Change{Kind: join.LeftUpsert, Left: join.LeftRow{PK: vals(pk1, pk2), FK: vals(fk1, fk2), Values: vals(v)}}
			}
			right := func(k1, k2, v string) join.Change {
				return join.Change{Kind: join.RightUpsert, Right: join.RightRow{Key: vals(k1, k2), Values: vals(v)}}
			}
			h.batch(right("a", "1", "r1"), right("a", "10", "r10"), right("a\x00", "1", "rz"), right("", "1", "re"),
				left("x", "1", "a", "1", "l1"), left("x", "2", "a", "10", "l2"), left("x\x00", "1", "a\x00", "1", "l3"),
				left("", "1", "", "1", "l4"), left("x", "3", "a", "~", "l5"))
			got := h.batch(right("a", "1", "R1"))
			if want := []string{"=x|1:R1"}; !reflect.DeepEqual(got, want) {
				t.Errorf("outputs = %q, want %q", got, want)
			}
			got = h.batch(right("", "1", "RE"), right("a\x00", "1", "RZ"))
			if want := []string{"=|1:RE", "=x\x00|1:RZ"}; !reflect.DeepEqual(got, want) {
				t.Errorf("outputs = %q, want %q", got, want)
			}
		})
	}
}

// TestCanonicalForeignKeys checks SQL equality across text forms: an int4
// FK against an int8 key and numeric values with trailing zeros.
func TestCanonicalForeignKeys(t *testing.T) {
	t.Parallel()
	num := []join.Family{join.FamilyNumeric}
	spec := join.Spec{Name: "n", Type: join.Inner, PK: ints(1), FK: num, RightKey: num, LeftValues: 0, RightValues: 1}
	h := newHarness(t, spec)
	got := h.batch(
		join.Change{Kind: join.RightUpsert, Right: join.RightRow{Key: vals("1.5"), Values: vals("r")}},
		join.Change{Kind: join.LeftUpsert, Left: join.LeftRow{PK: vals("1"), FK: vals("1.50")}},
	)
	if want := []string{"+1|r"}; !reflect.DeepEqual(got, want) {
		t.Errorf("outputs = %q, want %q", got, want)
	}
}

func TestNewEngineValidates(t *testing.T) {
	t.Parallel()
	bad := []join.Spec{
		{Name: "no type", PK: ints(1), FK: ints(1), RightKey: ints(1)},
		{Name: "no pk", Type: join.Left, FK: ints(1), RightKey: ints(1)},
		{Name: "no fk", Type: join.Left, PK: ints(1)},
		{Name: "arity", Type: join.Left, PK: ints(1), FK: ints(2), RightKey: ints(1)},
		{Name: "families", Type: join.Left, PK: ints(1), FK: ints(1), RightKey: textFam},
	}
	for _, spec := range bad {
		if _, err := join.NewEngine(spec, jointest.NewStore()); err == nil || !strings.Contains(err.Error(), spec.Name) {
			t.Errorf("NewEngine(%s) = %v, want an error naming the join", spec.Name, err)
		}
	}
}

func TestApplyRejectsMalformedChanges(t *testing.T) {
	t.Parallel()
	h := newHarness(t, orderSpec(join.Left))
	bad := [][]join.Change{
		{{Kind: join.LeftUpsert, Left: join.LeftRow{PK: vals("1"), FK: vals("1")}}},
		{{Kind: join.LeftUpsert, Left: join.LeftRow{PK: vals("~"), FK: vals("1"), Values: vals("1", "2")}}},
		{{Kind: join.LeftUpsert, Left: join.LeftRow{PK: vals("1"), FK: vals("x"), Values: vals("1", "2")}}},
		{{Kind: join.RightDelete}},
		{{Kind: 0}},
	}
	for i, changes := range bad {
		if _, _, err := h.apply(changes...); err == nil {
			t.Errorf("batch %d: no error", i)
		}
	}
}

// TestMutations checks the net state change of a batch.
func TestMutations(t *testing.T) {
	t.Parallel()
	h := newHarness(t, orderSpec(join.Left))
	h.batch(ru("1", "alice"), lu("10", "1", "5"), lu("11", "1", "5"))
	_, m, err := h.apply(lu("10", "2", "5"), lu("10", "1", "5"), ld("11"), lu("12", "1", "3"), ld("12"), rd("7"))
	if err != nil {
		t.Fatal(err)
	}
	k11, _ := join.EncodeKey(ints(1), vals("11"))
	k1, _ := join.EncodeKey(ints(1), vals("1"))
	want := join.Mutations{DelLeft: []join.Key{k11}, DelSubs: []join.Subscription{{FK: k1, PK: k11}}}
	join.ForgetRows(&m)
	if !reflect.DeepEqual(m, want) {
		t.Errorf("mutations = %+v, want %+v", m, want)
	}
}

// TestFanoutCoalesced checks that a right key changed several times in a
// batch reads its dependents once — the changed keys' first pages all in one
// read — and that an empty batch does nothing.
func TestFanoutCoalesced(t *testing.T) {
	t.Parallel()
	h := newHarness(t, orderSpec(join.Inner))
	h.batch(ru("1", "alice"), ru("2", "bob"), lu("10", "1", "5"), lu("11", "2", "5"))
	calls := h.store.Calls.Dependents
	got := h.batch(ru("1", "a"), ru("2", "b"), ru("1", "b"), rd("2"), ru("1", "c"))
	if want := []string{"=10:c", "-11"}; !reflect.DeepEqual(got, want) {
		t.Errorf("outputs = %q, want %q", got, want)
	}
	if n := h.store.Calls.Dependents - calls; n != 1 {
		t.Errorf("read dependents %d times, want one read for both changed right keys", n)
	}
	outs, m, err := h.apply()
	if err != nil || len(outs) != 0 || !m.Empty() {
		t.Errorf("empty batch: outputs %q, mutations %v, error %v", outs, &m, err)
	}
}

// TestFanoutManyRightKeys: a batch changing many right rows reads their
// dependents and the dependents' left rows in a few round trips, not two per
// right row, and the output is the same as with one read per key.
func TestFanoutManyRightKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t, orderSpec(join.Left))
	var setup, renames []join.Change
	for c := 1; c <= 1000; c++ {
		setup = append(setup, ru(fmt.Sprint(c), "c"))
		for o := 0; o < 3; o++ {
			setup = append(setup, lu(fmt.Sprint(c*10+o), fmt.Sprint(c), "1"))
		}
		renames = append(renames, ru(fmt.Sprint(c), "renamed"))
	}
	h.batch(setup...)
	deps, lefts := h.store.Calls.Dependents, h.store.Calls.GetLeft
	// batch also checks the target against the SQL join.
	rows := 0
	for _, o := range h.batch(renames...) {
		rows += strings.Count(o, ":renamed")
	}
	if rows != 3000 {
		t.Fatalf("%d renamed rows written, want 3000", rows)
	}
	// 1000 keys in chunks of 512: two reads of first pages, and none of
	// left rows: a rename changes only the right columns.
	if d, l := h.store.Calls.Dependents-deps, h.store.Calls.GetLeft-lefts; d != 2 || l != 0 {
		t.Errorf("%d dependents reads and %d left reads for 1000 changed right keys, want 2 and 0", d, l)
	}
}
