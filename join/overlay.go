package join

import (
	"context"
	"fmt"
	"slices"
)

// leftEntry is a left row's state plus its encoded foreign key.
type leftEntry struct {
	LeftState
	fk Key // "" when a foreign key column is NULL: no subscription
}

// overlay is the batch's view of the join state: the store as of batch start
// (prefetched), plus everything the batch changed so far. Changes are kept
// net: the last value per key, which is what Mutations persist.
type overlay struct {
	store StateReader
	spec  *Spec

	// storeLeft and storeRight cache the batch-start store state of the keys
	// the batch touches; a nil value means known absent.
	storeLeft  map[Key]*leftEntry
	storeRight map[Key]*RightState

	// leftCleared and rightCleared record a TRUNCATE in this batch: the store
	// no longer counts for that side (subscriptions go with the left side).
	leftCleared  bool
	rightCleared bool

	// left, right and subs are the changes since the side was last cleared;
	// a nil row means deleted, a false subscription means removed.
	left  map[Key]*leftEntry
	right map[Key]*RightState
	subs  map[Key]subSet

	scratch []byte // key encoding buffer
	// entries and rights hand out the stored rows' entries and right
	// states (the engine's, when set).
	entries *slab[leftEntry]
	rights  *slab[RightState]
}

// newOverlay returns an empty overlay for a batch of about n changes
// (its left maps are sized for them).
func newOverlay(store StateReader, spec *Spec, n int) *overlay {
	return &overlay{
		store: store, spec: spec,
		storeLeft: make(map[Key]*leftEntry, n), storeRight: map[Key]*RightState{},
		left: make(map[Key]*leftEntry, n), right: map[Key]*RightState{}, subs: map[Key]subSet{},
	}
}

// size returns the number of entries the overlay holds.
func (o *overlay) size() int {
	return len(o.storeLeft) + len(o.storeRight) + len(o.left) + len(o.right) + len(o.subs)
}

// reset empties the overlay for another batch, keeping its maps' room.
func (o *overlay) reset() {
	clear(o.storeLeft)
	clear(o.storeRight)
	clear(o.left)
	clear(o.right)
	clear(o.subs)
	o.leftCleared, o.rightCleared = false, false
}

// newLeftEntry wraps a stored state, encoding its foreign key.
func (o *overlay) newLeftEntry(st LeftState) (*leftEntry, error) {
	var e *leftEntry
	if o.entries != nil {
		e = o.entries.new()
		e.LeftState = st
	} else {
		e = &leftEntry{LeftState: st}
	}
	return e, o.setFK(e, "")
}

// setFK encodes e's foreign key. When it equals hint (the key a fan-out
// page is about, the common case) hint's string is shared, so encoding
// allocates nothing.
func (o *overlay) setFK(e *leftEntry, hint Key) error {
	if hasNull(e.FK) {
		e.fk = ""
		return nil
	}
	var err error
	if o.scratch, err = AppendKey(o.scratch[:0], o.spec.FK, e.FK); err != nil {
		return fmt.Errorf("encode stored foreign key: %w", err)
	}
	if string(o.scratch) == string(hint) {
		e.fk = hint
	} else {
		e.fk = Key(o.scratch)
	}
	return nil
}

// loadLeft reads the store state of keys into the cache.
func (o *overlay) loadLeft(ctx context.Context, keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	got, err := o.store.GetLeft(ctx, keys)
	if err != nil {
		return fmt.Errorf("get left rows: %w", err)
	}
	defer releaseLeftMap(got)
	for _, k := range keys {
		st, ok := got[k]
		if !ok {
			o.storeLeft[k] = nil
			continue
		}
		e, err := o.newLeftEntry(st)
		if err != nil {
			return err
		}
		o.storeLeft[k] = e
	}
	return nil
}

// loadRight reads the store state of keys into the cache.
func (o *overlay) loadRight(ctx context.Context, keys []Key) error {
	if len(keys) == 0 {
		return nil
	}
	got, err := o.store.GetRight(ctx, keys)
	if err != nil {
		return fmt.Errorf("get right rows: %w", err)
	}
	defer releaseRightMap(got)
	var states []RightState
	if o.rights == nil {
		states = make([]RightState, 0, len(got)) // one allocation for all
	}
	for _, k := range keys {
		st, ok := got[k]
		switch {
		case !ok:
			o.storeRight[k] = nil
		case o.rights != nil:
			r := o.rights.new()
			*r = st
			o.storeRight[k] = r
		default:
			states = append(states, st)
			o.storeRight[k] = &states[len(states)-1]
		}
	}
	return nil
}

// leftOf returns the current state of left key k, nil when absent. Keys not
// prefetched are read from the store one at a time (a fallback).
func (o *overlay) leftOf(ctx context.Context, k Key) (*leftEntry, error) {
	if e, ok := o.left[k]; ok {
		return e, nil
	}
	if o.leftCleared {
		return nil, nil
	}
	if e, ok := o.storeLeft[k]; ok {
		return e, nil
	}
	if err := o.loadLeft(ctx, []Key{k}); err != nil {
		return nil, err
	}
	return o.storeLeft[k], nil
}

