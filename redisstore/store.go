package redisstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

var _ join.StateReader = (*Store)(nil)

// Errors reported by Store.
var (
	// ErrNoState means the store holds no state (no meta hash): it was never
	// initialised, or Redis lost it. Call Init and rebuild.
	ErrNoState = errors.New("redis state is not initialised")
	// ErrLayout means the state was written with another key layout (shard
	// counts or encoding version) than the store's Config. Call Init and
	// rebuild, or restore the previous shard counts.
	ErrLayout = errors.New("redis state has another layout")
	// ErrEpoch means the state's epoch changed under the store: another
	// process re-initialised it. Reopen the store.
	ErrEpoch = errors.New("redis state epoch changed")
	// ErrInFlight means a large transaction written by CommitPartial is
	// neither finished nor rolled back: call FinishPartial once it is
	// committed in the target, or Recover to roll it back.
	ErrInFlight = errors.New("a partial transaction is in flight")
	// ErrNotInFlight means FinishPartial found no partial transaction to
	// finish: it was rolled back by Recover (replay it), or never started.
	ErrNotInFlight = errors.New("no partial transaction is in flight")
)

// Meta is the store's metadata, kept in the hash <prefix>:meta.
type Meta struct {
	// Epoch identifies this incarnation of the state; it is chosen when the
	// state is initialised. The daemon stores it in the target database too:
	// a different or missing epoch in Redis means lost or foreign state.
	Epoch string
	// Fingerprint is the caller's fingerprint of the join configuration the
	// state was built for.
	Fingerprint string
	// Layout names the key layout and row encoding: the version and the
	// Shape, chosen at Init.
	Layout string
	// Shape is the shape the layout names; zero when the layout is not of
	// this version.
	Shape Shape
	// Checkpoint is the LSN of the last committed batch, 0 after Init.
	Checkpoint wal.LSN
	// LeftGen and RightGen are the current generations of the left side (left
	// rows and subscriptions) and of the right side (right rows). A Clear
	// bumps one; keys of other generations are garbage for Sweep.
	LeftGen, RightGen uint64
	// InFlight is the id of the large transaction written in part by
	// CommitPartial and not yet finished (FinishPartial) or rolled back
	// (Recover); 0 when there is none.
	InFlight wal.LSN
	// Subscriptions is the number of subscriptions in the current left
	// generation, kept exact by every write in the meta field subs, so that
	// it is known without scanning the subscription sets; -1 when unknown: a
	// state written before the counter existed, until the next Init or left
	// Clear starts it from 0. While a partial transaction is in flight it
	// counts the chunks written so far; Recover restores it.
	Subscriptions int64
	// Write is the id of the last write on a Redis Cluster, which every
	// shard's checkpoint must reach (see cluster.go); "" on one server.
	Write string
	// Resizing are the left and right generations a Resize is filling
	// (0: none), which Sweep spares until the resize switches to them or
	// Recover forgets them.
	Resizing [2]uint64
}

// Fields of the meta hash.
const (
	fieldEpoch       = "epoch"
	fieldFingerprint = "fingerprint"
	fieldLayout      = "layout"
	fieldCheckpoint  = "checkpoint"
	fieldLeftGen     = "gen_left"
	fieldRightGen    = "gen_right"
	fieldInFlight    = "inflight"
	fieldSubs        = "subs"
	fieldWrite       = "write"
	fieldResize      = "resize"
	// fieldGenChanges counts the writes that may have left keys of a
	// generation no longer in use (a Clear, the first chunk of a partial
	// transaction that clears, a Resize's switch or abandonment; a Recover
	// deletes what the chunks wrote, and the count is never restored, so
	// that a value is never seen twice). Sweep records the epoch and the
	// count when it last went through the whole keyspace (keys.swept);
	// equal, there is no garbage to look for.
	fieldGenChanges = "gen_changes"
)

var metaFields = []string{fieldEpoch, fieldFingerprint, fieldLayout, fieldCheckpoint, fieldLeftGen, fieldRightGen, fieldInFlight, fieldSubs, fieldWrite, fieldResize}

