package agg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
)

// Append appends the state's encoding, as the roll-up state keeps it: the
// aggregate, then only what it counts.
func (s *State) Append(b []byte) []byte {
	b = append(b, byte(s.fn))
	b = binary.AppendVarint(b, s.n)
	switch s.fn {
	case SumInt:
		b = appendInt(b, &s.sum)
	case SumNumeric, AvgNumeric:
		b = appendInt(b, &s.sum)
		b = binary.AppendUvarint(b, uint64(s.sumScale))
		b = binary.AppendUvarint(b, uint64(len(s.scales)))
		for _, c := range s.scales {
			b = binary.AppendUvarint(b, uint64(c.scale))
			b = binary.AppendVarint(b, c.n)
		}
		b = s.appendSpecial(b)
	case SumFloat, AvgFloat:
		if s.fsum == nil || s.fsum.Sign() == 0 {
			b = binary.AppendUvarint(b, 0)
		} else {
			f, _ := s.fsum.GobEncode()
			b = binary.AppendUvarint(b, uint64(len(f)))
			b = append(b, f...)
		}
		b = s.appendSpecial(b)
	case BoolAnd, BoolOr:
		b = binary.AppendVarint(b, s.trues)
		b = binary.AppendVarint(b, s.falses)
	}
	return b
}

func (s *State) appendSpecial(b []byte) []byte {
	b = binary.AppendVarint(b, s.nan)
	b = binary.AppendVarint(b, s.pinf)
	return binary.AppendVarint(b, s.ninf)
}

// appendInt appends v's sign and magnitude.
func appendInt(b []byte, v *big.Int) []byte {
	mag := v.Bytes()
	n := uint64(len(mag)) << 1
	if v.Sign() < 0 {
		n |= 1
	}
	b = binary.AppendUvarint(b, n)
	return append(b, mag...)
}

var errCorrupt = errors.New("corrupt roll-up accumulator")

// Decode reads a state Append wrote, and returns the rest of b.
func Decode(b []byte) (*State, []byte, error) {
	s := new(State)
	rest, err := DecodeInto(s, b)
	if err != nil {
		return nil, nil, err
	}
	return s, rest, nil
}

// DecodeInto is Decode into s, a zero State: a caller decoding several
// states can hold them in one slice.
func DecodeInto(s *State, b []byte) ([]byte, error) {
	if len(b) == 0 {
		return nil, errCorrupt
	}
	s.fn = Func(b[0])
	r := reader{b: b[1:]}
	s.n = r.varint()
	switch s.fn {
	case CountStar, Count:
	case SumInt:
		r.int(&s.sum)
	case SumNumeric, AvgNumeric:
		r.int(&s.sum)
		s.sumScale = int32(r.uvarint())
		for k := r.uvarint(); k > 0 && r.err == nil; k-- {
			c := scaleCount{scale: int32(r.uvarint()), n: r.varint()}
			if n := len(s.scales); n > 0 && s.scales[n-1].scale >= c.scale || c.n <= 0 {
				r.err = errors.New("numeric scales out of order")
			}
			s.scales = append(s.scales, c)
		}
		s.nan, s.pinf, s.ninf = r.varint(), r.varint(), r.varint()
	case SumFloat, AvgFloat:
		if n := r.uvarint(); n > 0 {
			s.fsum = exactFloat()
			if err := s.fsum.GobDecode(r.bytes(n)); err != nil && r.err == nil {
				r.err = err
			}
			s.fsum.SetPrec(exactFloat().Prec())
		}
		s.nan, s.pinf, s.ninf = r.varint(), r.varint(), r.varint()
	case BoolAnd, BoolOr:
		s.trues, s.falses = r.varint(), r.varint()
	default:
		return nil, fmt.Errorf("%w: aggregate %d", errCorrupt, s.fn)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %w", errCorrupt, r.err)
	}
	return r.b, nil
}

// reader reads varints and bytes, keeping the first error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes(n uint64) []byte {
	if uint64(len(r.b)) < n {
		r.fail()
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) int(v *big.Int) {
	n := r.uvarint()
	v.SetBytes(r.bytes(n >> 1))
	if n&1 == 1 {
		v.Neg(v)
	}
}

func (r *reader) fail() {
	if r.err == nil {
		r.err = errors.New("truncated")
	}
	r.b = nil
}
