package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/crash"
	"github.com/fkmat/fkmat/internal/testenv"
)

// toastJoinYAML joins orders and customers with a big (out-of-line) text
// column projected on each side.
const toastJoinYAML = `
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, amount, note]
    right:
      table: public.customers
      columns: [name AS customer_name, tier, bio]
    target:
      table: public.orders_enriched
`

// toastTables creates orders and customers whose note and bio are stored
// out of line, and fails the test if they are not.
func toastTables(t *testing.T, tc *testenv.Case) {
	t.Helper()
	sqlExec(t, tc,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text, bio text)`,
		`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text)`,
		`INSERT INTO customers SELECT g, 'c' || g, 'silver', `+bigText(400)+` || g FROM generate_series(1, 8) g`,
		`INSERT INTO orders SELECT g, 1 + g % 8, g, `+bigText(300)+` || g FROM generate_series(1, 60) g`)
	for _, table := range []string{"orders", "customers"} {
		if n := queryInt(t, tc, `SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = $1`, table); n == 0 {
			t.Fatalf("the big values of %s are not stored out of line; the test would not exercise unchanged TOAST", table)
		}
	}
}

// TestKeyChangeToast: UPDATEs that change the key of a row whose TOASTed
// column is unchanged (pgoutput sends it as unchanged-TOAST under the new
// key) on both tables: for rows from the backfill and rows inserted while
// streaming, the key changed twice in one transaction, changed back, changed
// together with the foreign key, a right key change with dependents on both
// keys, key changes inside a large chunked transaction, in overlapping
// batches, and replayed after a restart. Before the fix, the first of these
// stalled the daemon for good.
func TestKeyChangeToast(t *testing.T) {
	testenv.Race(t)
	for _, typ := range []string{"left", "inner"} {
		t.Run(typ, func(t *testing.T) {
			tc := testenv.New(t)
			toastTables(t, tc)
			cfg := daemonConfig(t, tc, toastJoinYAML)
			cfg.Joins[0].Type = typ
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			sqlExec(t, tc,
				// Rows from the backfill.
				`UPDATE orders SET id = 9999 WHERE id = 1`,
				`UPDATE customers SET id = 900 WHERE id = 2`, // its orders now dangle
				`INSERT INTO orders VALUES (500, 900, 1, 'small')`,
				// A row inserted while streaming, then its key changed.
				`INSERT INTO orders VALUES (200, 3, 5, `+bigText(300)+`)`,
				`UPDATE orders SET id = 201 WHERE id = 200`,
				// Twice in one transaction, and back.
				`BEGIN; UPDATE orders SET id = 1001 WHERE id = 10; UPDATE orders SET id = 1002 WHERE id = 1001; COMMIT`,
				`BEGIN; UPDATE orders SET id = 1011 WHERE id = 11; UPDATE orders SET id = 11 WHERE id = 1011; COMMIT`,
				// Key and FK together, and in two statements of one transaction.
				`UPDATE orders SET id = 1012, customer_id = 4 WHERE id = 12`,
				`BEGIN; UPDATE orders SET id = 1013 WHERE id = 13; UPDATE orders SET customer_id = NULL WHERE id = 1013; COMMIT`,
				// An insert, a key change and an update of the new key in one transaction.
				`BEGIN; INSERT INTO orders VALUES (300, 5, 1, `+bigText(300)+`); UPDATE orders SET id = 301 WHERE id = 300;
				 UPDATE orders SET amount = 7 WHERE id = 301; COMMIT`,
				// A right key change onto the key of dangling orders, with its bio unchanged.
				`UPDATE orders SET customer_id = 77 WHERE id IN (20, 21)`,
				`UPDATE customers SET id = 77 WHERE id = 3`,
				// A right key change, then an update of the moved row.
				`BEGIN; UPDATE customers SET id = 78 WHERE id = 4; UPDATE customers SET tier = 'gold' WHERE id = 78; COMMIT`,
				`UPDATE customers SET id = 5, name = 'five' WHERE id = 5`, // same key: an ordinary update
				// Every order's key at once (one statement, many key changes).
				`UPDATE orders SET id = id + 100000 WHERE id BETWEEN 30 AND 45`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// A large transaction, delivered in chunks: key changes of
			// TOASTed rows before and after 12k inserts.
			sqlExec(t, tc, `BEGIN;
				UPDATE orders SET id = id + 200000 WHERE id BETWEEN 46 AND 50;
				INSERT INTO orders SELECT g, g % 9, g, 'n' FROM generate_series(20000, 32000) g;
				UPDATE orders SET id = id + 10 WHERE id BETWEEN 200046 AND 200048;
				UPDATE orders SET id = id + 300000 WHERE id BETWEEN 51 AND 55;
				UPDATE customers SET id = 601 WHERE id = 6;
				COMMIT`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// Replayed after a restart: the daemon stops with the key changes
			// unapplied; the values come from the Redis state.
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
			sqlExec(t, tc,
				`UPDATE orders SET id = 7777 WHERE id = 56`,
				`UPDATE customers SET id = 701 WHERE id = 7`,
				`UPDATE orders SET id = 7778, customer_id = 8 WHERE id = 57`)
			d = startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			if n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE id IN (9999, 201, 1002, 1012, 7777, 7778) AND length(note) > 8000`); typ == "left" && n != 6 {
				t.Fatalf("%d of 6 re-keyed orders hold their big note", n)
			}
		})
	}
}

