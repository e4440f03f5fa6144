package redisstore

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/join"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// newStore opens an initialised store on the test's own Redis prefix.
func newStore(t testing.TB, cfg Config) (*Store, *testenv.Case) {
	t.Helper()
	tc := testenv.New(t)
	cfg.Prefix = tc.RedisPrefix
	s, err := Open(context.Background(), tc.Redis, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Init(context.Background(), NewEpoch(), "test", Size{}); err != nil {
		t.Fatal(err)
	}
	return s, tc
}

func intKey(t testing.TB, ns ...int64) join.Key {
	t.Helper()
	fams := make([]join.Family, len(ns))
	vals := make([]join.Value, len(ns))
	for i, n := range ns {
		fams[i], vals[i] = join.FamilyInt, join.TextValue(strconv.FormatInt(n, 10))
	}
	return mustKey(t, fams, vals)
}

func textKey(t testing.TB, ss ...string) join.Key {
	t.Helper()
	fams := make([]join.Family, len(ss))
	vals := make([]join.Value, len(ss))
	for i, s := range ss {
		fams[i], vals[i] = join.FamilyText, join.TextValue(s)
	}
	return mustKey(t, fams, vals)
}

func mustKey(t testing.TB, fams []join.Family, vals []join.Value) join.Key {
	t.Helper()
	k, err := join.EncodeKey(fams, vals)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func texts(ss ...string) []join.Value {
	vs := make([]join.Value, len(ss))
	for i, s := range ss {
		vs[i] = join.TextValue(s)
	}
	return vs
}

// leftRow returns a left row state with integer keys.
func leftRow(pk, fk int64, vals ...string) join.LeftState {
	return join.NewLeftState(texts(strconv.FormatInt(pk, 10)), texts(strconv.FormatInt(fk, 10)), texts(vals...))
}
