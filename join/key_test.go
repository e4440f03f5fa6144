package join

import (
	"bytes"
	"errors"
	"math"
	"sort"
	"strconv"
	"strings"
	"testing"
)

func mustKey(t testing.TB, fams []Family, vals ...Value) Key {
	t.Helper()
	k, err := EncodeKey(fams, vals)
	if err != nil {
		t.Fatalf("EncodeKey(%v): %v", vals, err)
	}
	return k
}

func texts(ss ...string) []Value {
	vs := make([]Value, len(ss))
	for i, s := range ss {
		vs[i] = TextValue(s)
	}
	return vs
}

var (
	famText = []Family{FamilyText}
	famInt  = []Family{FamilyInt}
)

// TestKeyBoundaries checks that keys that are prefixes of each other never
// share a member range.
func TestKeyBoundaries(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		fams []Family
		keys [][]string
	}{
		{"text prefixes", famText, [][]string{{""}, {"1"}, {"10"}, {"1\x00"}, {"1\x00\x00"}, {"1\xff"}, {"\x00"}, {"\xff"}}},
		{"ints", famInt, [][]string{{"0"}, {"1"}, {"10"}, {"-1"}, {"109"}, {"110"}, {"255"}, {"256"},
			{"-128"}, {"-129"}, {strconv.FormatInt(math.MaxInt64, 10)}, {strconv.FormatInt(math.MinInt64, 10)}}},
		{"composite text", []Family{FamilyText, FamilyText}, [][]string{{"a", "b"}, {"ab", ""}, {"a", "bc"}, {"", "ab"}, {"a\x00", "b"}, {"a", "\x00b"}}},
		{"composite mixed", []Family{FamilyInt, FamilyText}, [][]string{{"1", ""}, {"1", "0"}, {"10", ""}, {"1", "\x00"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pkFams := famText
			for i, a := range tt.keys {
				ka := mustKey(t, tt.fams, texts(a...)...)
				end := PrefixEnd([]byte(ka))
				for j, b := range tt.keys {
					if i == j {
						continue
					}
					kb := mustKey(t, tt.fams, texts(b...)...)
					if ka == kb {
						t.Fatalf("%q and %q encode equal", a, b)
					}
					// Every member of b must lie outside a's exclusive range.
					for _, pk := range []string{"", "x", "\x00", "\xff\xff"} {
						m := Subscription{FK: kb, PK: mustKey(t, pkFams, TextValue(pk))}.Member()
						if m > string(ka) && (end == nil || m < string(end)) {
							t.Errorf("member of %q (pk %q) falls in range of %q", b, pk, a)
						}
					}
				}
				m := Subscription{FK: ka, PK: mustKey(t, pkFams, TextValue("p"))}.Member()
				if !(m > string(ka) && m < string(end)) {
					t.Errorf("own member of %q outside its range", a)
				}
			}
		})
	}
}

func TestEncodeKeyCanonical(t *testing.T) {
	t.Parallel()
	tests := []struct {
		fam  Family
		a, b string
		want bool
	}{
		{FamilyInt, "42", "0042", true},
		{FamilyInt, "-0", "0", true},
		{FamilyNumeric, "1.50", "1.5", true},
		{FamilyNumeric, "2.000", "2", true},
		{FamilyNumeric, "10", "1", false},
		{FamilyNumeric, "100", "100.0", true},
		{FamilyNumeric, "-0.00", "0", true},
		{FamilyBpchar, "ab  ", "ab", true},
		{FamilyBpchar, " ab", "ab", false},
		{FamilyText, "ab ", "ab", false},
		{FamilyUUID, "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc999c0b4ef8bb6d6bb9bd380a11", true},
		{FamilyFloat, "-0", "0", true},
		{FamilyExact, "t", "true", false},
	}
	for _, tt := range tests {
		ka := mustKey(t, []Family{tt.fam}, TextValue(tt.a))
		kb := mustKey(t, []Family{tt.fam}, TextValue(tt.b))
		if (ka == kb) != tt.want {
			t.Errorf("%s: %q == %q is %t, want %t", tt.fam, tt.a, tt.b, ka == kb, tt.want)
		}
	}
}

func TestEncodeKeyErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		fam  Family
		v    Value
		want error
	}{
		{FamilyText, NullValue(), ErrNullKey},
		{FamilyInt, ToastValue(), ErrToastKey},
		{FamilyInt, TextValue("1.5"), nil},
		{FamilyInt, TextValue(""), nil},
		{FamilyUUID, TextValue("nope"), nil},
	}
	for _, tt := range tests {
		_, err := EncodeKey([]Family{tt.fam}, []Value{tt.v})
		if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
			t.Errorf("EncodeKey(%s, %+v) = %v, want error %v", tt.fam, tt.v, err, tt.want)
		}
	}
	if _, err := EncodeKey(famInt, nil); err == nil {
		t.Error("EncodeKey with missing values succeeded")
	}
}

