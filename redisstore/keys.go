package redisstore

import (
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// Key kinds: the letter after the prefix.
const (
	kindLeft  = 'l'
	kindRight = 'r'
	kindSubs  = 's'
)

// keys names the Redis keys of one store:
//
//	<prefix>:meta                   hash: epoch, fingerprint, layout (version and Shape), checkpoint, generations, inflight, subs
//	<prefix>:undo                   hash: undo log of a partial transaction (see partial.go)
//	<prefix>:l<gen>:{<bucket>}      hash: encoded left PK -> left row
//	<prefix>:r<gen>:{<bucket>}      hash: encoded right key -> right row
//	<prefix>:s<gen>:{<shard>}       sorted set, all scores 0: FK ++ PK
//
// gen is the side's generation in base 36 (subscriptions belong to the left
// side), bucket and shard are decimal. The braces are Redis Cluster hash tags.
// The shard and bucket counts are the state's Shape, read from its meta hash.
//
// On a Redis Cluster (see cluster.go) the keys of the meta slot share the
// hash tag {<prefix>}, and every other key carries the tag of its shard, so
// that each of the store's atomic writes stays in one slot:
//
//	<prefix>:{<prefix>}:meta          the meta hash, with the write id
//	<prefix>:{<prefix>}:undo          the undo log
//	<prefix>:{<prefix>}:redo          hash: the last write's redo record
//	<prefix>:cp:{<tag>}               string: the shard's checkpoint, <epoch>:<write id>
//	<prefix>:l<gen>:<bucket>:{<tag>}  left rows, and r, s alike
//
// where the tag is that of shard bucket % shards (shardTags).
type keys struct {
	prefix string
	// shards is nil on one server.
	shards *shardSet
	// names remembers the names built last (nil: none).
	names *nameCache
}

// nameCache remembers the data key names built last, one per slot of a
// direct-mapped table: a batch names the same buckets again and again (a
// row's hash, its subscriptions' sets, at reads and at the commit), and a
// name found here costs no allocation. Safe for concurrent use.
type nameCache struct {
	slots [nameSlots]atomic.Pointer[cachedName]
}

const (
	nameBits  = 16
	nameSlots = 1 << nameBits
)

type cachedName struct {
	kind        byte
	gen, bucket uint64
	name        string
}

// shardSet is the shards of a cluster state.
type shardSet struct {
	n    int
	tags []string
	// index maps a tag to its shard.
	index map[string]int
}

func newShardSet(n int) *shardSet {
	ss := &shardSet{n: n, tags: shardTags(n), index: make(map[string]int, n)}
	for i, t := range ss.tags {
		ss.index[t] = i
	}
	return ss
}

func newKeys(c Config) keys { return keys{prefix: c.Prefix, names: new(nameCache)} }

// newClusterKeys returns the keys of a store on a cluster with n shards.
func newClusterKeys(c Config, n int) keys {
	return keys{prefix: c.Prefix, shards: newShardSet(n), names: new(nameCache)}
}

// metaSlot returns the name of a key of the meta slot.
func (k keys) metaSlot(name string) string {
	if k.shards == nil {
		return k.prefix + ":" + name
	}
	return k.prefix + ":{" + k.prefix + "}:" + name
}

func (k keys) meta() string { return k.metaSlot("meta") }

func (k keys) undo() string { return k.metaSlot("undo") }

func (k keys) redo() string { return k.metaSlot("redo") }

// swept is the hash where Sweep records the state it last went
// through whole (see fieldGenChanges): beside the meta hash, not in it, so
// that recording it does not fail the commits watching the meta hash.
func (k keys) swept() string { return k.metaSlot("meta:swept") }

// cp returns the checkpoint key of shard i of a cluster state.
func (k keys) cp(i int) string { return k.prefix + ":cp:{" + k.shards.tags[i] + "}" }

// shardOfKey returns the shard of a data key of a cluster state.
func (k keys) shardOfKey(key string) (int, bool) {
	i := strings.IndexByte(key, '{')
	if i < 0 || !strings.HasSuffix(key, "}") {
		return 0, false
	}
	n, ok := k.shards.index[key[i+1:len(key)-1]]
	return n, ok
}

// pattern matches every key of the store (the prefix has no glob characters).
func (k keys) pattern() string { return k.prefix + ":*" }

// shardOf returns the shard of an encoded key among n. The hash is part of
// the persistent layout.
func shardOf(key string, n uint64) uint64 { return xxhash.Sum64String(key) % n }

func (k keys) name(kind byte, gen, bucket uint64) string {
	if k.names == nil {
		return k.build(kind, gen, bucket)
	}
	h := (bucket ^ gen<<32 ^ uint64(kind)<<56) * 0x9E3779B97F4A7C15 // Fibonacci hashing
	slot := &k.names.slots[h>>(64-nameBits)]
	if c := slot.Load(); c != nil && c.bucket == bucket && c.gen == gen && c.kind == kind {
		return c.name
	}
	n := k.build(kind, gen, bucket)
	slot.Store(&cachedName{kind: kind, gen: gen, bucket: bucket, name: n})
	return n
}

// build builds the name of a data key: kind's hash or set of generation
// gen at bucket, in one allocation.
func (k keys) build(kind byte, gen, bucket uint64) string {
	var num [20]byte
	var b strings.Builder
	b.Grow(len(k.prefix) + 48)
	b.WriteString(k.prefix)
	b.WriteByte(':')
	b.WriteByte(kind)
	b.Write(strconv.AppendUint(num[:0], gen, 36))
	if k.shards != nil {
		b.WriteByte(':')
		b.Write(strconv.AppendUint(num[:0], bucket, 10))
		b.WriteString(":{")
		b.WriteString(k.shards.tags[bucket%uint64(k.shards.n)])
		b.WriteByte('}')
		return b.String()
	}
	b.WriteString(":{")
	b.Write(strconv.AppendUint(num[:0], bucket, 10))
	b.WriteByte('}')
	return b.String()
}

// left returns the hash holding the left row with encoded key pk in state m.
func (k keys) left(m Meta, pk string) string {
	return k.name(kindLeft, m.LeftGen, shardOf(pk, uint64(m.Shape.LeftBuckets)))
}

// right returns the hash holding the right row with encoded key key in
// state m.
func (k keys) right(m Meta, key string) string {
	return k.name(kindRight, m.RightGen, shardOf(key, uint64(m.Shape.RightBuckets)))
}

// subs returns the sorted set holding the subscription of encoded PK pk to
// encoded FK fk in state m.
func (k keys) subs(m Meta, fk, pk string) string {
	return k.name(kindSubs, m.LeftGen, subShard(m.Shape, fk, pk))
}

// subsOf returns the sorted sets holding the subscriptions to encoded FK fk
// in state m: one, or one per lane of its fan (Shape.Fans).
func (k keys) subsOf(m Meta, fk string) []string {
	fan := m.Shape.fan(fk)
	base := xxhash.Sum64String(fk)
	out := make([]string, fan)
	for lane := range out {
		out[lane] = k.name(kindSubs, m.LeftGen, (base+uint64(lane))%uint64(m.Shape.SubShards))
	}
	return out
}

// subShard returns the subscription set of pk's subscription to fk among
// the shape's: xxhash64(fk) mod SubShards when fk has one lane, else the
// set of lane xxhash64(pk) mod fan past it. The hashes are part of the
// persistent layout.
func subShard(sh Shape, fk, pk string) uint64 {
	base := xxhash.Sum64String(fk)
	if fan := sh.fan(fk); fan > 1 {
		base += xxhash.Sum64String(pk) % uint64(fan)
	}
	return base % uint64(sh.SubShards)
}

// parse returns the kind and generation of a data key of this store, and
// false for any other key (meta, foreign keys under the prefix).
func (k keys) parse(key string) (kind byte, gen uint64, ok bool) {
	kind, gen, _, ok = k.parseKey(key)
	return kind, gen, ok
}

// parseKey is parse, with the data key's bucket (or subscription shard).
func (k keys) parseKey(key string) (kind byte, gen, bucket uint64, ok bool) {
	rest, ok := strings.CutPrefix(key, k.prefix+":")
	if !ok || len(rest) < 2 {
		return 0, 0, 0, false
	}
	kind = rest[0]
	if kind != kindLeft && kind != kindRight && kind != kindSubs {
		return 0, 0, 0, false
	}
	g, tag, ok := strings.Cut(rest[1:], ":{")
	if !ok {
		return 0, 0, 0, false
	}
	if tag, ok = strings.CutSuffix(tag, "}"); !ok || tag == "" {
		return 0, 0, 0, false
	}
	b := tag
	if k.shards != nil {
		// <gen>:<bucket>:{<tag>}
		if g, b, ok = strings.Cut(g, ":"); !ok {
			return 0, 0, 0, false
		}
		if _, ok := k.shards.index[tag]; !ok {
			return 0, 0, 0, false
		}
	}
	if b == "" || strings.Trim(b, "0123456789") != "" {
		return 0, 0, 0, false
	}
	bucket, err := strconv.ParseUint(b, 10, 64)
	if err != nil {
		return 0, 0, 0, false
	}
	if gen, err = strconv.ParseUint(g, 36, 64); err != nil {
		return 0, 0, 0, false
	}
	return kind, gen, bucket, true
}
