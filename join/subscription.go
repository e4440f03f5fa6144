package join

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Response is the subscription side's answer for one left row: the right row
// its foreign key referenced when the answer was computed.
type Response struct {
	// Kind is the instruction answered; fan-out responses carry the join
	// type's propagate kind.
	Kind InstructionKind
	PK   Key
	FK   Key
	// Hash is the left value hash of the instruction answered, checked by
	// the resolver when Hashed. Fan-out responses are not hashed: they are
	// computed with the final right row and hold for any left value that
	// still references FK.
	Hash   uint64
	Hashed bool
	// Right holds the right row's projected values when Found.
	Right []Value
	Found bool
}

// receive applies one instruction to the subscriptions and queues its
// answer for the resolver.
func (b *batch) receive(ctx context.Context, ins Instruction) error {
	switch ins.Kind {
	case DeleteKeyNoPropagate:
		b.ov.setSub(ins.FK, ins.PK, false)
		return nil
	case DeleteKeyAndPropagate:
		if ins.FK != "" {
			b.ov.setSub(ins.FK, ins.PK, false)
		}
		b.respond(Response{Kind: ins.Kind, PK: ins.PK, FK: ins.FK})
		return nil
	}
	r := Response{Kind: ins.Kind, PK: ins.PK, FK: ins.FK, Hash: ins.Hash, Hashed: true}
	if ins.FK != "" {
		// The subscription is kept even when the right row is missing: a
		// later right insert must find it.
		b.ov.setSub(ins.FK, ins.PK, true)
		right, err := b.ov.rightOf(ctx, ins.FK)
		if err != nil {
			return err
		}
		if right != nil {
			r.Right, r.Found = right.Values, true
		}
	}
	b.respond(r)
	return nil
}

// respond queues r for the resolver.
func (b *batch) respond(r Response) {
	b.e.stats.Responses++
	b.seg.queue = append(b.seg.queue, r)
}

// rightUpsert applies a new version of right row k; a version whose projected
// values did not change marks nothing.
func (b *batch) rightUpsert(ctx context.Context, k Key, row RightRow) error {
	old, err := b.ov.rightOf(ctx, k)
	if err != nil {
		return err
	}
	values, err := fillToast(row.Values, old, func(r *RightState) []Value { return r.Values })
	if old == nil && b.e.spec.RightPartitioned && errors.Is(err, ErrNoToastState) {
		b.e.stats.AbsentToastSkips++
		return nil // its partition's move writes it whole
	}
	if err != nil {
		return fmt.Errorf("fill right values: %w", err)
	}
	if old != nil && ValuesEqual(old.Values, values) {
		return nil
	}
	b.touchRight(k, old)
	b.ov.right[k] = &RightState{Key: row.Key, Values: values}
	return nil
}

// rightKeyChange applies right row old moving to key k, its values filling
// the new row's unchanged-TOAST markers.
func (b *batch) rightKeyChange(ctx context.Context, old, k Key, row RightRow) error {
	if old == k {
		return b.rightUpsert(ctx, k, row)
	}
	prev, err := b.ov.rightOf(ctx, old)
	if err != nil {
		return err
	}
	if prev == nil && b.e.spec.RightPartitioned && hasToast(row.Values) {
		b.e.stats.AbsentToastSkips++
		return nil // its partition's move writes it whole
	}
	if row.Values, err = fillToast(row.Values, prev, func(r *RightState) []Value { return r.Values }); err != nil {
		return fmt.Errorf("fill right values from the old key's row: %w", err)
	}
	if err := b.rightDelete(ctx, old); err != nil {
		return err
	}
	return b.rightUpsert(ctx, k, row)
}

// rightDelete applies the deletion of right row k; deleting a row that does
// not exist marks nothing.
func (b *batch) rightDelete(ctx context.Context, k Key) error {
	old, err := b.ov.rightOf(ctx, k)
	if err != nil || old == nil {
		return err
	}
	b.touchRight(k, old)
	b.ov.right[k] = nil
	return nil
}

// touchRight marks right key k dirty, remembering its segment-start state.
func (b *batch) touchRight(k Key, old *RightState) {
	if _, ok := b.seg.rightStart[k]; !ok {
		b.seg.rightStart[k] = old
	}
	b.seg.dirty[k] = struct{}{}
}

// Fan-outs of many right keys read their first pages together: fanOutChunk
// keys at a time, the first prefetchPage dependents of each in one round
// trip and their left rows in another, so that a batch changing many right
// rows does not pay two round trips per row. The bounds keep the prefetched
// state small (at most fanOutChunk*prefetchPage keys).
const (
	fanOutChunk  = 512
	prefetchPage = 128
)

// fanOutPrefetch is what prefetchFanOut read for a chunk of right keys.
type fanOutPrefetch struct {
	limit int
	// first is the first page of stored dependents per right key, read
	// with limit.
	first map[Key][]Key
	// lefts are the stored left rows of those pages; nil when absent.
	lefts map[Key]*LeftState
}

