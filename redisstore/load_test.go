package redisstore

import (
	"context"
	"strconv"
	"testing"

	"github.com/fkmat/fkmat/join"
)

// TestLoader: rows and subscriptions gathered over several Adds, by two
// loaders at once, with flushes forced by a small size, read back exactly;
// rows of one bucket went out in multi-field HSETs; the subscription count
// is exact; and a loader refuses deletes and a state that is not fresh.
func TestLoader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newStore(t, Config{SubShards: 8, RowShards: 4})
	const n = 2000
	want := join.Mutations{PutLeft: map[join.Key]join.LeftState{}, PutRight: map[join.Key]join.RightState{}}
	loaders := make([]*Loader, 2)
	for i := range loaders {
		l, err := s.NewLoader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.limit = 20_000 // several flushes
		loaders[i] = l
	}
	for page := range 20 {
		m := join.Mutations{PutLeft: map[join.Key]join.LeftState{}, PutRight: map[join.Key]join.RightState{}}
		for i := page * n / 20; i < (page+1)*n/20; i++ {
			k, fk := intKey(t, int64(i)), intKey(t, int64(i%37))
			st := leftRow(int64(i), int64(i%37), "note "+strconv.Itoa(i))
			m.PutLeft[k], want.PutLeft[k] = st, st
			if i%10 != 0 { // some NULL foreign keys: no subscription
				m.AddSubs = append(m.AddSubs, join.Subscription{FK: fk, PK: k})
				want.AddSubs = append(want.AddSubs, join.Subscription{FK: fk, PK: k})
			}
			if i < 37 {
				r := join.RightState{Key: texts(strconv.Itoa(i)), Values: texts("customer " + strconv.Itoa(i))}
				m.PutRight[fk], want.PutRight[fk] = r, r
			}
		}
		if err := loaders[page%2].Add(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range loaders {
		if err := l.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// 2037 rows in 4+4 buckets and 1800 subscriptions in 8 sets: each
	// flush sends a command per key, not per row.
	commands, entries := loaders[0].commands+loaders[1].commands, loaders[0].entries+loaders[1].entries
	if entries != n+37+len(want.AddSubs) || commands > entries/10 {
		t.Errorf("%d commands for %d rows and subscriptions", commands, entries)
	}
	keys := make([]join.Key, 0, n)
	for k := range want.PutLeft {
		keys = append(keys, k)
	}
	left, err := s.GetLeft(ctx, keys)
	if err != nil || len(left) != n {
		t.Fatalf("GetLeft: %d rows, %v", len(left), err)
	}
	for k, st := range want.PutLeft {
		if !left[k].Equal(st) {
			t.Fatalf("left %x = %v, want %v", k, left[k], st)
		}
	}
	for fk, r := range want.PutRight {
		got, err := s.GetRight(ctx, []join.Key{fk})
		if err != nil || !got[fk].Equal(r) {
			t.Fatalf("right %x = %v, %v", fk, got[fk], err)
		}
		deps, err := s.Dependents(ctx, fk, "", n)
		if err != nil || len(deps) == 0 {
			t.Fatalf("dependents of %x: %d, %v", fk, len(deps), err)
		}
	}
	meta, err := s.Meta(ctx)
	if err != nil || meta.Subscriptions != int64(len(want.AddSubs)) {
		t.Errorf("subscriptions = %d, %v; want %d", meta.Subscriptions, err, len(want.AddSubs))
	}
	if err := loaders[0].Add(ctx, join.Mutations{DelLeft: []join.Key{keys[0]}}); err == nil {
		t.Error("a loader accepted a delete")
	}
	if err := s.Commit(ctx, join.Mutations{}, 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.NewLoader(ctx); err == nil {
		t.Error("NewLoader accepted a state with a checkpoint")
	}
}
