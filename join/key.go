package join

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Family is the equality family of a key column: two values of the same
// family are equal in SQL exactly when their canonical encodings are equal.
// The FK columns and the right key columns of a join must be pairwise of the
// same family.
type Family uint8

// The key families.
const (
	// FamilyExact compares the Postgres text form byte for byte. It is only
	// sound when both sides have the same type (see CheckKeyTypes).
	FamilyExact Family = iota
	// FamilyInt is smallint, integer and bigint: an int4 FK matches an int8 key.
	FamilyInt
	// FamilyText is text, varchar and name.
	FamilyText
	// FamilyBpchar is character(n): trailing spaces are insignificant.
	FamilyBpchar
	// FamilyNumeric is numeric: trailing fractional zeros are insignificant.
	FamilyNumeric
	// FamilyUUID is uuid, encoded as its 16 bytes.
	FamilyUUID
	// FamilyFloat is real and double precision: -0 equals 0.
	FamilyFloat
)

var familyNames = [...]string{"exact", "int", "text", "bpchar", "numeric", "uuid", "float"}

// String returns the family's name.
func (f Family) String() string {
	if int(f) < len(familyNames) {
		return familyNames[f]
	}
	return "family(" + strconv.Itoa(int(f)) + ")"
}

// typeAliases maps pg_type.typname spellings to format_type spellings.
var typeAliases = map[string]string{
	"int2": "smallint", "int4": "integer", "int": "integer", "int8": "bigint",
	"varchar": "character varying", "bpchar": "character",
	"float4": "real", "float8": "double precision", "bool": "boolean",
	"decimal":     "numeric",
	"timestamp":   "timestamp without time zone",
	"timestamptz": "timestamp with time zone",
	"time":        "time without time zone",
	"timetz":      "time with time zone",
}

// typeFamilies maps canonical type names to their family; others are exact.
var typeFamilies = map[string]Family{
	"smallint": FamilyInt, "integer": FamilyInt, "bigint": FamilyInt,
	"text": FamilyText, "character varying": FamilyText, "name": FamilyText,
	"character": FamilyBpchar,
	"numeric":   FamilyNumeric,
	"uuid":      FamilyUUID,
	"real":      FamilyFloat, "double precision": FamilyFloat,
}

// unsoundTypes are types whose text forms differ for SQL-equal values or that
// have no plain equality, so they cannot be join keys.
var unsoundTypes = map[string]string{
	"interval": "'1 day' equals '24 hours' but their text differs",
	"citext":   "its equality ignores case",
	"json":     "it has no equality operator",
	"xml":      "it has no equality operator",
	"point":    "it has no plain equality operator",
}

// canonicalType normalizes a type name from format_type or typname: lower
// case, type modifiers removed ("numeric(12,2)" -> "numeric",
// "timestamp(3) with time zone" -> "timestamp with time zone"), aliases
// resolved. The one-byte type "char" (format_type quotes it) stays "char",
// distinct from character(n).
func canonicalType(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	var b strings.Builder
	depth := 0
	for _, r := range name {
		switch {
		case r == '(':
			depth++
		case r == ')':
			depth--
		case depth == 0:
			b.WriteRune(r)
		}
	}
	name = strings.Join(strings.Fields(b.String()), " ")
	name = strings.TrimPrefix(name, "pg_catalog.")
	name = strings.Trim(name, `"`)
	if a, ok := typeAliases[name]; ok {
		return a
	}
	return name
}

// FamilyOf returns the family of a Postgres type, given as format_type output
// ("bigint", "character varying(20)", "numeric(12,2)") or as typname
// ("int8", "varchar"). Unknown types are FamilyExact.
func FamilyOf(typeName string) Family {
	return typeFamilies[canonicalType(typeName)]
}

// CheckKeyTypes reports whether a foreign-key column of type fkType may be
// joined to a right key column of type keyType by comparing canonical
// encodings. It rejects pairs whose text forms can differ for SQL-equal values
// (numeric vs integer, text vs character, timestamp vs timestamptz, ...) and
// types that cannot be keys at all, with a message naming the fix.
func CheckKeyTypes(fkType, keyType string) error {
	fk, key := canonicalType(fkType), canonicalType(keyType)
	for _, t := range []string{fk, key} {
		if why, ok := unsoundTypes[t]; ok {
			return fmt.Errorf("type %s cannot be a join key: %s; join on a column of another type", t, why)
		}
	}
	ff, kf := typeFamilies[fk], typeFamilies[key]
	if ff != kf || (ff == FamilyExact && fk != key) {
		return fmt.Errorf("foreign key type %s is not comparable with key type %s: "+
			"equal values may have different text forms; change one column to the other's type "+
			"(or a generated column of that type)", fk, key)
	}
	return nil
}

