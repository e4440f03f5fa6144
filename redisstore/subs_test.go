package redisstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

// countedSubs counts the subscriptions of the store's current left
// generation the slow way: ZCARD of every subscription set SCAN finds.
func countedSubs(t *testing.T, s *Store) int64 {
	t.Helper()
	ctx := context.Background()
	meta, err := s.Meta(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, k := range allKeys(t, s, s.keys.prefix+":s*") {
		if kind, gen, ok := s.keys.parse(k); ok && kind == kindSubs && gen == meta.LeftGen {
			c, err := s.rdb.ZCard(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			n += c
		}
	}
	return n
}

// checkSubs compares Meta.Subscriptions with the subscriptions in Redis,
// like subsCount, but returns an error instead of failing the test, so that
// it can run off the test's goroutine. Reads that fail (a primary failing
// over) are retried for up to 30 s.
func checkSubs(ctx context.Context, s *Store, when string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := s.Meta(ctx)
		var n int64
		if err == nil {
			n, err = countGenSubs(ctx, s, m.LeftGen)
		}
		if err == nil {
			if m.Subscriptions != n {
				return fmt.Errorf("%s: Meta.Subscriptions = %d, %d subscriptions in Redis", when, m.Subscriptions, n)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: count the subscriptions: %w", when, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// countGenSubs counts the subscriptions of generation gen on every primary.
func countGenSubs(ctx context.Context, s *Store, gen uint64) (int64, error) {
	var mu sync.Mutex
	var n int64
	err := s.masters(ctx, func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, s.keys.prefix+":s*", 1000).Iterator()
		for iter.Next(ctx) {
			if kind, g, ok := s.keys.parse(iter.Val()); ok && kind == kindSubs && g == gen {
				card, err := c.ZCard(ctx, iter.Val()).Result()
				if err != nil {
					return err
				}
				mu.Lock()
				n += card
				mu.Unlock()
			}
		}
		return iter.Err()
	})
	return n, err
}

// allKeys returns the keys matching pattern on every primary.
func allKeys(t *testing.T, s *Store, pattern string) []string {
	t.Helper()
	var mu sync.Mutex
	var out []string
	err := s.masters(context.Background(), func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			out = append(out, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// subsCount checks that the counter equals the subscriptions counted by
// scanning, and returns it.
func subsCount(t *testing.T, s *Store, when string) int64 {
	t.Helper()
	m, err := s.Meta(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := countedSubs(t, s); m.Subscriptions != want {
		t.Fatalf("%s: Meta.Subscriptions = %d, %d subscriptions in Redis", when, m.Subscriptions, want)
	}
	return m.Subscriptions
}

// subsUnknown checks that the counter is unknown: no field, Meta says -1.
func subsUnknown(t *testing.T, s *Store, when string) {
	t.Helper()
	ctx := context.Background()
	m, err := s.Meta(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.rdb.HExists(ctx, s.keys.meta(), fieldSubs).Val(); m.Subscriptions != -1 || n {
		t.Fatalf("%s: Meta.Subscriptions = %d, field present %t; want unknown", when, m.Subscriptions, n)
	}
}

// undoMetaEntries returns the number of entries of meta fields in the undo
// log, which Recover restores last rather than by pages.
func undoMetaEntries(t *testing.T, s *Store) int64 {
	t.Helper()
	vals, err := s.rdb.HMGet(context.Background(), s.keys.undo(),
		undoMeta+fieldLeftGen, undoMeta+fieldRightGen, undoMeta+fieldSubs).Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, v := range vals {
		if v != nil {
			n++
		}
	}
	return n
}

// TestSubscriptionCountCommit follows the counter through commits: Init,
// adds and deletes, replays, a batch applied again at a new LSN and
// mutations that are not net (corrected from the ZADD and ZREM replies),
// and a Clear.
func TestSubscriptionCountCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 2})
	if n := subsCount(t, s, "after Init"); n != 0 {
		t.Fatalf("after Init: %d subscriptions", n)
	}
	steps := []struct {
		name string
		lsn  wal.LSN
		m    join.Mutations
		want int64
	}{
		{"base", 10, baseBatch(t), 4},
		{"replay", 10, baseBatch(t), 4},
		{"replay below the checkpoint", 5, baseBatch(t), 4},
		{"applied again at a new LSN", 11, baseBatch(t), 4},
		{"moves", 12, join.Mutations{
			DelSubs: []join.Subscription{sub(t, 7, 1), sub(t, 7, 2)},
			AddSubs: []join.Subscription{sub(t, 8, 1), sub(t, 9, 2), sub(t, 9, 5)},
		}, 5},
		{"delete absent, add present", 13, join.Mutations{
			DelSubs: []join.Subscription{sub(t, 7, 1), sub(t, 1, 1)},
			AddSubs: []join.Subscription{sub(t, 8, 1), sub(t, 9, 6)},
		}, 6},
		{"clear left", 14, join.Mutations{
			ClearLeft: true,
			// Deletes of a cleared side are dropped, not counted.
			DelSubs: []join.Subscription{sub(t, 8, 1)},
			AddSubs: []join.Subscription{sub(t, 7, 1), sub(t, 7, 2)},
		}, 2},
		{"clear right", 15, join.Mutations{ClearRight: true, AddSubs: []join.Subscription{sub(t, 7, 3)}}, 3},
		{"replay of the clear", 14, join.Mutations{ClearLeft: true}, 3},
	}
	for _, st := range steps {
		if err := s.Commit(ctx, st.m, st.lsn); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if n := subsCount(t, s, st.name); n != st.want {
			t.Fatalf("%s: %d subscriptions, want %d", st.name, n, st.want)
		}
		// The cache agrees with Redis.
		if m, _ := s.Meta(ctx); *s.meta != m {
			t.Fatalf("%s: cached meta %+v, Redis has %+v", st.name, *s.meta, m)
		}
	}
	// Another store sees it; Init starts over.
	s2, err := Open(ctx, s.rdb, s.Config())
	if err != nil {
		t.Fatal(err)
	}
	if m, err := s2.Meta(ctx); err != nil || m.Subscriptions != 3 {
		t.Fatalf("Meta from another store = %+v, %v", m, err)
	}
	if err := s2.Init(ctx, NewEpoch(), "again", Size{}); err != nil {
		t.Fatal(err)
	}
	if n := subsCount(t, s2, "after a second Init"); n != 0 {
		t.Fatalf("after a second Init: %d subscriptions", n)
	}
}

// TestSubscriptionCountUnknown checks that a state without the counter (from
// before it existed) reports it unknown, keeps it unknown through commits,
// partial commits and Recover, and gets it back from a left Clear.
func TestSubscriptionCountUnknown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 2})
	if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
		t.Fatal(err)
	}
	// A state written before the counter existed.
	if err := s.rdb.HDel(ctx, s.keys.meta(), fieldSubs).Err(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, s.rdb, s.Config())
	if err != nil {
		t.Fatal(err)
	}
	subsUnknown(t, s, "old state")
	if err := s.Commit(ctx, join.Mutations{AddSubs: []join.Subscription{sub(t, 9, 5)}}, 11); err != nil {
		t.Fatal(err)
	}
	subsUnknown(t, s, "after a commit")
	chunks := partialCases[2].chunks(t) // subscriptions added and removed, no clear
	for _, c := range chunks {
		if err := s.CommitPartial(ctx, c, 20); err != nil {
			t.Fatal(err)
		}
	}
	subsUnknown(t, s, "after partial commits")
	if _, err := s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	subsUnknown(t, s, "after Recover")

	// A clear in a partial transaction makes the count known; Recover
	// makes it unknown again.
	withClear := partialCases[3].chunks(t)
	for i, c := range withClear {
		if err := s.CommitPartial(ctx, c, 20); err != nil {
			t.Fatal(err)
		}
		if c.ClearLeft || i > 1 {
			subsCount(t, s, "after a partial clear")
		} else {
			subsUnknown(t, s, "before a partial clear")
		}
	}
	if _, err := s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	subsUnknown(t, s, "after Recover of a clear")
	for _, c := range withClear {
		if err := s.CommitPartial(ctx, c, 20); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FinishPartial(ctx, 20); err != nil {
		t.Fatal(err)
	}
	if n := subsCount(t, s, "after a finished clear"); n != 1 {
		t.Fatalf("after a finished clear: %d subscriptions, want 1", n)
	}

	// A value no write produces reads as unknown and blocks nothing; a
	// Commit with a clear repairs it.
	if err := s.rdb.HSet(ctx, s.keys.meta(), fieldSubs, "x").Err(); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Meta(ctx); err != nil || m.Subscriptions != -1 {
		t.Fatalf("Meta with a garbled count = %+v, %v", m, err)
	}
	if err := s.Commit(ctx, join.Mutations{ClearLeft: true, AddSubs: []join.Subscription{sub(t, 7, 1)}}, 21); err != nil {
		t.Fatal(err)
	}
	if n := subsCount(t, s, "after a clear"); n != 1 {
		t.Fatalf("after a clear: %d subscriptions, want 1", n)
	}
}

// TestSubscriptionCountRecoverOldLog checks that Recover of a transaction
// whose undo log has no count (written before the counter existed) leaves
// the count unknown rather than wrong.
func TestSubscriptionCountRecoverOldLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 2})
	if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
		t.Fatal(err)
	}
	for _, c := range partialCases[2].chunks(t) {
		if err := s.CommitPartial(ctx, c, 20); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.rdb.HDel(ctx, s.keys.undo(), undoMeta+fieldSubs).Err(); err != nil {
		t.Fatal(err)
	}
	if rolledBack, err := s.Recover(ctx); err != nil || !rolledBack {
		t.Fatalf("Recover = %t, %v", rolledBack, err)
	}
	subsUnknown(t, s, "after Recover of an old log")
}

// TestSubscriptionCountPartial follows the counter through every partial
// case: after each chunk (sent twice), after Recover (the count before the
// transaction) and after FinishPartial.
func TestSubscriptionCountPartial(t *testing.T) {
	t.Parallel()
	for _, tt := range partialCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 2})
			if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
				t.Fatal(err)
			}
			before := subsCount(t, s, "base")
			chunks := tt.chunks(t)
			for round := range 2 {
				for i, c := range chunks {
					for range 2 { // a retried chunk is not counted twice
						if err := s.CommitPartial(ctx, c, 20); err != nil {
							t.Fatal(err)
						}
						subsCount(t, s, "after chunk "+string(rune('0'+i)))
					}
				}
				if round == 0 {
					if _, err := s.Recover(ctx); err != nil {
						t.Fatal(err)
					}
					if n := subsCount(t, s, "after Recover"); n != before {
						t.Fatalf("after Recover: %d subscriptions, want %d", n, before)
					}
				}
			}
			if err := s.FinishPartial(ctx, 20); err != nil {
				t.Fatal(err)
			}
			subsCount(t, s, "after FinishPartial")
		})
	}
}
