package redisstore

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/join"
)

// key encodes vals as ints (or, with fams, in those families).
func key(t testing.TB, fams []join.Family, vals ...string) string {
	t.Helper()
	k, err := join.EncodeKey(fams, texts(vals...))
	if err != nil {
		t.Fatal(err)
	}
	return string(k)
}

var (
	famInt     = []join.Family{join.FamilyInt}
	famNumeric = []join.Family{join.FamilyNumeric}
)

func TestRowRoundTrip(t *testing.T) {
	t.Parallel()
	null := join.NullValue()
	lefts := []struct {
		pk string
		st join.LeftState
	}{
		{"", join.NewLeftState(nil, nil, nil)},
		{key(t, famInt, "1"), join.NewLeftState(texts("1"), texts("2"), texts("a", "", "c"))},
		{key(t, famInt, "1"), join.NewLeftState(texts("1"), texts("c"), texts("a", "", "c"))}, // FK as a reference
		{key(t, famInt, "1"), join.NewLeftState(texts("1"), []join.Value{null}, []join.Value{null, join.TextValue(""), join.TextValue("NULL")})},
		{key(t, famNumeric, "1.50"), join.NewLeftState(texts("1.50"), texts("a", "b"), texts("b", "a"))}, // the key does not give "1.50" back
		{"\x01garbage", join.NewLeftState(texts("\x00\xff", strings.Repeat("x", 300)), texts("a", "b"), []join.Value{{Text: "odd", Null: true}})},
	}
	for _, tt := range lefts {
		b := appendLeft(nil, tt.pk, tt.st)
		got, err := decodeLeft(tt.pk, string(b))
		if err != nil {
			t.Fatalf("decode %v: %v", tt.st, err)
		}
		if !got.Equal(tt.st) {
			t.Errorf("left round trip: got %v, want %v", got, tt.st)
		}
		for i := range len(b) {
			if _, err := decodeLeft(tt.pk, string(b[:i])); err == nil {
				t.Errorf("decode of %d of %d bytes of %v succeeded", i, len(b), tt.st)
			}
		}
		if _, err := decodeRight(tt.pk, string(b)); err == nil {
			t.Errorf("a left row decoded as a right row")
		}
	}
	rights := []struct {
		key string
		st  join.RightState
	}{
		{"", join.RightState{}},
		{key(t, []join.Family{join.FamilyText}, "k"), join.RightState{Key: texts("k"), Values: []join.Value{null, join.TextValue(""), join.TextValue("NULL")}}},
		{key(t, famNumeric, "2.0"), join.RightState{Key: texts("2.0"), Values: texts("x")}},
	}
	for _, tt := range rights {
		b := appendRight(nil, tt.key, tt.st)
		got, err := decodeRight(tt.key, string(b))
		if err != nil {
			t.Fatalf("decode %v: %v", tt.st, err)
		}
		if !got.Equal(tt.st) {
			t.Errorf("right round trip: got %v, want %v", got, tt.st)
		}
	}
}

func TestRowEncodingIsCompact(t *testing.T) {
	t.Parallel()
	// An orders row of the bench (id, customer_id, amount, note; a length of
	// 32 or more takes two bytes of framing): the key,
	// the hash and the FK (projected too) are not stored again.
	note := strings.Repeat("f", 32)
	st := join.NewLeftState(texts("1234567"), texts("123456"), texts("123456", "123.25", note))
	if n := len(appendLeft(nil, key(t, famInt, "1234567"), st)); n != 1+(1+1+6+1+6+2+32)+(1+1) || n > 64 {
		t.Errorf("left row takes %d bytes", n)
	}
	// Not projected, the FK is stored.
	st = join.NewLeftState(texts("1234567"), texts("123456"), texts("123.25"))
	if n := len(appendLeft(nil, key(t, famInt, "1234567"), st)); n != 1+(1+1+6)+(1+1+6) {
		t.Errorf("left row with an FK not projected takes %d bytes", n)
	}
	null := join.NewLeftState(texts("1"), nil, []join.Value{join.NullValue(), join.TextValue("")})
	if n := len(appendLeft(nil, key(t, famInt, "1"), null)); n != 1+3+1 {
		t.Errorf("NULL/empty row takes %d bytes", n)
	}
	r := join.RightState{Key: texts("42"), Values: texts("customer 42", "gold")}
	if n := len(appendRight(nil, key(t, famInt, "42"), r)); n != 1+(1+1+11+1+4) {
		t.Errorf("right row takes %d bytes", n)
	}
}

