package redisstore

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/join"
)

func TestRowRoundTrip(t *testing.T) {
	t.Parallel()
	lefts := []join.LeftState{
		{},
		{PK: texts("1"), FK: texts("2"), Values: texts("a", "", "c"), Hash: 42},
		{PK: texts("1"), FK: []join.Value{join.NullValue()}, Values: []join.Value{join.NullValue(), join.TextValue(""), join.ToastValue()}, Hash: 1<<64 - 1},
		{PK: texts("\x00\xff", strings.Repeat("x", 300)), FK: texts("a", "b"), Values: []join.Value{{Text: "odd", Null: true, Toast: true}}},
	}
	for _, st := range lefts {
		b := appendLeft(nil, st)
		got, err := decodeLeft(string(b))
		if err != nil {
			t.Fatalf("decode %v: %v", st, err)
		}
		if !got.Equal(st) {
			t.Errorf("left round trip: got %v, want %v", got, st)
		}
		for i := range len(b) {
			if _, err := decodeLeft(string(b[:i])); err == nil {
				t.Errorf("decode of %d of %d bytes succeeded", i, len(b))
			}
		}
		if _, err := decodeRight(string(b)); err == nil {
			t.Errorf("a left row decoded as a right row")
		}
	}
	rights := []join.RightState{
		{},
		{Key: texts("k"), Values: []join.Value{join.NullValue(), join.TextValue(""), join.TextValue("NULL")}},
	}
	for _, st := range rights {
		b := appendRight(nil, st)
		got, err := decodeRight(string(b))
		if err != nil {
			t.Fatalf("decode %v: %v", st, err)
		}
		if !got.Equal(st) {
			t.Errorf("right round trip: got %v, want %v", got, st)
		}
	}
}

func TestRowEncodingIsCompact(t *testing.T) {
	t.Parallel()
	// An orders row: id, customer_id, amount, status.
	st := join.NewLeftState(texts("1234567"), texts("123456"), texts("123.45", "shipped"))
	if n := len(appendLeft(nil, st)); n != 1+8+(1+1+7)+(1+1+6)+(1+1+6+1+7) {
		t.Errorf("left row takes %d bytes", n)
	}
	null := join.LeftState{Values: []join.Value{join.NullValue(), join.ToastValue(), join.TextValue("")}}
	if n := len(appendLeft(nil, null)); n != 1+8+1+1+1+3 {
		t.Errorf("NULL/TOAST/empty row takes %d bytes", n)
	}
}

func TestDecodeRejectsGarbage(t *testing.T) {
	t.Parallel()
	huge := binary.AppendUvarint([]byte{formatRight}, 1<<40)
	overflow := append([]byte{formatRight}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)
	for _, s := range []string{"", "\x03", string(huge), string(overflow), "\x02\x00\x00\x00"} {
		if st, err := decodeRight(s); err == nil {
			t.Errorf("decodeRight(%q) = %v, want an error", s, st)
		}
	}
}

// valuesFromBytes builds a value list from fuzz input: each value takes a
// flag byte and a length byte.
func valuesFromBytes(b []byte) ([]join.Value, []byte) {
	if len(b) == 0 {
		return nil, b
	}
	n := int(b[0] % 8)
	b = b[1:]
	var vs []join.Value
	for range n {
		if len(b) < 2 {
			break
		}
		f, l := b[0], min(int(b[1]), len(b)-2)
		vs = append(vs, join.Value{Null: f&1 != 0, Toast: f&2 != 0, Text: string(b[2 : 2+l])})
		b = b[2+l:]
	}
	return vs, b
}

func FuzzLeftRow(f *testing.F) {
	f.Add([]byte("\x02\x00\x011\x01\x01"), uint64(7))
	f.Add(appendLeft(nil, join.NewLeftState(texts("1"), texts("2"), texts("x"))), uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, hash uint64) {
		// Arbitrary bytes never panic and what decodes re-encodes stably.
		if st, err := decodeLeft(string(data)); err == nil {
			again, err := decodeLeft(string(appendLeft(nil, st)))
			if err != nil || !again.Equal(st) {
				t.Fatalf("re-encoding %v: got %v, %v", st, again, err)
			}
		}
		if st, err := decodeRight(string(data)); err == nil {
			again, err := decodeRight(string(appendRight(nil, st)))
			if err != nil || !again.Equal(st) {
				t.Fatalf("re-encoding %v: got %v, %v", st, again, err)
			}
		}
		// Every row built from the input round-trips.
		pk, rest := valuesFromBytes(data)
		fk, rest := valuesFromBytes(rest)
		vals, _ := valuesFromBytes(rest)
		st := join.LeftState{PK: pk, FK: fk, Values: vals, Hash: hash}
		got, err := decodeLeft(string(appendLeft(nil, st)))
		if err != nil || !got.Equal(st) {
			t.Fatalf("left round trip of %v: got %v, %v", st, got, err)
		}
		rs := join.RightState{Key: fk, Values: vals}
		rgot, err := decodeRight(string(appendRight(nil, rs)))
		if err != nil || !rgot.Equal(rs) {
			t.Fatalf("right round trip of %v: got %v, %v", rs, rgot, err)
		}
	})
}

// inLex reports whether member lies within ZRANGE BYLEX bounds lo and hi of
// the forms "(x", "[x", "-" and "+".
func inLex(member, lo, hi string) bool {
	switch {
	case lo == "+":
		return false
	case lo[0] == '(' && member <= lo[1:], lo[0] == '[' && member < lo[1:]:
		return false
	}
	switch {
	case hi == "+":
		return true
	case hi == "-":
		return false
	case hi[0] == '(':
		return member < hi[1:]
	}
	return member <= hi[1:]
}

func FuzzDepRange(f *testing.F) {
	f.Add("\x12a\x00\x01", "", "\x12a\x00\x01\x89")
	f.Add("\xff", "\x01", "\xff\xff")
	f.Add("", "", "x")
	f.Fuzz(func(t *testing.T, fk, after, member string) {
		// For any bytes, the range holds exactly the members with prefix fk
		// whose rest sorts after `after`.
		lo, hi := depRange(join.Key(fk), join.Key(after))
		rest, ok := strings.CutPrefix(member, fk)
		want := ok && rest > after
		if got := inLex(member, lo, hi); got != want {
			t.Fatalf("member %q in range of fk %q after %q: %t, want %t", member, fk, after, got, want)
		}
	})
}
