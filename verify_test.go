package fkmat

import (
	"testing"

	"github.com/fkmat/fkmat/internal/plan"
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

// TestChainLeftSQL: the backfill query of each step's left rows is the
// join's SQL up to the entries before it, selecting the key and the carried
// columns (customers.region_id, hidden, for the regions step).
func TestChainLeftSQL(t *testing.T) {
	p := plantest.Wide()
	l := plan.ChainOf(p)
	for i, want := range []string{
		`SELECT l."id", l."customer_id", l."product_id", l."amount" FROM "public"."orders" l`,
		`SELECT l."id", l."customer_id", l."product_id", l."amount", e0."name", e0."region_id" FROM "public"."orders" l ` +
			`LEFT JOIN "public"."customers" e0 ON l."customer_id" = e0."id"`,
		`SELECT l."id", l."customer_id", l."product_id", l."amount", e0."name", e0."region_id", e1."title" FROM "public"."orders" l ` +
			`LEFT JOIN "public"."customers" e0 ON l."customer_id" = e0."id" JOIN "public"."products" e1 ON l."product_id" = e1."id"`,
	} {
		if got := chainLeftSQL(p, l, i); got != want {
			t.Errorf("step %d:\n%s\nwant\n%s", i, got, want)
		}
	}
}
