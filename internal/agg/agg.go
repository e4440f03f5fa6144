// Package agg keeps Postgres's aggregates incrementally: count, sum, avg,
// bool_and and bool_or of a group whose rows come and go, each add and
// remove in O(1), with the result Postgres computes over the rows present.
//
// Sums are exact: integers and numerics as big integers (Postgres's
// sum(bigint) and sum(numeric) are numeric, of any size), floating-point
// values as the exact sum of their binary values, rounded once when read
// (Postgres adds them one by one in table order, so its last digits may
// differ: docs/semantics.md). A numeric sum's display scale is the largest
// of the values present, as Postgres's is; avg divides as Postgres's
// numeric division does (its result scale and rounding). NaN and the
// infinities are counted, so that removing one brings the finite sum back.
package agg

import (
	"cmp"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// Func is an aggregate over one input type.
type Func uint8

// The aggregates, by result: what Postgres's function returns for the
// input types it is given (Of).
const (
	CountStar  Func = iota + 1 // count(*): bigint
	Count                      // count(x): bigint
	SumInt                     // sum of smallint or integer: bigint
	SumNumeric                 // sum of bigint or numeric: numeric
	SumFloat                   // sum of double precision: double precision
	AvgNumeric                 // avg of smallint, integer, bigint or numeric: numeric
	AvgFloat                   // avg of real or double precision: double precision
	BoolAnd                    // bool_and: boolean
	BoolOr                     // bool_or: boolean
)

// Of returns the aggregate fn (count, sum, avg, bool_and, bool_or) of an
// input of Postgres type typ (format_type's spelling, without modifiers),
// and its result type; star is count(*).
func Of(fn, typ string, star bool) (Func, string, error) {
	typ = strings.TrimSpace(typ)
	if i := strings.IndexByte(typ, '('); i >= 0 {
		typ = typ[:i]
	}
	switch fn {
	case "count":
		if star {
			return CountStar, "bigint", nil
		}
		return Count, "bigint", nil
	case "sum":
		switch typ {
		case "smallint", "integer":
			return SumInt, "bigint", nil
		case "bigint", "numeric":
			return SumNumeric, "numeric", nil
		case "double precision":
			return SumFloat, "double precision", nil
		case "real":
			return 0, "", errors.New("sum of real is real in Postgres, added in single precision in table order, which fkmat cannot match to the last digit: sum a double precision, e.g. sum(x::double precision)")
		}
	case "avg":
		switch typ {
		case "smallint", "integer", "bigint", "numeric":
			return AvgNumeric, "numeric", nil
		case "real", "double precision":
			return AvgFloat, "double precision", nil
		}
	case "bool_and", "bool_or":
		if typ == "boolean" {
			if fn == "bool_and" {
				return BoolAnd, "boolean", nil
			}
			return BoolOr, "boolean", nil
		}
		return 0, "", fmt.Errorf("%s takes a boolean, not %s", fn, typ)
	default:
		return 0, "", fmt.Errorf("%s is not kept by this package", fn)
	}
	return 0, "", fmt.Errorf("%s of %s is not supported: roll up smallint, integer, bigint, numeric or double precision (cast it, e.g. %s(x::numeric))", fn, typ, fn)
}

// State is one group's accumulator of one aggregate. The zero State of a
// Func is the group without rows.
type State struct {
	fn Func
	// n counts the rows (count(*)) or the non-NULL inputs.
	n int64
	// sum is the exact sum of the finite inputs: integers, or numerics
	// unscaled at scale sumScale.
	sum      big.Int
	sumScale int32
	// scales counts the finite numeric inputs by display scale, in
	// ascending order of scale (a column's are usually all one).
	scales []scaleCount
	// fsum is the exact sum of the finite floating-point inputs.
	fsum *big.Float
	// trues and falses count the boolean inputs.
	trues, falses int64
	// nan, pinf and ninf count the special inputs.
	nan, pinf, ninf int64
}

// New returns the empty state of fn.
func New(fn Func) *State { return &State{fn: fn} }

// Func returns the state's aggregate.
func (s *State) Func() Func { return s.fn }

// Empty reports whether the group holds no row the aggregate counts.
func (s *State) Empty() bool { return s.n == 0 }

// Add adds a row's input: text is its Postgres text form, null says NULL
// (count(*) counts it).
func (s *State) Add(text string, null bool) error { return s.apply(text, null, 1) }

// Remove removes a row's input that Add added.
func (s *State) Remove(text string, null bool) error { return s.apply(text, null, -1) }

func (s *State) apply(text string, null bool, sign int64) error {
	if s.fn == CountStar {
		s.n += sign
		return nil
	}
	if null {
		return nil
	}
	s.n += sign
	switch s.fn {
	case Count:
	case SumInt:
		v, ok := new(big.Int).SetString(text, 10)
		if !ok {
			return fmt.Errorf("sum: %q is not an integer", text)
		}
		s.addInt(v, 0, sign)
	case SumNumeric, AvgNumeric:
		if s.special(text, sign) {
			return nil
		}
		v, scale, err := parseNumeric(text)
		if err != nil {
			return err
		}
		s.addInt(v, scale, sign)
		if s.countScale(scale, sign) {
			s.shrinkScale()
		}
	case SumFloat, AvgFloat:
		if s.special(text, sign) {
			return nil
		}
		f, err := strconv.ParseFloat(text, 64)
		if err != nil {
			return fmt.Errorf("sum: %q is not a number: %w", text, err)
		}
		if s.fsum == nil {
			s.fsum = exactFloat()
		}
		v := exactFloat().SetFloat64(f)
		if sign < 0 {
			v.Neg(v)
		}
		s.fsum.Add(s.fsum, v)
	case BoolAnd, BoolOr:
		switch text {
		case "t", "true":
			s.trues += sign
		case "f", "false":
			s.falses += sign
		default:
			return fmt.Errorf("%q is not a boolean", text)
		}
	}
	return nil
}

// exactFloat returns a big.Float that holds any sum of float64 values
// exactly: their bits span 2^-1074 to 2^1024, and 2^63 of them add 63 bits.
func exactFloat() *big.Float { return new(big.Float).SetPrec(2200) }

// special counts NaN and the infinities, and reports whether text was one.
func (s *State) special(text string, sign int64) bool {
	switch strings.ToLower(text) {
	case "nan":
		s.nan += sign
	case "infinity", "+infinity", "inf":
		s.pinf += sign
	case "-infinity", "-inf":
		s.ninf += sign
	default:
		return false
	}
	return true
}

// shrinkScale brings the sum down to the largest scale of the inputs
// present, as a sum of them alone would have it: one state, and one
// encoding, per multiset of inputs. The sum is a multiple of the power of
// ten it drops.
func (s *State) shrinkScale() {
	var top int32
	if n := len(s.scales); n > 0 {
		top = s.scales[n-1].scale
	}
	if top < s.sumScale {
		s.sum.Quo(&s.sum, pow10(s.sumScale-top))
		s.sumScale = top
	}
}

// Widened returns s as the state of fn, when fn keeps the same inputs at
// a wider type: a sum of integers (bigint) once its input widened to
// bigint, whose sum is numeric (scale 0). ok is false for any other pair.
func (s *State) Widened(fn Func) (*State, bool) {
	if s.fn == fn {
		return s, true
	}
	if s.fn != SumInt || fn != SumNumeric {
		return nil, false
	}
	w := &State{fn: SumNumeric, n: s.n}
	w.sum.Set(&s.sum)
	if s.n > 0 {
		w.scales = []scaleCount{{scale: 0, n: s.n}}
	}
	return w, true
}

// scaleCount is how many inputs present have a display scale.
type scaleCount struct {
	scale int32
	n     int64
}

// countScale adds sign to the count of scale, and reports whether that
// scale has no input left.
func (s *State) countScale(scale int32, sign int64) bool {
	i, found := slices.BinarySearchFunc(s.scales, scale, func(c scaleCount, scale int32) int { return cmp.Compare(c.scale, scale) })
	if !found {
		s.scales = slices.Insert(s.scales, i, scaleCount{scale: scale})
	}
	if s.scales[i].n += sign; s.scales[i].n == 0 {
		s.scales = slices.Delete(s.scales, i, i+1)
		return true
	}
	return false
}

// addInt adds sign*v at scale to the sum.
func (s *State) addInt(v *big.Int, scale int32, sign int64) {
	if sign < 0 {
		v.Neg(v)
	}
	switch {
	case scale > s.sumScale:
		s.sum.Mul(&s.sum, pow10(scale-s.sumScale))
		s.sumScale = scale
	case scale < s.sumScale:
		v.Mul(v, pow10(s.sumScale-scale))
	}
	s.sum.Add(&s.sum, v)
}

// Result returns the aggregate over the rows present, in Postgres's text
// form, and whether it is NULL.
func (s *State) Result() (string, bool) {
	switch s.fn {
	case CountStar, Count:
		return strconv.FormatInt(s.n, 10), false
	case BoolAnd, BoolOr:
		if s.trues+s.falses == 0 {
			return "", true
		}
		if s.fn == BoolAnd && s.falses == 0 || s.fn == BoolOr && s.trues > 0 {
			return "t", false
		}
		return "f", false
	}
	if s.n == 0 {
		return "", true
	}
	switch s.fn {
	case SumInt:
		return s.sum.String(), false
	case SumNumeric, AvgNumeric:
		if v, ok := s.specialResult("Infinity"); ok {
			return v, false
		}
		dscale := s.displayScale()
		sum := s.rescaled(dscale)
		if s.fn == SumNumeric {
			return formatNumeric(sum, dscale), false
		}
		q, qscale := divide(sum, dscale, big.NewInt(s.n), 0)
		return formatNumeric(q, qscale), false
	case SumFloat, AvgFloat:
		if v, ok := s.specialResult("Infinity"); ok {
			return v, false
		}
		f := 0.0
		if s.fsum != nil {
			if s.fn == AvgFloat {
				q := exactFloat().Quo(s.fsum, exactFloat().SetInt64(s.n))
				f, _ = q.Float64()
			} else {
				f, _ = s.fsum.Float64()
			}
		}
		return strconv.FormatFloat(f, 'g', -1, 64), false
	}
	return "", true
}

// specialResult is the result when NaN or an infinity is present.
func (s *State) specialResult(inf string) (string, bool) {
	switch {
	case s.nan > 0 || s.pinf > 0 && s.ninf > 0:
		return "NaN", true
	case s.pinf > 0:
		return inf, true
	case s.ninf > 0:
		return "-" + inf, true
	}
	return "", false
}

// displayScale is the largest display scale of the finite numeric inputs
// present (Postgres's sum keeps the largest it added).
func (s *State) displayScale() int32 {
	if n := len(s.scales); n > 0 {
		return s.scales[n-1].scale
	}
	return 0
}

// rescaled returns the sum unscaled at scale (at least every input's).
func (s *State) rescaled(scale int32) *big.Int {
	v := new(big.Int).Set(&s.sum)
	switch {
	case scale > s.sumScale:
		v.Mul(v, pow10(scale-s.sumScale))
	case scale < s.sumScale:
		// The scales of the inputs present are at most scale: the digits
		// below it are zeros.
		v.Quo(v, pow10(s.sumScale-scale))
	}
	return v
}

func pow10(n int32) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(n)), nil) }

