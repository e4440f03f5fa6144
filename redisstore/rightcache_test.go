package redisstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/fkmat/fkmat/join"
)

// TestRightCache: right rows are served from the in-process cache once
// read or committed (a row deleted behind the store's back still reads);
// commits keep it exact; a read that raced with a commit does not put the
// row it read over the committed one; a clear starts it anew; it stays
// within its bytes; and a negative size disables it.
func TestRightCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{SubShards: 4, RowShards: 4})
	c7, c8, c9 := intKey(t, 7), intKey(t, 8), intKey(t, 9)
	row := func(k int, v string) join.RightState {
		return join.RightState{Key: texts(fmt.Sprint(k)), Values: texts(v)}
	}
	read := func(s *Store, k join.Key) string {
		t.Helper()
		got, err := s.GetRight(ctx, []join.Key{k})
		if err != nil {
			t.Fatal(err)
		}
		if st, ok := got[k]; ok {
			return st.Values[0].Text
		}
		return "<absent>"
	}
	if err := s.Commit(ctx, join.Mutations{PutRight: map[join.Key]join.RightState{c7: row(7, "alice"), c9: row(9, "old")}}, 10); err != nil {
		t.Fatal(err)
	}
	if got := read(s, c7); got != "alice" {
		t.Fatalf("c7 = %s, want alice", got)
	}
	if got := read(s, c8); got != "<absent>" {
		t.Fatalf("c8 = %s, want absent", got)
	}
	// Behind the store's back: the cache answers, not Redis.
	m, _ := s.Meta(ctx)
	if err := tc.Redis.HDel(ctx, s.keys.right(m, string(c7)), string(c7)).Err(); err != nil {
		t.Fatal(err)
	}
	if got := read(s, c7); got != "alice" {
		t.Fatalf("c7 deleted behind the store's back = %s; want alice from the cache", got)
	}
	if n, _ := s.right.stats(); n != 3 {
		t.Fatalf("cache holds %d entries, want 3 (c7, c9 committed, c8 known absent)", n)
	}

	// A second store on the same state, its cache empty: its read of c9
	// returns "old", and before that read fills the cache, a commit of the
	// same store sets "new". The fill must not bring "old" back.
	s2, err := Open(ctx, tc.Redis, s.Config())
	if err != nil {
		t.Fatal(err)
	}
	read(s2, c8) // the cache follows the state's generation from now on
	s2.beforeFill = func() {
		s2.beforeFill = nil
		if err := s2.Commit(ctx, join.Mutations{PutRight: map[join.Key]join.RightState{c9: row(9, "new")}}, 11); err != nil {
			t.Fatal(err)
		}
	}
	if got := read(s2, c9); got != "old" {
		t.Fatalf("the racing read = %s, want old (it read before the commit)", got)
	}
	if got := read(s2, c9); got != "new" {
		t.Fatalf("c9 after the racing read = %s; want new: a stale read was cached over the commit", got)
	}
	// Deletes are cached as absent; a clear starts a new generation.
	if err := s2.Commit(ctx, join.Mutations{DelRight: []join.Key{c9}}, 12); err != nil {
		t.Fatal(err)
	}
	if got := read(s2, c9); got != "<absent>" {
		t.Fatalf("c9 after its delete = %s", got)
	}
	if err := s2.Commit(ctx, join.Mutations{ClearRight: true, PutRight: map[join.Key]join.RightState{c8: row(8, "bob")}}, 13); err != nil {
		t.Fatal(err)
	}
	if got, got8 := read(s2, c7), read(s2, c8); got != "<absent>" || got8 != "bob" {
		t.Fatalf("after a clear: c7 = %s, c8 = %s; want absent, bob", got, got8)
	}

	// Bounded in bytes.
	small, tc3 := newStore(t, Config{SubShards: 4, RowShards: 4, RightCacheBytes: 8 << 10})
	puts := map[join.Key]join.RightState{}
	var keys []join.Key
	for i := range 1000 {
		k := intKey(t, int64(i))
		puts[k], keys = row(i, fmt.Sprintf("customer %d", i)), append(keys, k)
	}
	if err := small.Commit(ctx, join.Mutations{PutRight: puts}, 10); err != nil {
		t.Fatal(err)
	}
	got, err := small.GetRight(ctx, keys)
	if err != nil || len(got) != 1000 {
		t.Fatalf("GetRight of 1000 rows: %d, %v", len(got), err)
	}
	if n, bytes := small.right.stats(); bytes > 8<<10 || n == 0 {
		t.Fatalf("cache of 8 KiB holds %d entries in %d bytes", n, bytes)
	}

	// Disabled: a row deleted behind the store's back is gone.
	off, err := Open(ctx, tc3.Redis, Config{Prefix: tc3.RedisPrefix, SubShards: 4, RowShards: 4, RightCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	k0 := intKey(t, 0)
	if got := read(off, k0); got != "customer 0" {
		t.Fatalf("k0 = %s", got)
	}
	m, _ = off.Meta(ctx)
	if err := tc3.Redis.HDel(ctx, off.keys.right(m, string(k0)), string(k0)).Err(); err != nil {
		t.Fatal(err)
	}
	if got := read(off, k0); got != "<absent>" {
		t.Fatalf("with the cache disabled, k0 deleted in Redis = %s", got)
	}
}
