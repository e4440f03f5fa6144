package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

// dump returns every key under the store's prefix, the meta hash and the
// undo log included, as "<name>/<field or member>" -> value (score for
// members), with the prefix cut from the names. With relative set, data keys
// name their generation relative to the side's current one, so that stores
// with different random generations compare, and the meta hash is left out.
func dump(t *testing.T, s *Store, relative bool) map[string]string {
	t.Helper()
	ctx := context.Background()
	meta, err := s.Meta(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range allKeys(t, s, s.keys.pattern()) {
		if s.Cluster() && (k == s.keys.redo() || strings.HasPrefix(k, s.keys.prefix+":cp:")) {
			continue // the bookkeeping of writes on a cluster: each write changes it
		}
		if k == s.keys.swept() {
			continue // Sweep's bookkeeping
		}
		name := strings.TrimPrefix(k, s.keys.prefix)
		if relative {
			if k == s.keys.meta() {
				continue
			}
			if kind, gen, ok := s.keys.parse(k); ok {
				cur := meta.LeftGen
				if kind == kindRight {
					cur = meta.RightGen
				}
				_, tag, _ := strings.Cut(name, "{")
				name = fmt.Sprintf("%c%+d{%s", kind, int64(gen-cur), tag)
			}
		}
		switch typ := s.rdb.Type(ctx, k).Val(); typ {
		case "hash":
			for f, v := range s.rdb.HGetAll(ctx, k).Val() {
				if k == s.keys.meta() && (f == fieldWrite || f == fieldGenChanges) {
					continue // bookkeeping: the cluster's last write, Sweep's count of drops
				}
				out[name+"/"+f] = v
			}
		case "zset":
			for _, z := range s.rdb.ZRangeWithScores(ctx, k, 0, -1).Val() {
				out[name+"/"+z.Member.(string)] = strconv.FormatFloat(z.Score, 'g', -1, 64)
			}
		default:
			t.Fatalf("key %q has type %s", k, typ)
		}
	}
	return out
}

// diffDumps describes how two dumps differ, "" when equal.
func diffDumps(got, want map[string]string) string {
	var b strings.Builder
	n := 0
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if g, ok := got[k]; !ok || g != want[k] {
			n++
			if n <= 5 {
				fmt.Fprintf(&b, "\n  %q: got %q (present %t), want %q", k, g, ok, want[k])
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			n++
			if n <= 5 {
				fmt.Fprintf(&b, "\n  %q: unexpected %q", k, got[k])
			}
		}
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d differences:%s", n, b.String())
}

// Keys of the fixture: left rows 1-6, right rows (customers) 7-9.
var (
	fixtureLeft  = []int64{1, 2, 3, 4, 5, 6}
	fixtureRight = []int64{7, 8, 9}
)

// readState renders what the store returns through join.StateReader for the
// fixture's keys: left rows, right rows and the dependents of every customer.
func readState(t *testing.T, s *Store) string {
	t.Helper()
	ctx := context.Background()
	var lk, rk []join.Key
	for _, i := range fixtureLeft {
		lk = append(lk, intKey(t, i))
	}
	for _, i := range fixtureRight {
		rk = append(rk, intKey(t, i))
	}
	left, err := s.GetLeft(ctx, lk)
	if err != nil {
		t.Fatal(err)
	}
	right, err := s.GetRight(ctx, rk)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, k := range lk {
		if st, ok := left[k]; ok {
			fmt.Fprintf(&b, "left %v: fk %v values %v hash %x\n", st.PK, st.FK, st.Values, st.Hash)
		}
	}
	for _, k := range rk {
		if st, ok := right[k]; ok {
			fmt.Fprintf(&b, "right %v: %v\n", st.Key, st.Values)
		}
		fmt.Fprintf(&b, "dependents %x: %x\n", string(k), readAll(t, s, k, 2))
	}
	return b.String()
}

func sub(t testing.TB, fk, pk int64) join.Subscription {
	return join.Subscription{FK: intKey(t, fk), PK: intKey(t, pk)}
}

func rightRow(key int64, val string) join.RightState {
	return join.RightState{Key: texts(strconv.FormatInt(key, 10)), Values: texts(val)}
}

// baseBatch is the fixture's state before a large transaction: rows 1-3
// reference customer 7, row 4 customer 8.
func baseBatch(t *testing.T) join.Mutations {
	return join.Mutations{
		PutLeft: map[join.Key]join.LeftState{
			intKey(t, 1): leftRow(1, 7, "a"), intKey(t, 2): leftRow(2, 7, "a"),
			intKey(t, 3): leftRow(3, 7, "a"), intKey(t, 4): leftRow(4, 8, "a"),
		},
		PutRight: map[join.Key]join.RightState{intKey(t, 7): rightRow(7, "alice"), intKey(t, 8): rightRow(8, "bob")},
		AddSubs:  []join.Subscription{sub(t, 7, 1), sub(t, 7, 2), sub(t, 7, 3), sub(t, 8, 4)},
	}
}

// partialCases are large transactions over baseBatch, as chunks of mutations.
var partialCases = []struct {
	name   string
	chunks func(t *testing.T) []join.Mutations
}{
	{"left row updated twice", func(t *testing.T) []join.Mutations {
		return []join.Mutations{
			{PutLeft: map[join.Key]join.LeftState{intKey(t, 1): leftRow(1, 7, "b")}},
			{PutLeft: map[join.Key]join.LeftState{intKey(t, 1): leftRow(1, 7, "c")}},
		}
	}},
	{"row inserted then deleted", func(t *testing.T) []join.Mutations {
		return []join.Mutations{
			{
				PutLeft:  map[join.Key]join.LeftState{intKey(t, 5): leftRow(5, 9, "n")},
				PutRight: map[join.Key]join.RightState{intKey(t, 9): rightRow(9, "carol")},
				AddSubs:  []join.Subscription{sub(t, 9, 5)},
			},
			{DelLeft: []join.Key{intKey(t, 5)}, DelRight: []join.Key{intKey(t, 9)}, DelSubs: []join.Subscription{sub(t, 9, 5)}},
		}
	}},
	{"subscriptions added and removed", func(t *testing.T) []join.Mutations {
		return []join.Mutations{
			{
				PutLeft: map[join.Key]join.LeftState{intKey(t, 2): leftRow(2, 8, "a")},
				DelSubs: []join.Subscription{sub(t, 7, 2)}, AddSubs: []join.Subscription{sub(t, 8, 2)},
			},
			{
				PutLeft: map[join.Key]join.LeftState{intKey(t, 2): leftRow(2, 7, "a"), intKey(t, 3): leftRow(3, 9, "a")},
				DelSubs: []join.Subscription{sub(t, 8, 2), sub(t, 7, 3)},
				AddSubs: []join.Subscription{sub(t, 7, 2), sub(t, 9, 3)},
			},
			{DelLeft: []join.Key{intKey(t, 4)}, DelSubs: []join.Subscription{sub(t, 8, 4)}},
		}
	}},
	{"clear left in chunk 2", func(t *testing.T) []join.Mutations {
		return []join.Mutations{
			{
				PutLeft: map[join.Key]join.LeftState{intKey(t, 1): leftRow(1, 7, "b")},
				DelLeft: []join.Key{intKey(t, 4)}, DelSubs: []join.Subscription{sub(t, 8, 4)},
			},
			{
				ClearLeft: true,
				PutLeft:   map[join.Key]join.LeftState{intKey(t, 6): leftRow(6, 7, "x")},
				AddSubs:   []join.Subscription{sub(t, 7, 6)},
			},
			{
				PutLeft: map[join.Key]join.LeftState{intKey(t, 1): leftRow(1, 8, "y")},
				AddSubs: []join.Subscription{sub(t, 8, 1)},
				DelLeft: []join.Key{intKey(t, 6)}, DelSubs: []join.Subscription{sub(t, 7, 6)},
			},
		}
	}},
	{"clear right in chunk 2", func(t *testing.T) []join.Mutations {
		return []join.Mutations{
			{PutRight: map[join.Key]join.RightState{intKey(t, 7): rightRow(7, "alice2")}},
			{ClearRight: true, PutRight: map[join.Key]join.RightState{intKey(t, 9): rightRow(9, "carol")}},
			{PutRight: map[join.Key]join.RightState{intKey(t, 8): rightRow(8, "bob2")}, DelRight: []join.Key{intKey(t, 9)}},
		}
	}},
	{"both sides cleared, left twice", func(t *testing.T) []join.Mutations {
		return []join.Mutations{
			{
				ClearLeft: true,
				PutLeft:   map[join.Key]join.LeftState{intKey(t, 5): leftRow(5, 9, "n")},
				AddSubs:   []join.Subscription{sub(t, 9, 5)},
			},
			{
				ClearLeft: true, ClearRight: true,
				PutLeft:  map[join.Key]join.LeftState{intKey(t, 6): leftRow(6, 8, "m")},
				PutRight: map[join.Key]join.RightState{intKey(t, 8): rightRow(8, "bob2")},
				AddSubs:  []join.Subscription{sub(t, 8, 6)},
			},
		}
	}},
	{"empty chunks", func(t *testing.T) []join.Mutations {
		return []join.Mutations{{}, {}}
	}},
}

// merge returns the net effect of chunks applied in order, as one batch.
func merge(chunks []join.Mutations) join.Mutations {
	var out join.Mutations
	left := map[join.Key]*join.LeftState{} // nil: deleted
	right := map[join.Key]*join.RightState{}
	subs := map[join.Subscription]bool{} // false: removed
	for _, c := range chunks {
		if c.ClearLeft {
			out.ClearLeft = true
			clear(left)
			clear(subs)
		}
		if c.ClearRight {
			out.ClearRight = true
			clear(right)
		}
		for _, k := range c.DelLeft {
			left[k] = nil
		}
		for k, st := range c.PutLeft {
			left[k] = &st
		}
		for _, k := range c.DelRight {
			right[k] = nil
		}
		for k, st := range c.PutRight {
			right[k] = &st
		}
		for _, s := range c.DelSubs {
			subs[s] = false
		}
		for _, s := range c.AddSubs {
			subs[s] = true
		}
	}
	out.PutLeft, out.PutRight = map[join.Key]join.LeftState{}, map[join.Key]join.RightState{}
	for k, st := range left {
		if st == nil {
			out.DelLeft = append(out.DelLeft, k)
		} else {
			out.PutLeft[k] = *st
		}
	}
	for k, st := range right {
		if st == nil {
			out.DelRight = append(out.DelRight, k)
		} else {
			out.PutRight[k] = *st
		}
	}
	for s, add := range subs {
		if add {
			out.AddSubs = append(out.AddSubs, s)
		} else {
			out.DelSubs = append(out.DelSubs, s)
		}
	}
	return out
}

// TestPartialThenFinishEqualsCommit checks that a large transaction written
// in chunks and finished leaves the same state as one Commit of its net
// mutations, also when every chunk is sent twice (a retry).
func TestPartialThenFinishEqualsCommit(t *testing.T) {
	t.Parallel()
	for _, tt := range partialCases {
		for _, retry := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/retry=%t", tt.name, retry), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				cfg := Config{SubShards: 4, RowShards: 4, PageSize: 2}
				chunked, _ := newStore(t, cfg)
				whole, _ := newStore(t, cfg)
				for _, s := range []*Store{chunked, whole} {
					if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
						t.Fatal(err)
					}
				}
				chunks := tt.chunks(t)
				for _, c := range chunks {
					for range 1 + btoi(retry) {
						if err := chunked.CommitPartial(ctx, c, 20); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := chunked.FinishPartial(ctx, 20); err != nil {
					t.Fatal(err)
				}
				if err := whole.Commit(ctx, merge(chunks), 20); err != nil {
					t.Fatal(err)
				}

				if got, want := readState(t, chunked), readState(t, whole); got != want {
					t.Errorf("state read after the chunks:\n%s\nwant (one commit):\n%s", got, want)
				}
				mc, _ := chunked.Meta(ctx)
				mw, _ := whole.Meta(ctx)
				if mc.Checkpoint != 20 || mc.InFlight != 0 || chunked.InFlight() != 0 || mw.Checkpoint != 20 {
					t.Errorf("meta after finish = %+v, after one commit %+v", mc, mw)
				}
				// The merged batch is not net when a chunk undoes another's
				// subscription: the count is corrected from the replies.
				if nc, nw := subsCount(t, chunked, "chunks finished"), subsCount(t, whole, "one commit"); nc != nw {
					t.Errorf("%d subscriptions after the chunks, %d after one commit", nc, nw)
				}
				// Raw keys, garbage generations swept: the undo log is gone
				// and the current generations hold the same data.
				for _, s := range []*Store{chunked, whole} {
					if _, err := s.Sweep(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if d := diffDumps(dump(t, chunked, true), dump(t, whole, true)); d != "" {
					t.Errorf("raw state after the chunks differs from one commit: %s", d)
				}
			})
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestRecoverRestoresCheckpointState checks that Recover, from a restarted
// process, brings every key back to its value before the transaction.
func TestRecoverRestoresCheckpointState(t *testing.T) {
	t.Parallel()
	for _, tt := range partialCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 2})
			if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
				t.Fatal(err)
			}
			before, beforeState := dump(t, s, false), readState(t, s)
			if rolledBack, err := s.Recover(ctx); err != nil || rolledBack {
				t.Fatalf("Recover with nothing in flight = %t, %v", rolledBack, err)
			}
			chunks := tt.chunks(t)
			for i, c := range chunks {
				if err := s.CommitPartial(ctx, c, 20); err != nil {
					t.Fatal(err)
				}
				if n, err := s.Sweep(ctx); err != nil || n != 0 {
					t.Fatalf("Sweep after chunk %d = %d, %v; want nothing deleted", i, n, err)
				}
			}
			if s.InFlight() != 20 {
				t.Errorf("InFlight() = %d, want 20", s.InFlight())
			}
			if diffDumps(dump(t, s, false), before) == "" {
				t.Fatal("the chunks changed nothing")
			}

			// The process dies; its successor recovers.
			s2, err := Open(ctx, s.rdb, s.Config())
			if err != nil {
				t.Fatal(err)
			}
			if m, err := s2.Meta(ctx); err != nil || m.InFlight != 20 || s2.InFlight() != 20 {
				t.Fatalf("Meta after reopen = %+v, %v; InFlight() = %d", m, err, s2.InFlight())
			}
			if rolledBack, err := s2.Recover(ctx); err != nil || !rolledBack {
				t.Fatalf("Recover = %t, %v", rolledBack, err)
			}
			if d := diffDumps(dump(t, s2, false), before); d != "" {
				t.Errorf("raw state after Recover: %s", d)
			}
			if got := readState(t, s2); got != beforeState {
				t.Errorf("state read after Recover:\n%s\nwant\n%s", got, beforeState)
			}
			if s2.InFlight() != 0 || s2.Checkpoint() != 10 {
				t.Errorf("after Recover: InFlight() = %d, Checkpoint() = %d", s2.InFlight(), s2.Checkpoint())
			}
			if rolledBack, err := s2.Recover(ctx); err != nil || rolledBack {
				t.Errorf("second Recover = %t, %v; want a no-op", rolledBack, err)
			}
			if err := s2.Commit(ctx, merge(chunks), 20); err != nil {
				t.Errorf("Commit after Recover: %v", err)
			}
		})
	}
}

