package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Growth thresholds. Init sizes a state for its tables then (Size): about
// 64 rows per row bucket and 64 references per lane of a fan. A table that
// grows fills them past Redis's compact encodings (512 fields of a hash,
// 128 members of a sorted set), which cost 2-6 times the memory; Outgrown
// says when a Resize is due and Resize moves the state to the counts its
// tables have now.
const (
	// growBuckets: a side's row buckets are resized once its table would
	// get this many times as many at Init, at some 256 rows per bucket,
	// half the listpack limit; they hold 64 again after.
	growBuckets = 4
	// growLanes: a fan is resized once its keys' average would get twice
	// its lanes, at some 128 references per lane, the listpack limit of a
	// sorted set.
	growLanes = 2
)

// Outgrown returns the shape a Resize should give the state now that its
// tables have the size sz, and whether one is due: some side's buckets
// would be growBuckets times as many, or some fan's lanes growLanes times.
// Counts never shrink, and the counts a Config fixes never change.
func (s *Store) Outgrown(ctx context.Context, sz Size) (Shape, bool, error) {
	m, err := s.current(ctx)
	if err != nil {
		return Shape{}, false, fmt.Errorf("size redis state: %w", err)
	}
	next, grew := outgrown(m.Shape, s.cfg.shape(sz, s.shardCount()))
	return next, grew, nil
}

// outgrown returns cur with the counts of want that passed the growth
// thresholds, and whether there were any.
func outgrown(cur, want Shape) (Shape, bool) {
	next, grew := cur, false
	if want.LeftBuckets >= growBuckets*cur.LeftBuckets {
		next.LeftBuckets, grew = want.LeftBuckets, true
	}
	if want.RightBuckets >= growBuckets*cur.RightBuckets {
		next.RightBuckets, grew = want.RightBuckets, true
	}
	lanes := map[byte]int{}
	for _, f := range cur.Fans {
		if f.Lanes > 1 {
			lanes[f.Prefix] = int(f.Lanes)
		}
	}
	for _, f := range want.Fans {
		if f.Lanes > 1 && int(f.Lanes) >= growLanes*max(lanes[f.Prefix], 1) {
			lanes[f.Prefix], grew = int(f.Lanes), true
		}
	}
	if !grew {
		return cur, false
	}
	// At most maxFans fans: the ones with the most lanes.
	prefixes := slices.SortedFunc(maps.Keys(lanes), func(a, b byte) int { return lanes[b] - lanes[a] })
	prefixes = prefixes[:min(len(prefixes), maxFans)]
	slices.Sort(prefixes)
	next.Fans = Fans{}
	for i, b := range prefixes {
		next.Fans[i] = Fan{Prefix: b, Lanes: uint16(lanes[b])}
	}
	return next, true
}

// ResizeStats is what a Resize moved: the rows and subscriptions it read
// and wrote to their new keys, and the keys it copied whole (COPY, on the
// server) because their contents stay together.
type ResizeStats struct {
	Rows, Subscriptions, Copied int
}

