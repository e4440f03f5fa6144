package fkmat

import (
	"testing"

	"github.com/fkmat/fkmat/internal/plan/plantest"
)

// TestOracleListSQL: the oracle of a list-form join is the join's SQL, the
// entries joined in list order on their parents' foreign keys.
func TestOracleListSQL(t *testing.T) {
	got := OracleSQL(plantest.Wide())
	want := `SELECT l."id" AS "id", l."customer_id" AS "customer_id", l."product_id" AS "product_id", l."amount" AS "amount", ` +
		`e0."name" AS "customer_name", e1."title" AS "product_title", e2."name" AS "region_name" ` +
		`FROM "public"."orders" l LEFT JOIN "public"."customers" e0 ON l."customer_id" = e0."id" ` +
		`JOIN "public"."products" e1 ON l."product_id" = e1."id" LEFT JOIN "public"."regions" e2 ON e0."region_id" = e2."id"`
	if got != want {
		t.Errorf("OracleSQL =\n%s\nwant\n%s", got, want)
	}
}