// largeTransaction returns chunks that rewrite rows 0..rows-1 (the first
// base of them exist, subscribed to customer 1) to customer 2, then clear
// the left side and insert a few rows.
func largeTransaction(t *testing.T, base, rows, chunk int) []join.Mutations {
	var chunks []join.Mutations
	for lo := 0; lo < rows; lo += chunk {
		m := join.Mutations{PutLeft: map[join.Key]join.LeftState{}}
		for i := int64(lo); i < int64(min(lo+chunk, rows)); i++ {
			m.PutLeft[intKey(t, i)] = leftRow(i, 2, "v2")
			m.AddSubs = append(m.AddSubs, sub(t, 2, i))
			if i < int64(base) {
				m.DelSubs = append(m.DelSubs, sub(t, 1, i))
			}
		}
		chunks = append(chunks, m)
	}
	last := rowsAt(t, 10, 3)
	last.ClearLeft = true
	return append(chunks, last)
}

// TestRecoverInterrupted stops Recover after some pages, as a crash would,
// and checks that calling it again completes the rollback.
func TestRecoverInterrupted(t *testing.T) {
	t.Parallel()
	errStop := errors.New("stop")
	for _, tt := range []struct {
		name  string
		stops []int // pages restored before each interruption; 0: one page at a time to the end
	}{
		{"after the first page", []int{1}},
		{"twice", []int{7, 2}},
		{"after every page", []int{0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 4})
			if err := s.Commit(ctx, rowsAt(t, 50, 1), 1); err != nil {
				t.Fatal(err)
			}
			before := dump(t, s, false)
			// Over 512 entries: the log is no listpack, which HSCAN would
			// return whole, and Recover takes many pages.
			for _, c := range largeTransaction(t, 50, 300, 100) {
				if err := s.CommitPartial(ctx, c, 2); err != nil {
					t.Fatal(err)
				}
			}
			interrupt := func(after int) {
				t.Helper()
				pages := 0
				s.afterRestore = func(n int) error {
					// Only pages that restored something count: a scan
					// starting over may first meet buckets emptied before.
					if n > 0 {
						pages++
					}
					if pages == after {
						return errStop
					}
					return nil
				}
				defer func() { s.afterRestore = nil }()
				if _, err := s.Recover(ctx); !errors.Is(err, errStop) {
					t.Fatalf("interrupted Recover: %v", err)
				}
				if m, err := s.Meta(ctx); err != nil || m.InFlight != 2 {
					t.Fatalf("meta after an interrupted Recover = %+v, %v; want the marker kept", m, err)
				}
				if err := s.Commit(ctx, join.Mutations{}, 3); !errors.Is(err, ErrInFlight) {
					t.Fatalf("Commit after an interrupted Recover: %v, want ErrInFlight", err)
				}
			}
			interrupted := 0
			for _, after := range tt.stops {
				if after > 0 {
					interrupt(after)
					interrupted++
					continue
				}
				// Until only the entries of meta fields are left.
				for s.rdb.HLen(ctx, s.keys.undo()).Val() > undoMetaEntries(t, s) {
					if interrupted > 1000 {
						t.Fatal("interrupted Recover makes no progress")
					}
					interrupt(1)
					interrupted++
				}
			}
			if d := diffDumps(dump(t, s, false), before); d == "" {
				t.Fatal("interrupted Recover restored everything")
			}
			rolledBack, err := s.Recover(ctx)
			if err != nil || !rolledBack {
				t.Fatalf("Recover = %t, %v", rolledBack, err)
			}
			if d := diffDumps(dump(t, s, false), before); d != "" {
				t.Errorf("raw state after %d interruptions and Recover: %s", interrupted, d)
			}
		})
	}
}