// Key is the canonical encoding of a tuple of non-NULL key values: order
// preserving (for ints and text-like values) and prefix-free, so that the
// concatenation of two keys is prefix-free too. A subscription member is
// FK key ++ PK key, and "all dependents of fk" is the range of members with
// prefix fk. Key is a string so that it can be a map key; it is not text.
type Key string

// Encoding tags. Ints use the range intMin..intMax as a self-describing
// length tag (see appendInt); the other families use one tag byte each.
const (
	tagText    = 0x12
	tagBpchar  = 0x13
	tagNumeric = 0x14
	tagUUID    = 0x15
	tagFloat   = 0x16
	tagExact   = 0x17

	intMin   = 0x80 // 8-byte negative
	intZero  = intMin + 8
	intSmall = intMax - intZero - 8 // largest value encoded in the tag byte
	intMax   = 0xfd

	escByte  = 0x00 // escapes 0x00 inside text-like values
	escZero  = 0xff // 0x00 0xff is a literal 0x00
	escFinal = 0x01 // 0x00 0x01 terminates a text-like value
)

// Errors returned by EncodeKey.
var (
	ErrNullKey  = errors.New("key value is NULL")
	ErrToastKey = errors.New("key value is an unchanged TOAST marker")
)

// EncodeKey returns the canonical encoding of vals, one value per family.
// It fails on NULL or Toast values and on values that do not parse in their
// family (an int that is not an integer, a malformed uuid).
func EncodeKey(fams []Family, vals []Value) (Key, error) {
	var buf [64]byte // most keys fit: the key's string is the one allocation
	b, err := AppendKey(buf[:0], fams, vals)
	return Key(b), err
}

// AppendKey appends the canonical encoding of vals to b (see EncodeKey).
func AppendKey(b []byte, fams []Family, vals []Value) ([]byte, error) {
	if len(fams) != len(vals) {
		return b, fmt.Errorf("encode key: %d values for %d columns", len(vals), len(fams))
	}
	for i, v := range vals {
		var err error
		b, err = appendValue(b, fams[i], v)
		if err != nil {
			return b, fmt.Errorf("encode key column %d: %w", i+1, err)
		}
	}
	return b, nil
}

// appendValue appends the encoding of one value of family f.
func appendValue(b []byte, f Family, v Value) ([]byte, error) {
	switch {
	case v.Null:
		return b, ErrNullKey
	case v.Toast:
		return b, ErrToastKey
	}
	switch f {
	case FamilyInt:
		n, err := strconv.ParseInt(strings.TrimSpace(v.Text), 10, 64)
		if err != nil {
			return b, fmt.Errorf("parse integer %q: %w", v.Text, err)
		}
		return appendInt(b, n), nil
	case FamilyUUID:
		return appendUUID(b, v.Text)
	case FamilyText:
		return appendBytes(b, tagText, v.Text), nil
	case FamilyBpchar:
		return appendBytes(b, tagBpchar, strings.TrimRight(v.Text, " ")), nil
	case FamilyNumeric:
		return appendBytes(b, tagNumeric, canonicalNumeric(v.Text)), nil
	case FamilyFloat:
		return appendBytes(b, tagFloat, canonicalFloat(v.Text)), nil
	case FamilyExact:
		return appendBytes(b, tagExact, v.Text), nil
	}
	return b, fmt.Errorf("unknown key family %d", f)
}

// appendInt appends an order-preserving, self-delimiting encoding of n: values
// 0..intSmall take one byte, others a length tag and the fewest big-endian
// bytes (two's complement for negatives); a longer negative sorts first, a
// longer positive last.
func appendInt(b []byte, n int64) []byte {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], uint64(n))
	if n < 0 {
		l := 8
		for l > 1 && buf[8-l] == 0xff && buf[9-l]&0x80 != 0 {
			l--
		}
		return append(append(b, byte(intZero-l)), buf[8-l:]...)
	}
	if n <= intSmall {
		return append(b, byte(intZero+n))
	}
	l := 8
	for buf[8-l] == 0 {
		l--
	}
	return append(append(b, byte(intZero+intSmall+l)), buf[8-l:]...)
}

