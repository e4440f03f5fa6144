package join

import "testing"

func benchSpec() Spec {
	return Spec{Name: "bench", Type: Left, PK: []Family{FamilyInt}, FK: []Family{FamilyInt},
		RightKey: []Family{FamilyInt}, LeftValues: 3, RightValues: 2}
}

// BenchmarkSender measures the sender for one left update that changes a
// value and keeps its foreign key: TOAST fill, no-op check, hash, FK
// encoding and the instruction.
func BenchmarkSender(b *testing.B) {
	spec := benchSpec()
	pk, _ := EncodeKey(spec.PK, []Value{TextValue("1001")})
	old, _, err := newLeft(&spec, new(slab[leftEntry]), nil, LeftRow{PK: []Value{TextValue("1001")}, FK: []Value{TextValue("42")},
		Values: []Value{TextValue("42"), TextValue("19.99"), TextValue("a fairly long description of the order")}})
	if err != nil {
		b.Fatal(err)
	}
	row := LeftRow{PK: []Value{TextValue("1001")}, FK: []Value{TextValue("42")},
		Values: []Value{TextValue("42"), TextValue("20.99"), ToastValue()}}
	var dst []Instruction
	var entries slab[leftEntry]
	b.ReportAllocs()
	for b.Loop() {
		cur, changed, err := newLeft(&spec, &entries, old, row)
		if err != nil || !changed {
			b.Fatal(err)
		}
		dst = send(PropagateNullIfNoRight, pk, old, cur, dst[:0])
	}
}

// BenchmarkResolver measures the resolver for one response: the stale check
// and the joined row.
func BenchmarkResolver(b *testing.B) {
	spec := benchSpec()
	e, err := NewEngine(spec, nil)
	if err != nil {
		b.Fatal(err)
	}
	bt := &batch{e: e, ov: newOverlay(nil, &e.spec, 0), seg: newSegment(), prop: PropagateNullIfNoRight}
	cur, _, err := newLeft(&spec, new(slab[leftEntry]), nil, LeftRow{PK: []Value{TextValue("1001")}, FK: []Value{TextValue("42")},
		Values: []Value{TextValue("42"), TextValue("19.99"), TextValue("description")}})
	if err != nil {
		b.Fatal(err)
	}
	r := Response{Kind: PropagateNullIfNoRight, PK: "pk", FK: cur.fk, Hash: cur.Hash, Hashed: true,
		Right: []Value{TextValue("alice"), TextValue("gold")}, Found: true}
	b.ReportAllocs()
	for b.Loop() {
		if _, exists, ok := bt.resolve(&r, cur); !ok || !exists {
			b.Fatal("response rejected")
		}
	}
}