// parseNumeric parses a numeric's text form into its unscaled value and
// display scale ("12.50" is 1250 at scale 2).
func parseNumeric(text string) (*big.Int, int32, error) {
	if v, scale, ok := parseSmallNumeric(text); ok {
		return new(big.Int).SetInt64(v), scale, nil
	}
	digits, scale := text, int32(0)
	if i := strings.IndexByte(text, '.'); i >= 0 {
		digits, scale = text[:i]+text[i+1:], int32(len(text)-i-1)
	}
	v, ok := new(big.Int).SetString(digits, 10)
	if !ok || strings.ContainsAny(text, "eE") {
		return nil, 0, fmt.Errorf("%q is not a numeric's text", text)
	}
	return v, scale, nil
}

// parseSmallNumeric parses a numeric's text of at most 18 digits (a
// sign, digits, at most one point), the common case, without big.Int's
// parser; ok is false for any other text.
func parseSmallNumeric(text string) (v int64, scale int32, ok bool) {
	s, neg := text, false
	if len(s) > 0 && (s[0] == '-' || s[0] == '+') {
		s, neg = s[1:], s[0] == '-'
	}
	digits, point := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			if digits++; digits > 18 {
				return 0, 0, false
			}
			v = v*10 + int64(c-'0')
			if point {
				scale++
			}
		case c == '.' && !point:
			point = true
		default:
			return 0, 0, false
		}
	}
	if digits == 0 {
		return 0, 0, false
	}
	if neg {
		v = -v
	}
	return v, scale, true
}