// Store keeps one join's state in Redis: subscriptions, left and right rows
// and the meta hash. It implements join.StateReader; Commit persists a
// batch's join.Mutations. Reads and Commit are meant for one goroutine (the
// daemon's batch loop); Sweep and Meta may run concurrently with them.
type Store struct {
	rdb  redis.UniversalClient
	cfg  Config
	keys keys

	mu sync.Mutex
	// meta is the cached meta hash; nil when unknown (not initialised, or
	// unsure after a failed commit: reload before use).
	meta *Meta
	// broken is set when a commit was applied in part; the state must be
	// rebuilt.
	broken error
	// resumed is set once the last write on a cluster is known to be
	// applied on every shard (see beginUnit).
	resumed bool
	// waitShort counts the writes whose WAIT for Config.WaitReplicas ended
	// with fewer replicas, or failed.
	waitShort    atomic.Int64
	waitShortWhy atomic.Pointer[string]

	// unitMu serialises the writes on a cluster (see cluster.go).
	unitMu sync.Mutex
	// beforeApply, when set by tests, runs before a write's second step
	// on each shard: an error skips the shard and fails the write, as a
	// crash between two shards' commits would.
	beforeApply func(shard int) error
	// dumpVersion, when set by tests, is the RDB version of the backfill's
	// RESTORE payloads (0: rdbVersion): a higher one than the server's is
	// refused as Redis 6.2 refuses 7.0's.
	dumpVersion uint16

	// right caches right rows (see rightCache).
	right *rightCache
	// planners holds the planner commits borrow (see takePlanner).
	planners chan *planner
	// beforeFill, when set by tests, runs in GetRight between the Redis
	// read and the cache fill.
	beforeFill func()

	// beforeExec, when set by tests, runs after a commit's commands are
	// queued and before EXEC.
	beforeExec func(context.Context, redis.Pipeliner)
	// afterMove, when set by tests, runs in Resize between the move of
	// the keys and the check that none was missed.
	afterMove func()
	// afterRestore, when set by tests, runs after each page Recover restores,
	// with the number of undo entries in it; an error stops Recover there.
	afterRestore func(entries int) error
}

// Open returns a store for the join whose keys start with cfg.Prefix, and
// loads its meta hash. A store without state (ErrNoState) or with another
// layout (ErrLayout) opens fine; it must be initialised with Init before use.
// The client addresses one Redis server (standalone, or a primary found
// through Sentinel) or a Redis Cluster (*redis.ClusterClient): the state is
// then split into Config.Shards shards, written as cluster.go describes.
// Ring clients are refused: they have no atomic writes at all.
func Open(ctx context.Context, rdb redis.UniversalClient, cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("open redis store: %w", err)
	}
	if _, ok := rdb.(*redis.Ring); ok {
		return nil, errors.New("open redis store: a Redis Ring client is not supported: use one server (with Sentinel for failover) or a Redis Cluster")
	}
	cfg = cfg.WithDefaults()
	k := newKeys(cfg)
	if _, ok := rdb.(*redis.ClusterClient); ok {
		k = newClusterKeys(cfg, cfg.Shards)
	}
	s := &Store{rdb: rdb, cfg: cfg, keys: k, right: newRightCache(cfg.RightCacheBytes), planners: make(chan *planner, 1)}
	if _, err := s.load(ctx); err != nil && !errors.Is(err, ErrNoState) {
		return nil, fmt.Errorf("open redis store: %w", err)
	}
	return s, nil
}

// Config returns the store's configuration, defaults filled.
func (s *Store) Config() Config { return s.cfg }

// CheckLayout reports, as an ErrLayout, why the store cannot use a state of
// meta m: a layout of another version (an older fkmat), or other counts
// than its Config sets.
func (s *Store) CheckLayout(m Meta) error {
	if err := s.cfg.accepts(m.Layout, s.shardCount()); err != nil {
		return fmt.Errorf("%w: %w", ErrLayout, err)
	}
	return nil
}

