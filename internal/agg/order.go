package agg

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Order keys: a value's encoding whose byte order is Postgres's order of
// the values, for min, max and jsonb_agg's ORDER BY kept in sorted sets.
// Ascending keys put NULL last and descending ones first, as ORDER BY does
// by default; equal values (1.0 and 1.00, -0 and 0) have equal keys. Every
// key is self-delimiting, so that a key followed by another (a tie-breaker)
// keeps the order.

// The first byte of a key: a value, or NULL (after every value).
const (
	orderValue = 0x01
	orderNull  = 0x02
)

// OrderTypes are the types order keys cover, by format_type's spelling
// without modifiers. Text is ordered byte by byte: its collation must be
// "C" or "POSIX" (CheckOrder).
var orderTypes = map[string]bool{
	"smallint": true, "integer": true, "bigint": true, "numeric": true, "real": true, "double precision": true,
	"boolean": true, "date": true, "timestamp without time zone": true, "timestamp with time zone": true,
	"text": true, "character varying": true, "character": true, "uuid": true,
}

// CheckOrder says whether values of typ under collation (pg_collation's
// name, "" for none) can be ordered by their keys, naming the fix if not.
func CheckOrder(typ, collation string) error {
	typ = baseType(typ)
	if !orderTypes[typ] {
		return fmt.Errorf("values of type %s cannot be ordered by fkmat (order by an integer, numeric, floating-point, boolean, date, timestamp, uuid or text column)", typ)
	}
	switch typ {
	case "text", "character varying", "character":
		switch collation {
		case "C", "POSIX", "C.UTF-8", "C.utf8", "ucs_basic":
			// Byte order; C.UTF-8 orders by code point, which is UTF-8's
			// byte order.
		default:
			return fmt.Errorf("text under collation %q is ordered by rules fkmat does not reproduce: order it byte by byte, e.g. max(name COLLATE \"C\")", collation)
		}
	}
	return nil
}

func baseType(typ string) string {
	typ = strings.TrimSpace(typ)
	if i := strings.IndexByte(typ, '('); i >= 0 {
		// "timestamp(3) with time zone", "numeric(12,2)"
		typ = strings.TrimSpace(typ[:i] + typ[strings.IndexByte(typ, ')')+1:])
	}
	return typ
}

// AppendOrderKey appends the order key of a value of typ (its Postgres text
// form, or NULL) to b; desc orders descending.
func AppendOrderKey(b []byte, typ, text string, null, desc bool) ([]byte, error) {
	start := len(b)
	if null {
		b = append(b, orderNull)
	} else {
		b = append(b, orderValue)
		var err error
		if b, err = appendValueKey(b, baseType(typ), text); err != nil {
			return b[:start], err
		}
	}
	if desc {
		for i := start; i < len(b); i++ {
			b[i] = ^b[i]
		}
	}
	return b, nil
}

func appendValueKey(b []byte, typ, text string) ([]byte, error) {
	switch typ {
	case "smallint", "integer", "bigint":
		v, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return b, fmt.Errorf("order key of %s %q: %w", typ, text, err)
		}
		return appendInt64Key(b, v), nil
	case "real", "double precision":
		return appendFloatKey(b, text)
	case "numeric":
		return appendNumericKey(b, text)
	case "boolean":
		switch text {
		case "f", "false":
			return append(b, 0), nil
		case "t", "true":
			return append(b, 1), nil
		}
		return b, fmt.Errorf("order key of boolean %q", text)
	case "date", "timestamp without time zone", "timestamp with time zone":
		v, err := timeKey(typ, text)
		if err != nil {
			return b, err
		}
		return appendInt64Key(b, v), nil
	case "text", "character varying", "character":
		if typ == "character" {
			text = strings.TrimRight(text, " ") // trailing spaces are insignificant
		}
		for i := 0; i < len(text); i++ {
			if text[i] == 0 {
				b = append(b, 0, 0xFF)
			} else {
				b = append(b, text[i])
			}
		}
		return append(b, 0, 0x01), nil
	case "uuid":
		raw, err := hex.DecodeString(strings.ReplaceAll(text, "-", ""))
		if err != nil || len(raw) != 16 {
			return b, fmt.Errorf("order key of uuid %q", text)
		}
		return append(b, raw...), nil
	}
	return b, fmt.Errorf("values of type %s cannot be ordered by fkmat", typ)
}

func appendInt64Key(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(v)^(1<<63))
}

// appendFloatKey: NaN after +Infinity, -0 equal to 0, as Postgres orders
// floating-point values.
func appendFloatKey(b []byte, text string) ([]byte, error) {
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !strings.EqualFold(text, "nan") && !strings.Contains(strings.ToLower(text), "infinity") {
		return b, fmt.Errorf("order key of %q: %w", text, err)
	}
	switch {
	case strings.EqualFold(text, "nan") || math.IsNaN(f):
		return binary.BigEndian.AppendUint64(b, math.MaxUint64), nil
	case f == 0:
		f = 0
	}
	bits := math.Float64bits(f)
	if bits>>63 == 1 {
		bits = ^bits
	} else {
		bits |= 1 << 63
	}
	return binary.BigEndian.AppendUint64(b, bits), nil
}

// The first byte of a numeric's key, in Postgres's order: -Infinity, the
// negatives, zero, the positives, Infinity, NaN.
const (
	numNegInf = 0x02 + iota
	numNeg
	numZero
	numPos
	numPosInf
	numNaN
)