// TestRecoverLargeLog rolls back a transaction of 100k rows (200k undo
// entries) and checks that Recover reads the log in pages.
func TestRecoverLargeLog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 64, RowShards: 64})
	const base, rows = 1000, 100_000
	if err := s.Commit(ctx, rowsAt(t, base, 1), 1); err != nil {
		t.Fatal(err)
	}
	before := dump(t, s, false)
	start := time.Now()
	for _, c := range largeTransaction(t, base, rows, 20_000) {
		if err := s.CommitPartial(ctx, c, 2); err != nil {
			t.Fatal(err)
		}
	}
	entries := s.rdb.HLen(ctx, s.keys.undo()).Val()
	metaEntries := undoMetaEntries(t, s) // restored last, not by pages
	t.Logf("%d chunks of %d rows, %d undo entries: %v", rows/20_000+1, 20_000, entries, time.Since(start))
	if entries < 2*rows {
		t.Fatalf("%d undo entries, want at least %d", entries, 2*rows)
	}
	pages, largest, total := 0, 0, 0
	s.afterRestore = func(n int) error {
		pages++
		largest = max(largest, n)
		total += n
		return nil
	}
	start = time.Now()
	if rolledBack, err := s.Recover(ctx); err != nil || !rolledBack {
		t.Fatalf("Recover = %t, %v", rolledBack, err)
	}
	t.Logf("Recover: %d pages, %d entries, largest page %d: %v", pages, total, largest, time.Since(start))
	if int64(total) != entries-metaEntries {
		t.Errorf("Recover restored %d entries, want %d", total, entries-metaEntries)
	}
	if page := s.cfg.PageSize; largest > 4*page || pages < int(entries)/(4*page) {
		t.Errorf("Recover read %d pages of at most %d entries, want pages of about %d", pages, largest, page)
	}
	if d := diffDumps(dump(t, s, false), before); d != "" {
		t.Errorf("raw state after Recover: %s", d)
	}
}

