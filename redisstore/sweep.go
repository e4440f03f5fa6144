package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// sweepRetries bounds the attempts of one sweep step that keeps losing its
// WATCH to concurrent commits.
const sweepRetries = 100

// errPaused stops a sweep that finds a partial transaction in flight.
var errPaused = errors.New("sweep paused by a partial transaction")

// Sweep deletes the keys of generations that are no longer current (left
// behind by Clear or Init), in bounded steps: each step SCANs about
// Config.PageSize keys and UNLINKs the garbage among them. It returns the
// number of keys deleted, and stops early when ctx is done. It may run in the
// background, concurrently with reads and commits: each step decides and
// deletes under WATCH of the meta hash, so a generation that a concurrent
// commit makes current is never deleted. While a partial transaction is in
// flight (see CommitPartial) Sweep deletes nothing and returns 0: Recover may
// make a replaced generation current again. When no generation was dropped
// since the last sweep that went through the whole keyspace (the meta
// hash counts the drops), Sweep returns 0 at once, without a SCAN: a
// restart of the daemon over a large state costs nothing here.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	meta := s.keys.meta()
	m, err := readMeta(ctx, s.rdb, meta)
	if err != nil {
		return 0, fmt.Errorf("sweep redis state: %w", err)
	}
	if m.InFlight != 0 {
		return 0, nil
	}
	// No generation was dropped since the last whole sweep: nothing to
	// look for, and a restart does not SCAN the keyspace again.
	changes, err := s.rdb.HGet(ctx, meta, fieldGenChanges).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("sweep redis state: %w", err)
	}
	mark := m.Epoch + " " + changes
	swept, err := s.rdb.HGet(ctx, s.keys.swept(), sweptField).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("sweep redis state: %w", err)
	}
	if swept == mark {
		return 0, nil
	}
	var n int
	if s.Cluster() {
		n, err = s.sweepCluster(ctx)
	} else {
		n, err = s.sweepServer(ctx)
	}
	if errors.Is(err, errPaused) {
		return n, nil
	}
	if err != nil {
		return n, fmt.Errorf("sweep redis state: %w", err)
	}
	if err := s.markSwept(ctx, mark); err != nil {
		return n, fmt.Errorf("sweep redis state: %w", err)
	}
	return n, nil
}

// markSwept records mark, the epoch and the count of drops (fieldGenChanges,
// "" when absent) read before a sweep that went through the whole state
// and left no garbage of those drops. A drop or an Init during the pass
// needs no check: the count has moved past the one recorded, or the epoch
// is another, and the next sweep scans. Neither does a concurrent sweep
// that records an older mark: it only costs one more scan.
func (s *Store) markSwept(ctx context.Context, mark string) error {
	return s.rdb.HSet(ctx, s.keys.swept(), sweptField, mark).Err()
}

// sweptField is the field of keys.swept holding the mark: a hash, so that
// the commands fkmat's Redis ACL user needs stay hash, sorted-set and
// transaction commands (docs/security.md).
const sweptField = "mark"

// forgetResize drops the marker of a Resize that never switched: its
// generations become garbage for Sweep.
func (s *Store) forgetResize(ctx context.Context) error {
	meta := s.keys.meta()
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, meta, fieldResize)
		p.HIncrBy(ctx, meta, fieldGenChanges, 1)
		return nil
	})
	return err
}

// sweepServer is Sweep on one server: it SCANs the keyspace a page at a
// time and unlinks the garbage of each page (sweepStep). It fails with
// errPaused when a partial transaction begins.
func (s *Store) sweepServer(ctx context.Context) (int, error) {
	var cursor uint64
	total := 0
	for {
		keys, next, err := s.rdb.Scan(ctx, cursor, s.keys.pattern(), int64(s.cfg.PageSize)).Result()
		if err != nil {
			return total, err
		}
		n, err := s.sweepStep(ctx, keys)
		total += n
		if err != nil {
			return total, err
		}
		if next == 0 {
			return total, nil
		}
		cursor = next
	}
}

// sweepStep unlinks the keys among keys whose generation is not current. It
// fails with errPaused, deleting nothing, when a partial transaction is in
// flight.
func (s *Store) sweepStep(ctx context.Context, keys []string) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	var stale []string
	err := s.watchMeta(ctx, func(tx *redis.Tx, m Meta) error {
		stale = s.staleKeys(stale[:0], keys, m)
		if len(stale) == 0 {
			return nil
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Unlink(ctx, stale...)
			return nil
		})
		return err
	})
	if err != nil {
		return 0, err
	}
	return len(stale), nil
}

// watchMeta runs fn with the meta hash read under WATCH, again while a
// concurrent write to it fails fn's transaction (up to sweepRetries
// times). It fails with errPaused, calling nothing, when a partial
// transaction is in flight.
func (s *Store) watchMeta(ctx context.Context, fn func(tx *redis.Tx, m Meta) error) error {
	meta := s.keys.meta()
	for range sweepRetries {
		err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
			m, err := readMeta(ctx, tx, meta)
			if err != nil {
				return err
			}
			if m.InFlight != 0 {
				return errPaused
			}
			return fn(tx, m)
		}, meta)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return errors.New("meta hash keeps changing; retry later")
}

// staleKeys appends to dst the keys among keys whose generation m does not
// use.
func (s *Store) staleKeys(dst, keys []string, m Meta) []string {
	for _, k := range keys {
		if s.isStale(k, m) {
			dst = append(dst, k)
		}
	}
	return dst
}

// isStale reports whether key is a data key of a generation m does not use.
func (s *Store) isStale(key string, m Meta) bool {
	kind, gen, ok := s.keys.parse(key)
	if !ok {
		return false
	}
	if kind == kindRight {
		return gen != m.RightGen && gen != m.Resizing[1]
	}
	return gen != m.LeftGen && gen != m.Resizing[0]
}

// sweepCluster is Sweep on a cluster: it SCANs every primary, and unlinks
// the garbage of each page in one write of the store (see cluster.go),
// decided under WATCH of the meta hash like sweepStep. It fails with
// errPaused when a partial transaction begins.
func (s *Store) sweepCluster(ctx context.Context) (int, error) {
	var swept atomic.Int64 // the primaries are swept concurrently
	err := s.scanPages(ctx, func(ctx context.Context, _ redis.Cmdable, keys []string) error {
		n, err := s.sweepUnit(ctx, keys)
		swept.Add(int64(n))
		return err
	})
	return int(swept.Load()), err
}

// sweepUnit unlinks the keys among keys whose generation is not current, as
// one write of a cluster state.
func (s *Store) sweepUnit(ctx context.Context, keys []string) (int, error) {
	release, err := s.beginUnit(ctx)
	if err != nil {
		return 0, err
	}
	defer release()
	var (
		stale []string
		next  Meta
		rd    *redo
	)
	err = s.watchMeta(ctx, func(tx *redis.Tx, m Meta) error {
		next = m
		stale = s.staleKeys(stale[:0], keys, m)
		if len(stale) == 0 {
			return nil
		}
		_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			w := newWrites()
			w.unlink = stale
			var err error
			rd, err = s.stage(ctx, p, w, &next, false)
			return err
		})
		return err
	})
	if err != nil {
		return 0, err
	}
	if rd == nil {
		return 0, nil
	}
	if err := s.settle(ctx, nil, nil, next, "sweep"); err != nil {
		return 0, err
	}
	if _, _, err := s.finishUnit(ctx, rd); err != nil {
		return 0, err
	}
	return len(stale), nil
}