// formatNumeric writes v at scale as Postgres does ("-0.50").
func formatNumeric(v *big.Int, scale int32) string {
	neg := v.Sign() < 0
	digits := new(big.Int).Abs(v).String()
	if scale > 0 {
		if pad := int(scale) + 1 - len(digits); pad > 0 {
			digits = strings.Repeat("0", pad) + digits
		}
		digits = digits[:len(digits)-int(scale)] + "." + digits[len(digits)-int(scale):]
	}
	if neg {
		return "-" + digits
	}
	return digits
}

// Postgres's numeric: decimal digits per base-10000 digit (DEC_DIGITS),
// and the bounds of a division's result scale (numeric.c).
const (
	decDigits       = 4
	minSigDigits    = 16
	maxDisplayScale = 1000
	minDisplayScale = 0
)

// divide divides a by b (unscaled values at their display scales) as
// Postgres's numeric division does: at the result scale select_div_scale
// picks, rounded half away from zero. It returns the quotient unscaled and
// its scale.
func divide(a *big.Int, ascale int32, b *big.Int, bscale int32) (*big.Int, int32) {
	w1, d1 := weightAndFirst(a, ascale)
	w2, d2 := weightAndFirst(b, bscale)
	qweight := w1 - w2
	if d1 <= d2 {
		qweight--
	}
	rscale := int32(minSigDigits - qweight*decDigits)
	rscale = max(rscale, ascale, bscale, minDisplayScale)
	rscale = min(rscale, maxDisplayScale)
	// a/10^ascale / (b/10^bscale) at rscale: a * 10^(rscale-ascale+bscale) / b.
	num := new(big.Int).Set(a)
	if e := rscale - ascale + bscale; e >= 0 {
		num.Mul(num, pow10(e))
	} else {
		b = new(big.Int).Mul(b, pow10(-e))
	}
	q, r := new(big.Int).QuoRem(num, b, new(big.Int))
	// Half away from zero: |2r| >= |b| rounds |q| up.
	r2 := new(big.Int).Abs(r)
	r2.Lsh(r2, 1)
	if r2.Cmp(new(big.Int).Abs(b)) >= 0 {
		if num.Sign()*b.Sign() < 0 {
			q.Sub(q, big.NewInt(1))
		} else {
			q.Add(q, big.NewInt(1))
		}
	}
	return q, rscale
}

// weightAndFirst returns the weight of the first non-zero base-10000 digit
// of |v|×10^-scale, and that digit (0 and 0 for zero), as numeric.c's
// select_div_scale reads them.
func weightAndFirst(v *big.Int, scale int32) (int, int64) {
	if v.Sign() == 0 {
		return 0, 0
	}
	digits := new(big.Int).Abs(v).String()
	// The decimal point is scale digits from the right; align it to a
	// multiple of four by padding the fraction with zeros.
	pad := (decDigits - int(scale)%decDigits) % decDigits
	digits += strings.Repeat("0", pad)
	frac := int(scale) + pad // digits after the point, a multiple of 4
	// Group from the right into base-10000 digits; digit k (from the
	// right, 0-based) has weight k - frac/4.
	lead := len(digits) % decDigits
	if lead == 0 {
		lead = decDigits
	}
	for start, k := 0, (len(digits)-lead)/decDigits; start < len(digits); k-- {
		end := start + lead
		if start > 0 {
			end = start + decDigits
		}
		d, _ := strconv.ParseInt(digits[start:end], 10, 64)
		if d != 0 {
			return k - frac/decDigits, d
		}
		start = end
	}
	return 0, 0
}