// TestFinishPartialIdempotent checks retries of FinishPartial, also from a
// store whose cache still sees the transaction in flight (as after a lost
// reply), and its refusals.
func TestFinishPartialIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4})
	if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
		t.Fatal(err)
	}
	if err := s.FinishPartial(ctx, 5); err != nil {
		t.Errorf("FinishPartial below the checkpoint with nothing in flight: %v", err)
	}
	if err := s.FinishPartial(ctx, 11); !errors.Is(err, ErrNotInFlight) {
		t.Errorf("FinishPartial with nothing in flight: %v, want ErrNotInFlight", err)
	}
	for _, c := range partialCases[3].chunks(t) {
		if err := s.CommitPartial(ctx, c, 30); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FinishPartial(ctx, 10); err == nil {
		t.Error("FinishPartial at the checkpoint succeeded")
	}
	stale, err := Open(ctx, s.rdb, s.Config())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.FinishPartial(ctx, 30); err != nil {
		t.Fatal(err)
	}
	want, wantState := dump(t, s, false), readState(t, s)
	for _, retry := range []struct {
		s   *Store
		lsn wal.LSN
	}{{s, 30}, {stale, 30}, {s, 25}, {stale, 12}} {
		if err := retry.s.FinishPartial(ctx, retry.lsn); err != nil {
			t.Errorf("FinishPartial(%d) retried: %v", retry.lsn, err)
		}
	}
	if d := diffDumps(dump(t, s, false), want); d != "" {
		t.Errorf("raw state after retries: %s", d)
	}
	if got := readState(t, stale); got != wantState {
		t.Errorf("state after retries:\n%s\nwant\n%s", got, wantState)
	}
	m, _ := s.Meta(ctx)
	if m.Checkpoint != 30 || m.InFlight != 0 || stale.Checkpoint() != 30 || stale.InFlight() != 0 {
		t.Errorf("meta after retries = %+v; stale store: checkpoint %d, in flight %d", m, stale.Checkpoint(), stale.InFlight())
	}
	if n := s.rdb.Exists(ctx, s.keys.undo()).Val(); n != 0 {
		t.Error("undo log left after FinishPartial")
	}
	if err := stale.FinishPartial(ctx, 31); !errors.Is(err, ErrNotInFlight) {
		t.Errorf("FinishPartial above the checkpoint after finishing: %v, want ErrNotInFlight", err)
	}
}