// fanOutMode is how a fan-out answers the stored dependents of a changed
// right key that the batch's left changes did not touch.
type fanOutMode uint8

const (
	// fanOutNone: their joined rows do not change: the right part is the
	// same at the segment's start and end (changed and changed back, or
	// no row before nor after in an inner join).
	fanOutNone fanOutMode = iota
	// fanOutRight: their rows exist before and after and only the right
	// columns change. Each page of keys becomes one RightUpdate; their
	// left rows are not read.
	fanOutRight
	// fanOutRows: their rows appear or disappear (an inner join's right
	// row inserted or deleted): each is resolved from its left row.
	fanOutRows
)

// fanOutMode returns the mode of right key fk's fan-out.
func (b *batch) fanOutMode(ctx context.Context, fk Key) (fanOutMode, error) {
	right, err := b.ov.rightOf(ctx, fk)
	if err != nil {
		return 0, err
	}
	start, err := b.rightAtSegStart(ctx, fk)
	if err != nil {
		return 0, err
	}
	before := start != nil || b.e.spec.Type == Left
	after := right != nil || b.e.spec.Type == Left
	switch {
	case !before && !after, before && after && ValuesEqual(b.rightPart(start), b.rightPart(right)):
		return fanOutNone, nil
	case before && after:
		return fanOutRight, nil
	}
	return fanOutRows, nil
}

// prefetchFanOut reads the first stored dependents of fks and, for those
// whose mode is fanOutRows, their left rows, when the store can read many
// pages at once and there are several keys; nil means each fan-out reads
// its own.
func (b *batch) prefetchFanOut(ctx context.Context, fks []Key, modes map[Key]fanOutMode) (*fanOutPrefetch, error) {
	if b.ov.leftCleared {
		return nil, nil
	}
	fks = slices.DeleteFunc(slices.Clone(fks), func(fk Key) bool { return modes[fk] == fanOutNone })
	if len(fks) < 2 {
		return nil, nil
	}
	mr, ok := b.ov.store.(ManyDependentsReader)
	if !ok {
		return nil, nil
	}
	limit := min(prefetchPage, b.e.spec.PageSize)
	limits := make([]int, len(fks))
	for i := range limits {
		limits[i] = limit
	}
	pages, err := mr.DependentsMany(ctx, fks, limits)
	if err != nil {
		return nil, fmt.Errorf("read dependents: %w", err)
	}
	pre := &fanOutPrefetch{limit: limit, first: make(map[Key][]Key, len(fks)), lefts: map[Key]*LeftState{}}
	var want []Key
	for i, fk := range fks {
		pre.first[fk] = pages[i]
		if modes[fk] != fanOutRows {
			continue
		}
		for _, pk := range pages[i] {
			_, inBatch := b.ov.left[pk]
			_, cached := b.ov.storeLeft[pk]
			if !inBatch && !cached {
				want = append(want, pk)
			}
		}
	}
	if len(want) == 0 {
		return pre, nil
	}
	got, err := b.ov.store.GetLeft(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("get dependent left rows: %w", err)
	}
	defer releaseLeftMap(got)
	for _, pk := range want {
		if st, ok := got[pk]; ok {
			pre.lefts[pk] = &st
		} else {
			pre.lefts[pk] = nil
		}
	}
	return pre, nil
}

// fanOut answers every left row subscribed to right key fk with its final
// right row, a page at a time: first the subscriptions added in this batch,
// then the stored ones in key order. pre, when not nil, holds fk's first
// stored page and, in mode fanOutRows, its left rows.
//
// Every left row the batch changed that references fk is among the added
// subscriptions (each change of a left row with a foreign key sets its
// subscription in the overlay), so the stored dependents left to answer are
// rows the batch did not change.
func (b *batch) fanOut(ctx context.Context, fk Key, pre *fanOutPrefetch, mode fanOutMode) error {
	right, err := b.ov.rightOf(ctx, fk)
	if err != nil {
		return err
	}
	touched := b.ov.subs[fk]
	var added []Key
	for pk, present := range touched.all {
		if present {
			added = append(added, pk)
		}
	}
	slices.Sort(added)
	for page := range slices.Chunk(added, b.e.spec.PageSize) {
		if err := b.resolvePage(ctx, fk, right, page, pre); err != nil {
			return err
		}
	}
	if b.ov.leftCleared {
		return nil
	}
	switch mode {
	case fanOutRows:
		return b.fanOutStored(ctx, fk, right, touched, pre)
	case fanOutRight:
		return b.fanOutRight(ctx, fk, right, touched, pre)
	}
	return nil
}

