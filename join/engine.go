package join

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
)

// Engine maintains one join. It is not safe for concurrent use: the daemon
// applies one batch at a time, in commit order.
type Engine struct {
	spec  Spec
	store StateReader
	// stats are counted by Apply; published is their copy at the end of
	// the last Apply, which Stats may read from another goroutine.
	stats     Stats
	published atomic.Pointer[Stats]
	nullRight []Value
	// rows hands out the joined rows (one batch at a time uses it).
	rows valueSlab
	// reorder, when set (by tests), permutes each segment's response queue
	// before it is resolved, to show that the order does not matter.
	reorder func([]Response)
	// spare is the last batch's segment, emptied: its maps and queue keep
	// their room for the next batch, whose sizes are alike. spareOv and
	// pre are the last batch's overlay and prefetch maps, for the same
	// reason (emptied when taken).
	spare   segment
	spareOv *overlay
	pre     prefetchScratch
	// recycled are containers of batches the caller gave back (Recycle).
	recycled recycled
	// pendings, entries and rights hand out a batch's pending outputs,
	// left entries and stored right states, which live for the batch
	// (taken back by the next).
	pendings slab[pending]
	entries  slab[leftEntry]
	rights   slab[RightState]
	// sorted holds a segment's keys in order (sortedKeys).
	sorted []Key
}

// sortedKeys returns m's keys in order, in buf's memory.
func sortedKeys[V any](buf []Key, m map[Key]V) []Key {
	clear(buf)
	buf = buf[:0]
	for k := range m {
		buf = append(buf, k)
	}
	slices.Sort(buf)
	return buf
}

// prefetchScratch is what prefetch fills: each change's encoded keys and
// the keys it reads.
type prefetchScratch struct {
	keys                  []changeKeys
	right                 map[Key]struct{}
	firstLeft, firstRight map[Key]bool
	// left and rightKeys are the keys read from the store.
	left, rightKeys []Key
}

// take empties the scratch for a batch of n changes.
func (s *prefetchScratch) take(n int) {
	if cap(s.keys) < n {
		s.keys = make([]changeKeys, n)
	}
	s.keys = s.keys[:n]
	clear(s.keys)
	if s.right == nil {
		s.right, s.firstLeft, s.firstRight = make(map[Key]struct{}, n), make(map[Key]bool, n), map[Key]bool{}
	}
	clear(s.right)
	clear(s.firstLeft)
	clear(s.firstRight)
	clear(s.left)
	clear(s.rightKeys)
}

// takeOverlay returns an empty overlay for a batch of n changes: the last
// batch's, emptied, unless it grew far larger than this batch needs.
func (e *Engine) takeOverlay(n int) *overlay {
	o := e.spareOv
	e.spareOv = nil
	if o == nil || o.size() > 4*max(n, 4096) {
		o = newOverlay(e.store, &e.spec, n)
	} else {
		o.reset()
	}
	o.entries, o.rights = &e.entries, &e.rights
	return o
}

// NewEngine returns an engine for spec reading state from store.
func NewEngine(spec Spec, store StateReader) (*Engine, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("new join engine: %w", err)
	}
	if spec.PageSize == 0 {
		spec.PageSize = DefaultPageSize
	}
	spec.PK, spec.FK, spec.RightKey = slices.Clone(spec.PK), slices.Clone(spec.FK), slices.Clone(spec.RightKey)
	nulls := make([]Value, spec.RightValues)
	for i := range nulls {
		nulls[i] = NullValue()
	}
	return &Engine{spec: spec, store: store, nullRight: nulls}, nil
}

// Spec returns the engine's spec, defaults filled.
func (e *Engine) Spec() Spec { return e.spec }

// Stats returns the engine's cumulative counters as of the end of the last
// Apply. It is safe to call while Apply runs (the metrics handler does).
func (e *Engine) Stats() Stats {
	if s := e.published.Load(); s != nil {
		return *s
	}
	return Stats{}
}

// publish makes the counters so far visible to Stats.
func (e *Engine) publish() {
	s := e.stats
	e.published.Store(&s)
}

