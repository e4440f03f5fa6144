package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{Prefix: "fkmat:slot:orders"}, true},
		{Config{Prefix: "p", SubShards: 1, RowShards: 1, PageSize: 1}, true},
		{Config{}, false},
		{Config{Prefix: "fkmat:*"}, false},
		{Config{Prefix: "fkmat:{x}"}, false},
		{Config{Prefix: "p", SubShards: -1}, false},
		{Config{Prefix: "p", RowShards: maxShards + 1}, false},
		{Config{Prefix: "p", PageSize: -5}, false},
	} {
		if err := tt.cfg.Validate(); (err == nil) != tt.ok {
			t.Errorf("Validate(%+v) = %v, want ok=%t", tt.cfg, err, tt.ok)
		}
	}
}

func TestOpenRefusesRing(t *testing.T) {
	t.Parallel()
	rc := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer rc.Close()
	if _, err := Open(context.Background(), rc, Config{Prefix: "p"}); err == nil {
		t.Fatal("Open accepted a ring client")
	}
}

func TestKeysParse(t *testing.T) {
	t.Parallel()
	k := newKeys(Config{Prefix: "fk:1:j"})
	for _, tt := range []struct {
		key  string
		kind byte
		gen  uint64
		ok   bool
	}{
		{k.name(kindLeft, 12345, 7), kindLeft, 12345, true},
		{k.name(kindSubs, 1<<32, 0), kindSubs, 1 << 32, true},
		{k.right(Meta{RightGen: 99, Shape: Shape{SubShards: 1, LeftBuckets: 10, RightBuckets: 10}}, "x"), kindRight, 99, true},
		{k.meta(), 0, 0, false},
		{"fk:1:j:x5:{1}", 0, 0, false},
		{"fk:1:j:l5:{}", 0, 0, false},
		{"fk:1:j:l5:{1a}", 0, 0, false},
		{"fk:1:j:l:5:{1}", 0, 0, false},
		{"fk:1:j:l1:l5:{1}", 0, 0, false}, // a key of a join with prefix fk:1:j:l1
		{"fk:1:jx:l5:{1}", 0, 0, false},
	} {
		kind, gen, ok := k.parse(tt.key)
		if ok != tt.ok || kind != tt.kind || gen != tt.gen {
			t.Errorf("parse(%q) = %c, %d, %t; want %c, %d, %t", tt.key, kind, gen, ok, tt.kind, tt.gen, tt.ok)
		}
	}
}

func TestDepRange(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		fk, after, lo, hi string
	}{
		{"\x12a\x00\x01", "", "(\x12a\x00\x01", "(\x12a\x00\x02"},
		{"\x12a\x00\x01", "\x89", "(\x12a\x00\x01\x89", "(\x12a\x00\x02"},
		{"a\xff\xff", "", "(a\xff\xff", "(b"},
		{"\xff\xff", "", "(\xff\xff", "+"},
		{"", "", "(", "+"},
	} {
		lo, hi := depRange(join.Key(tt.fk), join.Key(tt.after))
		if lo != tt.lo || hi != tt.hi {
			t.Errorf("depRange(%q, %q) = %q, %q; want %q, %q", tt.fk, tt.after, lo, hi, tt.lo, tt.hi)
		}
	}
}

func TestMetaRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tc := testenv.New(t)
	cfg := Config{Prefix: tc.RedisPrefix, SubShards: 64, RowShards: 32}
	s, err := Open(ctx, tc.Redis, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Meta(ctx); !errors.Is(err, ErrNoState) {
		t.Fatalf("Meta of an empty store: %v, want ErrNoState", err)
	}
	if _, err := s.GetLeft(ctx, []join.Key{intKey(t, 1)}); !errors.Is(err, ErrNoState) {
		t.Fatalf("GetLeft of an empty store: %v, want ErrNoState", err)
	}
	if err := s.Commit(ctx, join.Mutations{}, 0); err == nil {
		t.Fatal("Commit at LSN 0 succeeded")
	}
	if err := s.Commit(ctx, join.Mutations{}, 1); !errors.Is(err, ErrNoState) {
		t.Fatalf("Commit to an empty store: %v, want ErrNoState", err)
	}
	if _, err := s.Sweep(ctx); !errors.Is(err, ErrNoState) {
		t.Fatalf("Sweep of an empty store: %v, want ErrNoState", err)
	}

	epoch := NewEpoch()
	if err := s.Init(ctx, epoch, "fp1", Size{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, join.Mutations{}, 0x16B3748 /* 0/16B3748 */); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, tc.Redis, cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s2.Meta(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m.Epoch != epoch || m.Fingerprint != "fp1" || m.Checkpoint != 0x16B3748 || m.Layout != "v2/sub_shards=64/left_buckets=32/right_buckets=32" ||
		m.LeftGen == 0 || m.RightGen == 0 {
		t.Errorf("meta after reopen = %+v", m)
	}
	if s2.Checkpoint() != 0x16B3748 {
		t.Errorf("Checkpoint() = %d", s2.Checkpoint())
	}

	// Re-initialising starts new generations and resets the checkpoint.
	if err := s2.Init(ctx, NewEpoch(), "fp2", Size{}); err != nil {
		t.Fatal(err)
	}
	m2, err := s2.Meta(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m2.Epoch == epoch || m2.Checkpoint != 0 || m2.LeftGen == m.LeftGen || m2.RightGen == m.RightGen || m2.Fingerprint != "fp2" {
		t.Errorf("meta after second Init = %+v (before %+v)", m2, m)
	}
	// The first store's epoch is gone: its commits fail.
	if err := s.Commit(ctx, join.Mutations{}, 0x16B3749); !errors.Is(err, ErrEpoch) {
		t.Errorf("Commit after a foreign Init: %v, want ErrEpoch", err)
	}

	// Another shard count is another layout: unusable until Init.
	s3, err := Open(ctx, tc.Redis, Config{Prefix: tc.RedisPrefix, SubShards: 128, RowShards: 32})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s3.Dependents(ctx, intKey(t, 1), "", 10); !errors.Is(err, ErrLayout) {
		t.Errorf("Dependents with another layout: %v, want ErrLayout", err)
	}
}

// TestSizedShape: without a configured row count, Init sizes each side's
// buckets for its expected rows, and every store opened later reads the
// shape from the meta hash; an older layout is refused.
func TestSizedShape(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		rows int64
		want int
	}{{0, 1024}, {-1, 1024}, {1, 1024}, {65536, 1024}, {65537, 2048},
		{1_000_000, 16384}, {10_000_000, 1 << 18}, {1e12, 1 << 22}} {
		if got := bucketsFor(tt.rows); got != tt.want {
			t.Errorf("bucketsFor(%d) = %d, want %d", tt.rows, got, tt.want)
		}
	}
	for _, bad := range []string{"v1/sub_shards=64/row_shards=32", "v2/sub_shards=64/left_buckets=0/right_buckets=8",
		"v2/sub_shards=64/left_buckets=8/right_buckets=8/x", "v2/sub_shards=064/left_buckets=8/right_buckets=8", ""} {
		if sh, err := parseLayout(bad); err == nil {
			t.Errorf("parseLayout(%q) = %+v, want an error", bad, sh)
		}
	}

	ctx := context.Background()
	tc := testenv.New(t)
	cfg := Config{Prefix: tc.RedisPrefix, SubShards: 64}
	s, err := Open(ctx, tc.Redis, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(ctx, NewEpoch(), "fp", Size{LeftRows: 1_000_000, RightRows: 50_000}); err != nil {
		t.Fatal(err)
	}
	m := rowsAt(t, 100, 7)
	if err := s.Commit(ctx, m, 5); err != nil {
		t.Fatal(err)
	}
	meta, err := s.Meta(ctx)
	if err != nil || meta.Layout != "v2/sub_shards=64/left_buckets=16384/right_buckets=1024" || meta.Shape != (Shape{SubShards: 64, LeftBuckets: 16384, RightBuckets: 1024}) {
		t.Fatalf("meta = %+v, %v", meta, err)
	}
	if err := s.CheckLayout(meta); err != nil {
		t.Errorf("CheckLayout of its own state: %v", err)
	}
	// The left rows sit in the sized buckets.
	k := intKey(t, 42)
	if n, err := tc.Redis.HExists(ctx, s.keys.name(kindLeft, meta.LeftGen, shardOf(string(k), 16384)), string(k)).Result(); err != nil || !n {
		t.Errorf("left row 42 not in its bucket of 16384: %t, %v", n, err)
	}
	// A second store, unsized, reads the shape from Redis.
	s2, err := Open(ctx, tc.Redis, cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s2.GetLeft(ctx, []join.Key{k})
	if err != nil || !got[k].Equal(m.PutLeft[k]) {
		t.Errorf("GetLeft through a second store = %v, %v", got, err)
	}
	// A store configured with other counts refuses it.
	s3, err := Open(ctx, tc.Redis, Config{Prefix: tc.RedisPrefix, SubShards: 64, RowShards: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s3.GetLeft(ctx, []join.Key{k}); !errors.Is(err, ErrLayout) {
		t.Errorf("GetLeft with other row counts: %v, want ErrLayout", err)
	}
	// A state of the previous layout version is refused, naming it.
	if err := tc.Redis.HSet(ctx, s.keys.meta(), fieldLayout, "v1/sub_shards=64/row_shards=16384").Err(); err != nil {
		t.Fatal(err)
	}
	s4, err := Open(ctx, tc.Redis, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s4.GetLeft(ctx, []join.Key{k}); !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), "v1/") {
		t.Errorf("GetLeft of a v1 state: %v, want ErrLayout naming it", err)
	}
}

func TestCommitAndRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4})

	k1, k2, k3 := intKey(t, 1), intKey(t, 2), intKey(t, 3)
	c7, c8 := intKey(t, 7), intKey(t, 8)
	nullish := join.NewLeftState(texts("3"), []join.Value{join.NullValue()}, []join.Value{join.NullValue(), join.TextValue("")})
	m := join.Mutations{
		PutLeft:  map[join.Key]join.LeftState{k1: leftRow(1, 7, "a"), k2: leftRow(2, 7, "b"), k3: nullish},
		PutRight: map[join.Key]join.RightState{c7: {Key: texts("7"), Values: texts("alice")}},
		AddSubs:  []join.Subscription{{FK: c7, PK: k1}, {FK: c7, PK: k2}},
	}
	if err := s.Commit(ctx, m, 10); err != nil {
		t.Fatal(err)
	}
	left, err := s.GetLeft(ctx, []join.Key{k1, k2, k3, intKey(t, 4), k1})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 3 || !left[k1].Equal(m.PutLeft[k1]) || !left[k3].Equal(nullish) {
		t.Errorf("GetLeft = %v", left)
	}
	right, err := s.GetRight(ctx, []join.Key{c7, c8})
	if err != nil {
		t.Fatal(err)
	}
	if len(right) != 1 || !right[c7].Equal(m.PutRight[c7]) {
		t.Errorf("GetRight = %v", right)
	}
	assertDependents(t, s, c7, k1, k2)

	// Row 2 moves to customer 8, row 1 is deleted, customer 7 too.
	m = join.Mutations{
		PutLeft:  map[join.Key]join.LeftState{k2: leftRow(2, 8, "b")},
		DelLeft:  []join.Key{k1},
		DelRight: []join.Key{c7},
		PutRight: map[join.Key]join.RightState{c8: {Key: texts("8"), Values: texts("bob")}},
		AddSubs:  []join.Subscription{{FK: c8, PK: k2}},
		DelSubs:  []join.Subscription{{FK: c7, PK: k1}, {FK: c7, PK: k2}},
	}
	if err := s.Commit(ctx, m, 11); err != nil {
		t.Fatal(err)
	}
	left, err = s.GetLeft(ctx, []join.Key{k1, k2})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || !left[k2].Equal(leftRow(2, 8, "b")) {
		t.Errorf("GetLeft after update = %v", left)
	}
	if right, _ := s.GetRight(ctx, []join.Key{c7, c8}); len(right) != 1 || right[c8].Values[0].Text != "bob" {
		t.Errorf("GetRight after update = %v", right)
	}
	assertDependents(t, s, c7)
	assertDependents(t, s, c8, k2)
	if _, err := s.Dependents(ctx, c8, "", 0); err == nil {
		t.Error("Dependents with limit 0 succeeded")
	}
}

// assertDependents checks the dependents of fk, read in pages of 2.
func assertDependents(t *testing.T, s *Store, fk join.Key, want ...join.Key) {
	t.Helper()
	got := readAll(t, s, fk, 2)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("dependents of %x = %x, want %x", string(fk), got, want)
	}
}

func readAll(t *testing.T, s *Store, fk join.Key, page int) []join.Key {
	t.Helper()
	var all []join.Key
	var after join.Key
	for {
		got, err := s.Dependents(context.Background(), fk, after, page)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, got...)
		if len(got) < page {
			return all
		}
		after = got[len(got)-1]
	}
}