// Serving returns the configuration under which a store serves the existing
// state of meta m although CheckLayout refuses it: a state of this layout
// version with other counts than the Config sets (an older fkmat's sizing,
// other sub_shards or row_shards options). It fails when the state cannot
// be served at all (another layout version, another Redis topology). A
// daemon serves such a state while it builds one of its own layout beside
// it, and switches to that one once it has caught up.
func (s *Store) Serving(m Meta) (Config, error) {
	sh, err := parseLayout(m.Layout)
	if err != nil {
		return s.cfg, fmt.Errorf("%w: %w", ErrLayout, err)
	}
	if sh.Shards != s.shardCount() {
		return s.cfg, s.CheckLayout(m)
	}
	c := s.cfg
	c.SubShards, c.RowShards = sh.SubShards, 0
	if sh.LeftBuckets == sh.RightBuckets {
		c.RowShards = sh.LeftBuckets
	}
	return c, nil
}

// shardCount returns the number of shards of the store on a cluster, 0 on
// one server.
func (s *Store) shardCount() int {
	if s.keys.shards == nil {
		return 0
	}
	return s.keys.shards.n
}

// Cluster reports whether the store is on a Redis Cluster.
func (s *Store) Cluster() bool { return s.keys.shards != nil }

// NewEpoch returns a fresh random epoch for Init.
func NewEpoch() string { return rand.Text() }

// Meta reads the meta hash from Redis and returns it; it fails with
// ErrNoState when there is none (or when a failed commit marked the state
// lost). The daemon compares its Epoch with the one it keeps in the target
// database and its Fingerprint with the configuration's.
func (s *Store) Meta(ctx context.Context) (Meta, error) {
	return readMeta(ctx, s.rdb, s.keys.meta())
}

// waitReplicas runs WAIT on c, the connection that has just written, when
// the store waits for replicas (Config.WaitReplicas). A wait that ends with
// fewer replicas, or fails, counts in WaitShort: the write stands, but a
// failover of that primary may lose it (and the state is then rebuilt).
func (s *Store) waitReplicas(ctx context.Context, c waiter) {
	if s.cfg.WaitReplicas == 0 {
		return
	}
	s.waited("meta", c.Wait(ctx, s.cfg.WaitReplicas, s.cfg.WaitTimeout))
}

// waited counts a WAIT that came short in WaitShort and keeps why in
// LastWaitShort; wait is nil when the write could not wait at all.
func (s *Store) waited(where string, wait *redis.IntCmd) {
	var why string
	switch {
	case wait == nil:
		why = where + ": written through a redirect, not waited for"
	case wait.Err() != nil:
		why = fmt.Sprintf("%s: WAIT %d %d: %v", where, s.cfg.WaitReplicas, s.cfg.WaitTimeout.Milliseconds(), wait.Err())
	case wait.Val() < int64(s.cfg.WaitReplicas):
		why = fmt.Sprintf("%s: %d of %d replicas confirmed within %s", where, wait.Val(), s.cfg.WaitReplicas, s.cfg.WaitTimeout)
	default:
		return
	}
	s.waitShort.Add(1)
	s.waitShortWhy.Store(&why)
}

// LastWaitShort says why the last write counted in WaitShort came short,
// or "" when none has.
func (s *Store) LastWaitShort() string {
	if why := s.waitShortWhy.Load(); why != nil {
		return *why
	}
	return ""
}

// waiter is a connection, or a pipeline on one, that can send WAIT.
type waiter interface {
	Wait(ctx context.Context, numReplicas int, timeout time.Duration) *redis.IntCmd
}

// WaitShort returns how many writes of this process waited for fewer
// replicas than Config.WaitReplicas asks (a timeout or an error), or could
// not wait at all (a shard written through a redirect during a slot
// migration or a failover).
func (s *Store) WaitShort() int64 { return s.waitShort.Load() }

// Key kinds KeyKind reports.
const (
	KindLeft  = kindLeft  // left rows
	KindRight = kindRight // right rows
	KindSubs  = kindSubs  // subscriptions
)

