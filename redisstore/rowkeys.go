package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// ErrMovedDuringScan is RowKeys's error when the state moved to new
// generations (a resize) while it was read: read it again.
var ErrMovedDuringScan = errors.New("the state was resized while its rows were listed")

// rowKeysBuckets is how many buckets RowKeys reads in one pipeline.
const rowKeysBuckets = 64

// RowKeys calls fn with the encoded keys of every row of one side of the
// state (the left rows, or the right rows when right is set), a few
// buckets at a time, as committed when each bucket is read. It is for the
// rare reads of a whole table's keys (a partition that left a table); the
// join never reads the state this way.
func (s *Store) RowKeys(ctx context.Context, right bool, fn func(keys []string) error) error {
	m, err := s.Meta(ctx)
	if err != nil {
		return fmt.Errorf("list the state's rows: %w", err)
	}
	kind, gen, buckets := byte(kindLeft), m.LeftGen, m.Shape.LeftBuckets
	if right {
		kind, gen, buckets = kindRight, m.RightGen, m.Shape.RightBuckets
	}
	for from := 0; from < buckets; from += rowKeysBuckets {
		to := min(buckets, from+rowKeysBuckets)
		cmds := make([]*redis.StringSliceCmd, to-from)
		err := retryRead(ctx, s.rdb, func() error {
			p := s.rdb.Pipeline()
			for b := from; b < to; b++ {
				cmds[b-from] = p.HKeys(ctx, s.keys.name(kind, gen, uint64(b)))
			}
			_, err := p.Exec(ctx)
			return err
		})
		if err != nil {
			return fmt.Errorf("list the state's rows: %w", err)
		}
		var keys []string
		for _, c := range cmds {
			keys = append(keys, c.Val()...)
		}
		if err := fn(keys); err != nil {
			return err
		}
	}
	after, err := s.Meta(ctx)
	if err != nil {
		return fmt.Errorf("list the state's rows: %w", err)
	}
	if after.LeftGen != m.LeftGen || after.RightGen != m.RightGen || after.Epoch != m.Epoch {
		return ErrMovedDuringScan
	}
	return nil
}
