package join

import (
	"context"
)

// pending is the resolver's record of a left key the batch's left changes
// touched in the current segment.
type pending struct {
	pk []Value
	// base is the joined row in the target at segment start.
	base   Row
	baseOK bool
	// final is the row of the last valid response (base until one arrives).
	final   Row
	finalOK bool
}

// checkResponse reports whether r still holds for the current left row cur
// (nil = absent). A response is stale when the row is gone (or, for a
// delete, back), references another key, or has another value hash.
func checkResponse(r *Response, cur *leftEntry) bool {
	if r.Kind == DeleteKeyAndPropagate {
		return cur == nil
	}
	return cur != nil && cur.fk == r.FK && (!r.Hashed || cur.Hash == r.Hash)
}

// joinRow returns the joined row of left row l with the right values of a
// response (found = a right row exists), and whether the join has a row.
func (e *Engine) joinRow(l *leftEntry, right []Value, found bool) (Row, bool) {
	if l == nil || (!found && e.spec.Type == Inner) {
		return nil, false
	}
	if !found {
		right = e.nullRight
	}
	row := Row(e.rows.take(len(l.PK) + len(l.Values) + len(right)))
	row = append(append(append(row, l.PK...), l.Values...), right...)
	return row, true
}

// resolve checks response r against the current left row and returns the
// joined row it yields; ok is false for a stale response, counted.
func (b *batch) resolve(r *Response, cur *leftEntry) (row Row, exists, ok bool) {
	if !checkResponse(r, cur) {
		b.e.stats.StaleResponses++
		return nil, false, false
	}
	if r.Kind == DeleteKeyAndPropagate {
		return nil, false, true
	}
	row, exists = b.e.joinRow(cur, r.Right, r.Found)
	return row, exists, true
}

// resolveQueue resolves the queued responses of the segment in order; per
// left key the last valid response wins.
func (b *batch) resolveQueue(ctx context.Context) error {
	if b.e.reorder != nil {
		b.e.reorder(b.seg.queue)
	}
	for i := range b.seg.queue {
		r := &b.seg.queue[i]
		cur, err := b.ov.leftOf(ctx, r.PK)
		if err != nil {
			return err
		}
		if row, exists, ok := b.resolve(r, cur); ok {
			p := b.seg.pending[r.PK]
			p.final, p.finalOK = row, exists
		}
	}
	b.seg.queue = b.seg.queue[:0]
	return nil
}

// resolveFanout resolves one fan-out response. A key the batch's left
// changes touched is settled later with its other responses; any other key
// is untouched in this segment, so its left row is the segment-start one and
// only the right part of its row can differ.
func (b *batch) resolveFanout(ctx context.Context, r Response, cur *leftEntry, out *Output) error {
	row, exists, ok := b.resolve(&r, cur)
	if !ok {
		return nil
	}
	if p := b.seg.pending[r.PK]; p != nil {
		p.final, p.finalOK = row, exists
		return nil
	}
	start, err := b.rightAtSegStart(ctx, r.FK)
	if err != nil {
		return err
	}
	baseOK := start != nil || b.e.spec.Type == Left
	switch {
	case exists && (!baseOK || !ValuesEqual(b.rightPart(start), row[len(row)-b.e.spec.RightValues:])):
		out.Upserts = append(out.Upserts, row)
	case !exists && baseOK:
		out.Deletes = append(out.Deletes, cur.PK)
	}
	return nil
}

// rightPart returns the right values a right row contributes to a joined row.
func (b *batch) rightPart(r *RightState) []Value {
	if r == nil {
		return b.e.nullRight
	}
	return r.Values
}

// rightAtSegStart returns right row k as it was at segment start.
func (b *batch) rightAtSegStart(ctx context.Context, k Key) (*RightState, error) {
	if k == "" {
		return nil, nil
	}
	if r, ok := b.seg.rightStart[k]; ok {
		return r, nil
	}
	return b.ov.rightOf(ctx, k)
}

// touchLeft starts the resolver's record of left key pk at its first change
// in the segment: old is its segment-start state, cur the new one.
func (b *batch) touchLeft(ctx context.Context, pk Key, old, cur *leftEntry) error {
	if _, ok := b.seg.pending[pk]; ok {
		return nil
	}
	p := b.e.pendings.new()
	if old != nil {
		right, err := b.rightAtSegStart(ctx, old.fk)
		if err != nil {
			return err
		}
		p.pk = old.PK
		p.base, p.baseOK = b.e.joinRow(old, b.rightPart(right), right != nil)
	} else {
		p.pk = cur.PK
	}
	p.final, p.finalOK = p.base, p.baseOK
	b.seg.pending[pk] = p
	return nil
}

// flushPending emits the net output of the touched left keys, in key order:
// an upsert only when the final row differs from the target's, a delete only
// when the target has a row.
func (b *batch) flushPending(ctx context.Context) error {
	r := &b.e.recycled
	out := Output{Upserts: r.takeRows(), Deletes: r.takeKeys()}
	b.e.sorted = sortedKeys(b.e.sorted, b.seg.pending)
	for _, pk := range b.e.sorted {
		p := b.seg.pending[pk]
		switch {
		case p.finalOK && (!p.baseOK || !ValuesEqual(p.base, p.final)):
			out.Upserts = append(out.Upserts, p.final)
		case !p.finalOK && p.baseOK:
			out.Deletes = append(out.Deletes, p.pk)
		}
		if len(out.Upserts)+len(out.Deletes) >= b.e.spec.PageSize {
			if err := b.emitOutput(ctx, out); err != nil {
				return err
			}
			out = Output{Upserts: r.takeRows(), Deletes: r.takeKeys()}
		}
	}
	if out.empty() {
		r.putBack(&out)
		return nil
	}
	return b.emitOutput(ctx, out)
}