func TestDecodeKeyRoundTrip(t *testing.T) {
	t.Parallel()
	fams := []Family{FamilyInt, FamilyText, FamilyUUID, FamilyNumeric, FamilyBpchar}
	vals := texts("-300", "a\x00b", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "1.50", "x  ")
	k := mustKey(t, fams, vals...)
	got, n, err := DecodeKey(fams, string(k)+"rest")
	if err != nil || n != len(k) {
		t.Fatalf("DecodeKey = %v, %d, %v", got, n, err)
	}
	want := texts("-300", "a\x00b", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "1.5", "x")
	if !ValuesEqual(got, want) {
		t.Errorf("DecodeKey = %v, want %v", got, want)
	}
	sub, err := ParseMember(fams, Subscription{FK: k, PK: "pk"}.Member())
	if err != nil || sub.FK != k || sub.PK != "pk" {
		t.Errorf("ParseMember = %+v, %v", sub, err)
	}
}

func TestKeyValues(t *testing.T) {
	t.Parallel()
	fams := []Family{FamilyInt, FamilyText, FamilyUUID, FamilyNumeric, FamilyBpchar, FamilyFloat, FamilyExact, FamilyInt}
	vals := texts("-300", "a\x00b", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "1.50", "x  ", "-0", "2024-01-01", "7")
	got, err := KeyValues(string(mustKey(t, fams, vals...)))
	want := texts("-300", "a\x00b", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "1.5", "x", "0", "2024-01-01", "7")
	if err != nil || !ValuesEqual(got, want) {
		t.Errorf("KeyValues = %v, %v, want %v", got, err, want)
	}
	k := string(mustKey(t, fams, vals...))
	if !KeyMatches(k, want) || KeyMatches(k, vals) || KeyMatches(k, want[:7]) || KeyMatches(k[:len(k)-1], want) {
		t.Errorf("KeyMatches disagrees with KeyValues")
	}
	ik := string(mustKey(t, famInt, TextValue("-129")))
	if !KeyMatches(ik, texts("-129")) || KeyMatches(ik, texts("-128")) || KeyMatches(ik, []Value{NullValue()}) {
		t.Errorf("KeyMatches of an int disagrees")
	}
	for _, bad := range []string{"\x01", string(mustKey(t, fams[:2], vals[:2]...))[:4], "\x12ab"} {
		if got, err := KeyValues(bad); err == nil {
			t.Errorf("KeyValues(%q) = %v, want an error", bad, got)
		}
	}
}

func TestKeyLen(t *testing.T) {
	t.Parallel()
	fams := []Family{FamilyInt, FamilyText, FamilyUUID, FamilyNumeric, FamilyBpchar, FamilyFloat, FamilyExact, FamilyInt}
	vals := texts("-300", "a\x00b", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "1.50", "x  ", "-0", "2024-01-01", "7")
	for n := range len(fams) + 1 {
		prefix := string(mustKey(t, fams[:n], vals[:n]...))
		whole := prefix + string(mustKey(t, fams[n:], vals[n:]...))
		if got, err := KeyLen(whole, n); err != nil || got != len(prefix) {
			t.Errorf("KeyLen(.., %d) = %d, %v, want %d", n, got, err, len(prefix))
		}
	}
	k := string(mustKey(t, fams[:2], vals[:2]...))
	for _, bad := range []string{"\x01", k[:4], k} {
		if got, err := KeyLen(bad, 3); err == nil {
			t.Errorf("KeyLen(%q, 3) = %d, want an error", bad, got)
		}
	}
}

func TestCheckKeyTypes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		fk, key string
		ok      bool
	}{
		{"integer", "bigint", true},
		{"int4", "int8", true},
		{"smallint", "bigint", true},
		{"text", "character varying(20)", true},
		{"varchar", "text", true},
		{"numeric(12,2)", "numeric", true},
		{"uuid", "uuid", true},
		{"character(3)", "bpchar", true},
		{"timestamp(3) with time zone", "timestamptz", true},
		{"date", "date", true},
		{"numeric", "integer", false},
		{"bigint", "numeric(10,0)", false},
		{"timestamptz", "timestamp", false},
		{"text", "character(5)", false},
		{"text", "uuid", false},
		{"interval", "interval", false},
		{"citext", "citext", false},
		{"real", "double precision", true},
		{"date", "timestamp", false},
		{`"char"`, "character(1)", false},
		{`"char"`, "char", true},
	}
	for _, tt := range tests {
		err := CheckKeyTypes(tt.fk, tt.key)
		if (err == nil) != tt.ok {
			t.Errorf("CheckKeyTypes(%q, %q) = %v, want ok=%t", tt.fk, tt.key, err, tt.ok)
		}
	}
	if got := FamilyOf("character varying(20)"); got != FamilyText {
		t.Errorf("FamilyOf(varchar(20)) = %s", got)
	}
}

func TestPrefixEnd(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want []byte }{
		{[]byte("a"), []byte("b")},
		{[]byte{1, 0xff}, []byte{2}},
		{[]byte{0xff, 0xff}, nil},
		{nil, nil},
	}
	for _, tt := range tests {
		if got := PrefixEnd(tt.in); !bytes.Equal(got, tt.want) {
			t.Errorf("PrefixEnd(%x) = %x, want %x", tt.in, got, tt.want)
		}
	}
}