// TestCommitRefusedInFlight checks that Commit, and a partial commit of
// another transaction, fail while a partial transaction is in flight.
func TestCommitRefusedInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4})
	if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
		t.Fatal(err)
	}
	if err := s.CommitPartial(ctx, join.Mutations{}, 0); err == nil {
		t.Error("CommitPartial of transaction 0 succeeded")
	}
	chunk := partialCases[0].chunks(t)[0]
	if err := s.CommitPartial(ctx, chunk, 20); err != nil {
		t.Fatal(err)
	}
	other, err := Open(ctx, s.rdb, s.Config())
	if err != nil {
		t.Fatal(err)
	}
	for name, commit := range map[string]func() error{
		"Commit":                   func() error { return s.Commit(ctx, chunk, 30) },
		"Commit at an applied LSN": func() error { return s.Commit(ctx, chunk, 5) },
		"Commit by another store":  func() error { return other.Commit(ctx, chunk, 30) },
		"CommitPartial of another": func() error { return s.CommitPartial(ctx, chunk, 21) },
		"CommitPartial from other": func() error { return other.CommitPartial(ctx, chunk, 21) },
	} {
		err := commit()
		if !errors.Is(err, ErrInFlight) || !strings.Contains(err.Error(), "Recover") || !strings.Contains(err.Error(), "FinishPartial") {
			t.Errorf("%s while in flight: %v; want ErrInFlight naming Recover and FinishPartial", name, err)
		}
	}
	if err := s.FinishPartial(ctx, 20); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, chunk, 30); err != nil {
		t.Errorf("Commit after FinishPartial: %v", err)
	}
	if err := s.CommitPartial(ctx, chunk, 21); err != nil {
		t.Errorf("CommitPartial of the next transaction: %v", err)
	}
}

