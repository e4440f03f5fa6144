package join

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// A window is what a parent's state keeps of one of its sorted sets whose
// aggregates read only its first members (min, max, jsonb_agg … LIMIT n):
// the set's size, and its first members (as many as the aggregates read,
// fewer when the set is shorter) with the inputs those aggregates read.
// A batch computes them from the window and its own changes, and reads
// the set only when it removed members of the window from a set longer
// than it: a change outside the window costs no read at all.
type window struct {
	size    int
	entries []windowEntry
}

// windowEntry is a member of a window and its child's inputs, those of
// the set's aggregates (rollupSet.inputs).
type windowEntry struct {
	member Key
	values []Value
}

// complete says the window holds the whole set.
func (w *window) complete() bool { return len(w.entries) == w.size }

// newWindows returns the windows of a parent with no children.
func (r *Rollup) newWindows() []window { return make([]window, len(r.sets)) }

// entryOf returns the window entry of child st's member.
func (set *rollupSet) entryOf(member Key, st *LeftState) windowEntry {
	e := windowEntry{member: member, values: make([]Value, len(set.inputs))}
	for i, in := range set.inputs {
		e.values[i] = st.Values[in]
	}
	return e
}

// insert adds a member to a window built from children in any order (the
// backfill): the set grows by one, the window keeps its first members.
func (set *rollupSet) insert(w *window, e windowEntry) {
	w.size++
	n := len(w.entries)
	if n == set.window && e.member >= w.entries[n-1].member {
		return
	}
	i, _ := slices.BinarySearchFunc(w.entries, e.member, func(x windowEntry, m Key) int { return compareKey(x.member, m) })
	w.entries = slices.Insert(w.entries, i, e)
	if len(w.entries) > set.window {
		w.entries = w.entries[:set.window]
	}
}

// appendWindows appends the windows' encoding to b: per set with a window,
// its size and entries.
func (r *Rollup) appendWindows(b []byte, ws []window) []byte {
	for s, set := range r.sets {
		if set.window == 0 {
			continue
		}
		w := &ws[s]
		b = binary.AppendUvarint(b, uint64(w.size))
		b = binary.AppendUvarint(b, uint64(len(w.entries)))
		for _, e := range w.entries {
			b = binary.AppendUvarint(b, uint64(len(e.member)))
			b = append(b, e.member...)
			for _, v := range e.values {
				if v.Null {
					b = binary.AppendUvarint(b, 0)
					continue
				}
				b = binary.AppendUvarint(b, uint64(len(v.Text))+1)
				b = append(b, v.Text...)
			}
		}
	}
	return b
}

var errWindow = errors.New("a stored roll-up window is malformed")

// decodeWindows reads what appendWindows wrote. The windows' strings
// share b's memory.
func (r *Rollup) decodeWindows(b string) ([]window, error) {
	ws := r.newWindows()
	next := func() (int, error) {
		var v uint64
		for shift, i := 0, 0; ; shift, i = shift+7, i+1 {
			if i == len(b) || shift > 35 {
				return 0, errWindow
			}
			v |= uint64(b[i]&0x7f) << shift
			if b[i] < 0x80 {
				b = b[i+1:]
				return int(v), nil
			}
		}
	}
	bytes := func(n int) (string, error) {
		if n > len(b) {
			return "", errWindow
		}
		s := b[:n]
		b = b[n:]
		return s, nil
	}
	for s, set := range r.sets {
		if set.window == 0 {
			continue
		}
		w := &ws[s]
		var err error
		if w.size, err = next(); err != nil {
			return nil, err
		}
		n, err := next()
		if err != nil || n > set.window || n > w.size {
			return nil, errWindow
		}
		w.entries = make([]windowEntry, n)
		values := make([]Value, n*len(set.inputs))
		for i := range w.entries {
			e := &w.entries[i]
			l, err := next()
			if err != nil {
				return nil, err
			}
			m, err := bytes(l)
			if err != nil {
				return nil, err
			}
			e.member, e.values = Key(m), values[i*len(set.inputs):(i+1)*len(set.inputs):(i+1)*len(set.inputs)]
			for j := range e.values {
				l, err := next()
				if err != nil {
					return nil, err
				}
				if l == 0 {
					e.values[j] = NullValue()
					continue
				}
				t, err := bytes(l - 1)
				if err != nil {
					return nil, err
				}
				e.values[j] = TextValue(t)
			}
		}
	}
	if len(b) != 0 {
		return nil, errWindow
	}
	return ws, nil
}

// setChanges are a sorted set's members a batch added and removed.
type setChanges struct {
	added, removed []Key
}

