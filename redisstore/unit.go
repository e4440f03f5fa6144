package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// unitWrite is one write of a join's state that Commit and CommitPartial
// share: a MULTI/EXEC under WATCH of the meta hash, holding the data
// writes of the mutations and the meta's new fields. Each says only what
// differs.
type unitWrite struct {
	// what names the write in errors ("commit redis state at 0/1A"), and
	// name in the error that marks the state damaged ("commit at 0/1A").
	what, name string
	// skip, given the cached meta, says the write is already done (a
	// replay) and nothing is sent.
	skip func(cached Meta) bool
	// prepare checks the stored meta (read under WATCH, the same state as
	// the cached one) and returns the meta after the write and the writes;
	// nil writes send nothing. planned is the number of subscriptions the
	// writes add, net (see countSubs). tx reads what the write needs first.
	prepare func(ctx context.Context, tx *redis.Tx, stored Meta) (next Meta, w *writes, planned int64, err error)
	// before queues commands ahead of the data writes (the undo log).
	before func(ctx context.Context, p redis.Pipeliner, stored, next Meta)
	// metaFields are the meta hash's fields after the write.
	metaFields func(next Meta) []any
	// waitReplicas waits, after EXEC, for the replicas to confirm it.
	waitReplicas bool
	// applied runs once the write is settled, before the subscription
	// count is checked.
	applied func(wrote bool, next Meta)
}

// writeUnit runs u: it takes the store's unit lock, sends the write under
// WATCH, settles the cached meta, finishes a cluster's redo and checks the
// subscription count.
func (s *Store) writeUnit(ctx context.Context, u unitWrite) error {
	release, err := s.beginUnit(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", u.what, err)
	}
	defer release()
	cached, err := s.current(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", u.what, err)
	}
	if u.skip != nil && u.skip(cached) {
		return nil
	}
	var (
		next    Meta
		wrote   bool  // MULTI/EXEC was sent
		execErr error // the error of MULTI/EXEC itself, once sent
		planned int64
		replies subReplies
		rd      *redo
	)
	key := s.keys.meta()
	err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		planned, replies, wrote = 0, subReplies{}, false
		stored, err := readMeta(ctx, tx, key)
		if err != nil {
			return err
		}
		if err := sameState(cached, stored); err != nil {
			return err
		}
		var w *writes
		if next, w, planned, err = u.prepare(ctx, tx, stored); err != nil || w == nil {
			return err
		}
		wrote = true
		_, execErr = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if u.before != nil {
				u.before(ctx, p, stored, next)
			}
			var err error
			if replies, rd, err = s.queueData(ctx, p, *w, &next); err != nil {
				return err
			}
			p.HSet(ctx, key, u.metaFields(next)...)
			if next.LeftGen != stored.LeftGen || next.RightGen != stored.RightGen || next.Resizing != stored.Resizing {
				p.HIncrBy(ctx, key, fieldGenChanges, 1) // garbage for Sweep
			}
			if s.beforeExec != nil {
				s.beforeExec(ctx, p)
			}
			return nil
		})
		if execErr == nil && u.waitReplicas {
			s.waitReplicas(ctx, tx)
		}
		return execErr
	}, key)
	if err := s.settle(ctx, err, execErr, next, u.name); err != nil {
		return fmt.Errorf("%s: %w", u.what, err)
	}
	applied, exact, err := s.finishUnit(ctx, rd)
	if err != nil {
		return fmt.Errorf("%s: %w", u.what, err)
	}
	if u.applied != nil {
		u.applied(wrote, next)
	}
	if !exact {
		// A shard's reply was lost and its script's count with it: the
		// planned count stands, exact for the engine's net mutations.
		return nil
	}
	if err := s.fixSubs(ctx, next, applied+replies.delta()-planned); err != nil {
		return fmt.Errorf("%s: applied, but %w", u.what, err)
	}
	return nil
}
