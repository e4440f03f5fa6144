package join

import (
	"context"
	"errors"
	"slices"
	"sync"
)

// Pending is a StateReader showing its base's state as it will be once one
// batch's Mutations are persisted. It lets the daemon compute batch N+1
// while batch N's target and state commits are still in flight: the engine
// reads through Pending with N's mutations set, and sees exactly the state
// N's commit produces whether or not that commit has landed yet (the
// mutations are net and idempotent: a put, delete or subscription change
// already persisted reads the same).
//
// Mutations that clear a side cannot be overlaid (the base would keep
// showing the old generation); Set refuses them and the caller waits for
// the commit instead. Pending is not safe for concurrent use; the mutations
// it holds must not change while set.
type Pending struct {
	base StateReader
	m    *Mutations
	*pendingIndex
	// rest holds the keys a read passes to base.
	rest []Key
}

// pendingIndex is derived from mutations: deleted keys and, per foreign
// key, the subscriptions added (sorted) and deleted. Indexes no Pending
// holds any more are filled again for later mutations (indexPool).
type pendingIndex struct {
	delLeft, delRight map[Key]struct{}
	addSubs           map[Key][]Key
	delSubs           map[Key]map[Key]struct{}
	// pks holds addSubs' lists.
	pks []Key
	// holders counts the Pendings that hold the index.
	holders int
}

var indexPool = sync.Pool{New: func() any {
	return &pendingIndex{delLeft: map[Key]struct{}{}, delRight: map[Key]struct{}{}, addSubs: map[Key][]Key{}, delSubs: map[Key]map[Key]struct{}{}}
}}

// release drops a Pending's hold on x; the last one's gives x back.
func (x *pendingIndex) release() {
	if x.holders--; x.holders > 0 {
		return
	}
	if len(x.delLeft)+len(x.delRight)+len(x.addSubs)+len(x.delSubs) > keptEntries {
		return // too big to keep
	}
	clear(x.delLeft)
	clear(x.delRight)
	clear(x.addSubs)
	clear(x.delSubs)
	clear(x.pks)
	x.pks = x.pks[:0]
	indexPool.Put(x)
}

var (
	_ StateReader          = (*Pending)(nil)
	_ ManyDependentsReader = (*Pending)(nil)
)

// ErrCannotOverlay is returned by Set for mutations that clear a side.
var ErrCannotOverlay = errors.New("mutations that clear a side cannot be overlaid")

// NewPending returns a Pending over base with nothing set.
func NewPending(base StateReader) *Pending { return &Pending{base: base} }

// Set makes reads show m on top of the base; nil shows the base alone.
func (p *Pending) Set(m *Mutations) error { return p.SetFrom(m, nil) }

// SetFrom is Set, taking what from derived from m when from shows m (a
// batch's mutations are overlaid twice: newer, then older).
func (p *Pending) SetFrom(m *Mutations, from *Pending) error {
	var index *pendingIndex
	if from != nil && from.m == m {
		index = from.pendingIndex
	}
	if old := p.pendingIndex; old != nil {
		defer old.release() // after index is held, which may be old
	}
	*p = Pending{base: p.base, rest: p.rest}
	if m == nil || m.Empty() {
		return nil
	}
	if m.Tables != nil {
		return errors.New("overlay the mutations of a join of several tables table by table")
	}
	if m.ClearLeft || m.ClearRight {
		return ErrCannotOverlay
	}
	p.m = m
	if index == nil {
		index = newPendingIndex(m)
	}
	index.holders++
	p.pendingIndex = index
	return nil
}

// newPendingIndex derives the index of m.
func newPendingIndex(m *Mutations) *pendingIndex {
	x := indexPool.Get().(*pendingIndex)
	for _, k := range m.DelLeft {
		x.delLeft[k] = struct{}{}
	}
	for _, k := range m.DelRight {
		x.delRight[k] = struct{}{}
	}
	// Each foreign key's added subscriptions, sorted, are a run of one
	// slice: the engine's mutations come in member order already.
	subs := m.AddSubs
	if !slices.IsSortedFunc(subs, compareSubs) {
		subs = slices.SortedFunc(slices.Values(subs), compareSubs)
	}
	x.pks = slices.Grow(x.pks[:0], len(subs))[:len(subs)]
	for i := 0; i < len(subs); {
		j := i
		for ; j < len(subs) && subs[j].FK == subs[i].FK; j++ {
			x.pks[j] = subs[j].PK
		}
		x.addSubs[subs[i].FK] = x.pks[i:j:j]
		i = j
	}
	for _, s := range m.DelSubs {
		if x.delSubs[s.FK] == nil {
			x.delSubs[s.FK] = map[Key]struct{}{}
		}
		x.delSubs[s.FK][s.PK] = struct{}{}
	}
	return x
}

// GetLeft implements StateReader: keys the mutations decide are answered
// from them, the others from the base.
func (p *Pending) GetLeft(ctx context.Context, keys []Key) (map[Key]LeftState, error) {
	if p.m == nil {
		return p.base.GetLeft(ctx, keys)
	}
	return overlayGet(ctx, keys, &p.rest, p.m.PutLeft, p.delLeft, p.base.GetLeft, NewLeftMap)
}

// GetRight implements StateReader like GetLeft.
func (p *Pending) GetRight(ctx context.Context, keys []Key) (map[Key]RightState, error) {
	if p.m == nil {
		return p.base.GetRight(ctx, keys)
	}
	return overlayGet(ctx, keys, &p.rest, p.m.PutRight, p.delRight, p.base.GetRight, NewRightMap)
}