// TestSweepKeepsRestorableGeneration checks that Sweep leaves the generation
// a Clear replaced while the transaction is in flight, and deletes it once
// the transaction is finished.
func TestSweepKeepsRestorableGeneration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, tc := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 2})
	if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
		t.Fatal(err)
	}
	before, beforeState := dump(t, s, false), readState(t, s)
	chunks := partialCases[5].chunks(t) // clears both sides
	for _, c := range chunks {
		if err := s.CommitPartial(ctx, c, 20); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Sweep(ctx); err != nil || n != 0 {
		t.Errorf("Sweep in flight = %d, %v; want nothing deleted", n, err)
	}
	if rolledBack, err := s.Recover(ctx); err != nil || !rolledBack {
		t.Fatalf("Recover = %t, %v", rolledBack, err)
	}
	if d := diffDumps(dump(t, s, false), before); d != "" {
		t.Errorf("raw state after Recover: %s", d)
	}
	// Nothing is garbage: the replaced generations are current again and
	// the ones the chunks wrote are empty.
	if n, err := s.Sweep(ctx); err != nil || n != 0 {
		t.Errorf("Sweep after Recover = %d, %v; want nothing to delete", n, err)
	}
	if got := readState(t, s); got != beforeState {
		t.Errorf("state after Recover and Sweep:\n%s\nwant\n%s", got, beforeState)
	}

	// Finished, the replaced generations are garbage.
	oldKeys := countKeys(t, tc, s.keys.prefix+":[lrs]*")
	for _, c := range chunks {
		if err := s.CommitPartial(ctx, c, 20); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.FinishPartial(ctx, 20); err != nil {
		t.Fatal(err)
	}
	n, err := s.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Two left generations replaced (the first cleared at once) and one right.
	if n < oldKeys {
		t.Errorf("Sweep after FinishPartial deleted %d keys, want at least the %d of the old generations", n, oldKeys)
	}
}

// TestSweepConcurrentWithPartials runs Sweep in a loop while large
// transactions with clears are written and rolled back.
func TestSweepConcurrentWithPartials(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4, PageSize: 2})
	if err := s.Commit(ctx, rowsAt(t, 30, 1), 1); err != nil {
		t.Fatal(err)
	}
	sweeper, err := Open(ctx, s.rdb, s.Config())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := sweeper.Sweep(ctx); err != nil {
				t.Error(err)
				return
			}
		}
	})
	defer func() {
		close(done)
		wg.Wait()
	}()
	lsn := wal.LSN(1)
	for round := range 30 {
		// No garbage left for the concurrent sweeper to delete under the
		// comparison: it deletes nothing while the transaction is in flight.
		if _, err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		before := dump(t, s, false)
		for _, c := range largeTransaction(t, 30, 40, 15) {
			if err := s.CommitPartial(ctx, c, lsn+1); err != nil {
				t.Fatal(err)
			}
		}
		if round%2 == 0 {
			if _, err := s.Recover(ctx); err != nil {
				t.Fatal(err)
			}
			if d := diffDumps(dump(t, s, false), before); d != "" {
				t.Fatalf("round %d: raw state after Recover under a concurrent sweep: %s", round, d)
			}
			continue
		}
		lsn++
		if err := s.FinishPartial(ctx, lsn); err != nil {
			t.Fatal(err)
		}
		// Back to the rows the next round expects.
		m := rowsAt(t, 30, 1)
		m.ClearLeft = true
		lsn++
		if err := s.Commit(ctx, m, lsn); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDiscardedPartialChangesNothing checks that a CommitPartial whose MULTI
// Redis discards leaves no writes, no undo entries and no marker behind.
func TestDiscardedPartialChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 4, RowShards: 4})
	if err := s.Commit(ctx, baseBatch(t), 10); err != nil {
		t.Fatal(err)
	}
	before := dump(t, s, false)
	chunk := partialCases[3].chunks(t)[1] // a Clear and a new row
	s.beforeExec = func(ctx context.Context, p redis.Pipeliner) { p.Do(ctx, "HSET", s.keys.meta()) }
	if err := s.CommitPartial(ctx, chunk, 20); err == nil {
		t.Fatal("CommitPartial with a bad command succeeded")
	}
	if d := diffDumps(dump(t, s, false), before); d != "" {
		t.Errorf("a discarded partial commit changed the state: %s", d)
	}
	s.beforeExec = nil
	if err := s.CommitPartial(ctx, chunk, 20); err != nil {
		t.Fatal(err)
	}
	if s.InFlight() != 20 {
		t.Errorf("InFlight() after the retry = %d", s.InFlight())
	}
}