// appendNumericKey encodes a numeric as its sign, the exponent of its
// leading digit, and its significant digits (trailing zeros dropped, so
// that 1.0 and 1.00 are equal); a negative's exponent and digits are
// inverted, so that a larger magnitude sorts first.
func appendNumericKey(b []byte, text string) ([]byte, error) {
	switch strings.ToLower(text) {
	case "nan":
		return append(b, numNaN), nil
	case "infinity", "+infinity":
		return append(b, numPosInf), nil
	case "-infinity":
		return append(b, numNegInf), nil
	}
	neg := strings.HasPrefix(text, "-")
	text = strings.TrimLeft(text, "+-")
	intPart, frac, _ := strings.Cut(text, ".")
	if strings.Trim(intPart+frac, "0123456789") != "" || intPart+frac == "" {
		return b, fmt.Errorf("order key of numeric %q", text)
	}
	intPart = strings.TrimLeft(intPart, "0")
	var exp int
	var digits string
	if intPart != "" {
		exp, digits = len(intPart), intPart+frac
	} else {
		lead := len(frac) - len(strings.TrimLeft(frac, "0"))
		exp, digits = -lead, frac[lead:]
	}
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		return append(b, numZero), nil
	}
	e := uint32(int32(exp)) ^ (1 << 31)
	if !neg {
		b = append(b, numPos)
		b = binary.BigEndian.AppendUint32(b, e)
		b = append(b, digits...)
		return append(b, 0x00), nil
	}
	b = append(b, numNeg)
	b = binary.BigEndian.AppendUint32(b, ^e)
	for i := 0; i < len(digits); i++ {
		b = append(b, ^digits[i])
	}
	return append(b, 0xFF), nil
}

// timeKey returns a date's day number or a timestamp's microseconds since
// 1970-01-01 (UTC for timestamptz), from the ISO text form fkmat's sessions
// use (DateStyle ISO), with BC years and the infinities.
func timeKey(typ, text string) (int64, error) {
	switch text {
	case "infinity":
		return math.MaxInt64, nil
	case "-infinity":
		return math.MinInt64, nil
	}
	bc := strings.HasSuffix(text, " BC")
	text = strings.TrimSuffix(text, " BC")
	var layout string
	switch typ {
	case "date":
		layout = "2006-01-02"
	case "timestamp without time zone":
		layout = "2006-01-02 15:04:05.999999"
	default:
		layout = "2006-01-02 15:04:05.999999-07:00:00"
		// Postgres writes the offset as +HH, +HH:MM or +HH:MM:SS.
		if i := strings.LastIndexAny(text, "+-"); i > 10 {
			off := text[i+1:]
			switch len(off) {
			case 2:
				off += ":00:00"
			case 5:
				off += ":00"
			}
			text = text[:i+1] + off
		}
	}
	// Years past 9999 have more digits: Go's layout takes four.
	year, rest, ok := strings.Cut(text, "-")
	if !ok {
		return 0, fmt.Errorf("order key of %s %q", typ, text)
	}
	y, err := strconv.Atoi(year)
	if err != nil {
		return 0, fmt.Errorf("order key of %s %q: %w", typ, text, err)
	}
	t, err := time.Parse(layout, "2000-"+rest)
	if err != nil {
		return 0, fmt.Errorf("order key of %s %q: %w", typ, text, err)
	}
	if bc {
		y = 1 - y
	}
	t = t.AddDate(y-2000, 0, 0)
	if typ == "date" {
		sec := t.Unix()
		days := sec / 86400
		if sec%86400 < 0 {
			days--
		}
		return days, nil
	}
	return t.UnixMicro(), nil
}

// OrderKeyLen returns the length of the order key of typ at the start of
// b (AppendOrderKey wrote it, with desc): what follows it (a tie-breaker)
// starts there.
func OrderKeyLen(b []byte, typ string, desc bool) (int, error) {
	at := func(i int) (byte, bool) {
		if i >= len(b) {
			return 0, false
		}
		if desc {
			return ^b[i], true
		}
		return b[i], true
	}
	first, ok := at(0)
	switch {
	case !ok:
		return 0, errShortKey
	case first == orderNull:
		return 1, nil
	case first != orderValue:
		return 0, fmt.Errorf("order key: marker %#x", first)
	}
	n := 1
	fixed := func(w int) (int, error) {
		if len(b) < n+w {
			return 0, errShortKey
		}
		return n + w, nil
	}
	switch baseType(typ) {
	case "smallint", "integer", "bigint", "real", "double precision", "date", "timestamp without time zone", "timestamp with time zone":
		return fixed(8)
	case "boolean":
		return fixed(1)
	case "uuid":
		return fixed(16)
	case "numeric":
		sign, ok := at(n)
		if !ok {
			return 0, errShortKey
		}
		n++
		if sign != numPos && sign != numNeg {
			return n, nil
		}
		end := byte(0x00)
		if sign == numNeg {
			end = 0xFF
		}
		for i := n + 4; ; i++ {
			c, ok := at(i)
			if !ok {
				return 0, errShortKey
			}
			if c == end {
				return i + 1, nil
			}
		}
	case "text", "character varying", "character":
		for i := n; ; i++ {
			c, ok := at(i)
			if !ok {
				return 0, errShortKey
			}
			if c != 0 {
				continue
			}
			next, ok := at(i + 1)
			if !ok {
				return 0, errShortKey
			}
			if next == 0x01 {
				return i + 2, nil
			}
			i++ // an escaped zero byte
		}
	}
	return 0, fmt.Errorf("values of type %s cannot be ordered by fkmat", typ)
}

var errShortKey = errors.New("order key: truncated")