func TestPrefixBoundaries(t *testing.T) {
	t.Parallel()
	// Per FK schema (one join has one), keys that are byte prefixes of each
	// other as text, composite keys whose columns could be re-split, and
	// binary values; all in one set (SubShards 1) and spread (default).
	schemas := map[string][]join.Key{}
	for _, s := range []string{"1", "10", "1\x00", "", "\x00", "\x00\x01", "\x01", "\xff", "\xff\xff", "1\xff", "2"} {
		schemas["text"] = append(schemas["text"], textKey(t, s))
	}
	for _, p := range [][2]string{{"a", "b"}, {"a", "b\x00"}, {"a\x00", "b"}, {"ab", ""}, {"a", ""}, {"", "ab"}, {"", ""}, {"\xff", "\xff"}} {
		schemas["text,text"] = append(schemas["text,text"], textKey(t, p[0], p[1]))
	}
	for _, n := range []int64{0, 1, 2, 10, 100, 116, 117, 255, 256, 65536, -1, -256, 1 << 40, -1 << 63, 1<<63 - 1} {
		schemas["int"] = append(schemas["int"], intKey(t, n))
	}
	for _, p := range [][2]string{{"1", ""}, {"1", "0"}, {"10", ""}, {"-1", "\xff"}, {"1", "\x00"}} {
		schemas["int,text"] = append(schemas["int,text"], mustKey(t, []join.Family{join.FamilyInt, join.FamilyText}, texts(p[0], p[1])))
	}
	for _, u := range []string{"00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff", "ffffffff-ffff-ffff-ffff-fffffffffffe"} {
		schemas["uuid"] = append(schemas["uuid"], mustKey(t, []join.Family{join.FamilyUUID}, texts(u)))
	}
	// Primary keys that are prefixes of each other too.
	pks := []join.Key{textKey(t, "1"), textKey(t, "10"), textKey(t, "1\x00"), textKey(t, ""), textKey(t, "\xff")}

	for schema, fks := range schemas {
		for _, subShards := range []int{1, 0} {
			t.Run(schema+"/shards="+strconv.Itoa(subShards), func(t *testing.T) {
				t.Parallel()
				s, _ := newStore(t, Config{SubShards: subShards})
				var m join.Mutations
				want := map[join.Key][]join.Key{}
				for i, fk := range fks {
					own := append(slices.Clone(pks), textKey(t, "pk"+strconv.Itoa(i)))
					for _, pk := range own {
						m.AddSubs = append(m.AddSubs, join.Subscription{FK: fk, PK: pk})
					}
					slices.Sort(own)
					want[fk] = own
				}
				if err := s.Commit(context.Background(), m, 1); err != nil {
					t.Fatal(err)
				}
				for _, fk := range fks {
					for _, page := range []int{1, 3, 100} {
						if got := readAll(t, s, fk, page); !slices.Equal(got, want[fk]) {
							t.Errorf("fk %x, page %d: dependents %x, want %x", string(fk), page, got, want[fk])
						}
					}
				}
			})
		}
	}
}

