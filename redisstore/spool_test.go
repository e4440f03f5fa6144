package redisstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/join"
)

// TestSpool: rows, right rows and subscriptions (some to a fanned prefix)
// added by four goroutines at once into a spool with several partitions
// and chunks on disk, read back exactly on one server and on a cluster,
// with each key written whole by RESTORE; with partitions written in
// several parts (HSET and ZADD); and on a server that refuses RESTORE.
// Some keys exist already (a first spool loaded a few rows): their
// RESTORE is refused and they are written with HSET and ZADD. Each key's
// entries went out in few commands; the subscription count is exact; a
// spool refuses deletes and a state that is not fresh.
func TestSpool(t *testing.T) {
	t.Parallel()
	for _, split := range []bool{false, true} {
		name := map[bool]string{false: "whole", true: "split"}[split]
		t.Run("server/"+name, func(t *testing.T) {
			t.Parallel()
			s, _ := newStore(t, Config{PageSize: 100})
			testSpool(t, s, split, true)
		})
		t.Run("cluster/"+name, func(t *testing.T) {
			t.Parallel()
			s := newClusterStore(t, testenv.NewCluster(t), Config{Prefix: "fkmat:test:spool:" + name, PageSize: 100})
			testSpool(t, s, split, true)
		})
	}
	t.Run("server/payload-too-new", func(t *testing.T) {
		// The server refuses the payloads for its version, as Redis 6.2
		// refuses those of 7.0 (RDB 10): "DUMP payload version or
		// checksum are wrong".
		t.Parallel()
		s, _ := newStore(t, Config{PageSize: 100})
		s.dumpVersion = 0xfff0
		testSpool(t, s, false, false)
	})
	t.Run("server/without-restore", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		tc := testenv.New(t)
		user := strings.ReplaceAll(tc.RedisPrefix, ":", "-")
		if err := tc.Redis.Do(ctx, "ACL", "SETUSER", user, "on", ">spool-test", "~*", "&*", "+@all", "-restore").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tc.Redis.Do(ctx, "ACL", "DELUSER", user).Err() })
		rdb := redis.NewClient(&redis.Options{Addr: tc.Env.RedisAddr, Username: user, Password: "spool-test", MaxRetries: -1})
		defer func() { _ = rdb.Close() }()
		s, err := Open(ctx, rdb, Config{Prefix: tc.RedisPrefix, PageSize: 100})
		if err != nil {
			t.Fatal(err)
		}
		testSpool(t, s, false, false)
	})
}