// slideWindows brings the touched parents' windows to the state the batch
// leaves: from each window and the batch's changes where they say enough,
// else from the sorted set read through view (one round trip for all the
// sets, one more for the children they name).
func (a *rollupApply) slideWindows(ctx context.Context, view *Pending) error {
	cached := slices.ContainsFunc(a.r.sets, func(s rollupSet) bool { return s.window > 0 })
	if !cached || len(a.parents) == 0 {
		return nil
	}
	changes := map[Key]*setChanges{}
	for sub, in := range a.members {
		c := changes[sub.FK]
		if c == nil {
			c = &setChanges{}
			changes[sub.FK] = c
		}
		if in {
			c.added = append(c.added, sub.PK)
		} else {
			c.removed = append(c.removed, sub.PK)
		}
	}
	var fks []Key
	var limits []int
	var stale []*window
	for _, p := range a.parents {
		ws := p.windows
		for s := range a.r.sets {
			set := &a.r.sets[s]
			if set.window == 0 {
				continue
			}
			fk := a.setKey(p.key, s)
			ok, err := a.slide(&ws[s], s, changes[fk])
			if err != nil {
				return err
			}
			if !ok {
				fks, limits, stale = append(fks, fk), append(limits, set.window), append(stale, &ws[s])
			}
		}
	}
	if len(fks) == 0 {
		return nil
	}
	a.r.setReads.Add(uint64(len(fks)))
	pages, err := view.DependentsMany(ctx, fks, limits)
	if err != nil {
		return err
	}
	var keys []Key
	childKeys := make([][]Key, len(fks))
	for i, fk := range fks {
		s := int(fk[len(fk)-1])
		if want := min(a.r.sets[s].window, stale[i].size); len(pages[i]) != want {
			return fmt.Errorf("roll-up %s: a sorted set of %d first members where its parent counts %d", a.r.spec.Name, len(pages[i]), want)
		}
		for _, mem := range pages[i] {
			k, err := a.childOf(s, mem)
			if err != nil {
				return err
			}
			childKeys[i] = append(childKeys[i], k)
		}
		keys = append(keys, childKeys[i]...)
	}
	rows, err := view.GetLeft(ctx, keys)
	if err != nil {
		return err
	}
	for i, fk := range fks {
		set := &a.r.sets[int(fk[len(fk)-1])]
		w := stale[i]
		w.entries = w.entries[:0]
		for j, mem := range pages[i] {
			st, ok := rows[childKeys[i][j]]
			if !ok {
				return fmt.Errorf("roll-up %s: a sorted set names a child the state does not hold", a.r.spec.Name)
			}
			w.entries = append(w.entries, set.entryOf(mem, &st))
		}
	}
	return nil
}

// slide applies a batch's changes c of sorted set s to its window w. It
// returns false when they leave fewer first members known than the window
// holds: the set must be read.
func (a *rollupApply) slide(w *window, s int, c *setChanges) (bool, error) {
	set := &a.r.sets[s]
	complete := w.complete()
	var bound Key
	if !complete {
		bound = w.entries[len(w.entries)-1].member
	}
	var removed map[Key]bool
	var added []Key
	if c != nil {
		removed = make(map[Key]bool, len(c.removed))
		for _, m := range c.removed {
			removed[m] = true
		}
		added = c.added
		w.size += len(c.added) - len(c.removed)
	}
	entries := make([]windowEntry, 0, len(w.entries)+len(added))
	for _, e := range w.entries {
		if removed[e.member] {
			continue
		}
		// A child the batch changed without moving it in the set: its
		// inputs as the batch leaves them.
		k, err := a.childOf(s, e.member)
		if err != nil {
			return false, err
		}
		if st := a.children[k]; st != nil {
			e = set.entryOf(e.member, st)
		}
		entries = append(entries, e)
	}
	// Members past the bound may come after members the window does not
	// hold: they are not known to be among the first.
	for _, m := range added {
		if !complete && m >= bound {
			continue
		}
		k, err := a.childOf(s, m)
		if err != nil {
			return false, err
		}
		st := a.children[k]
		if st == nil {
			return false, fmt.Errorf("roll-up %s: a member added for a child the batch does not hold", a.r.spec.Name)
		}
		entries = append(entries, set.entryOf(m, st))
	}
	slices.SortFunc(entries, func(x, y windowEntry) int { return compareKey(x.member, y.member) })
	switch {
	case len(entries) >= set.window:
		w.entries = entries[:set.window]
	case complete:
		if len(entries) != w.size {
			return false, fmt.Errorf("roll-up %s: a window of %d members where its parent counts %d", a.r.spec.Name, len(entries), w.size)
		}
		w.entries = entries
	default:
		w.entries = entries
		return false, nil
	}
	return true, nil
}

// ordered computes ordered aggregate ag of a parent from its window: the
// first child's input (min, max) or the first children's elements
// (jsonb_agg … LIMIT n).
func (set *rollupSet) ordered(w window, ag RollupAggregate) Value {
	in := slices.Index(set.inputs, ag.Input)
	entries := w.entries
	if ag.Func != "jsonb_agg" {
		if len(entries) == 0 {
			return NullValue() // min/max of NULLs only
		}
		return entries[0].values[in]
	}
	if len(entries) > ag.Limit {
		entries = entries[:ag.Limit]
	}
	if len(entries) == 0 {
		return NullValue()
	}
	var b []byte
	b = append(b, '[')
	for j, e := range entries {
		if j > 0 {
			b = append(b, ", "...)
		}
		if v := e.values[in]; v.Null {
			b = append(b, "null"...)
		} else {
			b = append(b, v.Text...)
		}
	}
	return TextValue(string(append(b, ']')))
}