// KeyKind returns the kind (KindLeft, KindRight, KindSubs) of a data key of
// the store, of any generation, and false for any other key (meta, undo,
// redo, checkpoints): for tools and benchmarks that account the state's
// memory without parsing key names themselves.
func (s *Store) KeyKind(key string) (byte, bool) {
	kind, _, ok := s.keys.parse(key)
	return kind, ok
}

// MetaKey returns the key of the meta hash (epoch, fingerprint, layout,
// checkpoint): for tools and tests that inspect or damage the state without
// building key names themselves.
func (s *Store) MetaKey() string { return s.keys.meta() }

// load reads the meta hash and caches it for reads and commits.
func (s *Store) load(ctx context.Context) (Meta, error) {
	m, err := readMeta(ctx, s.rdb, s.keys.meta())
	if err != nil {
		return Meta{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.meta = &m
	return m, nil
}

// Checkpoint returns the LSN of the last batch committed through this store,
// or found committed when it was opened; 0 when unknown.
func (s *Store) Checkpoint() wal.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.meta == nil {
		return 0
	}
	return s.meta.Checkpoint
}

// InFlight returns the id of the partial transaction in flight as last seen
// by this store (see CommitPartial), or 0; Meta reads it from Redis.
func (s *Store) InFlight() wal.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.meta == nil {
		return 0
	}
	return s.meta.InFlight
}

// Init (re)initialises the state: it records epoch (see NewEpoch),
// fingerprint and the layout, with row buckets sized for size unless the
// Config sets their count, sets the checkpoint and the
// subscription count to 0 and starts new, empty generations for both sides,
// atomically. A partial transaction
// in flight is forgotten with its undo log. Existing data becomes garbage
// that Sweep deletes; Init itself is O(1).
func (s *Store) Init(ctx context.Context, epoch, fingerprint string, size Size) error {
	defer s.right.drop()
	if epoch == "" {
		return errors.New("init redis state: empty epoch")
	}
	key := s.keys.meta()
	var (
		m  Meta
		rd *redo
	)
	shape := s.cfg.shape(size, s.shardCount())
	if s.Cluster() {
		// No resume first: Init forces every shard to its new checkpoint.
		s.unitMu.Lock()
		defer s.unitMu.Unlock()
	}
	err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		old, err := readMeta(ctx, tx, key)
		if err != nil && !errors.Is(err, ErrNoState) {
			return err
		}
		// Random generations: keys left over from a state whose meta hash
		// was lost must not be mistaken for the new state's.
		m = Meta{
			Epoch: epoch, Fingerprint: fingerprint, Layout: shape.layout(), Shape: shape,
			LeftGen: newGen(old.LeftGen), RightGen: newGen(old.RightGen),
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, key)
			p.HSet(ctx, key, metaArgs(m)...)
			p.Unlink(ctx, s.keys.undo())
			if s.Cluster() {
				var err error
				rd, err = s.stage(ctx, p, newWrites(), &m, true)
				return err
			}
			return nil
		})
		return err
	}, key)
	if err != nil {
		return fmt.Errorf("init redis state: %w", err)
	}
	s.mu.Lock()
	s.meta, s.broken, s.resumed = &m, nil, true
	s.mu.Unlock()
	if _, _, err := s.finishUnit(ctx, rd); err != nil {
		return fmt.Errorf("init redis state: %w", err)
	}
	return nil
}

// newGen returns a random generation other than old.
func newGen(old uint64) uint64 {
	for {
		if g := mrand.Uint64N(1<<32-1) + 1; g != old {
			return g
		}
	}
}

func metaArgs(m Meta) []any {
	args := []any{
		fieldEpoch, m.Epoch, fieldFingerprint, m.Fingerprint, fieldLayout, m.Layout,
		fieldCheckpoint, strconv.FormatUint(uint64(m.Checkpoint), 10),
		fieldLeftGen, strconv.FormatUint(m.LeftGen, 10),
		fieldRightGen, strconv.FormatUint(m.RightGen, 10),
	}
	return appendSubs(args, m.Subscriptions)
}

