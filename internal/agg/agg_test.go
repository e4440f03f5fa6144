package agg

import (
	"context"
	"fmt"
	"math"
	"math/big"
	mrand "math/rand"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// value is one row's input: its text, or NULL.
type value struct {
	text string
	null bool
}

// gen returns a random input of typ: small and huge values, many display
// scales, and the special values, with NULLs.
func gen(r *rand.Rand, typ string) value {
	if r.IntN(8) == 0 {
		return value{null: true}
	}
	switch typ {
	case "integer":
		return value{text: strconv.FormatInt(int64(r.Int32())-math.MaxInt32/2, 10)}
	case "bigint":
		if r.IntN(3) == 0 {
			return value{text: strconv.FormatInt(math.MaxInt64-r.Int64N(1000), 10)}
		}
		return value{text: strconv.FormatInt(r.Int64N(2_000_000)-1_000_000, 10)}
	case "numeric":
		switch r.IntN(20) {
		case 0:
			return value{text: "NaN"}
		case 1:
			return value{text: "Infinity"}
		case 2:
			return value{text: "-Infinity"}
		}
		scale := r.IntN(6)
		digits := new(big.Int).Rand(r2big(r), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(1+r.IntN(30))), nil))
		if r.IntN(2) == 0 {
			digits.Neg(digits)
		}
		return value{text: formatNumeric(digits, int32(scale))}
	case "double precision":
		switch r.IntN(25) {
		case 0:
			return value{text: "NaN"}
		case 1:
			return value{text: "Infinity"}
		}
		f := (r.Float64() - 0.5) * math.Pow(10, float64(r.IntN(12)))
		return value{text: strconv.FormatFloat(f, 'g', -1, 64)}
	case "boolean":
		return value{text: map[bool]string{true: "t", false: "f"}[r.IntN(2) == 0]}
	}
	panic(typ)
}

// r2big is a math/rand generator drawn from r, for big.Int.Rand.
func r2big(r *rand.Rand) *mrand.Rand { return mrand.New(mrand.NewSource(r.Int64())) }