// overlayGet reads keys through the puts and deletes of an overlay: the
// others from get, into scratch's memory.
func overlayGet[S any](ctx context.Context, keys []Key, scratch *[]Key, puts map[Key]S, dels map[Key]struct{},
	get func(context.Context, []Key) (map[Key]S, error), newMap func(int) map[Key]S) (map[Key]S, error) {
	rest := keys
	for i, k := range keys {
		_, put := puts[k]
		_, del := dels[k]
		if put || del {
			// Some keys are decided by the overlay: read only the others.
			rest = append((*scratch)[:0], keys[:i]...)
			for _, k := range keys[i:] {
				_, put := puts[k]
				_, del := dels[k]
				if !put && !del {
					rest = append(rest, k)
				}
			}
			*scratch = rest
			break
		}
	}
	var out map[Key]S
	if len(rest) > 0 {
		var err error
		if out, err = get(ctx, rest); err != nil {
			return nil, err
		}
	}
	if len(rest) == len(keys) {
		return out, nil
	}
	if out == nil {
		out = newMap(len(keys) - len(rest))
	}
	for _, k := range keys {
		if st, ok := puts[k]; ok {
			out[k] = st
		}
	}
	return out, nil
}

// Dependents implements StateReader: the base's page, asked for enough
// more members to make up for deleted ones, merged with the added members.
func (p *Pending) Dependents(ctx context.Context, fk, after Key, limit int) ([]Key, error) {
	if p.m == nil {
		return p.base.Dependents(ctx, fk, after, limit)
	}
	page, err := p.base.Dependents(ctx, fk, after, limit+len(p.delSubs[fk]))
	if err != nil {
		return nil, err
	}
	return p.merge(fk, after, limit, page), nil
}

// DependentsMany implements ManyDependentsReader, with one round trip when
// the base implements it too.
func (p *Pending) DependentsMany(ctx context.Context, fks []Key, limits []int) ([][]Key, error) {
	asks := slices.Clone(limits)
	if p.m != nil {
		for i, fk := range fks {
			asks[i] += len(p.delSubs[fk])
		}
	}
	pages, err := dependentsMany(ctx, p.base, fks, asks)
	if err != nil || p.m == nil {
		return pages, err
	}
	for i, fk := range fks {
		pages[i] = p.merge(fk, "", limits[i], pages[i])
	}
	return pages, nil
}

// AfterDependentsReader is implemented by readers that can read a page of
// dependents of many foreign keys, each after its own member, in one round
// trip.
type AfterDependentsReader interface {
	// DependentsAfter returns, for each fks[i], what Dependents(ctx,
	// fks[i], afters[i], limit) returns.
	DependentsAfter(ctx context.Context, fks, afters []Key, limit int) ([][]Key, error)
}

var _ AfterDependentsReader = (*Pending)(nil)

// DependentsAfter implements AfterDependentsReader, with one round trip
// when the base implements it too.
func (p *Pending) DependentsAfter(ctx context.Context, fks, afters []Key, limit int) ([][]Key, error) {
	ask := limit
	if p.m != nil {
		for _, fk := range fks {
			ask = max(ask, limit+len(p.delSubs[fk]))
		}
	}
	pages, err := DependentsAfter(ctx, p.base, fks, afters, ask)
	if err != nil || p.m == nil {
		return pages, err
	}
	for i, fk := range fks {
		pages[i] = p.merge(fk, afters[i], limit, pages[i])
	}
	return pages, nil
}

// DependentsAfter reads a page of dependents of each fks[i] after
// afters[i] from r, in one round trip if r can.
func DependentsAfter(ctx context.Context, r StateReader, fks, afters []Key, limit int) ([][]Key, error) {
	if ar, ok := r.(AfterDependentsReader); ok {
		return ar.DependentsAfter(ctx, fks, afters, limit)
	}
	out := make([][]Key, len(fks))
	for i, fk := range fks {
		var err error
		if out[i], err = r.Dependents(ctx, fk, afters[i], limit); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// dependentsMany reads first pages from r, in one round trip if it can.
func dependentsMany(ctx context.Context, r StateReader, fks []Key, limits []int) ([][]Key, error) {
	if mr, ok := r.(ManyDependentsReader); ok {
		return mr.DependentsMany(ctx, fks, limits)
	}
	out := make([][]Key, len(fks))
	for i, fk := range fks {
		var err error
		if out[i], err = r.Dependents(ctx, fk, "", limits[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// merge applies the overlay to a base page read for fk after `after` with
// limit plus the number of fk's deleted subscriptions.
func (p *Pending) merge(fk, after Key, limit int, page []Key) []Key {
	dels, adds := p.delSubs[fk], p.addSubs[fk]
	merged := make([]Key, 0, len(page)+len(adds))
	for _, pk := range page {
		if _, gone := dels[pk]; !gone {
			merged = append(merged, pk)
		}
	}
	// Added members after `after`. When the base may hold more than its
	// page, at least limit base members up to the page's end remain, so any
	// add beyond the page's end sorts after them and is cut below.
	lo, found := slices.BinarySearch(adds, after)
	if found {
		lo++
	}
	merged = append(merged, adds[lo:]...)
	slices.Sort(merged)
	merged = slices.Compact(merged) // an add the base already has
	if len(merged) > limit {
		merged = merged[:limit]
	}
	return merged
}