// appendSubs appends to HSET arguments of the meta hash the subscription
// count n, unless it is unknown (negative): the field stays absent then.
func appendSubs(args []any, n int64) []any {
	if n < 0 {
		return args
	}
	return append(args, fieldSubs, strconv.FormatInt(n, 10))
}

// parseSubs parses the subs field of the meta hash ("" when absent). An
// absent field (a state from before the counter) and a value no write of
// this package produces are both unknown: status then says so rather than
// printing a wrong number, and the failure of a statistic stops nothing.
func parseSubs(v string) int64 {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// readMeta reads and parses the meta hash at key.
func readMeta(ctx context.Context, c redis.Cmdable, key string) (Meta, error) {
	vals, err := c.HMGet(ctx, key, metaFields...).Result()
	if err != nil {
		return Meta{}, fmt.Errorf("read redis meta: %w", err)
	}
	str := make([]string, len(vals))
	present := 0
	for i, v := range vals {
		if v, ok := v.(string); ok {
			str[i] = v
			present++
		}
	}
	if present == 0 {
		return Meta{}, ErrNoState
	}
	if str[0] == "" {
		// Commit drops the epoch when it damaged the state.
		return Meta{}, fmt.Errorf("%w: meta hash %s has no epoch", ErrNoState, key)
	}
	m := Meta{Epoch: str[0], Fingerprint: str[1], Layout: str[2], Subscriptions: parseSubs(str[7]), Write: str[8]}
	m.Shape, _ = parseLayout(m.Layout) // zero for another version: current refuses it
	var checkpoint, inFlight uint64
	for i, dst := range []*uint64{&checkpoint, &m.LeftGen, &m.RightGen, &inFlight} {
		f := str[3+i]
		if f == "" && metaFields[3+i] == fieldInFlight {
			continue // absent: no partial transaction
		}
		if *dst, err = strconv.ParseUint(f, 10, 64); err != nil {
			return Meta{}, fmt.Errorf("read redis meta %s: field %s is %q", key, metaFields[3+i], f)
		}
	}
	m.Checkpoint, m.InFlight = wal.LSN(checkpoint), wal.LSN(inFlight)
	if str[9] != "" {
		if _, err := fmt.Sscanf(str[9], "%d,%d", &m.Resizing[0], &m.Resizing[1]); err != nil {
			return Meta{}, fmt.Errorf("read redis meta %s: field %s is %q", key, fieldResize, str[9])
		}
	}
	return m, nil
}

// current returns the cached meta, reloading it when unknown, and checks
// that the store can be used.
func (s *Store) current(ctx context.Context) (Meta, error) {
	s.mu.Lock()
	m, broken := s.meta, s.broken
	s.mu.Unlock()
	if broken != nil {
		return Meta{}, broken
	}
	if m == nil {
		mm, err := s.load(ctx)
		if err != nil {
			return Meta{}, err
		}
		m = &mm
	}
	if err := s.CheckLayout(*m); err != nil {
		return Meta{}, fmt.Errorf("%w; re-initialise the state", err)
	}
	return *m, nil
}

// GetLeft returns the stored left rows of keys, in one pipelined round trip.
// Absent keys are missing from the map.
func (s *Store) GetLeft(ctx context.Context, keys []join.Key) (map[join.Key]join.LeftState, error) {
	m, err := s.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("get left rows: %w", err)
	}
	out := join.NewLeftMap(len(keys))
	err = s.hgetAll(ctx, keys, func(k join.Key) string { return s.keys.left(m, string(k)) },
		func(k join.Key, v string) error {
			st, err := decodeLeft(string(k), v)
			if err == nil {
				out[k] = st
			}
			return err
		})
	if err != nil {
		return nil, fmt.Errorf("get left rows: %w", err)
	}
	return out, nil
}

