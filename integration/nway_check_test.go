package integration

import (
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
)

// nwayShop is the example schema (README, "Joins of more than two tables") for a join of more than two tables:
// orders reference customers and products, customers reference regions.
const nwayShop = `
CREATE TABLE regions (id int PRIMARY KEY, name text);
CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int, code text);
CREATE TABLE products (id bigint PRIMARY KEY, title text, name text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, product_id bigint, amount numeric(12,2), region_code text);
`

// TestCheckListForm: fkmat check resolves the README's list form against the
// catalog (tables, keys, each edge's foreign key in its from table and its
// types, replica identities, output names) and reports every problem with
// its fix; the README's example passes.
func TestCheckListForm(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, nwayShop)
	good := `joins:
  - name: orders_wide
    type: left
    left:
      table: public.orders
      columns: [id, customer_id, product_id, amount]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        columns: [name AS customer_name]
      - table: public.products
        type: inner
        foreign_key: [product_id]
        columns: [title AS product_title]
      - table: public.regions
        from: customers
        foreign_key: [region_id]
        columns: [name AS region_name]
    target:
      table: public.orders_wide
`
	r := runCLI(t, cliEnv(t, tc, good), "check")
	if r.code != 0 {
		t.Fatalf("check of the README's list form: exit %d, want 0\n%s%s", r.code, r.stdout, r.stderr)
	}
	t.Logf("check:\n%s", r.stdout)

	sqlExec(t, tc, `ALTER TABLE regions REPLICA IDENTITY NOTHING`)
	bad := `joins:
  - name: orders_wide
    type: left
    left:
      table: public.orders
      columns: [id, customer_id, product_id, amount]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        columns: [name]
      - table: public.products
        foreign_key: [product_id]
        columns: [name, nope]
      - table: public.regions
        from: customers
        foreign_key: [code]
        columns: [name AS region_name]
      - table: public.regions
        as: order_region
        foreign_key: [region_code]
    target:
      table: public.orders_wide
`
	r = runCLI(t, cliEnv(t, tc, bad), "check")
	if r.code != 2 {
		t.Fatalf("check of a bad list form: exit %d, want 2\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		`right[1] (products).columns: table public.products has no column "nope"`,
		`right[2] (regions): foreign_key "code" -> key "id"`,
		`right[3] (order_region): foreign_key "region_code" -> key "id"`,
		`REPLICA IDENTITY NOTHING`,
		`output column "name" comes from customers and from products; rename one with ` + "`AS`",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("check of a bad list form does not say %q:\n%s", want, r.stderr)
		}
	}
	if n := strings.Count(r.stderr, "REPLICA IDENTITY NOTHING"); n != 1 {
		t.Errorf("check names regions' replica identity %d times, want once (the table is joined twice):\n%s", n, r.stderr)
	}
	if strings.Contains(r.stderr, "maintained by this version") {
		t.Errorf("check names the version limit before the problems are fixed:\n%s", r.stderr)
	}
}