func TestDecodeRejectsGarbage(t *testing.T) {
	t.Parallel()
	huge := binary.AppendUvarint([]byte{formatRight}, 1<<40)
	overflow := append([]byte{formatRight}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)
	for _, s := range []string{"", "\x03", "\x02\x00", string(huge), string(overflow), "\x05\x00\x00", "\x05\x01\x02"} {
		if st, err := decodeRight("", s); err == nil {
			t.Errorf("decodeRight(%q) = %v, want an error", s, st)
		}
	}
	// A TOAST marker is never stored, and a reference must name a value.
	for _, s := range []string{"\x03\x01\x02\x00", "\x03\x01\x00\x01\x06", "\x03\x01\x00\x01\x03"} {
		if st, err := decodeLeft("", s); err == nil {
			t.Errorf("decodeLeft(%q) = %v, want an error", s, st)
		}
	}
	// The key must decode when it is not stored.
	if st, err := decodeLeft("\x01", "\x03\x00\x00"); err == nil {
		t.Errorf("decodeLeft with a garbage key = %v, want an error", st)
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
		vs = append(vs, join.Value{Null: f&1 != 0, Text: string(b[2 : 2+l])}) // stored values are never TOAST
		b = b[2+l:]
	}
	return vs, b
}

func FuzzLeftRow(f *testing.F) {
	f.Add([]byte("\x02\x00\x011\x01\x01"), "")
	f.Add(appendLeft(nil, key(f, famInt, "1"), join.NewLeftState(texts("1"), texts("2"), texts("x"))), key(f, famInt, "1"))
	f.Fuzz(func(t *testing.T, data []byte, k string) {
		// Arbitrary bytes never panic and what decodes re-encodes stably.
		if st, err := decodeLeft(k, string(data)); err == nil {
			again, err := decodeLeft(k, string(appendLeft(nil, k, st)))
			if err != nil || !again.Equal(st) {
				t.Fatalf("re-encoding %v: got %v, %v", st, again, err)
			}
		}
		if st, err := decodeRight(k, string(data)); err == nil {
			again, err := decodeRight(k, string(appendRight(nil, k, st)))
			if err != nil || !again.Equal(st) {
				t.Fatalf("re-encoding %v: got %v, %v", st, again, err)
			}
		}
		// Every row built from the input round-trips under any key.
		pk, rest := valuesFromBytes(data)
		fk, rest := valuesFromBytes(rest)
		vals, _ := valuesFromBytes(rest)
		st := join.NewLeftState(pk, fk, vals)
		got, err := decodeLeft(k, string(appendLeft(nil, k, st)))
		if err != nil || !got.Equal(st) {
			t.Fatalf("left round trip of %v: got %v, %v", st, got, err)
		}
		rs := join.RightState{Key: fk, Values: vals}
		rgot, err := decodeRight(k, string(appendRight(nil, k, rs)))
		if err != nil || !rgot.Equal(rs) {
			t.Fatalf("right round trip of %v: got %v, %v", rs, rgot, err)
		}
		// A key that decodes to the row's key is not stored again.
		if ek, err := join.EncodeKey(slices.Repeat(famInt, len(pk)), pk); err == nil && join.KeyMatches(string(ek), pk) {
			if b := appendLeft(nil, string(ek), st); b[0] != formatLeft {
				t.Fatalf("key %v stored again", pk)
			}
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