// GetRight returns the stored right rows of keys: those in the cache of
// right rows from it, the others in one pipelined round trip. Absent keys
// are missing from the map.
func (s *Store) GetRight(ctx context.Context, keys []join.Key) (map[join.Key]join.RightState, error) {
	m, err := s.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("get right rows: %w", err)
	}
	out := join.NewRightMap(len(keys))
	misses, start := s.right.lookup(m.RightGen, keys, out)
	if len(misses) == 0 {
		return out, nil
	}
	defer func() {
		if err == nil {
			if s.beforeFill != nil {
				s.beforeFill()
			}
			s.right.fill(m.RightGen, start, misses, out)
		}
	}()
	err = s.hgetAll(ctx, misses, func(k join.Key) string { return s.keys.right(m, string(k)) },
		func(k join.Key, v string) error {
			st, err := decodeRight(string(k), v)
			if err == nil {
				out[k] = st
			}
			return err
		})
	if err != nil {
		return nil, fmt.Errorf("get right rows: %w", err)
	}
	return out, nil
}

// hgetAll reads field k of hash bucket(k) for every distinct key in one
// pipeline and calls found for those present.
func (s *Store) hgetAll(ctx context.Context, keys []join.Key, bucket func(join.Key) string, found func(join.Key, string) error) error {
	if len(keys) == 0 {
		return nil
	}
	sc := hgetScratches.Get().(*hgetScratch)
	defer sc.release()
	seen, ks := sc.seen, sc.ks[:0]
	for _, k := range keys {
		if _, dup := seen[k]; !dup {
			seen[k] = struct{}{}
			ks = append(ks, k)
		}
	}
	sc.ks = ks
	// Each command's arguments: "hget", then its hash and field by pointer
	// into one slice (an interface holds a pointer without an allocation).
	strs := slices.Grow(sc.strs[:0], 2*len(ks))[:2*len(ks)]
	args := slices.Grow(sc.args[:0], 3*len(ks))[:3*len(ks)]
	cmds := slices.Grow(sc.cmds[:0], len(ks))[:len(ks)]
	sc.strs, sc.args, sc.cmds = strs, args, cmds
	for i, k := range ks {
		strs[2*i], strs[2*i+1] = bucket(k), string(k)
		args[3*i], args[3*i+1], args[3*i+2] = "hget", &strs[2*i], &strs[2*i+1]
	}
	err := retryRead(ctx, s.rdb, func() error {
		p := s.rdb.Pipeline()
		for i := range ks {
			cmds[i] = redis.NewStringCmd(ctx, args[3*i:3*i+3:3*i+3]...)
			_ = p.Process(ctx, cmds[i])
		}
		_, _ = p.Exec(ctx)
		// Exec returns the first command's error, which may be a key's
		// absence (redis.Nil) before a connection error.
		for _, c := range cmds {
			if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, c := range cmds {
		v, err := c.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return err
		}
		if err := found(ks[i], v); err != nil {
			return fmt.Errorf("key %x: %w", string(ks[i]), err)
		}
	}
	return nil
}

// hgetScratch is what one hgetAll works in, kept from call to call.
type hgetScratch struct {
	seen map[join.Key]struct{}
	ks   []join.Key
	strs []string
	args []any
	cmds []*redis.StringCmd
}

var hgetScratches = sync.Pool{New: func() any { return &hgetScratch{seen: map[join.Key]struct{}{}} }}

// release empties sc and gives it back, unless it grew too big to keep.
func (sc *hgetScratch) release() {
	if len(sc.ks) > 1<<16 {
		return
	}
	clear(sc.seen)
	clear(sc.ks)
	clear(sc.strs)
	clear(sc.args)
	clear(sc.cmds)
	hgetScratches.Put(sc)
}

// Dependents returns up to limit encoded left keys subscribed to the encoded
// right key fk, in key order, strictly after `after` ("" = from the start),
// with one ZRANGE BYLEX over exclusive bounds: its cost is proportional to
// the page (plus the set's size while it is a listpack of at most 128
// members), never to the number of subscriptions.
func (s *Store) Dependents(ctx context.Context, fk, after join.Key, limit int) ([]join.Key, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("read dependents: limit %d must be positive", limit)
	}
	m, err := s.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("read dependents: %w", err)
	}
	out, err := s.dependentsPages(ctx, m, []join.Key{fk}, []join.Key{after}, []int{limit})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// DependentsMany implements join.ManyDependentsReader: the first page of
// each foreign key, all in one pipeline.
func (s *Store) DependentsMany(ctx context.Context, fks []join.Key, limits []int) ([][]join.Key, error) {
	if len(fks) != len(limits) {
		return nil, fmt.Errorf("read dependents: %d keys, %d limits", len(fks), len(limits))
	}
	m, err := s.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("read dependents: %w", err)
	}
	for _, n := range limits {
		if n <= 0 {
			return nil, fmt.Errorf("read dependents: limit %d must be positive", n)
		}
	}
	return s.dependentsPages(ctx, m, fks, nil, limits)
}

