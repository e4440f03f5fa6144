package join

// recycled are the containers of batches their caller is done with
// (Engine.Recycle), emptied, for the next batches to fill: a batch's
// mutations and outputs are maps and slices of the batch's size, and
// batches are alike, so after a few batches they are not allocated again.
type recycled struct {
	muts []Mutations
	rows [][]Row
	keys [][][]Value
}

// Bounds of what recycled keeps: containers per kind, and entries per map
// (a map keeps its room when emptied; one of a huge batch is dropped).
const (
	keptContainers = 16
	keptEntries    = 1 << 16
)

// Recycle gives the engine back the containers of a batch Apply returned,
// once the caller is done with them: m, the batch's mutations, committed
// and no longer overlaid (nil: none), and outs, its outputs, written. The
// next batches fill their maps and slices, and its joined rows' memory
// (which only its outputs hold); the values in its mutations are not
// reused, as later batches may share them. It must not run during Apply,
// and the caller must not use m or outs, or the rows of the batch's
// outputs, after it.
func (e *Engine) Recycle(m *Mutations, outs []Output) {
	r := &e.recycled
	if m != nil && m.Tables == nil && len(r.muts) < keptContainers &&
		len(m.PutLeft) <= keptEntries && len(m.PutRight) <= keptEntries {
		clear(m.PutLeft)
		clear(m.PutRight)
		clear(m.DelLeft)
		clear(m.DelRight)
		clear(m.AddSubs)
		clear(m.DelSubs)
		r.muts = append(r.muts, Mutations{PutLeft: m.PutLeft, PutRight: m.PutRight,
			DelLeft: m.DelLeft[:0], DelRight: m.DelRight[:0], AddSubs: m.AddSubs[:0], DelSubs: m.DelSubs[:0]})
	}
	if m != nil {
		e.rows.give(m.rows)
		*m = Mutations{}
	}
	for i := range outs {
		o := &outs[i]
		if cap(o.Upserts) > 0 && len(r.rows) < keptContainers {
			clear(o.Upserts)
			r.rows = append(r.rows, o.Upserts[:0])
		}
		if cap(o.Deletes) > 0 && len(r.keys) < keptContainers {
			clear(o.Deletes)
			r.keys = append(r.keys, o.Deletes[:0])
		}
		*o = Output{}
	}
}

// takeMutations returns recycled empty mutations, or none.
func (r *recycled) takeMutations() Mutations { return pop(&r.muts) }

// takeRows returns a recycled empty slice of rows, or nil.
func (r *recycled) takeRows() []Row { return pop(&r.rows) }

// takeKeys returns a recycled empty slice of keys' values, or nil.
func (r *recycled) takeKeys() [][]Value { return pop(&r.keys) }

// pop removes and returns the last of *s, or the zero value.
func pop[T any](s *[]T) T {
	var zero T
	n := len(*s)
	if n == 0 {
		return zero
	}
	v := (*s)[n-1]
	(*s)[n-1] = zero
	*s = (*s)[:n-1]
	return v
}

// putBack returns an output's containers Apply took but did not emit.
func (r *recycled) putBack(o *Output) {
	if cap(o.Upserts) > 0 && len(o.Upserts) == 0 && len(r.rows) < keptContainers {
		r.rows = append(r.rows, o.Upserts)
	}
	if cap(o.Deletes) > 0 && len(o.Deletes) == 0 && len(r.keys) < keptContainers {
		r.keys = append(r.keys, o.Deletes)
	}
}