// appendBytes appends tag, s with 0x00 escaped as 0x00 0xff, and 0x00 0x01.
func appendBytes(b []byte, tag byte, s string) []byte {
	b = append(b, tag)
	for {
		i := strings.IndexByte(s, escByte)
		if i < 0 {
			break
		}
		b = append(append(b, s[:i]...), escByte, escZero)
		s = s[i+1:]
	}
	return append(append(b, s...), escByte, escFinal)
}

// appendUUID appends the tag and the 16 bytes of a uuid in any of the input
// forms Postgres accepts for output comparison (hyphens optional, any case).
func appendUUID(b []byte, s string) ([]byte, error) {
	h := strings.NewReplacer("-", "", "{", "", "}", "").Replace(s)
	var u [16]byte
	if len(h) != 32 {
		return b, fmt.Errorf("parse uuid %q: wrong length", s)
	}
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return b, fmt.Errorf("parse uuid %q: %w", s, err)
	}
	return append(append(b, tagUUID), u[:]...), nil
}

// canonicalNumeric strips trailing fractional zeros ("1.50" -> "1.5",
// "2.000" -> "2") and turns a negative zero into "0".
func canonicalNumeric(s string) string {
	s = strings.TrimSpace(s)
	if strings.IndexByte(s, '.') >= 0 && !strings.ContainsAny(s, "eE") {
		s = strings.TrimRight(s, "0")
		s = strings.TrimSuffix(s, ".")
	}
	if strings.Trim(s, "-+0") == "" && s != "" {
		return "0"
	}
	return s
}

// canonicalFloat turns "-0" into "0"; Postgres (12+) prints other floats in
// their shortest round-trip form, unique per value.
func canonicalFloat(s string) string {
	if s == "-0" {
		return "0"
	}
	return s
}

// DecodeKey decodes the first len(fams) values of key k, returning them in
// canonical text form (ints in decimal, uuids hyphenated, numerics without
// trailing zeros) and the number of bytes consumed.
func DecodeKey(fams []Family, k string) ([]Value, int, error) {
	vals := make([]Value, len(fams))
	off := 0
	for i, f := range fams {
		v, n, err := decodeValue(f, k[off:])
		if err != nil {
			return nil, 0, fmt.Errorf("decode key column %d: %w", i+1, err)
		}
		vals[i], off = v, off+n
	}
	return vals, off, nil
}

var errShortKey = errors.New("truncated key")

// KeyValues decodes every value of key k by its tags, without knowing the
// families, in canonical text form as DecodeKey does. The text is not
// always the text that was encoded (a numeric "1.50" comes back as "1.5"):
// compare before relying on it.
func KeyValues(k string) ([]Value, error) {
	var vals []Value
	for off := 0; off < len(k); {
		f, ok := tagFamily(k[off])
		if !ok {
			return nil, fmt.Errorf("decode key column %d: unexpected tag 0x%02x", len(vals)+1, k[off])
		}
		v, n, err := decodeValue(f, k[off:])
		if err != nil {
			return nil, fmt.Errorf("decode key column %d: %w", len(vals)+1, err)
		}
		vals, off = append(vals, v), off+n
	}
	return vals, nil
}

// KeyLen returns the length of the first n values of key k, read by their
// tags: the length of the encoded foreign key of n columns that starts a
// subscription's member (FK ++ PK).
func KeyLen(k string, n int) (int, error) {
	off := 0
	for i := range n {
		if off >= len(k) {
			return 0, fmt.Errorf("decode key column %d: %w", i+1, errShortKey)
		}
		f, ok := tagFamily(k[off])
		if !ok {
			return 0, fmt.Errorf("decode key column %d: unexpected tag 0x%02x", i+1, k[off])
		}
		_, l, err := decodeValue(f, k[off:])
		if err != nil {
			return 0, fmt.Errorf("decode key column %d: %w", i+1, err)
		}
		off += l
	}
	return off, nil
}

// tagFamily returns the family whose encodings start with tag t.
func tagFamily(t byte) (Family, bool) {
	switch {
	case t >= intMin && t <= intMax:
		return FamilyInt, true
	case t == tagUUID:
		return FamilyUUID, true
	case t == tagText:
		return FamilyText, true
	case t == tagBpchar:
		return FamilyBpchar, true
	case t == tagNumeric:
		return FamilyNumeric, true
	case t == tagFloat:
		return FamilyFloat, true
	case t == tagExact:
		return FamilyExact, true
	}
	return 0, false
}