func testSpool(t *testing.T, s *Store, split, restore bool) {
	ctx := context.Background()
	const n, parents = 20_000, 300
	const early = 200 // rows loaded by a first spool
	hot := join.Key("\x07" + string(intKey(t, 1)))
	if err := s.Init(ctx, NewEpoch(), "fp", Size{LeftRows: n, RightRows: parents, Fans: map[byte]int{7: 8}}); err != nil {
		t.Fatal(err)
	}
	var all join.Mutations
	pages := make([]join.Mutations, 40)
	first := join.Mutations{PutLeft: map[join.Key]join.LeftState{}}
	for i := range int64(n) {
		m := &pages[i%int64(len(pages))]
		if i < early {
			m = &first
		}
		if m.PutLeft == nil {
			m.PutLeft, m.PutRight = map[join.Key]join.LeftState{}, map[join.Key]join.RightState{}
		}
		k := intKey(t, i)
		m.PutLeft[k] = leftRow(i, i%parents, "note "+strconv.FormatInt(i, 10))
		if i%10 != 0 { // some NULL foreign keys: no subscription
			m.AddSubs = append(m.AddSubs, sub(t, i%parents, i))
		}
		if i%4 == 0 {
			m.AddSubs = append(m.AddSubs, join.Subscription{FK: hot, PK: k})
		}
		if i < parents {
			if m.PutRight == nil {
				m.PutRight = map[join.Key]join.RightState{}
			}
			m.PutRight[intKey(t, i)] = rightRow(i, "customer "+strconv.FormatInt(i, 10))
		}
	}
	pages = append(pages, first)
	for _, m := range pages {
		all.AddSubs = append(all.AddSubs, m.AddSubs...)
	}
	// The first spool.
	sp, err := s.NewSpool(ctx, t.TempDir(), early)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Add(ctx, first); err != nil {
		t.Fatal(err)
	}
	if err := sp.Load(ctx); err != nil {
		t.Fatal(err)
	}
	_ = sp.Close()

	sp, err = s.NewSpool(ctx, t.TempDir(), 40_000) // several partitions
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sp.Close() }()
	if len(sp.parts) < 2 {
		t.Fatalf("%d partitions for 40k rows", len(sp.parts))
	}
	sp.chunk = 4 << 10 // chunks on disk
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for w := range errs {
		wg.Go(func() {
			for p := w; p < len(pages)-1; p += len(errs) {
				if err := sp.Add(ctx, pages[p]); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	onDisk := 0
	for i := range sp.parts {
		onDisk += len(sp.parts[i].chunks)
	}
	if onDisk == 0 {
		t.Fatal("no chunk went to the temporary file")
	}
	var parts int64
	if split {
		sp.merge = 64 << 10 // partitions written in several parts
		for i := range sp.parts {
			size := int64(len(sp.parts[i].buf))
			for _, c := range sp.parts[i].chunks {
				size += c.n
			}
			parts += (size + sp.merge - 1) / sp.merge
		}
		if parts <= int64(len(sp.parts)) {
			t.Fatalf("%d parts in %d partitions: none is written in several", parts, len(sp.parts))
		}
	}
	if err := sp.Load(ctx); err != nil {
		t.Fatal(err)
	}
	commands, entries := sp.Counts()
	t.Logf("%d commands for %d entries, %d chunks on disk, %d partitions written in %d parts, RESTORE refused: %v",
		commands, entries, onDisk, len(sp.parts), parts, sp.noRestore.Load())
	if entries != int64(n-early+parents-early+len(all.AddSubs)-len(first.AddSubs)) || commands > entries/4 {
		t.Errorf("%d commands for %d rows and subscriptions", commands, entries)
	}
	if sp.noRestore.Load() == restore {
		t.Errorf("RESTORE refused: %v, want %v", sp.noRestore.Load(), !restore)
	}
	if !split && restore && commands > entries/20 {
		t.Errorf("%d commands for %d rows and subscriptions: keys were not written whole", commands, entries)
	}

	keys := make([]join.Key, 0, n)
	for _, m := range pages {
		for k := range m.PutLeft {
			keys = append(keys, k)
		}
	}
	left, err := s.GetLeft(ctx, keys)
	if err != nil || len(left) != n {
		t.Fatalf("GetLeft: %d rows, %v", len(left), err)
	}
	for _, m := range pages {
		for k, st := range m.PutLeft {
			if !left[k].Equal(st) {
				t.Fatalf("left %x = %v, want %v", k, left[k], st)
			}
		}
		for k, r := range m.PutRight {
			got, err := s.GetRight(ctx, []join.Key{k})
			if err != nil || !got[k].Equal(r) {
				t.Fatalf("right %x = %v, %v", k, got[k], err)
			}
		}
	}
	want := map[join.Key]int{}
	for _, sb := range all.AddSubs {
		want[sb.FK]++
	}
	for fk, w := range want {
		deps, err := s.Dependents(ctx, fk, "", 2*n)
		if err != nil || len(deps) != w {
			t.Fatalf("dependents of %x: %d, %v; want %d", fk, len(deps), err, w)
		}
		if !slices.IsSortedFunc(deps, func(a, b join.Key) int { return strings.Compare(string(a), string(b)) }) {
			t.Fatalf("dependents of %x out of order", fk)
		}
	}
	meta, err := s.Meta(ctx)
	if err != nil || meta.Subscriptions != int64(len(all.AddSubs)) {
		t.Errorf("subscriptions = %d, %v; want %d", meta.Subscriptions, err, len(all.AddSubs))
	}
	if err := sp.Add(ctx, join.Mutations{DelLeft: []join.Key{keys[0]}}); err == nil {
		t.Error("a spool accepted a delete")
	}
	if err := s.Commit(ctx, join.Mutations{}, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewSpool(ctx, t.TempDir(), 1); err == nil {
		t.Error("NewSpool accepted a state with a checkpoint")
	}
}

// TestSpoolSort: the entries of a part come out of spoolSort whole, each
// key's together and in key order within its cluster, whether the part is
// one cluster or many.
func TestSpoolSort(t *testing.T) {
	t.Parallel()
	for _, n := range []int{50, 30_000} {
		rng := rand.New(rand.NewPCG(1, uint64(n)))
		var b []byte
		want := map[string]int{}
		for i := range n {
			kind := []byte{kindLeft, kindRight, kindSubs}[rng.IntN(3)]
			shard := rng.Uint64N(uint64(n/10 + 1))
			field := strconv.Itoa(i)
			value := strings.Repeat("v", rng.IntN(40))
			if kind == kindSubs {
				field = ""
			}
			b = append(b, kind)
			b = binary.AppendUvarint(b, shard)
			b = binary.AppendUvarint(b, uint64(len(field)))
			b = append(b, field...)
			b = binary.AppendUvarint(b, uint64(len(value)))
			b = append(b, value...)
			want[fmt.Sprint(uint64(kind)<<56|shard, field, value)]++
		}
		sorted, entries, err := spoolSort(slices.Clone(b), int64(n))
		if err != nil {
			t.Fatal(err)
		}
		if clusters := len(b)/spoolClusterBytes + 1; n > 50 && clusters < 3 {
			t.Fatalf("%d bytes in %d clusters", len(b), clusters)
		}
		done := map[uint64]bool{}
		for i, e := range entries {
			field, value := spoolEntryAt(sorted, e.off)
			k := fmt.Sprint(e.key, field, value)
			if want[k] == 0 {
				t.Fatalf("n=%d: entry %d (%s) is not one of the part's", n, i, k)
			}
			want[k]--
			if i > 0 && entries[i-1].key != e.key {
				if done[e.key] {
					t.Fatalf("n=%d: the entries of key %x are not together", n, e.key)
				}
				done[entries[i-1].key] = true
			}
		}
		if len(entries) != n {
			t.Fatalf("n=%d: %d entries out", n, len(entries))
		}
		if _, _, err := spoolSort(b[:len(b)-1], int64(n)); err == nil {
			t.Errorf("n=%d: a truncated part sorted without an error", n)
		}
	}
}

// TestSpoolTwice: a row spooled twice holds its last value, and a
// subscription spooled twice is one member, whether the key's entries
// come in order or not.
func TestSpoolTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{PageSize: 100})
	sp, err := s.NewSpool(ctx, t.TempDir(), 10)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sp.Close() }()
	// One bucket and one subscription set hold everything (a fresh state
	// of 10 rows), so that the entries of a key are both in and out of
	// order.
	var subs []join.Subscription
	for _, pk := range []int64{5, 3, 9, 3, 7, 9} {
		subs = append(subs, sub(t, 1, pk))
	}
	for i, m := range []join.Mutations{
		{PutLeft: map[join.Key]join.LeftState{intKey(t, 4): leftRow(4, 1, "first"), intKey(t, 2): leftRow(2, 1, "two")}, AddSubs: subs[:3]},
		{PutLeft: map[join.Key]join.LeftState{intKey(t, 4): leftRow(4, 1, "last")}, AddSubs: subs[3:]},
	} {
		if err := sp.Add(ctx, m); err != nil {
			t.Fatalf("add %d: %v", i, err)
		}
	}
	if err := sp.Load(ctx); err != nil {
		t.Fatal(err)
	}
	left, err := s.GetLeft(ctx, []join.Key{intKey(t, 4), intKey(t, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if want := leftRow(4, 1, "last"); !left[intKey(t, 4)].Equal(want) {
		t.Errorf("row 4 = %v, want %v", left[intKey(t, 4)], want)
	}
	if want := leftRow(2, 1, "two"); !left[intKey(t, 2)].Equal(want) {
		t.Errorf("row 2 = %v, want %v", left[intKey(t, 2)], want)
	}
	deps, err := s.Dependents(ctx, intKey(t, 1), "", 100)
	if err != nil {
		t.Fatal(err)
	}
	want := []join.Key{intKey(t, 3), intKey(t, 5), intKey(t, 7), intKey(t, 9)}
	if !slices.Equal(deps, want) {
		t.Errorf("dependents = %x, want %x", deps, want)
	}
}
