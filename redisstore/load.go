package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/join"
)

// DefaultLoadBytes is how many bytes of encoded rows and subscriptions a
// Loader gathers before it writes them. A backfill runs several loaders per
// table and several tables at once: at 8 MiB each, a join of several tables
// (W7) kept the heap at fkmat's soft memory limit and spent half its CPU
// collecting; at 2 MiB its backfill took 10.1 s instead of 12.3 s with half
// the CPU, and a two-table one (W4) 4.6 s (2.55x INSERT ... SELECT).
const DefaultLoadBytes = 2 << 20

// Loader is the bulk path of the initial load: it writes the puts and
// subscription adds of many join.Mutations into a freshly initialised
// state, pipelined and without a transaction (the daemon marks the state
// incomplete until it commits the checkpoint with Commit). It gathers
// about DefaultLoadBytes of encoded rows and subscriptions before writing
// them, grouped by key: rows that share a bucket go in one multi-field
// HSET, subscriptions that share a set in one multi-member ZADD, so that
// Redis, the bound of a backfill, runs fewer commands than rows. Each
// goroutine uses its own Loader; several may load one state at once.
type Loader struct {
	s     *Store
	meta  Meta
	rows  []loadEntry
	subs  []loadEntry
	bytes int
	// limit is the gathered bytes that trigger a write.
	limit int
	// commands and entries count the HSETs and ZADDs sent and the rows and
	// subscriptions they carried.
	commands, entries int
	// moving is set when the loader moves existing state to new
	// generations (Resize): the subscription count stays as it is.
	moving bool
}

// loadEntry is one hash field (field, value) or sorted-set member (field)
// of the key of kind in shard.
type loadEntry struct {
	kind         byte
	shard        uint64
	field, value string
}

// NewLoader returns a loader for the state, which must be freshly
// initialised (no checkpoint, no transaction in flight).
func (s *Store) NewLoader(ctx context.Context) (*Loader, error) {
	s.right.drop()
	cur, err := s.current(ctx)
	if err != nil {
		return nil, fmt.Errorf("load redis state: %w", err)
	}
	if cur.Checkpoint != 0 || cur.InFlight != 0 {
		return nil, errors.New("load redis state: the state is not freshly initialised; call Init first")
	}
	return &Loader{s: s, meta: cur, limit: DefaultLoadBytes}, nil
}

// Add gathers the puts and subscription adds of m, writing what was
// gathered once it passes the loader's size. It refuses clears and deletes.
func (l *Loader) Add(ctx context.Context, m join.Mutations) error {
	err := loadEntries(m, l.meta.Shape, func(kind byte, shard uint64, field string, value []byte) error {
		l.gather(kind, shard, field, string(value))
		return nil
	})
	if err != nil {
		return err
	}
	return l.flushFull(ctx)
}

// loadEntries calls fn with each entry m puts into a state of shape sh, in
// the key of kind in shard: a row (its key as field, its encoding as
// value) or a subscription (its member as value, no field). It refuses
// clears and deletes. value is reused after fn returns.
func loadEntries(m join.Mutations, sh Shape, fn func(kind byte, shard uint64, field string, value []byte) error) error {
	if m.ClearLeft || m.ClearRight || len(m.DelLeft) > 0 || len(m.DelRight) > 0 || len(m.DelSubs) > 0 {
		return errors.New("load redis state: only puts and subscription adds can be loaded")
	}
	var buf []byte
	for pk, st := range m.PutLeft {
		buf = appendLeft(buf[:0], string(pk), st)
		if err := fn(kindLeft, shardOf(string(pk), uint64(sh.LeftBuckets)), string(pk), buf); err != nil {
			return err
		}
	}
	for rk, st := range m.PutRight {
		buf = appendRight(buf[:0], string(rk), st)
		if err := fn(kindRight, shardOf(string(rk), uint64(sh.RightBuckets)), string(rk), buf); err != nil {
			return err
		}
	}
	for _, sub := range m.AddSubs {
		buf = append(append(buf[:0], sub.FK...), sub.PK...)
		if err := fn(kindSubs, subShard(sh, string(sub.FK), string(sub.PK)), "", buf); err != nil {
			return err
		}
	}
	return nil
}