// Resize moves the state to shape sh (from Outgrown): it writes every row
// and subscription of the sides whose counts change to new generations,
// laid out for sh, and then makes them current and sh the layout in one
// write of the meta hash, which on a cluster goes through the shards'
// commit protocol like any other. fkLen returns the length of the foreign
// key a subscription's member starts with (FK ++ PK), to find its lane.
//
// Nothing else may write the state meanwhile: the daemon calls it between
// two batches, with none in flight. It refuses a state with a partial
// transaction in flight. Until the switch the state is the old one, and a
// crash leaves it so: the new generations are kept from Sweep by the meta
// field resize, which Recover clears, and are garbage after that. The old
// generations are garbage after the switch; Sweep deletes them.
func (s *Store) Resize(ctx context.Context, sh Shape, fkLen func(member string) (int, error)) (ResizeStats, error) {
	var st ResizeStats
	defer s.right.drop()
	cur, err := s.current(ctx)
	if err != nil {
		return st, fmt.Errorf("resize redis state: %w", err)
	}
	if cur.InFlight != 0 {
		return st, fmt.Errorf("resize redis state: %w", inFlightError(cur.InFlight))
	}
	sh.SubShards, sh.Shards = cur.Shape.SubShards, cur.Shape.Shards
	if sh == cur.Shape {
		return st, nil
	}
	next := cur
	next.Shape, next.Layout = sh, sh.layout()
	rehashRows, rehashSubs := sh.LeftBuckets != cur.Shape.LeftBuckets, sh.Fans != cur.Shape.Fans
	leftMoves, rightMoves := rehashRows || rehashSubs, sh.RightBuckets != cur.Shape.RightBuckets
	if leftMoves {
		next.LeftGen = newGen(cur.LeftGen)
		next.Resizing[0] = next.LeftGen
	}
	if rightMoves {
		next.RightGen = newGen(cur.RightGen)
		next.Resizing[1] = next.RightGen
	}
	marked := fmt.Sprintf("%d,%d", next.Resizing[0], next.Resizing[1])
	if err := s.rdb.HSet(ctx, s.keys.meta(), fieldResize, marked).Err(); err != nil {
		return st, fmt.Errorf("resize redis state: %w", err)
	}
	fail := func(err error) (ResizeStats, error) {
		// The new generations become garbage for Sweep.
		_ = s.forgetResize(context.WithoutCancel(ctx))
		return st, fmt.Errorf("resize redis state: %w", err)
	}
	l := &Loader{s: s, meta: next, limit: DefaultLoadBytes, moving: true}
	// take reports whether the key of kind, gen and bucket moves and was
	// not taken before, and whether it is rehashed (else copied whole);
	// it marks it taken. SCAN may return a key twice (the keyspace grows
	// meanwhile): each bucket is moved once.
	taken := map[byte]*bitset{kindLeft: newBitset(cur.Shape.LeftBuckets), kindRight: newBitset(cur.Shape.RightBuckets),
		kindSubs: newBitset(cur.Shape.SubShards)}
	take := func(kind byte, gen, bucket uint64) (moves, rehash bool) {
		switch {
		case kind == kindLeft && gen == cur.LeftGen:
			moves, rehash = leftMoves, rehashRows
		case kind == kindSubs && gen == cur.LeftGen:
			moves, rehash = leftMoves, rehashSubs
		case kind == kindRight && gen == cur.RightGen:
			moves, rehash = rightMoves, true
		}
		if !moves || !taken[kind].add(bucket) {
			return false, false
		}
		return true, rehash
	}
	var mu sync.Mutex // the primaries are scanned concurrently
	err = s.scanPages(ctx, func(ctx context.Context, c redis.Cmdable, keys []string) error {
		mu.Lock()
		defer mu.Unlock()
		return s.movePage(ctx, c, l, keys, take, fkLen, &st)
	})
	if err == nil {
		err = l.Flush(ctx)
	}
	if err == nil && rehashSubs && cur.Subscriptions >= 0 && int64(st.Subscriptions) != cur.Subscriptions {
		err = fmt.Errorf("moved %d subscriptions, the state counts %d; was it written meanwhile, or did a slot move?", st.Subscriptions, cur.Subscriptions)
	}
	if s.afterMove != nil {
		s.afterMove()
	}
	if err == nil && s.Cluster() {
		// A key that a slot migration moved from a primary not yet
		// scanned to one already scanned was missed: a second scan
		// finds every key of the old generations not taken.
		err = s.scanPages(ctx, func(_ context.Context, _ redis.Cmdable, keys []string) error {
			mu.Lock()
			defer mu.Unlock()
			for _, k := range keys {
				if kind, gen, bucket, ok := s.keys.parseKey(k); ok {
					if missed, _ := take(kind, gen, bucket); missed {
						return fmt.Errorf("key %s was not moved (a slot migrated meanwhile?); the resize is tried again later", k)
					}
				}
			}
			return nil
		})
	}
	if err != nil {
		return fail(err)
	}
	err = s.writeUnit(ctx, unitWrite{
		what: "resize redis state", name: "resize",
		prepare: func(_ context.Context, _ *redis.Tx, stored Meta) (Meta, *writes, int64, error) {
			if stored.LeftGen != cur.LeftGen || stored.RightGen != cur.RightGen || stored.InFlight != 0 ||
				stored.Checkpoint != cur.Checkpoint || stored.Resizing != next.Resizing {
				return Meta{}, nil, 0, errors.New("the state was written while it was resized")
			}
			n := stored
			n.Shape, n.Layout, n.LeftGen, n.RightGen, n.Resizing = next.Shape, next.Layout, next.LeftGen, next.RightGen, [2]uint64{}
			w := newWrites()
			return n, &w, 0, nil
		},
		before: func(ctx context.Context, p redis.Pipeliner, _, _ Meta) {
			p.HDel(ctx, s.keys.meta(), fieldResize)
		},
		metaFields: func(n Meta) []any {
			return []any{fieldLayout, n.Layout, fieldLeftGen, n.LeftGen, fieldRightGen, n.RightGen}
		},
	})
	if err != nil {
		return fail(err)
	}
	return st, nil
}

// movePage moves the keys of one SCAN page that Resize moves: the ones
// whose contents keep together are copied on the server, the others read
// and gathered in l under their new keys.
func (s *Store) movePage(ctx context.Context, c redis.Cmdable, l *Loader, keys []string,
	take func(kind byte, gen, bucket uint64) (moves, rehash bool), fkLen func(string) (int, error), st *ResizeStats) error {
	type read struct {
		kind byte
		rows *redis.MapStringStringCmd
		subs *redis.StringSliceCmd
	}
	var reads []read
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			kind, gen, bucket, ok := s.keys.parseKey(k)
			if !ok {
				continue
			}
			moves, rehash := take(kind, gen, bucket)
			switch {
			case !moves:
			case !rehash:
				// Same bucket, new generation: same shard tag, same slot.
				p.Copy(ctx, k, s.keys.name(kind, l.meta.gen(kind), bucket), 0, true)
				st.Copied++
			case kind == kindSubs:
				reads = append(reads, read{kind: kind, subs: p.ZRange(ctx, k, 0, -1)})
			default:
				reads = append(reads, read{kind: kind, rows: p.HGetAll(ctx, k)})
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	sh := l.meta.Shape
	for _, r := range reads {
		if r.kind == kindSubs {
			for _, member := range r.subs.Val() {
				n, err := fkLen(member)
				if err != nil {
					return fmt.Errorf("subscription %q: %w", member, err)
				}
				l.gather(kindSubs, subShard(sh, member[:n], member[n:]), "", member)
				st.Subscriptions++
			}
			continue
		}
		buckets := sh.LeftBuckets
		if r.kind == kindRight {
			buckets = sh.RightBuckets
		}
		for field, value := range r.rows.Val() {
			l.gather(r.kind, shardOf(field, uint64(buckets)), field, value)
			st.Rows++
		}
	}
	return l.flushFull(ctx)
}

// bitset is a set of buckets 0..n-1.
type bitset []uint64

func newBitset(n int) *bitset {
	b := make(bitset, (n+63)/64)
	return &b
}

// add adds i and reports whether it was absent; i out of range is never
// added.
func (b *bitset) add(i uint64) bool {
	if i/64 >= uint64(len(*b)) {
		return false
	}
	w, bit := &(*b)[i/64], uint64(1)<<(i%64)
	if *w&bit != 0 {
		return false
	}
	*w |= bit
	return true
}
