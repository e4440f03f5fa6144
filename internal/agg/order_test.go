package agg

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
)

// genOrdered returns a random value of typ in Postgres's input form:
// duplicates, equal values written differently, extremes and specials.
func genOrdered(r *rand.Rand, typ string) *string {
	if r.IntN(10) == 0 {
		return nil
	}
	var s string
	switch typ {
	case "bigint":
		s = strconv.FormatInt([]int64{math.MinInt64, math.MaxInt64, -1, 0, 1, r.Int64N(100) - 50, r.Int64() - math.MaxInt64/2}[r.IntN(7)], 10)
	case "numeric":
		s = []string{"NaN", "Infinity", "-Infinity", "0", "0.000", "-0.0", "1", "1.0", "1.000", "-1.5", "-1.50", "-12.5", "0.001", "-0.001",
			"100", "99.99", "1e3", strconv.Itoa(r.IntN(2000) - 1000), fmt.Sprintf("%d.%0*d", r.IntN(100)-50, 1+r.IntN(4), r.IntN(1000)),
			"123456789012345678901234567890.123", "-123456789012345678901234567890.1234"}[r.IntN(21)]
	case "double precision":
		s = []string{"NaN", "Infinity", "-Infinity", "0", "-0", "1e-300", "-1e-300", "1.5", "-2.25",
			strconv.FormatFloat((r.Float64()-0.5)*math.Pow(10, float64(r.IntN(30)-15)), 'g', -1, 64)}[r.IntN(10)]
	case "boolean":
		s = []string{"t", "f"}[r.IntN(2)]
	case "date":
		s = []string{"infinity", "-infinity", "2024-02-29", "0044-03-15 BC", "0001-01-01", "0001-12-31 BC", "9999-12-31", "12345-01-01",
			fmt.Sprintf("%04d-%02d-%02d", 1+r.IntN(3000), 1+r.IntN(12), 1+r.IntN(28))}[r.IntN(9)]
	case "timestamp without time zone":
		s = []string{"infinity", "-infinity", "2024-02-29 23:59:59.999999", "2024-03-01 00:00:00", "1999-12-31 12:00:00.5 BC",
			fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%06d", 1+r.IntN(3000), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000000))}[r.IntN(6)]
	case "timestamp with time zone":
		s = []string{"infinity", "-infinity", "2024-02-29 23:59:59+05:30", "2024-02-29 18:29:59+00", "1900-01-01 00:00:00-00:19:32",
			fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d.%03d%+03d", 1900+r.IntN(200), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000), r.IntN(27)-13)}[r.IntN(6)]
	case "text":
		s = []string{"", "a", "ab", "a b", "B", "é", "a\tb", "zz", "Ab", strings.Repeat("x", r.IntN(5))}[r.IntN(10)]
	case "character(4)":
		s = []string{"", "a", "a  ", "ab", " a", "b", "a\x01"}[r.IntN(7)]
	case "uuid":
		s = fmt.Sprintf("%08x-0000-4000-8000-%012x", r.Uint32()>>uint(r.IntN(32)), r.Int64N(1<<40))
	}
	return &s
}

// TestOrderKeysAsPostgres sorts random values of every type by their keys,
// ascending and descending, and compares with Postgres's ORDER BY (ties in
// the order they came, both sides).
func TestOrderKeysAsPostgres(t *testing.T) {
	tc := testenv.New(t)
	ctx := context.Background()
	seed := uint64(rand.Int64())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 11))
	for _, typ := range []string{"bigint", "numeric", "double precision", "boolean", "date", "timestamp without time zone",
		"timestamp with time zone", "text", "character(4)", "uuid"} {
		for _, desc := range []bool{false, true} {
			vals := make([]*string, 300)
			for i := range vals {
				vals[i] = genOrdered(r, typ)
			}
			dir, col := "ASC", ""
			if desc {
				dir = "DESC"
			}
			if typ == "text" || typ == "character(4)" {
				col = ` COLLATE "C"`
			}
			// Postgres's order, and its text form of each value (the
			// stream carries that form, not the input's).
			// character(n)'s text cast trims its padding; the stream keeps it.
			out := "(v::%[1]s)::text"
			if typ == "character(4)" {
				out = "v::%[1]s"
			}
			q := fmt.Sprintf(`SELECT i::int, `+out+` FROM unnest($1::text[]) WITH ORDINALITY AS u(v, i)
				ORDER BY v::%[1]s%[2]s %[3]s, i`, typ, col, dir)
			conn, err := tc.Pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, "SET TIME ZONE 'UTC'; SET DateStyle = 'ISO, MDY'"); err != nil {
				t.Fatal(err)
			}
			rows, err := conn.Query(ctx, q, vals)
			if err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			var want []int
			texts := make([]*string, len(vals))
			for rows.Next() {
				var i int
				var text *string
				if err := rows.Scan(&i, &text); err != nil {
					t.Fatal(err)
				}
				want = append(want, i-1)
				texts[i-1] = text
			}
			rows.Close()
			conn.Release()
			keys := make([][]byte, len(vals))
			for i, v := range texts {
				var err error
				if keys[i], err = AppendOrderKey(nil, typ, deref(v), v == nil, desc); err != nil {
					t.Fatalf("%s %q: %v", typ, deref(v), err)
				}
				// The key's length is read back with a tie-breaker after it.
				if n, err := OrderKeyLen(append(slices.Clip(keys[i]), 0x00, 0x01, 0xFF), typ, desc); err != nil || n != len(keys[i]) {
					t.Fatalf("%s %q: OrderKeyLen = %d, %v; want %d", typ, deref(v), n, err, len(keys[i]))
				}
			}
			got := make([]int, len(vals))
			for i := range got {
				got[i] = i
			}
			slices.SortStableFunc(got, func(a, b int) int { return bytes.Compare(keys[a], keys[b]) })
			if !slices.Equal(got, want) {
				for k := range got {
					if got[k] != want[k] {
						t.Fatalf("%s %s: at %d fkmat puts %q, Postgres %q", typ, dir, k, deref(texts[got[k]]), deref(texts[want[k]]))
					}
				}
			}
		}
	}
}

func TestCheckOrder(t *testing.T) {
	for _, c := range []struct{ typ, coll, want string }{
		{"numeric(12,2)", "", ""}, {"timestamp(3) with time zone", "", ""}, {"text", "C", ""},
		{"text", "en_US.utf8", `max(name COLLATE "C")`}, {"jsonb", "", "cannot be ordered"}, {"interval", "", "cannot be ordered"},
	} {
		err := CheckOrder(c.typ, c.coll)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CheckOrder(%s, %s) = %v, want %q", c.typ, c.coll, err, c.want)
		}
	}
}