// gather gathers one row (kindLeft, kindRight: field and value) or
// subscription (kindSubs: member in value) of the key of kind in shard.
func (l *Loader) gather(kind byte, shard uint64, field, value string) {
	e := loadEntry{kind, shard, field, value}
	if kind == kindSubs {
		l.subs = append(l.subs, e)
	} else {
		l.rows = append(l.rows, e)
	}
	l.bytes += len(field) + len(value) + 48
}

// flushFull writes what was gathered once it passes the loader's size.
func (l *Loader) flushFull(ctx context.Context) error {
	if l.bytes >= l.limit {
		return l.Flush(ctx)
	}
	return nil
}

// Flush writes what the loader gathered.
func (l *Loader) Flush(ctx context.Context) error {
	if len(l.rows) == 0 && len(l.subs) == 0 {
		return nil
	}
	s, page := l.s, l.s.cfg.PageSize
	defer s.right.drop() // written outside Commit: the cache must not keep older rows
	byKey := func(a, b loadEntry) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.shard, b.shard))
	}
	slices.SortFunc(l.rows, byKey)
	slices.SortFunc(l.subs, byKey)
	p := s.rdb.Pipeline()
	for _, entries := range [][]loadEntry{l.rows, l.subs} {
		for run := range runs(entries) {
			key := s.keys.name(run[0].kind, l.meta.gen(run[0].kind), run[0].shard)
			n, _ := queueEntries(ctx, p, key, run[0].kind, len(run), page, func(i int) (string, string) { return run[i].field, run[i].value })
			l.commands += n
		}
	}
	// Loaded rows have distinct keys, so every add is a new member.
	if len(l.subs) > 0 && !l.moving {
		p.HIncrBy(ctx, s.keys.meta(), fieldSubs, int64(len(l.subs)))
	}
	_, err := p.Exec(ctx)
	l.entries += len(l.rows) + len(l.subs)
	l.rows, l.subs, l.bytes = l.rows[:0], l.subs[:0], 0
	if err != nil {
		return fmt.Errorf("load redis state: %w", err)
	}
	return nil
}

// gen returns the generation of the keys of kind.
func (m Meta) gen(kind byte) uint64 {
	if kind == kindRight {
		return m.RightGen
	}
	return m.LeftGen
}

// queueEntries queues in p the n entries of key, of kind, that entry(i)
// gives (a row's field and value; a subscription's member as its value):
// one multi-field HSET or multi-member ZADD per page of entries. It
// returns the commands and the bytes queued.
func queueEntries(ctx context.Context, p redis.Pipeliner, key string, kind byte, n, page int,
	entry func(int) (field, value string)) (commands, bytes int) {
	for start := 0; start < n; start += page {
		end := min(start+page, n)
		if kind == kindSubs {
			zs := make([]redis.Z, 0, end-start)
			for i := start; i < end; i++ {
				_, member := entry(i)
				zs = append(zs, redis.Z{Member: member})
				bytes += len(member) + 16
			}
			p.ZAdd(ctx, key, zs...)
		} else {
			args := make([]any, 0, 2*(end-start))
			for i := start; i < end; i++ {
				field, value := entry(i)
				args = append(args, field, value)
				bytes += len(field) + len(value) + 16
			}
			p.HSet(ctx, key, args...)
		}
		commands++
	}
	return commands, bytes
}

// runs yields the runs of entries of one key in entries sorted by key.
func runs(entries []loadEntry) func(yield func([]loadEntry) bool) {
	return func(yield func([]loadEntry) bool) {
		for start := 0; start < len(entries); {
			end := start + 1
			for end < len(entries) && entries[end].kind == entries[start].kind && entries[end].shard == entries[start].shard {
				end++
			}
			if !yield(entries[start:end]) {
				return
			}
			start = end
		}
	}
}
