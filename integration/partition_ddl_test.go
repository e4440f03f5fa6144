package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestPartitionDDLHoldsTheSlot: partition DDL is not in the replication
// stream, so the daemon may confirm the slot only up to where it has
// checked the catalog. For each change that moves rows in or out of a
// joined partitioned table without row changes in the WAL (DETACH and DROP
// of a partition with rows, ATTACH of a filled table, TRUNCATE of one
// partition), with writes to the table going on after it: the slot's
// confirmed_flush_lsn reaches the writes before the change, and never the
// change itself, before run stops naming the partition. (It used to be
// confirmed past the change for up to a partition check interval, while
// the target still held the rows.)
func TestPartitionDDLHoldsTheSlot(t *testing.T) {
	testenv.Race(t)
	cases := []struct {
		name, partition string
		ddl             []string
	}{
		{"detach", "orders_2025", []string{`ALTER TABLE orders DETACH PARTITION orders_2025`}},
		{"drop", "orders_2025", []string{`DROP TABLE orders_2025`}},
		{"attach", "orders_2027", []string{
			`CREATE TABLE orders_2027 (LIKE orders INCLUDING ALL)`,
			`INSERT INTO orders_2027 SELECT g, date '2027-01-01' + g % 300, g % 12, g, 'pre' FROM generate_series(1, 50) g`,
			`ALTER TABLE orders ATTACH PARTITION orders_2027 FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')`}},
		{"truncate", "orders_2025", []string{`TRUNCATE orders_2025`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, `CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text)`)
			sqlExec(t, tc, rangeOrders...)
			sqlExec(t, tc,
				`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 10) g`,
				`INSERT INTO orders SELECT g, date '2025-01-01' + g % 700, g % 12, g, 'n' FROM generate_series(1, 400) g`)
			cfg := daemonConfig(t, tc, partitionedYAML)
			opts := fkmat.Options{PartitionCheckInterval: 2 * time.Second}
			d := startDaemon(t, cfg, opts)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// Writes before the change, which the slot must confirm.
			sqlExec(t, tc, `UPDATE customers SET tier = 'gold' WHERE id < 5`)
			var before, after string
			if err := tc.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&before); err != nil {
				t.Fatal(err)
			}
			waitCaughtUp(t, tc, d)
			sqlExec(t, tc, c.ddl...)
			// Every commit of the change ends before this position.
			if err := tc.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&after); err != nil {
				t.Fatal(err)
			}

			// Writes after the change, until run stops: the slot must not
			// be confirmed past the change meanwhile.
			confirmedPast := func() (reachedBefore, pastChange bool) {
				t.Helper()
				err := tc.Pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn >= $1::pg_lsn, confirmed_flush_lsn >= $2::pg_lsn
					FROM pg_replication_slots WHERE slot_name = $3`, before, after, tc.Slot).Scan(&reachedBefore, &pastChange)
				if err != nil {
					t.Fatal(err)
				}
				return reachedBefore, pastChange
			}
			deadline := time.After(60 * time.Second)
			for i := 0; ; i++ {
				sqlExec(t, tc, fmt.Sprintf(`INSERT INTO orders VALUES (%d, '2026-02-02', 1, 1, 'after'); UPDATE customers SET name = name || '.' WHERE id = 3`, 10000+i))
				if _, past := confirmedPast(); past {
					t.Fatalf("the slot was confirmed past the %s of %s (%s) while the target still reflects the partition", c.name, c.partition, after)
				}
				select {
				case err := <-d.done:
					d.cancel = nil
					if !errors.Is(err, fkmat.ErrPartitionsChanged) || !strings.Contains(err.Error(), c.partition) {
						t.Fatalf("run stopped with %v, want ErrPartitionsChanged naming %s", err, c.partition)
					}
				case <-deadline:
					t.Fatalf("run did not stop after the %s of %s", c.name, c.partition)
				case <-time.After(50 * time.Millisecond):
					continue
				}
				break
			}
			reached, past := confirmedPast()
			if past {
				t.Fatalf("the slot was confirmed past the %s of %s (%s) when run stopped", c.name, c.partition, after)
			}
			if !reached {
				t.Fatalf("the slot was not confirmed up to the writes before the %s (%s): the check holds back too much", c.name, before)
			}

			if err := fkmat.BackfillIfNeeded(context.Background(), cfg, true, fkmat.Options{}); err != nil {
				t.Fatal(err)
			}
			d = startDaemon(t, cfg, opts)
			sqlExec(t, tc, `INSERT INTO orders VALUES (20001, '2026-03-03', 2, 1, 'rebuilt')`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
		})
	}
}
