package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// On a Redis Cluster a MULTI/EXEC or a script may touch one hash slot only,
// so the store cannot commit a batch in one transaction as it does on one
// server. It splits the state into Config.Shards shards instead, each a
// group of keys under one hash tag (one slot), and commits every write in
// two steps:
//
//  1. The commit point: one MULTI/EXEC in the meta slot (the meta hash, the
//     undo log and the redo record share a hash tag) writes the meta fields,
//     a new write sequence number (Meta.Seq) and the redo record: the
//     sequence number and, per shard, the commands of the write on that
//     shard's keys.
//  2. Each shard applies its part with one script, atomic in its slot,
//     guarded by the shard's checkpoint key (<epoch>:<seq> of the last write
//     it applied): it applies the part only when the checkpoint is that of
//     the write before, does nothing when it is already this write's, and
//     reports anything else as lost state. Every shard takes part in every
//     write, if only to move its checkpoint, so a shard that a failover set
//     back is seen at the next write.
//
// Writes are serialised in the store (unitMu): a write's second step ends on
// every shard before the next write's first step. A crash (or a failed
// step 2) leaves the redo record behind; the next write, and Resume, which
// the daemon calls before it streams, apply it to the shards that missed it
// before anything else. Readers never need the redo: the daemon reads the
// state of batch N+1 through the overlay of batch N's mutations until N is
// committed, and a crash ends every batch in flight.
//
// A failover can lose acknowledged writes of one shard, or of the meta slot.
// Either shows as a checkpoint that is neither the write's nor the one
// before (a shard behind, an empty node, a shard ahead of a meta hash that
// lost its last writes), and the store then fails with ErrLost: the daemon
// rebuilds the state (or refuses, with --on-lost-state refuse).

// ErrLost means a shard of a cluster state is not at the write the meta
// hash says it holds: a failover or a flush lost some of its writes. Rebuild
// the state (Init and a backfill).
var ErrLost = errors.New("redis cluster state lost writes")

// DefaultShards is the number of shards of a state on a Redis Cluster: a
// power of two, so that row buckets and subscription sets (powers of two)
// divide evenly among them, and enough for the shards' slots, spread evenly
// over 0..16383, to split within 5% among 3 to 8 primaries.
const DefaultShards = 64

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// shardTags returns n hash tags whose slots are spread evenly over the
// cluster's slots: tag i hashes into the i-th of n equal slot ranges, so a
// cluster whose primaries hold equal slot ranges holds nearly equal numbers
// of shards on each. They are part of the persistent layout.
func shardTags(n int) []string {
	tags := make([]string, n)
	for i := range tags {
		lo, hi := i*clusterSlots/n, (i+1)*clusterSlots/n
		for j := 0; ; j++ {
			t := strconv.Itoa(i) + "." + strconv.Itoa(j)
			if s := int(crc16(t) % clusterSlots); s >= lo && s < hi {
				tags[i] = t
				break
			}
		}
	}
	return tags
}

// keySlot returns the Redis Cluster hash slot of key: CRC16 of its hash tag
// (the part between the first '{' and the next '}', when not empty) or of
// the whole key.
func keySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % clusterSlots)
}

// crc16 is CRC-16/XMODEM, the hash of Redis Cluster's key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// applyScript applies one shard's part of a write (see the comment at the
// top of this file). KEYS[1] is the shard's checkpoint key, the others the
// data keys of the part. ARGV: the checkpoint before the write, the
// write's, "1" to apply whatever the checkpoint (Init), then the commands,
// each as name, key index, argument count and arguments. It returns
// {0, subscriptions added minus removed} when it applied the part, {1, 0}
// when the shard already had it, and {2, checkpoint found} otherwise.
var applyScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[2] then return {1, 0} end
if ARGV[3] ~= '1' and cur ~= ARGV[1] then return {2, cur or ''} end
local delta = 0
local i = 4
while i <= #ARGV do
  local op, k, n = ARGV[i], KEYS[tonumber(ARGV[i+1])], tonumber(ARGV[i+2])
  local r = redis.call(op, k, unpack(ARGV, i+3, i+2+n))
  if op == 'ZADD' then delta = delta + r elseif op == 'ZREM' then delta = delta - r end
  i = i + 3 + n