func TestDependentsPaging100k(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{PageSize: 1000})
	const n = 100_000
	fk := intKey(t, 1)
	var m join.Mutations
	// Neighbours that must not bleed in: 0, 2 and 10 share no prefix issue
	// with 1 in the int encoding, but "1" as text next to it does.
	for _, other := range []join.Key{intKey(t, 0), intKey(t, 2), intKey(t, 10), textKey(t, "1")} {
		for j := range int64(3) {
			m.AddSubs = append(m.AddSubs, join.Subscription{FK: other, PK: intKey(t, j)})
		}
	}
	for pk := range int64(n) {
		m.AddSubs = append(m.AddSubs, join.Subscription{FK: fk, PK: intKey(t, pk*7)})
	}
	if err := s.Commit(ctx, m, 1); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, s, fk, 250)
	if len(got) != n {
		t.Fatalf("%d dependents, want %d", len(got), n)
	}
	for i, pk := range got {
		if pk != intKey(t, int64(i)*7) {
			t.Fatalf("dependent %d = %x, want pk %d", i, string(pk), i*7)
		}
	}
}

// snapshot returns every data key of the store (all generations) with its
// fields or members; the meta hash is left out.
func snapshot(t *testing.T, s *Store, tc *testenv.Case) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	iter := tc.Redis.Scan(ctx, 0, s.keys.pattern(), 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if k == s.keys.meta() {
			continue
		}
		switch typ := tc.Redis.Type(ctx, k).Val(); typ {
		case "hash":
			for f, v := range tc.Redis.HGetAll(ctx, k).Val() {
				out[k+"/"+f] = v
			}
		case "zset":
			for _, mem := range tc.Redis.ZRange(ctx, k, 0, -1).Val() {
				out[k+"/"+mem] = ""
			}
		default:
			t.Fatalf("key %q has type %s", k, typ)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReplayIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{SubShards: 8, RowShards: 8})
	k1, k2 := intKey(t, 1), intKey(t, 2)
	c7 := intKey(t, 7)
	batches := []struct {
		lsn wal.LSN
		m   join.Mutations
	}{
		{10, join.Mutations{
			PutLeft:  map[join.Key]join.LeftState{k1: leftRow(1, 7, "a")},
			PutRight: map[join.Key]join.RightState{c7: {Key: texts("7"), Values: texts("x")}},
			AddSubs:  []join.Subscription{{FK: c7, PK: k1}},
		}},
		// TRUNCATE left, then row 2 inserted.
		{20, join.Mutations{
			ClearLeft: true,
			PutLeft:   map[join.Key]join.LeftState{k2: leftRow(2, 7, "b")},
			AddSubs:   []join.Subscription{{FK: c7, PK: k2}},
		}},
		{30, join.Mutations{
			PutLeft: map[join.Key]join.LeftState{k1: leftRow(1, 7, "c")},
			AddSubs: []join.Subscription{{FK: c7, PK: k1}},
		}},
	}
	for _, b := range batches {
		if err := s.Commit(ctx, b.m, b.lsn); err != nil {
			t.Fatal(err)
		}
	}
	want := snapshot(t, s, tc)
	wantMeta, _ := s.Meta(ctx)

	// A restarted daemon replays from an older checkpoint: every batch at or
	// below the stored checkpoint is a no-op, the truncate included.
	s2, err := Open(ctx, tc.Redis, s.Config())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range batches {
		if err := s2.Commit(ctx, b.m, b.lsn); err != nil {
			t.Fatal(err)
		}
	}
	// The same through the first store, whose cache says it is applied.
	for _, b := range batches[1:] {
		if err := s.Commit(ctx, b.m, b.lsn); err != nil {
			t.Fatal(err)
		}
	}
	if got := snapshot(t, s, tc); !mapsEqual(got, want) {
		t.Errorf("state after replay:\n%q\nwant\n%q", got, want)
	}
	if m, _ := s2.Meta(ctx); m != wantMeta {
		t.Errorf("meta after replay = %+v, want %+v", m, wantMeta)
	}
	assertDependents(t, s2, c7, k1, k2)

	// The commands themselves are idempotent: the last batch applied again
	// at a new LSN changes nothing but the checkpoint.
	if err := s2.Commit(ctx, batches[2].m, 40); err != nil {
		t.Fatal(err)
	}
	if got := snapshot(t, s2, tc); !mapsEqual(got, want) {
		t.Errorf("state after re-applying the last batch:\n%q\nwant\n%q", got, want)
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// rowsAt returns a batch that sets n left rows (in many buckets, several
// commands per bucket) and their subscriptions to version v.
func rowsAt(t *testing.T, n int, v int) join.Mutations {
	m := join.Mutations{PutLeft: map[join.Key]join.LeftState{}}
	for i := range int64(n) {
		k := intKey(t, i)
		m.PutLeft[k] = leftRow(i, int64(v), "v"+strconv.Itoa(v))
		m.AddSubs = append(m.AddSubs, join.Subscription{FK: intKey(t, int64(v)), PK: k})
	}
	return m
}

func TestCommitIsAtomic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{SubShards: 16, RowShards: 16, PageSize: 10})
	const rows = 3000
	first, last := intKey(t, 0), intKey(t, rows-1)
	meta := *s.meta

	// A reader takes consistent snapshots (MULTI) of the checkpoint, the
	// first and the last row while batches rewrite all rows: it must never
	// see the checkpoint and the rows disagree.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var seen, bad int
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			var ck *redis.StringCmd
			var a, b *redis.StringCmd
			_, err := tc.Redis.TxPipelined(ctx, func(p redis.Pipeliner) error {
				ck = p.HGet(ctx, s.keys.meta(), fieldCheckpoint)
				a = p.HGet(ctx, s.keys.left(meta, string(first)), string(first))
				b = p.HGet(ctx, s.keys.left(meta, string(last)), string(last))
				return nil
			})
			if err != nil && !errors.Is(err, redis.Nil) {
				t.Error(err)
				return
			}
			if a.Err() != nil {
				continue // before the first batch
			}
			sa, _ := decodeLeft(string(first), a.Val())
			sb, _ := decodeLeft(string(last), b.Val())
			want := "v" + ck.Val()
			if sa.Values[0].Text != want || sb.Values[0].Text != want {
				bad++
			}
			seen++
		}
	})
	for v := 1; v <= 30; v++ {
		if err := s.Commit(ctx, rowsAt(t, rows, v), wal.LSN(v)); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if bad > 0 {
		t.Errorf("%d of %d snapshots saw a partial commit", bad, seen)
	}
	t.Logf("%d snapshots", seen)
}

func TestDiscardedCommitChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{SubShards: 16, RowShards: 16, PageSize: 10})
	if err := s.Commit(ctx, rowsAt(t, 500, 1), 1); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, s, tc)

	// A command rejected while queueing (as with OOM) discards the whole
	// MULTI, including the batch's many commands queued before it.
	s.beforeExec = func(ctx context.Context, p redis.Pipeliner) { p.Do(ctx, "HSET", s.keys.meta()) }
	m := rowsAt(t, 500, 2)
	m.ClearRight = true
	if err := s.Commit(ctx, m, 2); err == nil {
		t.Fatal("Commit with a bad command succeeded")
	}
	if got := snapshot(t, s, tc); !mapsEqual(got, before) {
		t.Error("a discarded commit changed the state")
	}
	if meta, _ := s.Meta(ctx); meta.Checkpoint != 1 {
		t.Errorf("checkpoint after a discarded commit = %d", meta.Checkpoint)
	}
	// Retrying the batch applies it.
	s.beforeExec = nil
	if err := s.Commit(ctx, m, 2); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetLeft(ctx, []join.Key{intKey(t, 499)})
	if err != nil {
		t.Fatal(err)
	}
	if v := got[intKey(t, 499)].Values[0].Text; v != "v2" || s.Checkpoint() != 2 {
		t.Errorf("after retry: value %q, checkpoint %d", v, s.Checkpoint())
	}
}

func TestPartialCommitMarksStateLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{SubShards: 1, RowShards: 1})
	// A foreign value of the wrong type where the left rows live: HSET
	// fails inside EXEC, after other commands ran.
	if err := tc.Redis.Set(ctx, s.keys.left(*s.meta, ""), "junk", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, rowsAt(t, 3, 1), 1); err == nil {
		t.Fatal("Commit over a wrong-type key succeeded")
	}
	if _, err := s.Meta(ctx); !errors.Is(err, ErrNoState) {
		t.Errorf("Meta after a partial commit: %v, want ErrNoState", err)
	}
	if err := s.Commit(ctx, rowsAt(t, 3, 2), 2); err == nil {
		t.Error("Commit on a damaged store succeeded")
	}
	// Init starts over.
	if err := s.Init(ctx, NewEpoch(), "test", Size{}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, rowsAt(t, 3, 3), 3); err != nil {
		t.Errorf("Commit after Init: %v", err)
	}
}

func TestClearAndSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{SubShards: 8, RowShards: 8, PageSize: 5})
	c7 := intKey(t, 7)
	m := rowsAt(t, 100, 7)
	m.PutRight = map[join.Key]join.RightState{c7: {Key: texts("7"), Values: texts("x")}}
	if err := s.Commit(ctx, m, 1); err != nil {
		t.Fatal(err)
	}
	foreign := tc.RedisPrefix + ":other"
	if err := tc.Redis.Set(ctx, foreign, "keep", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(ctx); err != nil || n != 0 {
		t.Fatalf("Sweep with nothing to do = %d, %v", n, err)
	}
	leftKeys := countKeys(t, tc, s.keys.prefix+":l*")
	subKeys := countKeys(t, tc, s.keys.prefix+":s*")

	// TRUNCATE left with one new row in the same batch.
	k5 := intKey(t, 5)
	m = join.Mutations{
		ClearLeft: true,
		PutLeft:   map[join.Key]join.LeftState{k5: leftRow(5, 7, "new")},
		AddSubs:   []join.Subscription{{FK: c7, PK: k5}},
		DelLeft:   []join.Key{intKey(t, 6)}, // moot after the clear
	}
	if err := s.Commit(ctx, m, 2); err != nil {
		t.Fatal(err)
	}
	left, err := s.GetLeft(ctx, []join.Key{intKey(t, 1), k5})
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[k5].Values[0].Text != "new" {
		t.Errorf("left rows after clear = %v", left)
	}
	assertDependents(t, s, c7, k5)
	if right, _ := s.GetRight(ctx, []join.Key{c7}); len(right) != 1 {
		t.Error("ClearLeft dropped a right row")
	}
	// The old generation is still there until swept.
	if n := countKeys(t, tc, s.keys.prefix+":l*"); n != leftKeys+1 {
		t.Errorf("%d left keys before sweep, want %d", n, leftKeys+1)
	}
	n, err := s.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != leftKeys+subKeys { // every old left bucket and subscription set
		t.Errorf("Sweep deleted %d keys, want %d", n, leftKeys+subKeys)
	}
	if n := countKeys(t, tc, s.keys.prefix+":l*"); n != 1 {
		t.Errorf("%d left keys after sweep, want 1", n)
	}
	assertDependents(t, s, c7, k5)
	if tc.Redis.Get(ctx, foreign).Val() != "keep" {
		t.Error("Sweep deleted a foreign key")
	}

	// TRUNCATE right keeps the left side.
	if err := s.Commit(ctx, join.Mutations{ClearRight: true}, 3); err != nil {
		t.Fatal(err)
	}
	if right, _ := s.GetRight(ctx, []join.Key{c7}); len(right) != 0 {
		t.Error("right row survived ClearRight")
	}
	if n, _ := s.Sweep(ctx); n != 1 {
		t.Errorf("Sweep after ClearRight deleted %d keys, want 1", n)
	}
	assertDependents(t, s, c7, k5)
}

