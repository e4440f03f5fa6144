package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/testenv"
)

// growYAML joins orders to customers twice on one slot: a two-table join
// and a chain to the customers' regions (one state per table).
const growYAML = `
joins:
  - name: orders_customers
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, amount]
    right:
      table: public.customers
      columns: [name AS customer_name]
    target:
      table: public.orders_customers
  - name: orders_regions
    type: left
    left:
      table: public.orders
      columns: [id, customer_id, amount]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        columns: [name AS customer_name]
      - table: public.regions
        from: customers
        foreign_key: [region_id]
        columns: [name AS region_name]
    target:
      table: public.orders_regions
`

// TestStateGrowsWithItsTables: joins started on an empty orders table get
// Redis states sized for it (the fewest buckets, no fans); as orders grow
// to 240k rows through the stream, run resizes the states between two
// batches: the orders' row buckets of both joins, and the lanes of the
// references from orders to their 20 customers. Changes after the resize
// (renames fanning out over the new lanes, key changes, deletes) and the
// targets end equal to the SQL joins.
func TestStateGrowsWithItsTables(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc, nwayShop,
		`INSERT INTO regions SELECT g, 'region ' || g FROM generate_series(1, 3) g`,
		`INSERT INTO customers SELECT g, 'customer ' || g, g % 4, NULL FROM generate_series(1, 20) g`)
	cfg := daemonConfig(t, tc, growYAML)
	d := startDaemon(t, cfg, fkmat.Options{GrowCheckInterval: 300 * time.Millisecond})
	waitCaughtUp(t, tc, d)
	pair := joinStates(t, tc.Redis, tc.Slot, cfg.Joins[0])[0]
	tree := joinStates(t, tc.Redis, tc.Slot, cfg.Joins[1])
	ctx := context.Background()
	shapes := func() (pairBuckets, treeBuckets, lanes int) {
		pm, err := pair.Meta(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tm, err := tree[0].Meta(ctx)
		if err != nil {
			t.Fatal(err)
		}
		lanes = 1
		for _, f := range tm.Shape.Fans {
			if f.Prefix == pipeline.EdgeKey(1, "")[0] {
				lanes = int(f.Lanes)
			}
		}
		return pm.Shape.LeftBuckets, tm.Shape.LeftBuckets, lanes
	}
	if p, tb, l := shapes(); p != 1024 || tb != 1024 || l != 1 {
		t.Fatalf("states of an empty orders table: %d and %d buckets, %d lanes; want 1024, 1024 and 1", p, tb, l)
	}

	// 240k orders, 12k per customer, some dangling (0) or NULL.
	for i := range 4 {
		// The inserting session reports its statistics (n_live_tup) as it
		// goes idle, as busy sessions do: run sizes tables by them.
		sqlExec(t, tc, fmt.Sprintf(`INSERT INTO orders
			SELECT g, CASE WHEN g %% 50 = 0 THEN NULL ELSE g %% 21 END, g, NULL FROM generate_series(%d, %d) g;
			SELECT pg_stat_force_next_flush()`, 1+i*60000, (i+1)*60000))
	}
	waitFor(t, 3*time.Minute, "the states resized for 240k orders", func() bool {
		p, tb, l := shapes()
		return p >= 4096 && tb >= 4096 && l >= 64
	})
	p, tb, l := shapes()
	t.Logf("after 240k orders: %d and %d buckets, %d lanes to customers", p, tb, l)

	// The resized states keep working: fan-outs over the lanes, key
	// changes, deletes, and a region rename through the chain.
	sqlExec(t, tc,
		`UPDATE customers SET name = name || ' (renamed)' WHERE id % 3 = 0`,
		`UPDATE orders SET customer_id = (customer_id + 7) % 21 WHERE id % 11 = 0`,
		`DELETE FROM orders WHERE id % 17 = 0`,
		`UPDATE regions SET name = 'north' WHERE id = 1`,
		`UPDATE customers SET region_id = 2 WHERE id = 5`,
		`INSERT INTO orders SELECT g, g % 21, g, NULL FROM generate_series(300001, 305000) g`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
}