end
redis.call('SET', KEYS[1], ARGV[2])
return {0, delta}
`)

// shardPart is one shard's commands of a write.
type shardPart struct {
	keys []string // data keys; KEYS[2..] of the script
	args []string // commands: name, key index (2-based), count, arguments
	idx  map[string]int
}

func (p *shardPart) add(op, key string, args []string) {
	if p.idx == nil {
		p.idx = map[string]int{}
	}
	i, ok := p.idx[key]
	if !ok {
		p.keys = append(p.keys, key)
		i = len(p.keys) + 1
		p.idx[key] = i
	}
	p.args = append(p.args, op, strconv.Itoa(i), strconv.Itoa(len(args)))
	p.args = append(p.args, args...)
}

// encode returns the part as stored in the redo record.
func (p *shardPart) encode() string {
	var b []byte
	b = binary.AppendUvarint(b, uint64(len(p.keys)))
	for _, k := range p.keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
	}
	for _, a := range p.args {
		b = binary.AppendUvarint(b, uint64(len(a)))
		b = append(b, a...)
	}
	return string(b)
}

func decodePart(s string) (*shardPart, error) {
	b := []byte(s)
	next := func() (string, error) {
		n, w := binary.Uvarint(b)
		if w <= 0 || uint64(len(b)-w) < n {
			return "", errors.New("truncated redo part")
		}
		v := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return v, nil
	}
	nk, w := binary.Uvarint(b)
	if w <= 0 || nk > uint64(len(b)) {
		return nil, errors.New("truncated redo part")
	}
	b = b[w:]
	p := &shardPart{keys: make([]string, 0, nk)}
	for range nk {
		k, err := next()
		if err != nil {
			return nil, err
		}
		p.keys = append(p.keys, k)
	}
	for len(b) > 0 {
		a, err := next()
		if err != nil {
			return nil, err
		}
		p.args = append(p.args, a)
	}
	return p, nil
}

// redo is a write's second step: the ids of the write and of the one
// before, and the parts of the shards that have commands (the others only
// move their checkpoints).
type redo struct {
	epoch     string
	prev, cur string
	force     bool
	parts     map[int]*shardPart
}

// Fields of the redo record.
const (
	redoPrev  = "prev"
	redoCur   = "cur"
	redoForce = "force"
)

// newWriteID returns a fresh id for a write: random, so that a write that
// reuses the place of one a failover lost never passes for it.
func newWriteID() string { return rand.Text()[:16] }

// split returns w's commands as shard parts, Config.PageSize members or
// fields per command, removals first, as queue sends them on one server.
func (s *Store) split(w writes) (map[int]*shardPart, error) {
	parts := map[int]*shardPart{}
	part := func(key string) (*shardPart, error) {
		i, ok := s.keys.shardOfKey(key)
		if !ok {
			return nil, fmt.Errorf("key %q is not a data key of a shard", key)
		}
		p := parts[i]
		if p == nil {
			p = &shardPart{}
			parts[i] = p
		}
		return p, nil
	}
	page := s.cfg.PageSize
	emit := func(op string, group map[string][]string, score bool) error {
		for _, k := range slices.Sorted(maps.Keys(group)) {
			p, err := part(k)
			if err != nil {
				return err
			}
			for chunk := range slices.Chunk(group[k], page) {
				args := chunk
				if score {
					args = make([]string, 0, 2*len(chunk))
					for _, m := range chunk {
						args = append(args, "0", m)
					}
				}
				p.add(op, k, args)
			}
		}
		return nil
	}
	if err := emit("ZREM", w.zrem, false); err != nil {
		return nil, err
	}
	if err := emit("HDEL", w.hdel, false); err != nil {
		return nil, err
	}
	if err := emit("ZADD", w.zadd, true); err != nil {
		return nil, err
	}
	for _, k := range slices.Sorted(maps.Keys(w.hset)) {
		p, err := part(k)
		if err != nil {
			return nil, err
		}
		fv := w.hset[k]
		for len(fv) > 0 {
			n := min(len(fv), 2*page)
			p.add("HSET", k, fv[:n:n])
			fv = fv[n:]
		}
	}
	for _, k := range w.unlink {
		p, err := part(k)
		if err != nil {
			return nil, err
		}
		p.add("UNLINK", k, nil)
	}
	return parts, nil
}

// stage queues, in the meta MULTI p of a write that leads to next, the
// write's commit point on a cluster: a new write id in the meta hash and the
// redo record holding w. It sets next.Write and returns the redo to apply
// once EXEC succeeded. force applies the write whatever the shards hold
// (Init).
func (s *Store) stage(ctx context.Context, p redis.Pipeliner, w writes, next *Meta, force bool) (*redo, error) {
	parts, err := s.split(w)
	if err != nil {
		return nil, err
	}
	rd := &redo{epoch: next.Epoch, prev: next.Write, cur: newWriteID(), force: force, parts: parts}
	next.Write = rd.cur
	args := []any{redoPrev, rd.prev, redoCur, rd.cur}
	if force {
		args = append(args, redoForce, "1")
	}
	for i, part := range parts {
		args = append(args, strconv.Itoa(i), part.encode())
	}
	p.HSet(ctx, s.keys.meta(), fieldWrite, rd.cur)
	p.Del(ctx, s.keys.redo())
	p.HSet(ctx, s.keys.redo(), args...)
	return rd, nil
}

// cp returns the value of a shard's checkpoint key at write id of epoch.
func cp(epoch, id string) string { return epoch + ":" + id }

// applyAttempts bounds the rounds of apply: a slot that moves (MOVED, ASK,
// TRYAGAIN during a migration) or a primary that fails over gets this many
// chances, applyBackoff apart and more, before the write fails.
const (
	applyAttempts = 20
	applyBackoff  = 50 * time.Millisecond
)

// errInjected stops apply where a test's beforeApply hook says.
var errInjected = errors.New("injected stop between shards")

// apply runs the second step of rd on every shard and returns the
// subscriptions the shards' ZADDs added minus those their ZREMs removed,
// and whether that count is exact. It fails with ErrLost when a shard is
// neither at the write before rd nor at rd. It is idempotent: a shard that
// has rd already is left alone, so it retries the shards whose script
// failed (a slot moving, a failover).
//
// A shard found at rd already counts nothing, and makes the count inexact:
// its script ran before, in a round whose reply was lost (a read that timed
// out while a slot migrated, a connection cut), or in an earlier process
// (Resume). Its subscriptions are then unknown here.
func (s *Store) apply(ctx context.Context, rd *redo) (delta int64, exact bool, err error) {
	n := s.keys.shards.n
	pending := make([]int, 0, n)
	for i := range n {
		if s.beforeApply != nil && s.beforeApply(i) != nil {
			continue
		}
		pending = append(pending, i)
	}
	injected := len(pending) < n
	exact = true
	var (
		lost    []string
		lastErr error
		noSha   = map[int]bool{}
		// redirected marks the shards whose script failed other than for
		// NOSCRIPT (a slot moving, a failover): they go through the
		// cluster client's routing, which follows MOVED and ASK.
		redirected = map[int]bool{}
	)
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == applyAttempts {
			return delta, false, fmt.Errorf("apply write %s to the shards: %d shards failed %d times, last: %w", rd.cur, len(pending), attempt, lastErr)
		}
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return delta, false, fmt.Errorf("apply write %s to the shards: %w", rd.cur, ctx.Err())
			case <-time.After(applyBackoff * time.Duration(min(attempt, 10))):
			}
		}
		cmds := make([]*redis.Cmd, len(pending))
		queue := func(p redis.Pipeliner, j int) {
			i := pending[j]
			keys := []string{s.keys.cp(i)}
			argv := []any{cp(rd.epoch, rd.prev), cp(rd.epoch, rd.cur), "0"}
			if rd.force {
				argv[2] = "1"
			}
			if part := rd.parts[i]; part != nil {
				keys = append(keys, part.keys...)
				for _, a := range part.args {
					argv = append(argv, a)
				}
			}
			if noSha[i] {
				cmds[j] = applyScript.Eval(ctx, p, keys, argv...)
			} else {
				cmds[j] = applyScript.EvalSha(ctx, p, keys, argv...)
			}
		}
		s.applyRound(ctx, pending, redirected, queue) // each command's own error is looked at below
		var again []int
		for j, i := range pending {
			res, err := cmds[j].Slice()
			if err != nil {
				if redis.HasErrorPrefix(err, "NOSCRIPT") {
					noSha[i] = true
				} else {
					lastErr = err
					redirected[i] = true
				}
				again = append(again, i)
				continue
			}
			code, _ := res[0].(int64)
			switch code {
			case 0:
				d, _ := res[1].(int64)
				delta += d
			case 1:
				exact = false
			default:
				found, _ := res[1].(string)
				if found == "" {
					found = "nothing"
				}
				lost = append(lost, fmt.Sprintf("shard %d (key %s) holds %s", i, s.keys.cp(i), found))
			}
		}
		pending = again
	}
	if len(lost) > 0 {
		slices.Sort(lost)
		return delta, false, fmt.Errorf("%w: the meta hash is at write %s, but %s", ErrLost, cp(rd.epoch, rd.cur),
			strings.Join(lost[:min(len(lost), 4)], ", ")+more(len(lost)-4))
	}
	if injected {
		return delta, false, errInjected
	}
	return delta, exact, nil
}

// applyRound sends one round of apply's scripts, queue(p, j) adding the
// script of shard pending[j] to p. Without Config.WaitReplicas it is one
// pipeline through the cluster client. With it, the scripts go in one
// pipeline per primary, sent on that primary's own connection and ended by
// WAIT there (WAIT counts the writes of its connection only); the shards in
// redirected go through the cluster client, which follows redirects but
// cannot wait for them, and count in WaitShort.
func (s *Store) applyRound(ctx context.Context, pending []int, redirected map[int]bool, queue func(p redis.Pipeliner, j int)) {
	cc, _ := s.rdb.(*redis.ClusterClient)
	var routed []int // indexes into pending
	byNode := map[*redis.Client][]int{}
	for j, i := range pending {
		if cc == nil || s.cfg.WaitReplicas == 0 || redirected[i] {
			routed = append(routed, j)
			continue
		}
		node, err := cc.MasterForKey(ctx, s.keys.cp(i))
		if err != nil {
			routed = append(routed, j)
			continue
		}
		byNode[node] = append(byNode[node], j)
	}
	var wg sync.WaitGroup
	for node, js := range byNode {
		wg.Go(func() {
			p := node.Pipeline()
			for _, j := range js {
				queue(p, j)
			}
			var wait *redis.IntCmd
			if w, ok := p.(waiter); ok { // *redis.Pipeline is
				wait = w.Wait(ctx, s.cfg.WaitReplicas, s.cfg.WaitTimeout)
			}
			_, _ = p.Exec(ctx)
			s.waited("shards on "+node.Options().Addr, wait)
		})
	}
	if len(routed) > 0 {
		p := s.rdb.Pipeline()
		for _, j := range routed {
			queue(p, j)
		}
		_, _ = p.Exec(ctx)
		if s.cfg.WaitReplicas > 0 {
			s.waited(fmt.Sprintf("%d shards", len(routed)), nil)
		}
	}
	wg.Wait()
}

func more(n int) string {
	if n <= 0 {
		return ""
	}
	return fmt.Sprintf(" and %d more", n)
}

// resumeLocked reads the redo record and applies it to the shards that
// missed it; s.unitMu must be held. It fails with ErrLost when a shard lost
// writes, and with ErrNoState when there is no state.
func (s *Store) resumeLocked(ctx context.Context) error {
	m, err := readMeta(ctx, s.rdb, s.keys.meta())
	if err != nil {
		return err
	}
	if err := s.CheckLayout(m); err != nil {
		return err
	}
	fields, err := s.rdb.HGetAll(ctx, s.keys.redo()).Result()
	if err != nil {
		return fmt.Errorf("read redo record: %w", err)
	}
	if fields[redoCur] == "" || fields[redoCur] != m.Write {
		return fmt.Errorf("%w: the meta hash is at write %q, its redo record at %q", ErrLost, m.Write, fields[redoCur])
	}
	rd := &redo{epoch: m.Epoch, prev: fields[redoPrev], cur: fields[redoCur], force: fields[redoForce] == "1", parts: map[int]*shardPart{}}
	for f, v := range fields {
		if f == redoPrev || f == redoCur || f == redoForce {
			continue
		}
		i, err := strconv.Atoi(f)
		if err != nil || i < 0 || i >= s.keys.shards.n {
			return fmt.Errorf("%w: redo record has field %q", ErrLost, f)
		}
		if rd.parts[i], err = decodePart(v); err != nil {
			return fmt.Errorf("%w: redo record part %d: %w", ErrLost, i, err)
		}
	}
	// The subscriptions a redo applied only now adds are in the count
	// already: it was planned in the meta MULTI of the write.
	if _, _, err := s.apply(ctx, rd); err != nil {
		if errors.Is(err, ErrLost) {
			s.mu.Lock()
			s.broken = err
			s.mu.Unlock()
		}
		return err
	}
	s.mu.Lock()
	s.meta, s.resumed = &m, true
	s.mu.Unlock()
	return nil
}

// Resume brings a cluster state to the write its meta hash holds: it applies
// the redo record of the last write to the shards that missed it (a crash
// between the shards' commits), and fails with ErrLost when a shard lost
// writes (a failover, a flushed or replaced node). The daemon calls it
// before it streams. On one server it only checks that the state exists.
func (s *Store) Resume(ctx context.Context) error {
	if s.keys.shards == nil {
		_, err := s.load(ctx)
		return err
	}
	s.unitMu.Lock()
	defer s.unitMu.Unlock()
	if err := s.resumeLocked(ctx); err != nil {
		return fmt.Errorf("resume redis cluster state: %w", err)
	}
	return nil
}

// beginUnit starts a write on a cluster: it takes unitMu and, when an
// earlier write's second step may not have ended (after an error, or at the
// first write), applies the redo record first. The returned func releases
// unitMu. On one server it does nothing.
func (s *Store) beginUnit(ctx context.Context) (func(), error) {
	if s.keys.shards == nil {
		return func() {}, nil
	}
	s.unitMu.Lock()
	if err := s.resumeOnceLocked(ctx); err != nil && !errors.Is(err, ErrNoState) {
		s.unitMu.Unlock()
		return nil, err
	}
	return s.unitMu.Unlock, nil
}

// resumeOnceLocked runs resumeLocked unless this process already resumed
// the state and every write since ended on all shards; s.unitMu must be
// held.
func (s *Store) resumeOnceLocked(ctx context.Context) error {
	s.mu.Lock()
	resumed := s.resumed
	s.mu.Unlock()
	if resumed {
		return nil
	}
	return s.resumeLocked(ctx)
}

// finishUnit runs the second step of rd (nil: the write touched no shard)
// after its first step succeeded, and returns the subscriptions it added,
// net, and whether that count is exact (see apply). A failure leaves the
// redo record for the next write or Resume.
func (s *Store) finishUnit(ctx context.Context, rd *redo) (int64, bool, error) {
	if rd == nil {
		return 0, true, nil
	}
	delta, exact, err := s.apply(ctx, rd)
	if err != nil {
		s.mu.Lock()
		s.resumed = false
		if errors.Is(err, ErrLost) {
			s.broken = err
		}
		s.mu.Unlock()
		s.right.drop()
	}
	return delta, exact, err
}

// masters calls fn with a client of every primary: the one server, or each
// primary of a cluster.
func (s *Store) masters(ctx context.Context, fn func(context.Context, redis.Cmdable) error) error {
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return fn(ctx, c) })
	}
	return fn(ctx, s.rdb)
}

// scanPages calls fn with each page (about Config.PageSize keys) of the
// store's keys that SCAN returns on every primary, and the primary's
// client. The primaries of a cluster are scanned concurrently, and SCAN
// may return a key twice.
func (s *Store) scanPages(ctx context.Context, fn func(ctx context.Context, c redis.Cmdable, keys []string) error) error {
	return s.masters(ctx, func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, s.keys.pattern(), int64(s.cfg.PageSize)).Result()
			if err != nil {
				return err
			}
			if err := fn(ctx, c, keys); err != nil {
				return err
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	})
}

// Drop deletes every key of the store, of every generation, on every
// primary (SCAN and UNLINK in pages), for teardown: the state is gone
// afterwards (ErrNoState). The meta hash goes first, so that a Drop cut
// short leaves no state rather than a state with keys missing. Nothing may
// use the state meanwhile.
func (s *Store) Drop(ctx context.Context) error {
	defer s.right.drop()
	if err := s.rdb.Unlink(ctx, s.keys.meta()).Err(); err != nil {
		return fmt.Errorf("drop redis state %s: %w", s.cfg.Prefix, err)
	}
	s.mu.Lock()
	s.meta = nil
	s.mu.Unlock()
	err := s.scanPages(ctx, func(ctx context.Context, c redis.Cmdable, keys []string) error {
		// One UNLINK per key: on a cluster the keys of a page lie in
		// many slots.
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, k := range keys {
				p.Unlink(ctx, k)
			}
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("drop redis state %s: %w", s.cfg.Prefix, err)
	}
	s.mu.Lock()
	s.meta = nil
	s.mu.Unlock()
	return nil
}
