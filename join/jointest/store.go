// Package jointest provides in-memory fakes and a random-scenario checker for
// the join package: a state store, a target table, a model of the source
// tables that evaluates the join with SQL semantics, and a change generator.
// The redisstore tests reuse them to run the same scenarios against Redis.
package jointest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/fkmat/fkmat/join"
)

// StateStore is a join state store that can persist a batch's mutations.
type StateStore interface {
	join.StateReader
	Apply(ctx context.Context, m join.Mutations) error
}

// Calls counts a Store's reads.
type Calls struct {
	GetLeft, GetRight, Dependents int
	// LeftKeys is the number of keys read through GetLeft.
	LeftKeys int
}

// Store is an in-memory join.StateReader. Its Apply is strict: it rejects
// mutations that are not net (putting an unchanged row, deleting an absent
// one, adding a present subscription), so tests catch redundant state writes.
type Store struct {
	Left  map[join.Key]join.LeftState
	Right map[join.Key]join.RightState
	// subs maps a foreign key to its dependents in key order.
	subs map[join.Key][]join.Key
	// Calls counts the reads since creation.
	Calls Calls
	// OnDependents, if set, is called by Dependents before it reads.
	OnDependents func(fk join.Key)
}

var _ StateStore = (*Store)(nil)

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{Left: map[join.Key]join.LeftState{}, Right: map[join.Key]join.RightState{}, subs: map[join.Key][]join.Key{}}
}

// GetLeft implements join.StateReader.
func (s *Store) GetLeft(_ context.Context, keys []join.Key) (map[join.Key]join.LeftState, error) {
	s.Calls.GetLeft++
	s.Calls.LeftKeys += len(keys)
	out := make(map[join.Key]join.LeftState, len(keys))
	for _, k := range keys {
		if st, ok := s.Left[k]; ok {
			out[k] = st
		}
	}
	return out, nil
}

// GetRight implements join.StateReader.
func (s *Store) GetRight(_ context.Context, keys []join.Key) (map[join.Key]join.RightState, error) {
	s.Calls.GetRight++
	out := make(map[join.Key]join.RightState, len(keys))
	for _, k := range keys {
		if st, ok := s.Right[k]; ok {
			out[k] = st
		}
	}
	return out, nil
}

// Dependents implements join.StateReader.
func (s *Store) Dependents(_ context.Context, fk, after join.Key, limit int) ([]join.Key, error) {
	s.Calls.Dependents++
	if s.OnDependents != nil {
		s.OnDependents(fk)
	}
	deps := s.subs[fk]
	i := 0
	if after != "" {
		i = sort.Search(len(deps), func(i int) bool { return deps[i] > after })
	}
	end := min(len(deps), i+limit)
	return slices.Clone(deps[i:end]), nil
}

// DependentsMany implements join.ManyDependentsReader (one call).
func (s *Store) DependentsMany(ctx context.Context, fks []join.Key, limits []int) ([][]join.Key, error) {
	out := make([][]join.Key, len(fks))
	for i, fk := range fks {
		var err error
		if out[i], err = s.Dependents(ctx, fk, "", limits[i]); err != nil {
			return nil, err
		}
		s.Calls.Dependents--
	}
	s.Calls.Dependents++
	return out, nil
}

// Subs returns the number of subscriptions.
func (s *Store) Subs() int {
	n := 0
	for _, deps := range s.subs {
		n += len(deps)
	}
	return n
}

// Apply persists m: clears first, then deletes, puts and subscriptions.
func (s *Store) Apply(_ context.Context, m join.Mutations) error {
	if m.ClearLeft {
		s.Left, s.subs = map[join.Key]join.LeftState{}, map[join.Key][]join.Key{}
	}
	if m.ClearRight {
		s.Right = map[join.Key]join.RightState{}
	}
	if err := applyRows(s.Left, m.PutLeft, m.DelLeft, join.LeftState.Equal); err != nil {
		return fmt.Errorf("apply left rows: %w", err)
	}
	if err := applyRows(s.Right, m.PutRight, m.DelRight, join.RightState.Equal); err != nil {
		return fmt.Errorf("apply right rows: %w", err)
	}
	for _, sub := range m.DelSubs {
		if !s.delSub(sub) {
			return fmt.Errorf("delete absent subscription %x", sub.Member())
		}
	}
	for _, sub := range m.AddSubs {
		if !s.addSub(sub) {
			return fmt.Errorf("add present subscription %x", sub.Member())
		}
	}
	return nil
}

// applyRows applies puts and deletes to rows, rejecting non-net ones.
func applyRows[S any](rows map[join.Key]S, puts map[join.Key]S, dels []join.Key, eq func(S, S) bool) error {
	for _, k := range dels {
		if _, ok := rows[k]; !ok {
			return fmt.Errorf("delete absent key %x", k)
		}
		if _, ok := puts[k]; ok {
			return fmt.Errorf("key %x both put and deleted", k)
		}
		delete(rows, k)
	}
	for _, k := range slices.Sorted(maps.Keys(puts)) {
		if old, ok := rows[k]; ok && eq(old, puts[k]) {
			return fmt.Errorf("put unchanged key %x", k)
		}
		rows[k] = puts[k]
	}
	return nil
}

func (s *Store) addSub(sub join.Subscription) bool {
	deps := s.subs[sub.FK]
	i, found := slices.BinarySearch(deps, sub.PK)
	if found {
		return false
	}
	s.subs[sub.FK] = slices.Insert(deps, i, sub.PK)
	return true
}

func (s *Store) delSub(sub join.Subscription) bool {
	deps := s.subs[sub.FK]
	i, found := slices.BinarySearch(deps, sub.PK)
	if !found {
		return false
	}
	if deps = slices.Delete(deps, i, i+1); len(deps) == 0 {
		delete(s.subs, sub.FK)
	} else {
		s.subs[sub.FK] = deps
	}
	return true
}

// Check verifies the store's own invariant: the subscriptions are exactly the
// left rows with a non-NULL foreign key, and hashes match the values.
func (s *Store) Check(spec join.Spec) error {
	want := 0
	for pk, st := range s.Left {
		if st.Hash != join.HashLeft(st.FK, st.Values) {
			return fmt.Errorf("left %x: stale hash", pk)
		}
		fk, err := join.EncodeKey(spec.FK, st.FK)
		if err != nil {
			continue // NULL foreign key: no subscription
		}
		want++
		if _, ok := slices.BinarySearch(s.subs[fk], pk); !ok {
			return fmt.Errorf("left %x has no subscription to %x", pk, fk)
		}
	}
	if got := s.Subs(); got != want {
		return fmt.Errorf("%d subscriptions for %d left rows with a foreign key", got, want)
	}
	return nil
}
