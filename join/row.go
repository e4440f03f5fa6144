package join

import (
	"encoding/binary"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Value is one column value in Postgres text form. NULL and "unchanged TOAST"
// (pgoutput 'u': the value did not change and was not sent) are distinct from
// each other and from the empty string. Toast values only appear in incoming
// changes; stored state and output rows never contain them.
type Value struct {
	Text  string
	Null  bool
	Toast bool
}

// TextValue returns the non-NULL value s.
func TextValue(s string) Value { return Value{Text: s} }

// NullValue returns the SQL NULL value.
func NullValue() Value { return Value{Null: true} }

// ToastValue returns the "unchanged TOAST" marker.
func ToastValue() Value { return Value{Toast: true} }

// Equal reports whether v and o are the same value (NULL equals NULL here:
// this is identity, not SQL equality).
func (v Value) Equal(o Value) bool {
	return v.Null == o.Null && v.Toast == o.Toast && v.Text == o.Text
}

// String returns v quoted, or NULL, or TOAST; for tests and debugging.
func (v Value) String() string {
	switch {
	case v.Null:
		return "NULL"
	case v.Toast:
		return "TOAST"
	}
	return strconv.Quote(v.Text)
}

// ValuesEqual reports whether a and b hold the same values in the same order.
func ValuesEqual(a, b []Value) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

// hasNull reports whether any value in vs is NULL.
func hasNull(vs []Value) bool {
	for _, v := range vs {
		if v.Null {
			return true
		}
	}
	return false
}

// hasToast reports whether any value in vs is an unchanged-TOAST marker.
func hasToast(vs []Value) bool {
	for _, v := range vs {
		if v.Toast {
			return true
		}
	}
	return false
}

// LeftRow is a new version of a left-table row. PK are the left key columns,
// FK the foreign-key columns (same order as the right key), Values the
// projected left columns other than the key (they may repeat FK columns; the
// caller maps columns). FK and Values may hold Toast markers, filled from the
// stored state.
type LeftRow struct {
	PK     []Value
	FK     []Value
	Values []Value
}

// RightRow is a new version of a right-table row: its key columns and its
// projected columns. Values may hold Toast markers, filled from stored state.
type RightRow struct {
	Key    []Value
	Values []Value
}

// LeftState is the stored state of one left row: what the sender needs to
// know the row's previous foreign key and values without REPLICA IDENTITY FULL.
// Hash is HashLeft(FK, Values).
type LeftState struct {
	PK     []Value
	FK     []Value
	Values []Value
	Hash   uint64
}

// RightState is the stored state of one right row.
type RightState struct {
	Key    []Value
	Values []Value
}

// Row is one joined output row: the left key values, then the projected left
// values, then the projected right values (all NULL for a left-join row
// without a match).
type Row []Value

// HashLeft returns the stable 64-bit value hash of a left row's foreign key
// and projected values. The framing is unambiguous: every value is a state
// byte (NULL or text) followed by its length and bytes, and each list is
// prefixed by its length, so NULL, "" and shifted column boundaries all hash
// differently. Toast markers must be filled before hashing.
func HashLeft(fk, values []Value) uint64 {
	var d xxhash.Digest
	d.Reset()
	hashList(&d, fk)
	hashList(&d, values)
	return d.Sum64()
}

// hashList writes the framing of one value list to d.
func hashList(d *xxhash.Digest, vs []Value) {
	var buf [binary.MaxVarintLen64 + 1]byte
	n := binary.PutUvarint(buf[:], uint64(len(vs)))
	_, _ = d.Write(buf[:n])
	for _, v := range vs {
		if v.Null {
			buf[0] = 0
			_, _ = d.Write(buf[:1])
			continue
		}
		buf[0] = 1
		n := binary.PutUvarint(buf[1:], uint64(len(v.Text)))
		_, _ = d.Write(buf[:n+1])
		_, _ = d.WriteString(v.Text)
	}
}

// NewLeftState returns the state of a left row whose values contain no Toast
// markers, with its hash computed.
func NewLeftState(pk, fk, values []Value) LeftState {
	return LeftState{PK: pk, FK: fk, Values: values, Hash: HashLeft(fk, values)}
}

// Equal reports whether s and o hold the same row (hash included).
func (s LeftState) Equal(o LeftState) bool {
	return s.Hash == o.Hash && ValuesEqual(s.PK, o.PK) &&
		ValuesEqual(s.FK, o.FK) && ValuesEqual(s.Values, o.Values)
}

// Equal reports whether s and o hold the same row.
func (s RightState) Equal(o RightState) bool {
	return ValuesEqual(s.Key, o.Key) && ValuesEqual(s.Values, o.Values)
}
