package fkmat

import (
	"context"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
)

// TestCountRows: status counts small targets exactly and reports the
// planner's estimate for big ones instead of scanning them.
func TestCountRows(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Docker")
	}
	tc := testenv.New(t)
	ctx := context.Background()
	for _, s := range []string{
		`CREATE TABLE "odd Name" (id int PRIMARY KEY)`,
		`INSERT INTO "odd Name" SELECT generate_series(1, 5000)`,
		`ANALYZE "odd Name"`,
		`DELETE FROM "odd Name" WHERE id <= 1000`, // the estimate is now stale
	} {
		if _, err := tc.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	n, est, err := countRows(ctx, tc.Pool, `"odd Name"`)
	if err != nil || est || n != 4000 {
		t.Fatalf("below the limit: %d rows, estimated %v (%v); want exactly 4000", n, est, err)
	}
	defer func(old int64) { exactCountLimit = old }(exactCountLimit)
	exactCountLimit = 1000
	n, est, err = countRows(ctx, tc.Pool, `"odd Name"`)
	if err != nil || !est || n != 5000 {
		t.Fatalf("above the limit: %d rows, estimated %v (%v); want the estimate 5000", n, est, err)
	}
}
