package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/join"
)

// Commit persists a batch's mutations together with its checkpoint lsn in one
// MULTI/EXEC: a reader sees all of it or none of it. It is idempotent by
// checkpoint: a batch whose lsn is not above the stored checkpoint was
// already applied (a replay after a crash) and is skipped, so a replayed
// Clear never wipes what later batches wrote. A Clear bumps the side's
// generation inside the same transaction; the old generation's keys are left
// to Sweep. Large sets are split into commands of at most Config.PageSize
// arguments, all inside the one MULTI.
//
// Commit fails with ErrEpoch when the state was re-initialised by someone
// else. After any other error it is safe to call Commit again with the same
// batch: the store reloads the checkpoint and skips the batch if it was
// applied after all.
func (s *Store) Commit(ctx context.Context, m join.Mutations, lsn uint64) error {
	if lsn == 0 {
		return errors.New("commit redis state: LSN 0 is invalid")
	}
	cached, err := s.current(ctx)
	if err != nil {
		return fmt.Errorf("commit redis state at %d: %w", lsn, err)
	}
	if lsn <= cached.Checkpoint {
		return nil
	}
	var (
		next    Meta
		execErr error // the error of MULTI/EXEC itself, once sent
	)
	key := s.keys.meta()
	err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		stored, err := readMeta(ctx, tx, key)
		if err != nil {
			return err
		}
		if stored.Epoch != cached.Epoch || stored.Layout != cached.Layout {
			return fmt.Errorf("%w: store has epoch %q, redis has %q", ErrEpoch, cached.Epoch, stored.Epoch)
		}
		next = stored
		if lsn <= stored.Checkpoint {
			return nil
		}
		next.Checkpoint = lsn
		if m.ClearLeft {
			next.LeftGen++
		}
		if m.ClearRight {
			next.RightGen++
		}
		_, execErr = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			s.queue(ctx, p, &m, next)
			p.HSet(ctx, key, fieldCheckpoint, strconv.FormatUint(next.Checkpoint, 10),
				fieldLeftGen, strconv.FormatUint(next.LeftGen, 10),
				fieldRightGen, strconv.FormatUint(next.RightGen, 10))
			if s.beforeExec != nil {
				s.beforeExec(ctx, p)
			}
			return nil
		})
		return execErr
	}, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil:
		s.meta = &next
		return nil
	case isPartial(execErr):
		// EXEC ran and a command failed: Redis does not roll back. Drop the
		// epoch so that the daemon sees lost state and rebuilds.
		s.broken = fmt.Errorf("redis state is damaged by a failed commit at %d (%v); re-initialise it", lsn, err)
		_ = s.rdb.HDel(context.WithoutCancel(ctx), key, fieldEpoch).Err()
		s.meta = nil
	default:
		// Unknown whether EXEC ran (network error): reload before the next use.
		s.meta = nil
	}
	return fmt.Errorf("commit redis state at %d: %w", lsn, err)
}

// isPartial reports whether err, returned by a MULTI/EXEC, comes from a
// command that failed inside the executed transaction, rather than from a
// transaction that was discarded (EXECABORT: a command was rejected while
// queueing, e.g. for OOM or an ACL), aborted by WATCH, or not answered.
func isPartial(err error) bool {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) || errors.Is(err, redis.TxFailedErr) {
		return false
	}
	return !strings.HasPrefix(rerr.Error(), "EXECABORT")
}

// queue queues m's writes for the generations of next.
func (s *Store) queue(ctx context.Context, p redis.Pipeliner, m *join.Mutations, next Meta) {
	page := s.cfg.PageSize
	var buf []byte

	if !m.ClearLeft {
		del := groupBy(m.DelSubs, func(sub join.Subscription) string { return s.keys.subs(next.LeftGen, string(sub.FK)) })
		for k, subs := range del {
			for chunk := range slices.Chunk(subs, page) {
				ms := make([]any, len(chunk))
				for i, sub := range chunk {
					ms[i] = sub.Member()
				}
				p.ZRem(ctx, k, ms...)
			}
		}
		dl := groupBy(m.DelLeft, func(pk join.Key) string { return s.keys.left(next.LeftGen, string(pk)) })
		for k, pks := range dl {
			for chunk := range slices.Chunk(pks, page) {
				p.HDel(ctx, k, keyStrings(chunk)...)
			}
		}
	}
	if !m.ClearRight {
		dr := groupBy(m.DelRight, func(k join.Key) string { return s.keys.right(next.RightGen, string(k)) })
		for k, rks := range dr {
			for chunk := range slices.Chunk(rks, page) {
				p.HDel(ctx, k, keyStrings(chunk)...)
			}
		}
	}

	add := groupBy(m.AddSubs, func(sub join.Subscription) string { return s.keys.subs(next.LeftGen, string(sub.FK)) })
	for k, subs := range add {
		for chunk := range slices.Chunk(subs, page) {
			zs := make([]redis.Z, len(chunk))
			for i, sub := range chunk {
				zs[i] = redis.Z{Member: sub.Member()}
			}
			p.ZAdd(ctx, k, zs...)
		}
	}
	pl := make(map[string][]any)
	for pk, st := range m.PutLeft {
		buf = appendLeft(buf[:0], st)
		k := s.keys.left(next.LeftGen, string(pk))
		pl[k] = append(pl[k], string(pk), string(buf))
	}
	hsetChunks(ctx, p, pl, page)
	pr := make(map[string][]any)
	for rk, st := range m.PutRight {
		buf = appendRight(buf[:0], st)
		k := s.keys.right(next.RightGen, string(rk))
		pr[k] = append(pr[k], string(rk), string(buf))
	}
	hsetChunks(ctx, p, pr, page)
}

// hsetChunks queues HSETs of the field/value pairs per hash, page pairs each.
func hsetChunks(ctx context.Context, p redis.Pipeliner, pairs map[string][]any, page int) {
	for k, fv := range pairs {
		for len(fv) > 0 {
			n := min(len(fv), 2*page)
			p.HSet(ctx, k, fv[:n]...)
			fv = fv[n:]
		}
	}
}

// groupBy groups xs by the key key(x) returns.
func groupBy[T any](xs []T, key func(T) string) map[string][]T {
	g := make(map[string][]T)
	for _, x := range xs {
		k := key(x)
		g[k] = append(g[k], x)
	}
	return g
}

func keyStrings(ks []join.Key) []string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return s
}