// bytesTags are the tags of the families encoded by appendBytes.
var bytesTags = map[Family]byte{FamilyText: tagText, FamilyBpchar: tagBpchar,
	FamilyNumeric: tagNumeric, FamilyFloat: tagFloat, FamilyExact: tagExact}

// decodeValue decodes one value of family f from the start of k.
func decodeValue(f Family, k string) (Value, int, error) {
	if len(k) == 0 {
		return Value{}, 0, errShortKey
	}
	switch f {
	case FamilyInt:
		return decodeInt(k)
	case FamilyUUID:
		if len(k) < 17 || k[0] != tagUUID {
			return Value{}, 0, errShortKey
		}
		h := hex.EncodeToString([]byte(k[1:17]))
		return TextValue(h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]), 17, nil
	}
	tag, ok := bytesTags[f]
	if !ok || k[0] != tag {
		return Value{}, 0, fmt.Errorf("unexpected tag 0x%02x for family %s", k[0], f)
	}
	return decodeBytes(k)
}

// decodeInt decodes an appendInt encoding.
func decodeInt(k string) (Value, int, error) {
	n, l, err := decodeInt64(k)
	if err != nil {
		return Value{}, 0, err
	}
	return TextValue(strconv.FormatInt(n, 10)), l, nil
}

// decodeInt64 decodes an appendInt encoding to its number and length.
func decodeInt64(k string) (int64, int, error) {
	t := int(k[0])
	if t < intMin || t > intMax {
		return 0, 0, fmt.Errorf("unexpected tag 0x%02x for an integer", t)
	}
	if t >= intZero && t <= intZero+intSmall {
		return int64(t - intZero), 1, nil
	}
	l, neg := t-intZero-intSmall, false
	if t < intZero {
		l, neg = intZero-t, true
	}
	if len(k) < 1+l {
		return 0, 0, errShortKey
	}
	var buf [8]byte
	if neg {
		buf = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	}
	copy(buf[8-l:], k[1:1+l])
	return int64(binary.BigEndian.Uint64(buf[:])), 1 + l, nil
}

// KeyMatches reports whether KeyValues(k) would return exactly vals,
// without allocating for ints and text-like values.
func KeyMatches(k string, vals []Value) bool {
	var buf [20]byte
	off := 0
	for _, v := range vals {
		if off >= len(k) || v.Null || v.Toast {
			return false
		}
		f, ok := tagFamily(k[off])
		if !ok {
			return false
		}
		if f == FamilyInt {
			n, l, err := decodeInt64(k[off:])
			if err != nil || string(strconv.AppendInt(buf[:0], n, 10)) != v.Text {
				return false
			}
			off += l
			continue
		}
		got, l, err := decodeValue(f, k[off:])
		if err != nil || got.Text != v.Text {
			return false
		}
		off += l
	}
	return off == len(k)
}

// decodeBytes decodes an appendBytes encoding. A value without an escaped
// 0x00 shares memory with k.
func decodeBytes(k string) (Value, int, error) {
	if i := strings.IndexByte(k[1:], escByte); i >= 0 && i+2 < len(k) && k[i+2] == escFinal {
		return TextValue(k[1 : i+1]), i + 3, nil
	}
	var b strings.Builder
	for i := 1; i < len(k); i++ {
		if k[i] != escByte {
			b.WriteByte(k[i])
			continue
		}
		if i+1 >= len(k) {
			break
		}
		switch k[i+1] {
		case escFinal:
			return TextValue(b.String()), i + 2, nil
		case escZero:
			b.WriteByte(0)
			i++
		default:
			return Value{}, 0, fmt.Errorf("bad escape 0x00 0x%02x", k[i+1])
		}
	}
	return Value{}, 0, errShortKey
}

// PrefixEnd returns the smallest byte string greater than every string that
// starts with prefix, or nil when there is none (prefix empty or all 0xff).
// With prefix-free keys, the members of one FK are the range
// (fk, PrefixEnd(fk)) with exclusive bounds.
func PrefixEnd(prefix []byte) []byte {
	for i := len(prefix) - 1; i >= 0; i-- {
		if prefix[i] != 0xff {
			end := make([]byte, i+1)
			copy(end, prefix)
			end[i]++
			return end
		}
	}
	return nil
}
