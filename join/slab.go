package join

// slab hands out values of T from chunks of slabChunk: one allocation per
// chunk instead of one per value, for what a batch makes per change (left
// entries, pending outputs). Its values live for one batch: reset, at the
// start of the next, hands the chunks out again, zeroed.
type slab[T any] struct {
	chunks [][]T
	n      int // values handed out since the last reset
}

const (
	slabChunk = 256
	// maxSlabChunks bounds the chunks a slab keeps after a batch.
	maxSlabChunks = 256
)

func (s *slab[T]) new() *T {
	c, i := s.n/slabChunk, s.n%slabChunk
	if c == len(s.chunks) {
		s.chunks = append(s.chunks, make([]T, slabChunk))
	}
	s.n++
	return &s.chunks[c][i]
}

// reset takes back every value handed out: nothing may point to them.
func (s *slab[T]) reset() {
	for c := 0; c*slabChunk < s.n; c++ {
		clear(s.chunks[c][:min(slabChunk, s.n-c*slabChunk)])
	}
	s.n = 0
	if len(s.chunks) > maxSlabChunks {
		clear(s.chunks[maxSlabChunks:])
		s.chunks = s.chunks[:maxSlabChunks]
	}
}

// valueSlab hands out slices of values (joined rows) from chunks a batch
// owns: the rows live until the batch's outputs are written, so the chunks
// go with its mutations (seal), and come back once they are (give).
type valueSlab struct {
	free  []Value   // the rest of the current chunk
	used  [][]Value // the chunks of the batch in hand
	spare [][]Value // chunks given back, emptied
	// last is how many values the last batch took: a batch's first chunk
	// is sized for that when none is spare.
	last, taken int
}

const (
	valueChunk = 4096
	// maxSpareChunks bounds the chunks a valueSlab keeps for later batches
	// (about 25 MB: the rows of the batches in flight at 4x the change
	// limit).
	maxSpareChunks = 256
)

// take returns a slice of length 0 and capacity n.
func (s *valueSlab) take(n int) []Value {
	if n > valueChunk/8 {
		return make([]Value, 0, n)
	}
	s.taken += n
	if len(s.free) < n {
		if k := len(s.spare); k > 0 && len(s.spare[k-1]) >= n {
			s.free = s.spare[k-1]
			s.spare[k-1] = nil
			s.spare = s.spare[:k-1]
		} else {
			s.free = make([]Value, min(valueChunk, max(n, 256, s.last)))
		}
		s.used = append(s.used, s.free)
	}
	v := s.free[:0:n]
	s.free = s.free[n:]
	return v
}

// seal ends the batch in hand and returns its chunks.
func (s *valueSlab) seal() [][]Value {
	used := s.used
	s.used, s.free = nil, nil
	s.last, s.taken = s.taken, 0
	return used
}

// give takes back chunks seal returned, once nothing points into them.
func (s *valueSlab) give(chunks [][]Value) {
	for _, c := range chunks {
		if len(s.spare) == maxSpareChunks {
			return
		}
		clear(c)
		s.spare = append(s.spare, c[:cap(c)])
	}
}
