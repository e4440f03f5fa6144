package redisstore

import (
	"strconv"
	"strings"

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
type keys struct {
	prefix string
}

func newKeys(c Config) keys { return keys{prefix: c.Prefix} }

func (k keys) meta() string { return k.prefix + ":meta" }

func (k keys) undo() string { return k.prefix + ":undo" }

// pattern matches every key of the store (the prefix has no glob characters).
func (k keys) pattern() string { return k.prefix + ":*" }

// shardOf returns the shard of an encoded key among n. The hash is part of
// the persistent layout.
func shardOf(key string, n uint64) uint64 { return xxhash.Sum64String(key) % n }

func (k keys) name(kind byte, gen, shard uint64) string {
	b := make([]byte, 0, len(k.prefix)+24)
	b = append(b, k.prefix...)
	b = append(b, ':', kind)
	b = strconv.AppendUint(b, gen, 36)
	b = append(b, ":{"...)
	b = strconv.AppendUint(b, shard, 10)
	b = append(b, '}')
	return string(b)
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

// subs returns the sorted set holding the subscriptions of encoded FK fk in
// state m.
func (k keys) subs(m Meta, fk string) string {
	return k.name(kindSubs, m.LeftGen, shardOf(fk, uint64(m.Shape.SubShards)))
}

// parse returns the kind and generation of a data key of this store, and
// false for any other key (meta, foreign keys under the prefix).
func (k keys) parse(key string) (kind byte, gen uint64, ok bool) {
	rest, ok := strings.CutPrefix(key, k.prefix+":")
	if !ok || len(rest) < 2 {
		return 0, 0, false
	}
	kind = rest[0]
	if kind != kindLeft && kind != kindRight && kind != kindSubs {
		return 0, 0, false
	}
	g, tag, ok := strings.Cut(rest[1:], ":{")
	if !ok {
		return 0, 0, false
	}
	if tag, ok = strings.CutSuffix(tag, "}"); !ok || tag == "" || strings.Trim(tag, "0123456789") != "" {
		return 0, 0, false
	}
	gen, err := strconv.ParseUint(g, 36, 64)
	if err != nil {
		return 0, 0, false
	}
	return kind, gen, true
}
