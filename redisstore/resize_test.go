package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/join"
)

// TestResize grows a state filled at a small size, on one server and on a
// Redis Cluster: its rows' buckets, then a fan's lanes, then the right
// side's buckets. After each resize every row and every subscription reads
// back as before (whole, in order, a page at a time), the subscription
// count is unchanged, the old generations are garbage that Sweep deletes
// and commits go on. A resize that fails midway, or never switches (a
// crash), leaves the state as it was and its keys to Sweep.
func TestResize(t *testing.T) {
	t.Parallel()
	t.Run("one server", func(t *testing.T) {
		t.Parallel()
		s, _ := newStore(t, Config{PageSize: 100})
		testResize(t, s)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		testResize(t, newClusterStore(t, testenv.NewCluster(t), Config{PageSize: 100}))
	})
}

func testResize(t *testing.T, s *Store) {
	ctx := context.Background()
	if err := s.Init(ctx, NewEpoch(), "fp", Size{LeftRows: 1000, RightRows: 1000}); err != nil {
		t.Fatal(err)
	}
	// Members are FK ++ PK, the FK an entry byte and a parent key (a tree's
	// references): 10 hot parents under prefix 7, one row each under 3.
	ref := func(prefix byte, parent int64) join.Key {
		return join.Key(string([]byte{prefix}) + string(intKey(t, parent)))
	}
	fkLen := func(member string) (int, error) {
		n, err := join.KeyLen(member[1:], 1)
		return 1 + n, err
	}
	want := join.Mutations{PutLeft: map[join.Key]join.LeftState{}, PutRight: map[join.Key]join.RightState{}}
	deps := map[join.Key][]join.Key{}
	for pk := range int64(6000) {
		k := intKey(t, pk)
		want.PutLeft[k] = leftRow(pk, pk%10, fmt.Sprintf("note %d", pk))
		for _, fk := range []join.Key{ref(7, pk%10), ref(3, pk)} {
			want.AddSubs = append(want.AddSubs, join.Subscription{FK: fk, PK: k})
			deps[fk] = append(deps[fk], k)
		}
	}
	for key := range int64(3000) {
		want.PutRight[intKey(t, key)] = rightRow(key, fmt.Sprintf("name %d", key))
	}
	if err := s.Commit(ctx, want, 10); err != nil {
		t.Fatal(err)
	}
	check := func(what string) {
		t.Helper()
		left, err := s.GetLeft(ctx, slices.Collect(maps.Keys(want.PutLeft)))
		if err != nil || len(left) != len(want.PutLeft) {
			t.Fatalf("%s: GetLeft = %d rows, %v; want %d", what, len(left), err, len(want.PutLeft))
		}
		for k, row := range want.PutLeft {
			if !left[k].Equal(row) {
				t.Fatalf("%s: left row %x = %v, want %v", what, string(k), left[k], row)
			}
		}
		right, err := s.GetRight(ctx, slices.Collect(maps.Keys(want.PutRight)))
		if err != nil || len(right) != len(want.PutRight) {
			t.Fatalf("%s: GetRight = %d rows, %v; want %d", what, len(right), err, len(want.PutRight))
		}
		for fk, pks := range deps {
			if fk[0] == 3 && fk != ref(3, 42) {
				continue // one each: a sample will do
			}
			w := slices.Clone(pks)
			slices.Sort(w)
			if got := readAll(t, s, fk, 97); !slices.Equal(got, w) {
				t.Fatalf("%s: %d dependents of %x, want %d", what, len(got), string(fk), len(w))
			}
		}
		m, err := s.Meta(ctx)
		if err != nil || m.Subscriptions != int64(len(want.AddSubs)) {
			t.Fatalf("%s: meta %+v, %v; want %d subscriptions", what, m, err, len(want.AddSubs))
		}
	}
	gens := func() (uint64, uint64) {
		m, err := s.Meta(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return m.LeftGen, m.RightGen
	}
	resize := func(what string, sz Size, wantGrew bool, wantStats ResizeStats) {
		t.Helper()
		sh, grew, err := s.Outgrown(ctx, sz)
		if err != nil || grew != wantGrew {
			t.Fatalf("%s: Outgrown = %+v, %v, %v; want grown %v", what, sh, grew, err, wantGrew)
		}
		if !grew {
			return
		}
		l0, r0 := gens()
		st, err := s.Resize(ctx, sh, fkLen)
		if err != nil || st != wantStats {
			t.Fatalf("%s: Resize = %+v, %v; want %+v", what, st, err, wantStats)
		}
		if m, _ := s.Meta(ctx); m.Shape != sh || m.Resizing != [2]uint64{} {
			t.Fatalf("%s: shape %+v (resizing %v), want %+v", what, m.Shape, m.Resizing, sh)
		}
		check(what)
		if _, err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		l1, r1 := gens()
		for kind, gen := range map[byte]uint64{kindLeft: l0, kindRight: r0} {
			now := l1
			if kind == kindRight {
				now = r1
			}
			if gen != now && countGen(t, s, gen) != 0 {
				t.Fatalf("%s: Sweep left keys of the old generation %d", what, gen)
			}
		}
		check(what + ", swept")
	}
	check("before")
	resize("the same size", Size{LeftRows: 3000, RightRows: 3000}, false, ResizeStats{})
	resize("left rows", Size{LeftRows: 1 << 20, RightRows: 3000}, true,
		ResizeStats{Rows: 6000, Copied: keysOf(t, s, kindSubs)})
	resize("a fan", Size{LeftRows: 1 << 20, RightRows: 3000, Fans: map[byte]int{7: 16}}, true,
		ResizeStats{Subscriptions: 12000, Copied: keysOf(t, s, kindLeft)})
	resize("right rows", Size{LeftRows: 1 << 20, RightRows: 1 << 20, Fans: map[byte]int{7: 16}}, true,
		ResizeStats{Rows: 3000})
	if m, _ := s.Meta(ctx); m.Shape.LeftBuckets != 1<<14 || m.Shape.fan(string(ref(7, 1))) != 16 || m.Shape.RightBuckets != 1<<14 {
		t.Fatalf("shape after growing = %+v", m.Shape)
	}

	// Commits go on in the new layout.
	k := intKey(t, 5)
	more := join.Mutations{
		PutLeft: map[join.Key]join.LeftState{k: leftRow(5, 6, "moved")},
		DelSubs: []join.Subscription{{FK: ref(7, 5), PK: k}},
		AddSubs: []join.Subscription{{FK: ref(7, 6), PK: k}},
	}
	if err := s.Commit(ctx, more, 11); err != nil {
		t.Fatal(err)
	}
	want.PutLeft[k] = more.PutLeft[k]
	deps[ref(7, 5)] = slices.DeleteFunc(deps[ref(7, 5)], func(x join.Key) bool { return x == k })
	deps[ref(7, 6)] = append(deps[ref(7, 6)], k)
	check("a commit after")

	// A resize that fails midway changes nothing, and its keys are garbage.
	sh, _, _ := s.Outgrown(ctx, Size{LeftRows: 1 << 24, RightRows: 1 << 20, Fans: map[byte]int{7: 64}})
	before, _ := s.Meta(ctx)
	failing := func(member string) (int, error) {
		if member[0] == 3 {
			return 0, errors.New("injected")
		}
		return fkLen(member)
	}
	if _, err := s.Resize(ctx, sh, failing); err == nil {
		t.Fatal("Resize with a failing fkLen succeeded")
	}
	if m, _ := s.Meta(ctx); m.Layout != before.Layout || m.LeftGen != before.LeftGen || m.Resizing != [2]uint64{} {
		t.Fatalf("after a failed resize: meta %+v, want %+v", m, before)
	}
	check("after a failed resize")
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := countAllGens(t, s) - countGen(t, s, before.LeftGen) - countGen(t, s, before.RightGen); n != 0 {
		t.Fatalf("%d keys of the failed resize left after Sweep", n)
	}

	// On a cluster, a key that a slot migration hid from the scan (here:
	// one that appears after it) fails the resize, which changes nothing.
	if s.Cluster() {
		m, _ := s.Meta(ctx)
		stray := s.keys.name(kindSubs, m.LeftGen, 1<<19+7)
		s.afterMove = func() {
			if err := s.rdb.ZAdd(ctx, stray, redis.Z{Member: string(ref(3, 1<<40)) + string(intKey(t, 1))}).Err(); err != nil {
				t.Error(err)
			}
		}
		_, err := s.Resize(ctx, sh, fkLen)
		s.afterMove = nil
		if err == nil || !strings.Contains(err.Error(), "was not moved") {
			t.Fatalf("Resize with a key missed by the scan = %v, want an error naming it", err)
		}
		if m2, _ := s.Meta(ctx); m2.Layout != before.Layout || m2.LeftGen != before.LeftGen {
			t.Fatalf("after a resize that missed a key: meta %+v, want %+v", m2, before)
		}
		if err := s.rdb.Del(ctx, stray).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// A resize that never switched (a crash): Sweep spares its keys until
	// Recover forgets it.
	orphan := newGen(before.LeftGen)
	key := s.keys.name(kindLeft, orphan, 1)
	if err := s.rdb.HSet(ctx, key, "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.rdb.HSet(ctx, s.keys.meta(), fieldResize, fmt.Sprintf("%d,0", orphan)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(ctx); err != nil || s.rdb.Exists(ctx, key).Val() != 1 {
		t.Fatalf("Sweep deleted the keys of a resize in progress (%v)", err)
	}
	if _, err := s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Sweep(ctx); err != nil || s.rdb.Exists(ctx, key).Val() != 0 {
		t.Fatalf("Sweep kept the keys of a forgotten resize (%v)", err)
	}
	check("after a forgotten resize")
}

// keysOf counts the data keys of kind in the current generation.
func keysOf(t *testing.T, s *Store, kind byte) int {
	t.Helper()
	m, err := s.Meta(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	gen := m.LeftGen
	if kind == kindRight {
		gen = m.RightGen
	}
	seen := map[string]bool{} // SCAN may return a key twice
	forEachKey(t, s, func(k string) {
		if kk, g, ok := s.keys.parse(k); ok && kk == kind && g == gen {
			seen[k] = true
		}
	})
	return len(seen)
}

// countGen counts the data keys of generation gen.
func countGen(t *testing.T, s *Store, gen uint64) int {
	t.Helper()
	n := 0
	forEachKey(t, s, func(k string) {
		if _, g, ok := s.keys.parse(k); ok && g == gen {
			n++
		}
	})
	return n
}

// countAllGens counts every data key of the store.
func countAllGens(t *testing.T, s *Store) int {
	t.Helper()
	n := 0
	forEachKey(t, s, func(k string) {
		if _, _, ok := s.keys.parse(k); ok {
			n++
		}
	})
	return n
}

// forEachKey calls fn with every key of the store, on every primary.
func forEachKey(t *testing.T, s *Store, fn func(string)) {
	t.Helper()
	var mu sync.Mutex // the primaries are scanned concurrently
	err := s.masters(context.Background(), func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, s.keys.pattern(), 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			fn(iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}