// fanOutRight pages through the stored dependents of fk that the batch did
// not change and sets their right columns, without reading their left rows:
// their target rows exist before and after, and only the right part
// differs.
func (b *batch) fanOutRight(ctx context.Context, fk Key, right *RightState, touched subSet, pre *fanOutPrefetch) error {
	values := b.rightPart(right)
	return b.storedPages(ctx, fk, pre, func(page []Key) error {
		keys := make([][]Value, 0, len(page))
		for _, pk := range page {
			if touched.has(pk) {
				continue // answered from the overlay, or no longer a dependent
			}
			vals, _, err := DecodeKey(b.e.spec.PK, string(pk))
			if err != nil {
				return fmt.Errorf("decode dependent key: %w", err)
			}
			keys = append(keys, vals)
			b.e.stats.Responses++
			b.e.stats.FanoutRows++
		}
		if len(keys) == 0 {
			return nil
		}
		return b.emitOutput(ctx, Output{RightUpdates: []RightUpdate{{Keys: keys, Right: values}}})
	})
}

// fanOutStored pages through the stored dependents of fk, skipping the
// subscriptions this batch changed (answered from the overlay, or removed).
func (b *batch) fanOutStored(ctx context.Context, fk Key, right *RightState, touched subSet, pre *fanOutPrefetch) error {
	return b.storedPages(ctx, fk, pre, func(page []Key) error {
		keep := page
		if touched.len() > 0 {
			keep = slices.DeleteFunc(slices.Clone(page), touched.has)
		}
		return b.resolvePage(ctx, fk, right, keep, pre)
	})
}

// storedPages calls fn with each page of the stored dependents of fk, in
// key order: the prefetched first page when pre has it, then pages read
// from the store.
func (b *batch) storedPages(ctx context.Context, fk Key, pre *fanOutPrefetch, fn func(page []Key) error) error {
	var after Key
	for {
		size := b.e.spec.PageSize
		var page []Key
		if first, ok := pre.firstPage(fk, after); ok {
			page, size = first, pre.limit
		} else {
			var err error
			if page, err = b.ov.store.Dependents(ctx, fk, after, size); err != nil {
				return fmt.Errorf("read dependents: %w", err)
			}
		}
		if len(page) == 0 {
			return nil
		}
		after = page[len(page)-1]
		if err := fn(page); err != nil {
			return err
		}
		if len(page) < size {
			return nil
		}
	}
}

// left returns the prefetched stored left row of pk (nil when absent) and
// whether it was prefetched.
func (pre *fanOutPrefetch) left(pk Key) (*LeftState, bool) {
	if pre == nil {
		return nil, false
	}
	st, ok := pre.lefts[pk]
	return st, ok
}

// firstPage returns fk's prefetched first page when the fan-out is at its
// start (after is empty).
func (pre *fanOutPrefetch) firstPage(fk, after Key) ([]Key, bool) {
	if pre == nil || after != "" {
		return nil, false
	}
	page, ok := pre.first[fk]
	return page, ok
}

// resolvePage builds the fan-out responses of one page of dependents of fk,
// resolves them and emits the page's output.
func (b *batch) resolvePage(ctx context.Context, fk Key, right *RightState, pks []Key, pre *fanOutPrefetch) error {
	lefts, err := b.pageLefts(ctx, fk, pks, pre)
	if err != nil {
		return err
	}
	r := Response{Kind: b.prop, FK: fk}
	if right != nil {
		r.Right, r.Found = right.Values, true
	}
	var out Output
	for _, pk := range pks {
		r.PK = pk
		b.e.stats.Responses++
		b.e.stats.FanoutRows++
		if err := b.resolveFanout(ctx, r, lefts[pk], &out); err != nil {
			return err
		}
	}
	return b.emitOutput(ctx, out)
}

// pageLefts returns the current left state of pks, reading the ones the
// batch does not know with one GetLeft. The result lives for one page only,
// so memory stays bounded by the page size.
func (b *batch) pageLefts(ctx context.Context, fk Key, pks []Key, pre *fanOutPrefetch) (map[Key]*leftEntry, error) {
	lefts := make(map[Key]*leftEntry, len(pks))
	var missing []Key
	got := map[Key]LeftState{}
	for _, pk := range pks {
		if e, ok := b.ov.left[pk]; ok {
			lefts[pk] = e
		} else if e, ok := b.ov.storeLeft[pk]; ok && !b.ov.leftCleared {
			lefts[pk] = e
		} else if b.ov.leftCleared {
			continue
		} else if st, ok := pre.left(pk); ok {
			if st != nil {
				got[pk] = *st
			}
		} else {
			missing = append(missing, pk)
		}
	}
	if len(missing) > 0 {
		read, err := b.ov.store.GetLeft(ctx, missing)
		if err != nil {
			return nil, fmt.Errorf("get dependent left rows: %w", err)
		}
		for pk, st := range read {
			got[pk] = st
		}
		releaseLeftMap(read)
	}
	if len(got) == 0 {
		return lefts, nil
	}
	entries := make([]leftEntry, 0, len(got))
	for pk, st := range got {
		entries = append(entries, leftEntry{LeftState: st})
		e := &entries[len(entries)-1]
		if err := b.ov.setFK(e, fk); err != nil {
			return nil, err
		}
		lefts[pk] = e
	}
	return lefts, nil
}
