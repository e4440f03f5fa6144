package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/join"
)

// Load writes the puts and subscription adds of m into a freshly initialised
// state, pipelined and without a transaction: it is the bulk path of the
// initial load, which the daemon marks as incomplete until it commits the
// checkpoint with Commit. Load may run from several goroutines at once
// (each with its own rows). It refuses a state that has a checkpoint, a
// transaction in flight, clears or deletes.
func (s *Store) Load(ctx context.Context, m join.Mutations) error {
	defer s.right.drop()
	if m.ClearLeft || m.ClearRight || len(m.DelLeft) > 0 || len(m.DelRight) > 0 || len(m.DelSubs) > 0 {
		return errors.New("load redis state: only puts and subscription adds can be loaded")
	}
	cur, err := s.current(ctx)
	if err != nil {
		return fmt.Errorf("load redis state: %w", err)
	}
	if cur.Checkpoint != 0 || cur.InFlight != 0 {
		return errors.New("load redis state: the state is not freshly initialised; call Init first")
	}
	w := s.plan(&m, cur)
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		s.queue(ctx, p, w)
		// Loaded rows have distinct keys, so every add is a new member.
		if len(m.AddSubs) > 0 {
			p.HIncrBy(ctx, s.keys.meta(), fieldSubs, int64(len(m.AddSubs)))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("load redis state: %w", err)
	}
	return nil
}
