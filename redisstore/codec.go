package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/fkmat/fkmat/join"
)

// Row encoding. A stored row is a format byte followed by length-prefixed
// value lists:
//
//	left:  0x01, value hash (8 bytes, little endian), list PK, list FK, list Values
//	right: 0x02, list Key, list Values
//	list:  uvarint count, then count values
//	value: uvarint len<<2 | toast<<1 | null, then len bytes of text
//
// NULL, TOAST and the empty string are therefore distinct, and a NULL or
// short value costs one byte of framing. The format byte names both the kind
// of row and the version of its encoding.
const (
	formatLeft  = 0x01
	formatRight = 0x02
)

var errTruncated = errors.New("truncated")

// appendLeft appends the encoding of s to b.
func appendLeft(b []byte, s join.LeftState) []byte {
	b = append(b, formatLeft)
	b = binary.LittleEndian.AppendUint64(b, s.Hash)
	b = appendValues(b, s.PK)
	b = appendValues(b, s.FK)
	return appendValues(b, s.Values)
}

// appendRight appends the encoding of s to b.
func appendRight(b []byte, s join.RightState) []byte {
	b = append(b, formatRight)
	b = appendValues(b, s.Key)
	return appendValues(b, s.Values)
}

func appendValues(b []byte, vs []join.Value) []byte {
	b = binary.AppendUvarint(b, uint64(len(vs)))
	for _, v := range vs {
		h := uint64(len(v.Text)) << 2
		if v.Null {
			h |= 1
		}
		if v.Toast {
			h |= 2
		}
		b = binary.AppendUvarint(b, h)
		b = append(b, v.Text...)
	}
	return b
}

// decodeLeft decodes a row written by appendLeft. The returned strings share
// memory with s.
func decodeLeft(s string) (join.LeftState, error) {
	if len(s) < 9 || s[0] != formatLeft {
		return join.LeftState{}, fmt.Errorf("decode left row: %w", formatError(s, formatLeft))
	}
	var st join.LeftState
	st.Hash = binary.LittleEndian.Uint64([]byte(s[1:9]))
	d := decoder{s: s, off: 9}
	st.PK = d.values()
	st.FK = d.values()
	st.Values = d.values()
	if err := d.finish(); err != nil {
		return join.LeftState{}, fmt.Errorf("decode left row: %w", err)
	}
	return st, nil
}

// decodeRight decodes a row written by appendRight.
func decodeRight(s string) (join.RightState, error) {
	if len(s) < 1 || s[0] != formatRight {
		return join.RightState{}, fmt.Errorf("decode right row: %w", formatError(s, formatRight))
	}
	var st join.RightState
	d := decoder{s: s, off: 1}
	st.Key = d.values()
	st.Values = d.values()
	if err := d.finish(); err != nil {
		return join.RightState{}, fmt.Errorf("decode right row: %w", err)
	}
	return st, nil
}

func formatError(s string, want byte) error {
	if len(s) == 0 {
		return errTruncated
	}
	if s[0] != want {
		return fmt.Errorf("format byte 0x%02x, want 0x%02x", s[0], want)
	}
	return errTruncated
}

// decoder reads value lists from s, remembering the first error.
type decoder struct {
	s   string
	off int
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	var x uint64
	for shift := uint(0); ; shift += 7 {
		if d.off >= len(d.s) {
			d.err = errTruncated
			return 0
		}
		c := d.s[d.off]
		d.off++
		if shift == 63 && c > 1 {
			d.err = errors.New("varint overflows 64 bits")
			return 0
		}
		x |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return x
		}
	}
}

func (d *decoder) values() []join.Value {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	// Every value takes at least one byte: this bounds the allocation.
	if n > uint64(len(d.s)-d.off) {
		d.err = fmt.Errorf("list of %d values in %d bytes", n, len(d.s)-d.off)
		return nil
	}
	if n == 0 {
		return nil
	}
	vs := make([]join.Value, n)
	for i := range vs {
		h := d.uvarint()
		if d.err != nil {
			return nil
		}
		l := h >> 2
		if l > uint64(len(d.s)-d.off) {
			d.err = errTruncated
			return nil
		}
		vs[i] = join.Value{Text: d.s[d.off : d.off+int(l)], Null: h&1 != 0, Toast: h&2 != 0}
		d.off += int(l)
	}
	return vs
}

func (d *decoder) finish() error {
	if d.err == nil && d.off != len(d.s) {
		d.err = fmt.Errorf("%d trailing bytes", len(d.s)-d.off)
	}
	return d.err
}