// TestAgainstPostgres adds and removes random inputs of every supported
// type and aggregate, and compares each state's result with what Postgres
// computes over the rows present, at many points of the sequence.
func TestAgainstPostgres(t *testing.T) {
	tc := testenv.New(t)
	ctx := context.Background()
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 7))
	cases := []struct{ fn, typ string }{
		{"count", "integer"}, {"sum", "integer"}, {"sum", "bigint"}, {"sum", "numeric"}, {"sum", "double precision"},
		{"avg", "integer"}, {"avg", "bigint"}, {"avg", "numeric"}, {"avg", "double precision"},
		{"bool_and", "boolean"}, {"bool_or", "boolean"},
	}
	checks := 0
	for _, c := range cases {
		for _, star := range []bool{false, true} {
			if star && c.fn != "count" {
				continue
			}
			fn, resultType, err := Of(c.fn, c.typ, star)
			if err != nil {
				t.Fatal(err)
			}
			s := New(fn)
			var rows []value
			for step := range 400 {
				if len(rows) > 0 && r.IntN(5) < 2 {
					i := r.IntN(len(rows))
					if err := s.Remove(rows[i].text, rows[i].null); err != nil {
						t.Fatal(err)
					}
					rows[i] = rows[len(rows)-1]
					rows = rows[:len(rows)-1]
				} else {
					v := gen(r, c.typ)
					if err := s.Add(v.text, v.null); err != nil {
						t.Fatal(err)
					}
					rows = append(rows, v)
				}
				// The state goes through Redis between batches.
				enc := s.Append(nil)
				d, rest, err := Decode(enc)
				if err != nil || len(rest) != 0 {
					t.Fatalf("Decode(Append) = %v, %d bytes left", err, len(rest))
				}
				s = d
				if step%20 != 19 && step != 0 {
					continue
				}
				arg := "v"
				if star {
					arg = "*"
				}
				texts := make([]*string, len(rows))
				for i := range rows {
					if !rows[i].null {
						texts[i] = &rows[i].text
					}
				}
				var want *string
				q := fmt.Sprintf("SELECT %s(%s)::text, pg_typeof(%s(%s))::text FROM unnest($1::text[]) u, LATERAL (SELECT u::%s AS v) x",
					c.fn, arg, c.fn, arg, c.typ)
				var typ string
				if err := tc.Pool.QueryRow(ctx, q, texts).Scan(&want, &typ); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
				if typ != resultType {
					t.Fatalf("%s(%s): Postgres's type %s, Of says %s", c.fn, c.typ, typ, resultType)
				}
				got, null := s.Result()
				if !same(c.typ, c.fn, got, null, want) {
					t.Fatalf("%s(%s) over %d rows (step %d): got %q (null %v), Postgres %v", c.fn, c.typ, len(rows), step, got, null, deref(want))
				}
				checks++
			}
		}
	}
	t.Logf("%d results compared with Postgres", checks)
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// same compares a result with Postgres's: exactly, and floating-point
// results within a relative 1e-9 (Postgres adds in row order).
func same(typ, fn, got string, null bool, want *string) bool {
	if want == nil || null {
		return want == nil && null
	}
	if got == *want || typ == "boolean" && (got == "t") == (*want == "true") {
		return true
	}
	if typ != "double precision" {
		return false
	}
	g, err1 := strconv.ParseFloat(got, 64)
	w, err2 := strconv.ParseFloat(*want, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	if math.IsNaN(g) || math.IsNaN(w) || math.IsInf(g, 0) || math.IsInf(w, 0) {
		return strings.EqualFold(got, *want) || g == w
	}
	return math.Abs(g-w) <= 1e-9*math.Max(math.Abs(g), math.Abs(w))
}

// TestDivideAsPostgres checks avg's division against Postgres's numeric
// division on values whose quotients need every rounding and scale case.
func TestDivideAsPostgres(t *testing.T) {
	tc := testenv.New(t)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(uint64(rand.Int64()), 3))
	var as, bs, wants []string
	for range 2000 {
		a := new(big.Int).Rand(r2big(r), new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(1+r.IntN(40))), nil))
		if r.IntN(2) == 0 {
			a.Neg(a)
		}
		b := big.NewInt(1 + r.Int64N([]int64{3, 1000, 1 << 40}[r.IntN(3)]))
		ascale := int32(r.IntN(8))
		q, qs := divide(a, ascale, b, 0)
		as, bs, wants = append(as, formatNumeric(a, ascale)), append(bs, b.String()), append(wants, formatNumeric(q, qs))
	}
	rows, err := tc.Pool.Query(ctx, `SELECT (a::numeric / b::numeric)::text FROM unnest($1::text[], $2::text[]) AS u(a, b)`, as, bs)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for i := 0; rows.Next(); i++ {
		var pg string
		if err := rows.Scan(&pg); err != nil {
			t.Fatal(err)
		}
		if pg != wants[i] {
			t.Errorf("%s / %s: Postgres %s, divide %s", as[i], bs[i], pg, wants[i])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

func TestOfRefuses(t *testing.T) {
	for _, c := range []struct{ fn, typ, want string }{
		{"sum", "real", "sum(x::double precision)"},
		{"sum", "interval", "sum of interval is not supported"},
		{"avg", "text", "avg of text is not supported"},
		{"bool_and", "integer", "bool_and takes a boolean"},
	} {
		if _, _, err := Of(c.fn, c.typ, false); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Of(%s, %s) = %v, want %q", c.fn, c.typ, err, c.want)
		}
	}
}

// TestNumericScale: a sum's display scale is the largest of the values
// present, so removing the only value of the largest scale narrows it, as
// Postgres's sum over the rows left does; NaN and the infinities leave
// without a trace.
func TestNumericScale(t *testing.T) {
	s := New(SumNumeric)
	for _, step := range []struct {
		op, v, want string
	}{
		{"+", "1.500", "1.500"}, {"+", "2", "3.500"}, {"+", "NaN", "NaN"}, {"-", "1.500", "NaN"},
		{"-", "NaN", "2"}, {"+", "-Infinity", "-Infinity"}, {"+", "Infinity", "NaN"}, {"-", "Infinity", "-Infinity"},
		{"-", "-Infinity", "2"}, {"+", "-2.25", "-0.25"}, {"-", "2", "-2.25"},
	} {
		var err error
		if step.op == "+" {
			err = s.Add(step.v, false)
		} else {
			err = s.Remove(step.v, false)
		}
		if got, _ := s.Result(); err != nil || got != step.want {
			t.Fatalf("%s%s: sum %q (%v), want %q", step.op, step.v, got, err, step.want)
		}
	}
}

// TestDecodeTruncated: every prefix of an encoding is refused, none panics.
func TestDecodeTruncated(t *testing.T) {
	for _, fn := range []Func{CountStar, Count, SumInt, SumNumeric, SumFloat, AvgNumeric, AvgFloat, BoolAnd, BoolOr} {
		s := New(fn)
		for _, v := range []string{"1", "2.50", "NaN"} {
			if fn == BoolAnd || fn == BoolOr {
				v = "t"
			}
			_ = s.Add(v, false)
		}
		enc := s.Append(nil)
		for i := range len(enc) {
			if _, _, err := Decode(enc[:i]); err == nil {
				t.Errorf("aggregate %d: Decode of %d of %d bytes succeeded", fn, i, len(enc))
			}
		}
	}
}

// TestParseNumericFast: the fast path of a numeric's text gives what
// big.Int's parser gives, and leaves what it cannot read to it.
func TestParseNumericFast(t *testing.T) {
	for _, text := range []string{"0", "-0", "+1", "12.50", "-0.001", "999999999999999999", "1234567890.12345678",
		"9999999999999999999", "-12345678901234567890.5", "1e5", "", "-", ".", "1.2.3", "0.", "NaN", " 1"} {
		got, gotScale, gotErr := parseNumeric(text)
		digits, scale := text, int32(0)
		if i := strings.IndexByte(text, '.'); i >= 0 {
			digits, scale = text[:i]+text[i+1:], int32(len(text)-i-1)
		}
		want, ok := new(big.Int).SetString(digits, 10)
		if !ok || strings.ContainsAny(text, "eE") {
			if gotErr == nil {
				t.Errorf("%q: parsed as %v, want an error", text, got)
			}
			continue
		}
		if gotErr != nil || got.Cmp(want) != 0 || gotScale != scale {
			t.Errorf("%q: %v scale %d (%v), want %v scale %d", text, got, gotScale, gotErr, want, scale)
		}
	}
}

// TestWidenedSum: a sum of integers whose input widened to bigint goes on
// as the numeric sum of the same values: equal, in result and encoding,
// to a numeric sum of them from the start, through later changes too.
func TestWidenedSum(t *testing.T) {
	ints, nums := New(SumInt), New(SumNumeric)
	for _, v := range []string{"5", "-7", "2147483647", "0"} {
		if err := ints.Add(v, false); err != nil {
			t.Fatal(err)
		}
		if err := nums.Add(v, false); err != nil {
			t.Fatal(err)
		}
	}
	w, ok := ints.Widened(SumNumeric)
	if !ok {
		t.Fatal("a sum of integers does not widen to a numeric sum")
	}
	for _, s := range []*State{w, nums} {
		if err := s.Add("5000000000", false); err != nil {
			t.Fatal(err)
		}
		if err := s.Remove("-7", false); err != nil {
			t.Fatal(err)
		}
	}
	gw, _ := w.Result()
	gn, _ := nums.Result()
	if gw != gn || string(w.Append(nil)) != string(nums.Append(nil)) {
		t.Fatalf("widened %s (%q), numeric %s (%q)", gw, w.Append(nil), gn, nums.Append(nil))
	}
	if _, ok := New(SumNumeric).Widened(SumInt); ok {
		t.Fatal("a numeric sum narrowed to integers")
	}
}