// TestTruncateDuringBackfill: a TRUNCATE of a joined table right after the
// backfill's slot exists. TRUNCATE is not MVCC-safe: when it commits before
// a load reads the table, the snapshot sees the table empty, and the
// backfill must notice and start again; when it waits for the loads' locks,
// it is streamed. Either way the rows updated between the slot's snapshot
// and the TRUNCATE, their TOASTed values unchanged, resolve, and the target
// equals the SQL join. Most bulk orders have no customer, so the target
// holds few copies of the 13 kB bios.
func TestTruncateDuringBackfill(t *testing.T) {
	tc := testenv.New(t)
	toastTables(t, tc)
	sqlExec(t, tc, `INSERT INTO orders SELECT g, CASE WHEN g % 100 = 0 THEN 1 + g % 8 END, g, 'n' FROM generate_series(1000, 200000) g`)
	cfg := daemonConfig(t, tc, toastJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitFor(t, 60*time.Second, "the backfill's slot", func() bool {
		return queryInt(t, tc, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, cdc.BackfillSlot(tc.Slot)) == 1
	})
	sqlExec(t, tc, `UPDATE customers SET tier = 'gold'`, // bio unchanged-TOAST
		`BEGIN; TRUNCATE orders; INSERT INTO orders SELECT g, 1 + g % 8, g, 'r' FROM generate_series(1, 500) g; COMMIT`,
		`UPDATE customers SET name = name || '!'`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// TestSlotNeverAheadDuringBackfill: a TRUNCATE and reload, or a rewrite
// of a joined table (VACUUM FULL, CLUSTER, a column's ALTER TYPE), landing
// as the backfill's slot is created, while it loads, or once it has
// loaded, with busy loops taking the CPU beside. The backfill may start
// over; whenever the configured slot's confirmed_flush_lsn covers the
// change, the target must already hold the SQL join's rows: a reader who
// waits for the slot reads a right target.
func TestSlotNeverAheadDuringBackfill(t *testing.T) {
	testenv.BusyLoops(t, 2)
	for _, change := range []struct {
		name string
		sql  []string
	}{
		{"truncate", []string{`BEGIN; TRUNCATE orders; INSERT INTO orders SELECT g, 1 + g % 8, g, 'r' FROM generate_series(1, 500) g; COMMIT`}},
		{"vacuum full", []string{`DELETE FROM orders WHERE id > 500`, `VACUUM FULL orders`}},
		{"cluster", []string{`DELETE FROM orders WHERE id > 500`, `CLUSTER orders USING orders_pkey`}},
		{"alter type", []string{`DELETE FROM orders WHERE id > 500`, `ALTER TABLE orders ALTER COLUMN extra TYPE bigint`}},
	} {
		for _, at := range []string{"slot created", "loading", "loaded"} {
			t.Run(change.name+"/"+at, func(t *testing.T) {
				tc := testenv.New(t)
				toastTables(t, tc)
				sqlExec(t, tc, `ALTER TABLE orders ADD COLUMN extra int DEFAULT 0`,
					`INSERT INTO orders SELECT g, CASE WHEN g % 100 = 0 THEN 1 + g % 8 END, g, 'n' FROM generate_series(61, 150000) g`)
				cfg := daemonConfig(t, tc, toastJoinYAML)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				// The first backfill stops at the phase until the change is
				// made (a later one, after a restart, goes on).
				reached, resume := make(chan struct{}), make(chan struct{})
				var once sync.Once
				crash.SetTestHook(func(point string, arg any) {
					if point == "backfill: "+at && arg == tc.Slot {
						once.Do(func() {
							close(reached)
							<-resume
						})
					}
				})
				t.Cleanup(func() { crash.SetTestHook(nil) })
				d := startDaemon(t, cfg, fkmat.Options{})
				if at == "loading" {
					waitFor(t, 60*time.Second, "the load", func() bool {
						return queryInt(t, tc, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%FROM "public"."orders"%' AND state = 'active' AND pid <> pg_backend_pid()`) > 0
					})
				} else {
					select {
					case <-reached:
					case <-time.After(2 * time.Minute):
						t.Fatalf("the backfill did not reach %q", at)
					}
				}
				// VACUUM FULL and the rest wait for the loads' locks: let
				// the backfill go on meanwhile.
				done := make(chan error, 1)
				go func() {
					for _, q := range change.sql {
						if _, err := tc.Pool.Exec(ctx, q); err != nil {
							done <- fmt.Errorf("%s: %w", q, err)
							return
						}
					}
					done <- nil
				}()
				if at != "loading" {
					// Let the lock waiters queue before the backfill goes on.
					time.Sleep(100 * time.Millisecond)
					close(resume)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				var lsn string
				if err := tc.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
					t.Fatal(err)
				}
				want := queryInt(t, tc, `SELECT count(*) FROM orders`)
				// Until caught up: whenever the slot covers the change, the
				// target holds the join's rows (one per order).
				for {
					var covers *bool
					if err := tc.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2`,
						lsn, tc.Slot).Scan(&covers); err != nil && !errors.Is(err, pgx.ErrNoRows) {
						t.Fatal(err)
					}
					if covers != nil && *covers {
						var got int64
						if err := tc.Pool.QueryRow(ctx, `SELECT count(*) FROM orders_enriched`).Scan(&got); err != nil {
							t.Fatal(err)
						}
						if got != want {
							t.Fatalf("the slot's confirmed_flush_lsn covers the change at %s while the target holds %d rows, not %d", lsn, got, want)
						}
						break
					}
					select {
					case err := <-d.done:
						d.cancel = nil
						t.Fatalf("daemon stopped: %v", err)
					case <-ctx.Done():
						t.Fatal("the slot never covered the change")
					case <-time.After(5 * time.Millisecond):
					}
				}
				waitCaughtUp(t, tc, d)
				assertOracle(t, cfg)
			})
		}
	}
}