// segment is the resolver's and the subscription side's per-segment state. A
// segment is a batch, or the part of it between two truncates.
type segment struct {
	queue      []Response
	pending    map[Key]*pending
	rightStart map[Key]*RightState
	dirty      map[Key]struct{}
}

func newSegment() segment {
	return segment{pending: map[Key]*pending{}, rightStart: map[Key]*RightState{}, dirty: map[Key]struct{}{}}
}

// reset empties s for the next segment, keeping its room.
func (s *segment) reset() {
	clear(s.queue)
	s.queue = s.queue[:0]
	clear(s.pending)
	clear(s.rightStart)
	clear(s.dirty)
}

// batch is the state of one Apply call.
type batch struct {
	e      *Engine
	ov     *overlay
	seg    segment
	prop   InstructionKind
	emit   func(context.Context, Output) error
	instrs []Instruction
}

// Apply applies changes, whole source transactions in commit order, and
// returns the net state change to persist with the batch's checkpoint. The
// effect on the target is passed to emit, in order, as one or more Outputs
// (none when nothing changes); the caller applies all of a batch's Outputs
// in one target transaction. Apply takes ownership of the changes' values.
// On error nothing of the batch may be persisted.
func (e *Engine) Apply(ctx context.Context, changes []Change, emit func(context.Context, Output) error) (Mutations, error) {
	defer e.publish()
	if err := e.checkChanges(changes); err != nil {
		return Mutations{}, fmt.Errorf("apply %s batch: %w", e.spec.Name, err)
	}
	seg := e.spare
	if seg.pending == nil {
		seg = newSegment()
	}
	e.spare = segment{}
	b := &batch{e: e, ov: e.takeOverlay(len(changes)), seg: seg, prop: propagateKind(e.spec.Type), emit: emit}
	// The last batch's overlay is emptied: none of its entries is pointed
	// to any more.
	e.pendings.reset()
	e.entries.reset()
	e.rights.reset()
	defer func() {
		b.seg.reset()
		e.spare = b.seg
		e.spareOv = b.ov // the mutations share none of its maps
	}()
	keys, err := b.prefetch(ctx, changes)
	if err != nil {
		return Mutations{}, fmt.Errorf("apply %s batch: %w", e.spec.Name, err)
	}
	for i, c := range changes {
		if err := b.apply(ctx, c, keys[i]); err != nil {
			return Mutations{}, fmt.Errorf("apply %s batch: %w", e.spec.Name, &ChangeError{Index: i, Kind: c.Kind, Err: err})
		}
	}
	if err := b.endSegment(ctx); err != nil {
		return Mutations{}, fmt.Errorf("apply %s batch: %w", e.spec.Name, err)
	}
	m := b.ov.mutations(&e.recycled)
	m.rows = e.rows.seal()
	return m, nil
}

// ChangeError is the failure of one change of a batch: Index is its
// position in the changes passed to Apply.
type ChangeError struct {
	Index int
	Kind  ChangeKind
	Err   error
}

func (e *ChangeError) Error() string {
	return fmt.Sprintf("change %d (%s): %v", e.Index, e.Kind, e.Err)
}

func (e *ChangeError) Unwrap() error { return e.Err }

// Left reports whether the failed change was one of the left table.
func (e *ChangeError) Left() bool {
	switch e.Kind {
	case LeftUpsert, LeftDelete, LeftKeyChange, LeftTruncate:
		return true
	}
	return false
}