// DependentsAfter implements join.AfterDependentsReader: a page of each
// foreign key after its own member, all in one pipeline.
func (s *Store) DependentsAfter(ctx context.Context, fks, afters []join.Key, limit int) ([][]join.Key, error) {
	if len(fks) != len(afters) {
		return nil, fmt.Errorf("read dependents: %d keys, %d cursors", len(fks), len(afters))
	}
	if limit <= 0 {
		return nil, fmt.Errorf("read dependents: limit %d must be positive", limit)
	}
	m, err := s.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("read dependents: %w", err)
	}
	limits := make([]int, len(fks))
	for i := range limits {
		limits[i] = limit
	}
	return s.dependentsPages(ctx, m, fks, afters, limits)
}

// dependentsPages reads a page of dependents of each fks[i], after
// afters[i] (nil: from the start), in one pipeline.
func (s *Store) dependentsPages(ctx context.Context, m Meta, fks, afters []join.Key, limits []int) ([][]join.Key, error) {
	// One range read per set of each key: one, or one per lane of its fan.
	cmds := make([][]*redis.StringSliceCmd, len(fks))
	err := retryRead(ctx, s.rdb, func() error {
		p := s.rdb.Pipeline()
		for i, fk := range fks {
			var after join.Key
			if afters != nil {
				after = afters[i]
			}
			lo, hi := depRange(fk, after)
			sets := s.keys.subsOf(m, string(fk))
			cmds[i] = make([]*redis.StringSliceCmd, len(sets))
			for j, set := range sets {
				cmds[i][j] = p.ZRangeArgs(ctx, redis.ZRangeArgs{Key: set, Start: lo, Stop: hi, ByLex: true, Count: int64(limits[i])})
			}
		}
		_, err := p.Exec(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read dependents: %w", err)
	}
	out := make([][]join.Key, len(fks))
	for i, fk := range fks {
		members := cmds[i][0].Val()
		if len(cmds[i]) > 1 {
			// Each lane's page holds its smallest members after the
			// cursor: the smallest of all of them are the key's.
			members = nil
			for _, c := range cmds[i] {
				members = append(members, c.Val()...)
			}
			slices.Sort(members)
			members = members[:min(len(members), limits[i])]
		}
		pks, err := memberKeys(fk, members)
		if err != nil {
			return nil, err
		}
		out[i] = pks
	}
	return out, nil
}

// memberKeys strips fk from sorted-set members read for it.
func memberKeys(fk join.Key, members []string) ([]join.Key, error) {
	pks := make([]join.Key, len(members))
	for i, mem := range members {
		if len(mem) <= len(fk) || mem[:len(fk)] != string(fk) {
			return nil, fmt.Errorf("read dependents: member %x outside the range of foreign key %x", mem, string(fk))
		}
		pks[i] = join.Key(mem[len(fk):])
	}
	return pks, nil
}

// depRange returns the exclusive ZRANGE BYLEX bounds of the members of fk
// after the member fk ++ after. The members of fk are exactly the strings
// with prefix fk since keys are prefix-free; a member is never fk itself, as
// a subscription's primary key is never empty.
func depRange(fk, after join.Key) (lo, hi string) {
	lo = "(" + string(fk) + string(after)
	end := join.PrefixEnd([]byte(fk))
	if end == nil {
		return lo, "+"
	}
	return lo, "(" + string(end)
}
