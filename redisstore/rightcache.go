package redisstore

import (
	"slices"
	"sync"

	"github.com/fkmat/fkmat/join"
)

// rightCache is an exact in-process copy of some right rows of one
// generation, bounded in bytes. It is exact because fkmat is the only
// writer of its state: every write goes through the Store, which applies it
// here once it is committed (or, where it cannot tell what landed, drops
// the whole cache). A right row changes rarely and is read by every batch
// that touches one of its dependents, so the cache saves a Redis read per
// foreign key per batch.
//
// Reads race with commits: a read from Redis may return a row that a
// commit replaces before the read fills the cache. Every write is therefore
// stamped with a sequence number, and a fill is dropped for a key written
// after its read began, and wholly when the cache was dropped or an entry
// written after it began was evicted (floor).
type rightCache struct {
	mu       sync.Mutex
	capacity int // bytes; 0 disables the cache
	size     int
	gen      uint64
	seq      uint64
	floor    uint64
	entries  map[join.Key]cacheEntry
}

// cacheEntry is one key's row (nil: known absent), stamped with the
// sequence number of the write or of the read that filled it.
type cacheEntry struct {
	row *join.RightState
	seq uint64
}

// entryOverhead approximates a map entry's bookkeeping in bytes.
const entryOverhead = 96

func newRightCache(capacity int) *rightCache {
	return &rightCache{capacity: max(capacity, 0), entries: map[join.Key]cacheEntry{}}
}

func entrySize(k join.Key, row *join.RightState) int {
	n := len(k) + entryOverhead
	if row != nil {
		for _, v := range row.Key {
			n += len(v.Text) + 24
		}
		for _, v := range row.Values {
			n += len(v.Text) + 24
		}
	}
	return n
}

// lookup returns the cached rows of keys of generation gen (absent keys
// known absent are left out of found), the keys to read from Redis, and the
// sequence number to pass to fill with what they read.
func (c *rightCache) lookup(gen uint64, keys []join.Key, found map[join.Key]join.RightState) (misses []join.Key, start uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.capacity == 0 || gen != c.gen {
		return keys, c.seq
	}
	for _, k := range keys {
		e, ok := c.entries[k]
		switch {
		case !ok:
			misses = append(misses, k)
		case e.row != nil:
			// A cached row is never changed in place (a write replaces
			// it), and no reader changes a state's values: the caller
			// gets the cache's slices, capped so that an append copies.
			nk, nv := len(e.row.Key), len(e.row.Values)
			found[k] = join.RightState{Key: e.row.Key[:nk:nk], Values: e.row.Values[:nv:nv]}
		}
	}
	return misses, c.seq
}

// fill records what a read of keys from generation gen, begun at start,
// found (keys missing from found are absent).
func (c *rightCache) fill(gen, start uint64, keys []join.Key, found map[join.Key]join.RightState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.capacity == 0 || start < c.floor {
		return
	}
	if gen != c.gen {
		if start < c.seq {
			return // the generation may have changed after the read
		}
		c.reset(gen)
	}
	for _, k := range keys {
		if e, ok := c.entries[k]; ok {
			if e.seq > start {
				continue // written after the read began
			}
			c.size -= entrySize(k, e.row)
		}
		var row *join.RightState
		if st, ok := found[k]; ok {
			row = &join.RightState{Key: slices.Clone(st.Key), Values: slices.Clone(st.Values)}
		}
		c.entries[k] = cacheEntry{row: row, seq: start}
		c.size += entrySize(k, row)
	}
	c.evict()
}

// apply records a committed batch's right-row writes in generation gen
// (the generation after the batch: a clear starts a new one).
func (c *rightCache) apply(gen uint64, m *join.Mutations) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	if c.capacity == 0 {
		return
	}
	if m.ClearRight || gen != c.gen {
		c.floor = c.seq
		c.reset(gen)
	}
	put := func(k join.Key, row *join.RightState) {
		if e, ok := c.entries[k]; ok {
			c.size -= entrySize(k, e.row)
		}
		c.entries[k] = cacheEntry{row: row, seq: c.seq}
		c.size += entrySize(k, row)
	}
	for _, k := range m.DelRight {
		put(k, nil)
	}
	for k, st := range m.PutRight {
		put(k, &join.RightState{Key: slices.Clone(st.Key), Values: slices.Clone(st.Values)})
	}
	c.evict()
}

// drop empties the cache after a write whose effect it cannot follow (a
// failed or uncertain commit, a chunked transaction, a recovery, a new
// state): no read begun before is filled in.
func (c *rightCache) drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	c.floor = c.seq
	c.reset(c.gen)
}

func (c *rightCache) reset(gen uint64) {
	c.gen, c.size = gen, 0
	clear(c.entries)
}

// evict removes arbitrary entries (map order) until the cache is within 90%
// of its capacity. Reads begun before an evicted write are no longer
// filled in.
func (c *rightCache) evict() {
	if c.size <= c.capacity {
		return
	}
	for k, e := range c.entries {
		if c.size <= c.capacity*9/10 {
			break
		}
		delete(c.entries, k)
		c.size -= entrySize(k, e.row)
		c.floor = max(c.floor, e.seq)
	}
}

// stats returns the cache's entries and bytes.
func (c *rightCache) stats() (entries, bytes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries), c.size
}
