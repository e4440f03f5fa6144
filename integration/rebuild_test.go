package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/sink"
)

// widerJoinYAML is leftJoinYAML with one more output column (note): a
// definition change that needs a rebuild.
const widerJoinYAML = `
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, amount, note]
    right:
      table: public.customers
      columns: [name AS customer_name, tier]
    target:
      table: public.orders_enriched
`

// targetReader polls the row count of a target until stopped and records
// every count it saw and every error.
type targetReader struct {
	mu     sync.Mutex
	counts map[int64]int
	errs   []string
	stop   chan struct{}
	done   chan struct{}
}

func readTarget(t *testing.T, pool *pgxpool.Pool, table string) *targetReader {
	t.Helper()
	r := &targetReader{counts: map[int64]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			var n int64
			err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n)
			cancel()
			r.mu.Lock()
			if err != nil {
				r.errs = append(r.errs, err.Error())
			} else {
				r.counts[n]++
			}
			r.mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return r
}

// finish stops the reader and checks that it saw only the counts allowed,
// and each of them at least once when seen says so.
func (r *targetReader) finish(t *testing.T, what string, allowed ...int64) {
	t.Helper()
	close(r.stop)
	<-r.done
	if len(r.errs) > 0 {
		t.Fatalf("%s: a reader of the target failed %d times, first: %s", what, len(r.errs), r.errs[0])
	}
	for n, times := range r.counts {
		ok := false
		for _, a := range allowed {
			ok = ok || n == a
		}
		if !ok {
			t.Fatalf("%s: a reader saw %d rows (%d times); only %v are whole states of the target (all counts seen: %v)",
				what, n, times, allowed, r.counts)
		}
	}
	if len(r.counts) == 0 {
		t.Fatalf("%s: the reader read nothing", what)
	}
}

// TestRebuildKeepsTargetReadable: fkmat backfill --force builds the new
// rows beside the target and swaps them in in one transaction. A reader
// polling the target all along sees the old rows or the new ones, never a
// missing, empty or partial target: for a rebuild of the same definition
// (by a rename, which carries over grants and comments), for a definition
// that gained a column (the new shape arrives with the new rows), and for
// a target with a view on it (merged in place: the view stays). A shape
// change that would lose the view is refused up front, leaving the target
// as it was. Each rebuild ends equal to the SQL join.
func TestRebuildKeepsTargetReadable(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc, shop,
		`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 500) g`,
		`INSERT INTO orders SELECT g, CASE WHEN g % 10 = 0 THEN NULL ELSE g % 600 END, g, 'n' || g FROM generate_series(1, 30000) g`,
		`DROP ROLE IF EXISTS fkmat_rebuild_reader`, `CREATE ROLE fkmat_rebuild_reader`)
	t.Cleanup(func() {
		_, _ = tc.Pool.Exec(context.Background(), `DROP OWNED BY fkmat_rebuild_reader; DROP ROLE IF EXISTS fkmat_rebuild_reader`)
	})
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `GRANT SELECT ON orders_enriched TO fkmat_rebuild_reader`,
		`GRANT UPDATE (amount) ON orders_enriched TO fkmat_rebuild_reader`,
		`COMMENT ON TABLE orders_enriched IS 'orders with their customer'`,
		`COMMENT ON COLUMN orders_enriched.amount IS 'in cents'`)

	// rebuild runs backfill --force with cfg while a reader polls the
	// target; the source gains rows first, so the old and the new counts
	// differ.
	rebuild := func(what string, cfg *config.Config, more int) {
		t.Helper()
		before := queryInt(t, tc, `SELECT count(*) FROM orders_enriched`)
		sqlExec(t, tc, fmt.Sprintf(`INSERT INTO orders SELECT g, g %% 600, g, 'm' FROM generate_series(%d, %d) g`, 100000+before, 100000+before+int64(more)-1))
		r := readTarget(t, tc.Pool, "orders_enriched")
		if err := fkmat.BackfillIfNeeded(context.Background(), cfg, true, fkmat.Options{}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		r.finish(t, what, before, before+int64(more))
	}

	rebuild("a rebuild of the same definition", cfg, 700)
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_class WHERE relname LIKE 'orders_enriched_fkmat_%'`); n != 0 {
		t.Fatalf("%d shadow tables left behind", n)
	}
	assertCarried := func(what string) {
		t.Helper()
		var sel, upd, updOther bool
		var comment, colComment *string
		err := tc.Pool.QueryRow(context.Background(), `SELECT has_table_privilege('fkmat_rebuild_reader', 'orders_enriched', 'SELECT'),
			has_column_privilege('fkmat_rebuild_reader', 'orders_enriched', 'amount', 'UPDATE'),
			has_column_privilege('fkmat_rebuild_reader', 'orders_enriched', 'customer_id', 'UPDATE'),
			obj_description('orders_enriched'::regclass, 'pg_class'), col_description('orders_enriched'::regclass, 3)`).
			Scan(&sel, &upd, &updOther, &comment, &colComment)
		if err != nil {
			t.Fatal(err)
		}
		if !sel || !upd || updOther || comment == nil || *comment != "orders with their customer" || colComment == nil || *colComment != "in cents" {
			t.Fatalf("%s: grants or comments were not carried over: select %v, update(amount) %v, update(customer_id) %v, comments %v %v",
				what, sel, upd, updOther, comment, colComment)
		}
		var pkey string
		if err := tc.Pool.QueryRow(context.Background(), `SELECT conname FROM pg_constraint WHERE conrelid = 'orders_enriched'::regclass AND contype = 'p'`).
			Scan(&pkey); err != nil || pkey != "orders_enriched_pkey" {
			t.Fatalf("%s: the primary key is named %q (%v), want orders_enriched_pkey", what, pkey, err)
		}
	}
	assertCarried("after a rebuild")
	d = startDaemon(t, cfg, fkmat.Options{})
	sqlExec(t, tc, `UPDATE customers SET name = name || '!' WHERE id % 7 = 0`, `DELETE FROM orders WHERE id % 13 = 0`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}

	// A definition that gained a column: readers see the old shape with
	// the old rows until the swap.
	wider := daemonConfig(t, tc, widerJoinYAML)
	rebuild("a rebuild with a new column", wider, 300)
	assertCarried("after a rebuild with a new column")
	d = startDaemon(t, wider, fkmat.Options{})
	sqlExec(t, tc, `UPDATE orders SET note = 'changed' WHERE id % 5 = 0`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, wider)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}

	// A view on the target: the rows are merged in place and the view
	// stays; a new shape would lose the view, and is refused up front.
	sqlExec(t, tc, `CREATE VIEW big_orders AS SELECT id, customer_name FROM orders_enriched WHERE amount > 100`)
	sqlExec(t, tc, `UPDATE orders SET amount = amount + 1 WHERE id % 3 = 0`)
	rebuild("a rebuild merged in place under a view", wider, 200)
	if n := queryInt(t, tc, `SELECT count(*) FROM big_orders`); n == 0 {
		t.Fatal("the view on the target is empty after a merge")
	}
	err := fkmat.BackfillIfNeeded(context.Background(), cfg, true, fkmat.Options{})
	if !errors.Is(err, sink.ErrCannotSwap) || !strings.Contains(err.Error(), "big_orders") {
		t.Fatalf("a new shape under a view: backfill --force returned %v, want ErrCannotSwap naming the view big_orders", err)
	}
	d = startDaemon(t, wider, fkmat.Options{})
	sqlExec(t, tc, `UPDATE customers SET tier = 'gold' WHERE id % 4 = 0`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, wider)
}