func countKeys(t *testing.T, tc *testenv.Case, pattern string) int {
	t.Helper()
	keys, err := tc.Redis.Keys(context.Background(), pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}

func TestSweepConcurrentWithClears(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 2})
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := s.Sweep(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	})
	for v := 1; v <= 200; v++ {
		m := rowsAt(t, 20, v)
		m.ClearLeft = true
		if err := s.Commit(ctx, m, wal.LSN(v)); err != nil {
			t.Fatal(err)
		}
		left, err := s.GetLeft(ctx, []join.Key{intKey(t, 19)})
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != 1 {
			t.Fatalf("batch %d: row lost to a concurrent sweep", v)
		}
	}
	close(done)
	wg.Wait()
}

// A Sweep looks for garbage only when a generation was dropped since the
// last sweep that went through the whole keyspace: a daemon restarting over
// a large state does not SCAN it again.
func TestSweepOnlyAfterDrops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 3})
	if err := s.Commit(ctx, rowsAt(t, 20, 1), 1); err != nil {
		t.Fatal(err)
	}
	// stray plants a key of a generation not in use, as a crash between a
	// drop and its sweep leaves; a sweep that scans deletes it.
	stray := func() string {
		t.Helper()
		m, err := s.Meta(ctx)
		if err != nil {
			t.Fatal(err)
		}
		k := s.keys.name(kindLeft, newGen(m.LeftGen), 1)
		if err := s.rdb.HSet(ctx, k, "x", "y").Err(); err != nil {
			t.Fatal(err)
		}
		return k
	}
	sweep := func(s *Store, what string, k string, scans bool) {
		t.Helper()
		if _, err := s.Sweep(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if left := s.rdb.Exists(ctx, k).Val() == 1; left == scans {
			t.Fatalf("%s: stray key left %t, want a sweep that scans: %t", what, left, scans)
		}
	}
	// After Init: keys of a lost state may be there.
	sweep(s, "first sweep after Init", stray(), true)
	k := stray()
	sweep(s, "sweep with nothing dropped", k, false)
	reopened, err := Open(ctx, tc.Redis, s.Config())
	if err != nil {
		t.Fatal(err)
	}
	sweep(reopened, "sweep of a restarted daemon, nothing dropped", k, false)

	// A TRUNCATE drops the left generation.
	m := rowsAt(t, 20, 2)
	m.ClearLeft = true
	if err := s.Commit(ctx, m, 2); err != nil {
		t.Fatal(err)
	}
	sweep(s, "sweep after a clear", k, true)
	sweep(s, "second sweep after a clear", stray(), false)

	// A drop during a sweep's pass: the count the sweep records is the one
	// from before, and the next sweep scans.
	before, err := s.rdb.HGet(ctx, s.keys.meta(), fieldGenChanges).Result()
	if err != nil {
		t.Fatal(err)
	}
	m0, err := s.Meta(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, join.Mutations{ClearRight: true}, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.markSwept(ctx, m0.Epoch+" "+before); err != nil {
		t.Fatal(err)
	}
	sweep(s, "sweep after a drop during the last sweep", stray(), true)

	// An Init starts the count again, and a state with no drop since its
	// Init is still another state: the sweep scans.
	fresh, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 3})
	if _, err := fresh.Sweep(ctx); err != nil { // records the mark of the first state
		t.Fatal(err)
	}
	if err := fresh.Init(ctx, NewEpoch(), "test", Size{}); err != nil {
		t.Fatal(err)
	}
	m1, err := fresh.Meta(ctx)
	if err != nil {
		t.Fatal(err)
	}
	k = fresh.keys.name(kindLeft, newGen(m1.LeftGen), 1)
	if err := fresh.rdb.HSet(ctx, k, "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	sweep(fresh, "sweep after an Init", k, true)
}