func TestIntOrder(t *testing.T) {
	t.Parallel()
	var ns []int64
	for _, base := range []int64{0, 109, 110, 255, 256, 1 << 15, 1 << 31, 1 << 47, 1 << 55, math.MaxInt64 - 2} {
		for d := int64(-2); d <= 2; d++ {
			ns = append(ns, base+d, -(base + d))
		}
	}
	ns = append(ns, math.MinInt64, math.MaxInt64)
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	var prev Key
	for i, n := range ns {
		k := mustKey(t, famInt, TextValue(strconv.FormatInt(n, 10)))
		if i > 0 && ns[i-1] != n && !(prev < k) {
			t.Errorf("encode(%d) >= encode(%d)", ns[i-1], n)
		}
		got, _, err := DecodeKey(famInt, string(k))
		if err != nil || got[0].Text != strconv.FormatInt(n, 10) {
			t.Errorf("decode(encode(%d)) = %v, %v", n, got, err)
		}
		prev = k
	}
}

// FuzzEncodeKey checks order preservation for ints and texts, the round trip,
// and prefix-freedom of composite (int, text) keys.
func FuzzEncodeKey(f *testing.F) {
	f.Add(int64(1), int64(10), "1", "10")
	f.Add(int64(-1), int64(0), "1\x00", "1")
	f.Add(int64(109), int64(110), "", "\x00")
	f.Add(int64(math.MinInt64), int64(math.MaxInt64), "\xff", "\x00\x01")
	fams := []Family{FamilyInt, FamilyText}
	f.Fuzz(func(t *testing.T, i1, i2 int64, s1, s2 string) {
		k1 := mustKey(t, fams, TextValue(strconv.FormatInt(i1, 10)), TextValue(s1))
		k2 := mustKey(t, fams, TextValue(strconv.FormatInt(i2, 10)), TextValue(s2))
		want := 0
		switch {
		case i1 < i2 || (i1 == i2 && s1 < s2):
			want = -1
		case i1 > i2 || (i1 == i2 && s1 > s2):
			want = 1
		}
		if got := strings.Compare(string(k1), string(k2)); got != want {
			t.Fatalf("compare(%d %q, %d %q) = %d, want %d", i1, s1, i2, s2, got, want)
		}
		if k1 != k2 && (strings.HasPrefix(string(k1), string(k2)) || strings.HasPrefix(string(k2), string(k1))) {
			t.Fatalf("keys %x and %x are prefixes of each other", k1, k2)
		}
		vals, n, err := DecodeKey(fams, string(k1)+string(k2))
		if err != nil || n != len(k1) || vals[1].Text != s1 || vals[0].Text != strconv.FormatInt(i1, 10) {
			t.Fatalf("decode = %v, %d, %v", vals, n, err)
		}
		all, err := KeyValues(string(k1) + string(k2))
		if err != nil || !KeyMatches(string(k1)+string(k2), all) || !KeyMatches(string(k1), all[:2]) ||
			(s1 != s2 && KeyMatches(string(k1), all[2:])) {
			t.Fatalf("KeyValues = %v, %v, and KeyMatches disagree", all, err)
		}
		// A member of k2 never falls in k1's range unless the keys are equal.
		m := Subscription{FK: k2, PK: mustKey(t, famText, TextValue(s1))}.Member()
		end := PrefixEnd([]byte(k1))
		if k1 != k2 && m > string(k1) && (end == nil || m < string(end)) {
			t.Fatalf("member of %x in range of %x", k2, k1)
		}
	})
}

// TestHashLeftFraming pins the value hash (it is persisted, so it must not
// change between versions) and checks that its framing is unambiguous.
func TestHashLeftFraming(t *testing.T) {
	t.Parallel()
	distinct := []struct{ fk, vals []Value }{
		{texts("1"), texts("a", "b")},
		{texts("1"), texts("ab", "")},
		{texts("1"), texts("", "ab")},
		{texts("1", "a"), texts("b")},
		{texts("1"), []Value{NullValue(), TextValue("ab")}},
		{texts("1"), texts("", "ab", "")},
		{[]Value{NullValue()}, texts("a", "b")},
		{texts(""), texts("a", "b")},
		{texts("1"), []Value{TextValue("a"), NullValue()}},
		{texts("1"), texts("a", "")},
	}
	seen := map[uint64]int{}
	for i, c := range distinct {
		h := HashLeft(c.fk, c.vals)
		if j, ok := seen[h]; ok {
			t.Errorf("cases %d and %d hash equal", j, i)
		}
		seen[h] = i
	}
	if got, want := HashLeft(texts("42"), []Value{TextValue("x"), NullValue()}), uint64(0x591ffa7a07df5d3f); got != want {
		t.Errorf("HashLeft changed: %#x, want %#x; stored state would look stale", got, want)
	}
}
