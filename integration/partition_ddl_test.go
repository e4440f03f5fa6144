package integration

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestPartitionDDLFollowed: partition DDL moves rows in or out of a joined
// partitioned table without row changes in the WAL (DETACH and DROP of a
// partition with rows, ATTACH of a filled table, TRUNCATE of one
// partition). The daemon follows each online, with writes to the table
// going on: it never stops, the slot's confirmed_flush_lsn reaches the
// writes before the change, and once it covers the change the target
// reflects it (the partition's joined rows gone, or there); at the end the
// target equals the SQL join.
func TestPartitionDDLFollowed(t *testing.T) {
	testenv.Race(t)
	in2025 := `SELECT count(*) FROM orders_enriched WHERE created >= '2025-01-01' AND created < '2026-01-01'`
	cases := []struct {
		name, partition string
		ddl             []string
		// moved counts the target's rows the change moved, and want is
		// their count once it is followed.
		moved string
		want  int64
		// setup runs, and is followed, before the change.
		setup []string
	}{
		{"detach", "orders_2025", []string{`ALTER TABLE orders DETACH PARTITION orders_2025`}, in2025, 0, nil},
		{"drop", "orders_2025", []string{`DROP TABLE orders_2025`}, in2025, 0, nil},
		{"detach then drop", "orders_2025", []string{`ALTER TABLE orders DETACH PARTITION orders_2025`, `DROP TABLE orders_2025`}, in2025, 0, nil},
		{"attach", "orders_2027", []string{
			`CREATE TABLE orders_2027 (LIKE orders INCLUDING ALL)`,
			`INSERT INTO orders_2027 SELECT g, date '2027-01-01' + g % 300, g % 12, g, repeat('pre', 1000 + g) FROM generate_series(1, 50) g`,
			`ALTER TABLE orders ATTACH PARTITION orders_2027 FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')`},
			`SELECT count(*) FROM orders_enriched WHERE created >= '2027-01-01' AND note LIKE 'prepre%'`, 50, nil},
		{"truncate", "orders_2025", []string{`TRUNCATE orders_2025`}, in2025, 0, nil},
		// Rows streamed into a partition and detached with it in one
		// transaction: as old as the DETACH, and they leave.
		{"insert, detach", "orders_2030", []string{
			`BEGIN; INSERT INTO orders SELECT g, date '2030-01-01' + g, g % 12, g, 'x' FROM generate_series(1, 30) g;
			ALTER TABLE orders DETACH PARTITION orders_2030; COMMIT`},
			`SELECT count(*) FROM orders_enriched WHERE created >= '2030-01-01'`, 0, []string{
				`CREATE TABLE orders_2030 PARTITION OF orders FOR VALUES FROM ('2030-01-01') TO ('2031-01-01')`}},
		// Created, filled and attached in one transaction: the rows are
		// as old as the ATTACH.
		{"create, fill, attach", "orders_2027", []string{`BEGIN; CREATE TABLE orders_2027 (LIKE orders INCLUDING ALL);
			INSERT INTO orders_2027 SELECT g, date '2027-01-01' + g % 300, g % 12, g, 'one' FROM generate_series(1, 40) g;
			ALTER TABLE orders ATTACH PARTITION orders_2027 FOR VALUES FROM ('2027-01-01') TO ('2028-01-01'); COMMIT`},
			`SELECT count(*) FROM orders_enriched WHERE created >= '2027-01-01' AND note = 'one'`, 40, nil},
		// Detached, changed and attached back in one transaction: the
		// partition keeps its OID, parent and storage.
		{"detach, update, attach", "orders_2025", []string{`BEGIN; ALTER TABLE orders DETACH PARTITION orders_2025;
			UPDATE orders_2025 SET note = 'while detached'; DELETE FROM orders_2025 WHERE id % 3 = 0;
			ALTER TABLE orders ATTACH PARTITION orders_2025 FOR VALUES FROM ('2025-01-01') TO ('2026-01-01'); COMMIT`},
			`SELECT count(*) FROM orders_enriched WHERE created >= '2025-01-01' AND created < '2026-01-01' AND (note <> 'while detached' OR id % 3 = 0)`, 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tc := testenv.New(t)
			cfg := seedRangeOrders(t, tc, `date '2025-01-01' + g % 700`)
			opts := fkmat.Options{PartitionCheckInterval: 2 * time.Second}
			d := startDaemon(t, cfg, opts)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// Writes before the change, which the slot must confirm.
			sqlExec(t, tc, c.setup...)
			sqlExec(t, tc, `UPDATE customers SET tier = 'gold' WHERE id < 5`)
			before := walPosition(t, tc)
			waitCaughtUp(t, tc, d)
			sqlExec(t, tc, c.ddl...)
			// Every commit of the change ends before this position.
			after := walPosition(t, tc)

			// Writes after the change: the daemon goes on, and once the
			// slot is confirmed past the change the target reflects it.
			confirmedPast := func() (reachedBefore, pastChange bool) {
				t.Helper()
				err := tc.Pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn >= $1::pg_lsn, confirmed_flush_lsn >= $2::pg_lsn
					FROM pg_replication_slots WHERE slot_name = $3`, before, after, tc.Slot).Scan(&reachedBefore, &pastChange)
				if err != nil {
					t.Fatal(err)
				}
				return reachedBefore, pastChange
			}
			deadline := time.After(90 * time.Second)
			for i := 0; ; i++ {
				sqlExec(t, tc, fmt.Sprintf(`INSERT INTO orders VALUES (%d, '2026-02-02', 1, 1, 'after'); UPDATE customers SET name = name || '.' WHERE id = 3`, 10000+i))
				if _, past := confirmedPast(); past {
					if n := queryInt(t, tc, c.moved); n != c.want {
						t.Fatalf("the slot was confirmed past the %s of %s (%s) with %d of the rows it moved in the target, want %d",
							c.name, c.partition, after, n, c.want)
					}
					break
				}
				select {
				case err := <-d.done:
					d.cancel = nil
					t.Fatalf("run stopped after the %s of %s: %v", c.name, c.partition, err)
				case <-deadline:
					t.Fatalf("the slot was not confirmed past the %s of %s", c.name, c.partition)
				case <-time.After(50 * time.Millisecond):
				}
			}
			if reached, _ := confirmedPast(); !reached {
				t.Fatalf("the slot was not confirmed up to the writes before the %s (%s)", c.name, before)
			}
			sqlExec(t, tc, `INSERT INTO orders VALUES (20001, '2026-03-03', 2, 1, 'later')`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// walPosition returns the source's current WAL position.
func walPosition(t *testing.T, tc *testenv.Case) string {
	t.Helper()
	var lsn string
	if err := tc.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	return lsn
}

// partitionedTreeYAML joins a partitioned orders to a partitioned
// customers and on to regions, and the same two tables in a second join.
const partitionedTreeYAML = `joins:
  - name: orders_wide
    type: left
    left:
      table: public.orders
      columns: [id, created, customer_id, amount]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        columns: [name AS customer_name]
      - table: public.regions
        from: customers
        foreign_key: [region_id]
        columns: [name AS region_name]
    target:
      table: public.orders_wide
  - name: orders_enriched
    type: inner
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, created, customer_id, note]
    right:
      table: public.customers
      columns: [name AS customer_name]
    target:
      table: public.orders_enriched
`

// TestPartitionDDLInTree: partition DDL on the left table and on an entry
// of a join of several tables, both tables also in a two-table join: each
// change is followed in both joins without a stop, and the targets equal
// their SQL after each.
func TestPartitionDDLInTree(t *testing.T) {
	testenv.Race(t)
	t.Run("redis", func(t *testing.T) { partitionDDLInTree(t, "") })
	t.Run("cluster", func(t *testing.T) { partitionDDLInTree(t, testenv.NewCluster(t).URL()) })
}

// partitionDDLInTree is TestPartitionDDLInTree with the state on redisURL
// (a Redis Cluster), or on the test's Redis server.
func partitionDDLInTree(t *testing.T, redisURL string) {
	tc := testenv.New(t)
	sqlExec(t, tc, `CREATE TABLE regions (id int PRIMARY KEY, name text)`,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int) PARTITION BY RANGE (id)`,
		`CREATE TABLE customers_lo PARTITION OF customers FOR VALUES FROM (0) TO (100)`,
		`CREATE TABLE customers_hi PARTITION OF customers FOR VALUES FROM (100) TO (1000)`)
	sqlExec(t, tc, rangeOrders...)
	sqlExec(t, tc,
		`INSERT INTO regions SELECT g, 'r' || g FROM generate_series(1, 5) g`,
		`INSERT INTO customers SELECT g, 'c' || g, g % 6 FROM generate_series(1, 300) g`,
		`INSERT INTO orders SELECT g, date '2025-01-01' + g % 700, g % 320, g, 'n' FROM generate_series(1, 2000) g`)
	cfg := daemonConfig(t, tc, partitionedTreeYAML)
	if redisURL != "" {
		cfg.Redis = redisURL
	}
	d := startDaemon(t, cfg, fkmat.Options{PartitionCheckInterval: 2 * time.Second})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	steps := [][]string{
		{`ALTER TABLE customers DETACH PARTITION customers_hi`, `UPDATE regions SET name = name || '!' WHERE id = 2`},
		{`UPDATE customers_hi SET name = 'back ' || name WHERE id % 2 = 0`,
			`ALTER TABLE customers ATTACH PARTITION customers_hi FOR VALUES FROM (100) TO (1000)`,
			`UPDATE customers SET region_id = 3 WHERE id = 150`},
		{`DROP TABLE orders_2025`, `INSERT INTO orders VALUES (9001, '2026-05-05', 150, 1, 'new')`},
		{`BEGIN; TRUNCATE customers_lo; INSERT INTO customers VALUES (7, 'seven', 1); COMMIT`},
	}
	for i, step := range steps {
		sqlExec(t, tc, step...)
		waitCaughtUp(t, tc, d)
		assertOracle(t, cfg)
		select {
		case err := <-d.done:
			d.cancel = nil
			t.Fatalf("step %d: run stopped: %v", i+1, err)
		default:
		}
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM orders_wide WHERE customer_name IS NULL AND customer_id < 100 AND customer_id <> 7`); n == 0 {
		t.Fatal("the truncated customers did not leave orders_wide")
	}
}

// TestPartitionDefaultBound: the rows a partition takes with it are looked
// for within its partition constraint; a default partition's constraint
// widens when a sibling is detached, and rows that went into it then must
// still be found when it is truncated, whether or not a partition check ran
// in between.
func TestPartitionDefaultBound(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	cfg := seedRangeOrders(t, tc, `date '2024-06-01' + g % 800`, `CREATE TABLE orders_default PARTITION OF orders DEFAULT`)
	d := startDaemon(t, cfg, fkmat.Options{PartitionCheckInterval: 2 * time.Second})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	for _, together := range []bool{false, true} {
		steps := [][]string{
			{`ALTER TABLE orders DETACH PARTITION orders_2026`},
			{`INSERT INTO orders SELECT g, date '2026-01-01' + g % 300, g % 12, g, 'default' FROM generate_series(5000, 5100) g`},
			{`TRUNCATE orders_default`},
		}
		if together {
			// orders_2025 leaves empty, so only the default partition's
			// constraint, as it is after the detach, holds the rows.
			steps = [][]string{{`DELETE FROM orders WHERE created >= '2025-01-01' AND created < '2026-01-01'`},
				{`BEGIN; ALTER TABLE orders DETACH PARTITION orders_2025; COMMIT;
				INSERT INTO orders SELECT g, date '2025-01-01' + g % 300, g % 12, g, 'default' FROM generate_series(6000, 6100) g;
				TRUNCATE orders_default`}}
		}
		for _, step := range steps {
			sqlExec(t, tc, step...)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
		}
	}
	assertRunning(t, d)
}

// TestPartitionMoveWaitsForWriters: following a partition change takes a
// SHARE lock on the partitioned table. A transaction that holds the table
// for longer makes the move wait (in short lock requests, so that the other
// writers are not queued behind it all the time) and try again; the daemon
// never stops, the slot is not confirmed past the change meanwhile, and
// once the transaction ends the change is followed.
func TestPartitionMoveWaitsForWriters(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	cfg := seedRangeOrders(t, tc, `date '2025-01-01' + g % 700`)
	logs := &syncBuffer{}
	d := startDaemon(t, cfg, fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	waitCaughtUp(t, tc, d)

	ctx := context.Background()
	holder, err := tc.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, `INSERT INTO orders VALUES (9001, '2026-06-06', 1, 1, 'held')`); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `TRUNCATE orders_2025`)
	after := walPosition(t, tc)
	waitFor(t, 60*time.Second, "the move to wait for the holder", func() bool {
		return strings.Count(logs.String(), "a transaction holds a partitioned table") >= 2
	})
	// Other writers get through between the move's lock requests.
	start := time.Now()
	for i := range 5 {
		sqlExec(t, tc, fmt.Sprintf(`INSERT INTO orders VALUES (%d, '2026-07-07', 2, 1, 'other')`, 9100+i))
	}
	t.Logf("five other writes while the move waited: %s", time.Since(start).Round(time.Millisecond))
	var past bool
	if err := tc.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2`,
		after, tc.Slot).Scan(&past); err != nil {
		t.Fatal(err)
	}
	if past {
		t.Fatal("the slot was confirmed past the TRUNCATE while its move waited")
	}
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	assertRunning(t, d)
}

// assertRunning fails the test if the daemon has stopped.
func assertRunning(t *testing.T, d *daemon) {
	t.Helper()
	select {
	case err := <-d.done:
		d.cancel = nil
		t.Fatalf("run stopped: %v", err)
	default:
	}
}

// seedRangeOrders creates customers and the range-partitioned orders (with
// the partitions of rangeOrders and those of more), 10 customers and 400
// orders created on the date expression created (of g), and returns the
// configuration of partitionedYAML.
func seedRangeOrders(t *testing.T, tc *testenv.Case, created string, more ...string) *config.Config {
	t.Helper()
	sqlExec(t, tc, `CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text)`)
	sqlExec(t, tc, rangeOrders...)
	sqlExec(t, tc, more...)
	sqlExec(t, tc, `INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 10) g`,
		`INSERT INTO orders SELECT g, `+created+`, g % 12, g, 'n' FROM generate_series(1, 400) g`)
	return daemonConfig(t, tc, partitionedYAML)
}
