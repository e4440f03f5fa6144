package join

// slab hands out values of T from chunks of slabChunk: one allocation per
// chunk instead of one per value, for what a batch makes per change (left
// entries, pending outputs). A chunk is never reused: it is dropped once
// handed out and lives as long as any of its values.
type slab[T any] struct{ free []T }

const slabChunk = 256

func (s *slab[T]) new() *T {
	if len(s.free) == 0 {
		s.free = make([]T, slabChunk)
	}
	p := &s.free[0]
	s.free = s.free[1:]
	return p
}

// valueSlab hands out slices of values (joined rows) the same way.
type valueSlab struct{ free []Value }

const valueChunk = 4096

// take returns a slice of length 0 and capacity n.
func (s *valueSlab) take(n int) []Value {
	if n > valueChunk/8 {
		return make([]Value, 0, n)
	}
	if len(s.free) < n {
		s.free = make([]Value, valueChunk)
	}
	v := s.free[:0:n]
	s.free = s.free[n:]
	return v
}
