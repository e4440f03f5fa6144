package redisstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/fkmat/fkmat/join"
)

// Row encoding (layout version 2). A row is stored as the field of its
// encoded key (join.Key) in a bucket hash, and its value holds only what the
// key does not already say:
//
//	left:  format, list Values, list FK, [list PK]
//	right: format, list Values, [list Key]
//	list:  uvarint count, then count values
//	value: uvarint len<<2 | toast<<1 | null, then len bytes of text
//
// The key's values are left out when join.KeyValues of the field gives them
// back exactly (ints, text, uuids in their output form: almost always); the
// format byte says which (formatLeft/formatRight without, formatLeftKey/
// formatRightKey with). Stored values are never TOAST markers, so in the FK
// list the toast bit means a reference: len<<2 | 2 with no text is "the
// same as Values[len]", since the FK columns are usually projected too. The
// value hash (join.HashLeft of FK and Values) is recomputed when a row is
// read. An orders row (id, customer_id, amount, a 32-byte note) takes 52
// bytes, within the 64 bytes of Redis's compact listpack encoding; version
// 1 stored the key, the FK and the hash again and took 75.
//
// NULL, TOAST and the empty string are distinct, and a NULL or short value
// costs one byte of framing. The format byte names both the kind of row and
// the version of its encoding.
const (
	formatLeft     = 0x03
	formatLeftKey  = 0x04
	formatRight    = 0x05
	formatRightKey = 0x06
)

var errTruncated = errors.New("truncated")

// appendLeft appends the encoding of s, stored under the encoded key pk, to b.
func appendLeft(b []byte, pk string, s join.LeftState) []byte {
	withKey := !join.KeyMatches(pk, s.PK)
	b = append(b, formatByte(withKey, formatLeft, formatLeftKey))
	b = appendValues(b, s.Values)
	b = binary.AppendUvarint(b, uint64(len(s.FK)))
	for _, v := range s.FK {
		if j := slices.IndexFunc(s.Values, v.Equal); j >= 0 {
			b = binary.AppendUvarint(b, uint64(j)<<2|2)
			continue
		}
		b = appendValue(b, v)
	}
	if withKey {
		b = appendValues(b, s.PK)
	}
	return b
}

// appendRight appends the encoding of s, stored under the encoded key key,
// to b.
func appendRight(b []byte, key string, s join.RightState) []byte {
	withKey := !join.KeyMatches(key, s.Key)
	b = append(b, formatByte(withKey, formatRight, formatRightKey))
	b = appendValues(b, s.Values)
	if withKey {
		b = appendValues(b, s.Key)
	}
	return b
}

func formatByte(withKey bool, without, with byte) byte {
	if withKey {
		return with
	}
	return without
}

func appendValues(b []byte, vs []join.Value) []byte {
	b = binary.AppendUvarint(b, uint64(len(vs)))
	for _, v := range vs {
		b = appendValue(b, v)
	}
	return b
}

func appendValue(b []byte, v join.Value) []byte {
	h := uint64(len(v.Text)) << 2
	if v.Null {
		h |= 1
	}
	if v.Toast {
		h |= 2
	}
	b = binary.AppendUvarint(b, h)
	return append(b, v.Text...)
}

// decodeLeft decodes a row written by appendLeft under the encoded key pk.
// The returned strings share memory with s and pk.
func decodeLeft(pk, s string) (join.LeftState, error) {
	st, err := decodeLeftRow(pk, s)
	if err != nil {
		return join.LeftState{}, fmt.Errorf("decode left row: %w", err)
	}
	return st, nil
}

func decodeLeftRow(pk, s string) (join.LeftState, error) {
	if len(s) == 0 || (s[0] != formatLeft && s[0] != formatLeftKey) {
		return join.LeftState{}, formatError(s, formatLeft)
	}
	var st join.LeftState
	d := decoder{s: s, off: 1}
	st.Values = d.values()
	st.FK = d.fk(st.Values)
	if s[0] == formatLeftKey {
		st.PK = d.values()
	}
	if err := d.finish(); err != nil {
		return join.LeftState{}, err
	}
	if s[0] == formatLeft {
		var err error
		if st.PK, err = join.KeyValues(pk); err != nil {
			return join.LeftState{}, err
		}
	}
	st.Hash = join.HashLeft(st.FK, st.Values)
	return st, nil
}

// decodeRight decodes a row written by appendRight under the encoded key key.
func decodeRight(key, s string) (join.RightState, error) {
	st, err := decodeRightRow(key, s)
	if err != nil {
		return join.RightState{}, fmt.Errorf("decode right row: %w", err)
	}
	return st, nil
}

func decodeRightRow(key, s string) (join.RightState, error) {
	if len(s) == 0 || (s[0] != formatRight && s[0] != formatRightKey) {
		return join.RightState{}, formatError(s, formatRight)
	}
	var st join.RightState
	d := decoder{s: s, off: 1}
	st.Values = d.values()
	if s[0] == formatRightKey {
		st.Key = d.values()
	}
	if err := d.finish(); err != nil {
		return join.RightState{}, err
	}
	if s[0] == formatRight {
		var err error
		if st.Key, err = join.KeyValues(key); err != nil {
			return join.RightState{}, err
		}
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

// values reads a list of values. Stored values are never TOAST markers: the
// toast bit is refused.
func (d *decoder) values() []join.Value { return d.list(nil) }

// fk reads the FK list of a left row, whose values may refer to values.
func (d *decoder) fk(values []join.Value) []join.Value { return d.list(values) }

// list reads a list. With refs, a value with the toast bit and no NULL bit
// is a reference, len<<2 | 2, to refs[len]; without, the toast bit is
// refused.
func (d *decoder) list(refs []join.Value) []join.Value {
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
		if h&2 != 0 {
			if refs == nil || h&1 != 0 || l >= uint64(len(refs)) {
				d.err = fmt.Errorf("value %d is marked as unchanged TOAST, or refers to none of %d values", i+1, len(refs))
				return nil
			}
			vs[i] = refs[l]
			continue
		}
		if l > uint64(len(d.s)-d.off) {
			d.err = errTruncated
			return nil
		}
		vs[i] = join.Value{Text: d.s[d.off : d.off+int(l)], Null: h&1 != 0}
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