// checkChanges validates the shape of every change against the spec.
func (e *Engine) checkChanges(changes []Change) error {
	s := &e.spec
	for i, c := range changes {
		var ok bool
		switch c.Kind {
		case LeftUpsert:
			ok = len(c.Left.PK) == len(s.PK) && len(c.Left.FK) == len(s.FK) && len(c.Left.Values) == s.LeftValues
		case LeftDelete:
			ok = len(c.Left.PK) == len(s.PK)
		case RightUpsert:
			ok = len(c.Right.Key) == len(s.RightKey) && len(c.Right.Values) == s.RightValues
		case RightDelete:
			ok = len(c.Right.Key) == len(s.RightKey)
		case LeftKeyChange:
			ok = len(c.OldKey) == len(s.PK) && len(c.Left.PK) == len(s.PK) && len(c.Left.FK) == len(s.FK) &&
				len(c.Left.Values) == s.LeftValues && !hasToast(c.OldKey) && !hasToast(c.Left.PK)
		case RightKeyChange:
			ok = len(c.OldKey) == len(s.RightKey) && len(c.Right.Key) == len(s.RightKey) &&
				len(c.Right.Values) == s.RightValues && !hasToast(c.OldKey) && !hasToast(c.Right.Key)
		case LeftTruncate, RightTruncate:
			ok = true
		}
		if !ok {
			return fmt.Errorf("change %d (%s) does not match the join's columns", i, c.Kind)
		}
	}
	return nil
}

// changeKeys are the encoded keys of one change: the row's key and, for a
// key change, its old key.
type changeKeys struct {
	key, old Key
}

// prefetch encodes each change's keys and reads the state the batch needs in
// two rounds: the left rows, then the right rows of the new foreign keys, of
// the stored rows' old foreign keys and of the right changes. A row whose
// first change in the batch is an insert (Change.Insert) did not exist at
// the batch start: its state is known absent and not read.
func (b *batch) prefetch(ctx context.Context, changes []Change) ([]changeKeys, error) {
	// The engine's scratch, emptied: the last batch's room, not grown
	// again a doubling at a time. firstLeft and firstRight record, per
	// row key of each side, whether the row's first change in the batch
	// was an insert.
	b.e.pre.take(len(changes))
	keys, right := b.e.pre.keys, b.e.pre.right
	firstLeft, firstRight := b.e.pre.firstLeft, b.e.pre.firstRight
	see := func(first map[Key]bool, k Key, insert bool) {
		if _, ok := first[k]; !ok {
			first[k] = insert
		}
	}
	for i, c := range changes {
		var err error
		switch c.Kind {
		case LeftUpsert, LeftDelete, LeftKeyChange:
			if c.Kind == LeftKeyChange {
				if keys[i].old, err = EncodeKey(b.e.spec.PK, c.OldKey); err != nil {
					return nil, fmt.Errorf("change %d: encode old left key: %w", i, err)
				}
				see(firstLeft, keys[i].old, false)
			}
			if keys[i].key, err = EncodeKey(b.e.spec.PK, c.Left.PK); err != nil {
				return nil, fmt.Errorf("change %d: encode left key: %w", i, err)
			}
			see(firstLeft, keys[i].key, c.Insert && c.Kind == LeftUpsert)
			if c.Kind != LeftDelete && !hasNull(c.Left.FK) && !hasToast(c.Left.FK) {
				fk, err := EncodeKey(b.e.spec.FK, c.Left.FK)
				if err != nil {
					return nil, fmt.Errorf("change %d: encode foreign key: %w", i, err)
				}
				right[fk] = struct{}{}
			}
		case RightUpsert, RightDelete, RightKeyChange:
			if c.Kind == RightKeyChange {
				if keys[i].old, err = EncodeKey(b.e.spec.RightKey, c.OldKey); err != nil {
					return nil, fmt.Errorf("change %d: encode old right key: %w", i, err)
				}
				see(firstRight, keys[i].old, false)
			}
			if keys[i].key, err = EncodeKey(b.e.spec.RightKey, c.Right.Key); err != nil {
				return nil, fmt.Errorf("change %d: encode right key: %w", i, err)
			}
			see(firstRight, keys[i].key, c.Insert && c.Kind == RightUpsert)
		}
	}
	// The reads go in no particular order: sorting them cost more than
	// anything they gain.
	left := b.e.pre.left[:0]
	for k, inserted := range firstLeft {
		if inserted {
			b.ov.storeLeft[k] = nil // known absent
		} else {
			left = append(left, k)
		}
	}
	if err := b.ov.loadLeft(ctx, left); err != nil {
		return nil, err
	}
	for _, e := range b.ov.storeLeft {
		if e != nil && e.fk != "" {
			right[e.fk] = struct{}{}
		}
	}
	for k, inserted := range firstRight {
		if inserted {
			delete(right, k)
			b.ov.storeRight[k] = nil // known absent
		} else {
			right[k] = struct{}{}
		}
	}
	rightKeys := b.e.pre.rightKeys[:0]
	for k := range right {
		rightKeys = append(rightKeys, k)
	}
	b.e.pre.left, b.e.pre.rightKeys = left, rightKeys
	return keys, b.ov.loadRight(ctx, rightKeys)
}