// rightOf returns the current state of right key k, nil when absent.
func (o *overlay) rightOf(ctx context.Context, k Key) (*RightState, error) {
	if r, ok := o.right[k]; ok {
		return r, nil
	}
	if o.rightCleared {
		return nil, nil
	}
	if r, ok := o.storeRight[k]; ok {
		return r, nil
	}
	if err := o.loadRight(ctx, []Key{k}); err != nil {
		return nil, err
	}
	return o.storeRight[k], nil
}

// subSet is one foreign key's subscriptions the batch set: most keys have
// one, held inline; a map holds them once there are more.
type subSet struct {
	first   Key
	present bool
	more    map[Key]bool // all of them, first included; nil for one
}

// len returns the number of subscriptions in s.
func (s subSet) len() int {
	if s.more != nil {
		return len(s.more)
	}
	if s.first == "" {
		return 0
	}
	return 1
}

// has reports whether s holds a subscription of pk.
func (s subSet) has(pk Key) bool {
	if s.more != nil {
		_, ok := s.more[pk]
		return ok
	}
	return s.len() == 1 && s.first == pk
}

// all yields each subscription's key and whether it is present.
func (s subSet) all(yield func(Key, bool) bool) {
	if s.more == nil {
		if s.len() == 1 {
			yield(s.first, s.present)
		}
		return
	}
	for pk, present := range s.more {
		if !yield(pk, present) {
			return
		}
	}
}

// setSub records that subscription (fk, pk) is present or removed.
func (o *overlay) setSub(fk, pk Key, present bool) {
	s, ok := o.subs[fk]
	switch {
	case !ok:
		s = subSet{first: pk, present: present}
	case s.more == nil && s.first == pk:
		s.present = present
	case s.more == nil:
		s.more = map[Key]bool{s.first: s.present, pk: present}
	default:
		s.more[pk] = present
		return
	}
	o.subs[fk] = s
}

// clearLeft applies a left TRUNCATE: no left rows, no subscriptions.
func (o *overlay) clearLeft() {
	o.leftCleared = true
	o.left = map[Key]*leftEntry{}
	o.subs = map[Key]subSet{}
}

// clearRight applies a right TRUNCATE: no right rows.
func (o *overlay) clearRight() {
	o.rightCleared = true
	o.right = map[Key]*RightState{}
}

// baseLeft returns the store state of k as the batch's mutations will find it
// (after any clear), nil when absent.
func (o *overlay) baseLeft(k Key) *leftEntry {
	if o.leftCleared {
		return nil
	}
	return o.storeLeft[k]
}

// mutations returns the net change of the overlay against the store, in
// containers from spare when it has some.
func (o *overlay) mutations(spare *recycled) Mutations {
	m := spare.takeMutations()
	m.ClearLeft, m.ClearRight = o.leftCleared, o.rightCleared
	for k, e := range o.left {
		base := o.baseLeft(k)
		switch {
		case e != nil && (base == nil || !base.LeftState.Equal(e.LeftState)):
			if m.PutLeft == nil {
				m.PutLeft = make(map[Key]LeftState, len(o.left))
			}
			m.PutLeft[k] = e.LeftState
		case e == nil && base != nil:
			m.DelLeft = append(m.DelLeft, k)
		}
	}
	for k, r := range o.right {
		var base *RightState
		if !o.rightCleared {
			base = o.storeRight[k]
		}
		switch {
		case r != nil && (base == nil || !base.Equal(*r)):
			if m.PutRight == nil {
				m.PutRight = map[Key]RightState{}
			}
			m.PutRight[k] = *r
		case r == nil && base != nil:
			m.DelRight = append(m.DelRight, k)
		}
	}
	m.AddSubs, m.DelSubs = o.subMutations(m.AddSubs, m.DelSubs)
	slices.Sort(m.DelLeft)
	slices.Sort(m.DelRight)
	return m
}

// subMutations appends to add and del the subscriptions to add and to
// delete, and sorts them in member order.
func (o *overlay) subMutations(add, del []Subscription) ([]Subscription, []Subscription) {
	for fk, pks := range o.subs {
		for pk, present := range pks.all {
			base := o.baseLeft(pk)
			inStore := base != nil && base.fk == fk
			switch {
			case present && !inStore:
				add = append(add, Subscription{FK: fk, PK: pk})
			case !present && inStore:
				del = append(del, Subscription{FK: fk, PK: pk})
			}
		}
	}
	slices.SortFunc(add, compareSubs)
	slices.SortFunc(del, compareSubs)
	return add, del
}

// compareSubs orders subscriptions by member: foreign key, then key.
func compareSubs(a, b Subscription) int {
	if c := compareKey(a.FK, b.FK); c != 0 {
		return c
	}
	return compareKey(a.PK, b.PK)
}

func compareKey(a, b Key) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
