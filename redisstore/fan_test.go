package redisstore

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/join"
)

// TestFannedSubscriptions: the subscriptions to the foreign keys of a
// prefix with a fan (a tree's entry whose keys have many dependents) are
// spread over lanes that stay in the listpack encoding, and every read
// (a page after a cursor, many keys at once, after deletes, after a load
// and a partial transaction rolled back) sees them whole and in order; a prefix without a fan keeps one set per key. The fan is
// part of the layout and comes back from it.
func TestFannedSubscriptions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{PageSize: 500})
	if err := s.Init(ctx, NewEpoch(), "fp", Size{LeftRows: 10_000, Fans: map[byte]int{7: 32}}); err != nil {
		t.Fatal(err)
	}
	hot := join.Key("\x07" + string(intKey(t, 1)))
	// A loader (the backfill) writes to the lanes.
	l, err := s.NewLoader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var load join.Mutations
	for pk := int64(3000); pk < 3500; pk++ {
		load.AddSubs = append(load.AddSubs, join.Subscription{FK: hot, PK: intKey(t, pk)})
	}
	if err := l.Add(ctx, load); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	cold := join.Key("\x07" + string(intKey(t, 2)))
	plain := join.Key("\x03" + string(intKey(t, 1)))
	var m join.Mutations
	for pk := range int64(2000) {
		m.AddSubs = append(m.AddSubs, join.Subscription{FK: hot, PK: intKey(t, pk)})
	}
	for pk := range int64(3) {
		m.AddSubs = append(m.AddSubs, join.Subscription{FK: cold, PK: intKey(t, pk)})
	}
	for pk := range int64(300) {
		m.AddSubs = append(m.AddSubs, join.Subscription{FK: plain, PK: intKey(t, pk)})
	}
	if err := s.Commit(ctx, m, 10); err != nil {
		t.Fatal(err)
	}
	meta, err := s.Meta(ctx)
	if err != nil || !strings.Contains(meta.Layout, "/fans=7:32") || meta.Shape.fan(string(hot)) != 32 || meta.Shape.fan(string(plain)) != 1 {
		t.Fatalf("meta = %+v, %v; want a fan of 32 for prefix 7 only", meta, err)
	}
	if sh, err := parseLayout(meta.Layout); err != nil || sh != meta.Shape {
		t.Fatalf("parseLayout(%q) = %+v, %v", meta.Layout, sh, err)
	}
	want := func(n int64, except ...int64) []join.Key {
		var out []join.Key
		for pk := range n {
			if !slices.Contains(except, pk) {
				out = append(out, intKey(t, pk))
			}
		}
		if n == 2000 { // the hot key has the loaded ones too
			for pk := int64(3000); pk < 3500; pk++ {
				out = append(out, intKey(t, pk))
			}
		}
		slices.Sort(out) // members sort by their encoding
		return out
	}
	check := func(what string, fk join.Key, w []join.Key) {
		t.Helper()
		for _, page := range []int{1, 7, 500, 5000} {
			if got := readAll(t, s, fk, page); !slices.Equal(got, w) {
				t.Fatalf("%s, pages of %d: %d dependents, want %d", what, page, len(got), len(w))
			}
		}
	}
	check("hot key", hot, want(2000))
	check("cold key", cold, want(3))
	check("key without a fan", plain, want(300))
	// Many keys at once, each after its own cursor.
	got, err := s.DependentsAfter(ctx, []join.Key{hot, cold, plain}, []join.Key{want(2000)[99], "", want(300)[9]}, 50)
	if err != nil || !slices.Equal(got[0], want(2000)[100:150]) || !slices.Equal(got[1], want(3)) || !slices.Equal(got[2], want(300)[10:60]) {
		t.Fatalf("DependentsAfter = %d, %d, %d keys, %v", len(got[0]), len(got[1]), len(got[2]), err)
	}
	// The hot key's lanes are listpacks; the key without a fan is one set,
	// beyond the listpack's 128 members.
	for _, set := range s.keys.subsOf(meta, string(hot)) {
		if enc := tc.Redis.ObjectEncoding(ctx, set).Val(); enc != "listpack" {
			t.Errorf("lane %s of the hot key is a %s", set, enc)
		}
	}
	if sets := s.keys.subsOf(meta, string(plain)); len(sets) != 1 || tc.Redis.ObjectEncoding(ctx, sets[0]).Val() != "skiplist" {
		t.Errorf("the key without a fan: sets %v", sets)
	}
	// Deletes.
	var del join.Mutations
	for _, pk := range []int64{0, 5, 1999} {
		del.DelSubs = append(del.DelSubs, join.Subscription{FK: hot, PK: intKey(t, pk)})
	}
	if err := s.Commit(ctx, del, 20); err != nil {
		t.Fatal(err)
	}
	check("hot key after deletes", hot, want(2000, 0, 5, 1999))
	// A partial transaction's writes to the lanes, rolled back.
	var part join.Mutations
	for pk := int64(5000); pk < 5100; pk++ {
		part.AddSubs = append(part.AddSubs, join.Subscription{FK: hot, PK: intKey(t, pk)})
	}
	part.DelSubs = append(part.DelSubs, join.Subscription{FK: hot, PK: intKey(t, 7)})
	if err := s.CommitPartial(ctx, part, 30); err != nil {
		t.Fatal(err)
	}
	if n := len(readAll(t, s, hot, 500)); n != 2497-1+100 {
		t.Fatalf("after a partial write: %d dependents", n)
	}
	if undone, err := s.Recover(ctx); err != nil || !undone {
		t.Fatalf("Recover = %t, %v", undone, err)
	}
	check("hot key after a rolled back partial write", hot, want(2000, 0, 5, 1999))
}