// apply runs one change through the stages; k holds its encoded keys.
func (b *batch) apply(ctx context.Context, c Change, k changeKeys) error {
	if c.IfPresent {
		if present, err := b.present(ctx, c, k); err != nil || !present {
			return err
		}
	}
	switch c.Kind {
	case LeftUpsert:
		return b.leftUpsert(ctx, k.key, c.Left)
	case LeftDelete:
		return b.leftDelete(ctx, k.key)
	case LeftKeyChange:
		return b.leftKeyChange(ctx, k.old, k.key, c.Left)
	case RightUpsert:
		return b.rightUpsert(ctx, k.key, c.Right)
	case RightDelete:
		return b.rightDelete(ctx, k.key)
	case RightKeyChange:
		return b.rightKeyChange(ctx, k.old, k.key, c.Right)
	case LeftTruncate, RightTruncate:
		return b.truncate(ctx, c.Kind)
	}
	return fmt.Errorf("unknown change kind %d", c.Kind)
}

// present reports whether the state holds the row an upsert or a key
// change (at its old key) applies to.
func (b *batch) present(ctx context.Context, c Change, k changeKeys) (bool, error) {
	switch c.Kind {
	case LeftUpsert, LeftKeyChange:
		at := k.key
		if c.Kind == LeftKeyChange {
			at = k.old
		}
		e, err := b.ov.leftOf(ctx, at)
		return e != nil, err
	case RightUpsert, RightKeyChange:
		at := k.key
		if c.Kind == RightKeyChange {
			at = k.old
		}
		r, err := b.ov.rightOf(ctx, at)
		return r != nil, err
	}
	return true, nil
}

// endSegment resolves the segment's queued responses, fans out its dirty
// right keys once each, and emits the output of its touched left keys.
func (b *batch) endSegment(ctx context.Context) error {
	if err := b.resolveQueue(ctx); err != nil {
		return err
	}
	b.e.sorted = sortedKeys(b.e.sorted, b.seg.dirty)
	for chunk := range slices.Chunk(b.e.sorted, fanOutChunk) {
		modes := make(map[Key]fanOutMode, len(chunk))
		for _, fk := range chunk {
			m, err := b.fanOutMode(ctx, fk)
			if err != nil {
				return fmt.Errorf("fan out right key: %w", err)
			}
			modes[fk] = m
		}
		pre, err := b.prefetchFanOut(ctx, chunk, modes)
		if err != nil {
			return fmt.Errorf("fan out right keys: %w", err)
		}
		for _, fk := range chunk {
			if err := b.fanOut(ctx, fk, pre, modes[fk]); err != nil {
				return fmt.Errorf("fan out right key: %w", err)
			}
		}
	}
	if err := b.flushPending(ctx); err != nil {
		return err
	}
	b.seg.reset()
	return nil
}

// truncate ends the segment, emits the truncate's effect on the target and
// clears the state of the truncated side; what follows is a new segment.
func (b *batch) truncate(ctx context.Context, kind ChangeKind) error {
	if err := b.endSegment(ctx); err != nil {
		return err
	}
	out := Output{Truncate: true}
	if kind == LeftTruncate {
		b.ov.clearLeft()
	} else {
		// Subscriptions stay: the left rows still reference their keys.
		b.ov.clearRight()
		if b.e.spec.Type == Left {
			out = Output{NullRight: true}
		}
	}
	return b.emitOutput(ctx, out)
}

// emitOutput passes out to the caller unless it is empty.
func (b *batch) emitOutput(ctx context.Context, out Output) error {
	if out.empty() {
		return nil
	}
	if err := b.emit(ctx, out); err != nil {
		return fmt.Errorf("emit output: %w", err)
	}
	return nil
}
