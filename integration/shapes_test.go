package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// partitionedYAML joins a range-partitioned orders (key: id and the
// partition key created) to a hash-partitioned customers.
// partitionedOrders creates orders partitioned by range of created: 2025,
// 2026 and a default partition.
var partitionedOrders = []string{
	`CREATE TABLE orders (id bigint, created date, customer_id bigint, amount numeric(12,2), note text,
		PRIMARY KEY (id, created)) PARTITION BY RANGE (created)`,
	`CREATE TABLE orders_2025 PARTITION OF orders FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`,
	`CREATE TABLE orders_2026 PARTITION OF orders FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
	`CREATE TABLE orders_default PARTITION OF orders DEFAULT`,
}

const partitionedYAML = `
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, created, customer_id, amount, note]
    right:
      table: public.customers
      columns: [name AS customer_name, tier]
    target:
      table: public.orders_enriched
`

// TestPartitionedTables: orders partitioned by range of created (with a
// default partition) and customers partitioned by hash of id (left join) or
// by list of ids with a default partition (inner join), as the left and the
// right table. The backfill, streamed changes into every partition,
// UPDATEs moving rows between partitions (the partition key, and the key
// across partitions), a partition created and one attached while running,
// and a restart: the target equals the SQL join over the partitioned
// tables. (Without publish_via_partition_root, pgoutput names the leaf
// partitions and every streamed change was lost.)
func TestPartitionedTables(t *testing.T) {
	testenv.Race(t)
	for _, typ := range []string{"left", "inner"} {
		t.Run(typ, func(t *testing.T) {
			tc := testenv.New(t)
			customers := []string{ // hash-partitioned for the left join
				`CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text) PARTITION BY HASH (id)`,
				`CREATE TABLE customers_p0 PARTITION OF customers FOR VALUES WITH (MODULUS 3, REMAINDER 0)`,
				`CREATE TABLE customers_p1 PARTITION OF customers FOR VALUES WITH (MODULUS 3, REMAINDER 1)`,
				`CREATE TABLE customers_p2 PARTITION OF customers FOR VALUES WITH (MODULUS 3, REMAINDER 2)`,
			}
			if typ == "inner" { // list-partitioned, with a default partition, for the inner join
				customers = []string{
					`CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text) PARTITION BY LIST (id)`,
					`CREATE TABLE customers_low PARTITION OF customers FOR VALUES IN (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)`,
					`CREATE TABLE customers_mid PARTITION OF customers FOR VALUES IN (11, 12, 13, 14, 15, 16, 17, 18, 19, 20)`,
					`CREATE TABLE customers_rest PARTITION OF customers DEFAULT`,
				}
			}
			sqlExec(t, tc, customers...)
			sqlExec(t, tc, partitionedOrders...)
			sqlExec(t, tc,
				`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 30) g`,
				`INSERT INTO orders SELECT g, date '2024-06-01' + (g * 7) % 1000, CASE WHEN g % 11 = 0 THEN NULL ELSE g % 33 END, g, 'n'
					FROM generate_series(1, 300) g`)
			cfg := daemonConfig(t, tc, partitionedYAML)
			cfg.Joins[0].Type = typ
			// Checked every 2 s, not 10: each refused partition change
			// below waits for a check.
			opts := fkmat.Options{PartitionCheckInterval: 2 * time.Second}
			d := startDaemon(t, cfg, opts)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			sqlExec(t, tc,
				// Every partition of both tables.
				`INSERT INTO orders VALUES (1001, '2025-03-01', 1, 1, 'a'), (1002, '2026-03-01', 2, 1, 'b'), (1003, '2030-01-01', 3, 1, 'c')`,
				`INSERT INTO customers SELECT g, 'new' || g, 'gold' FROM generate_series(31, 40) g`,
				`UPDATE customers SET name = name || '*' WHERE id % 2 = 0`, // fans out to orders in every partition
				`INSERT INTO orders SELECT g, date '2025-01-01' + g % 700, 31 + g % 10, g, 'x' FROM generate_series(2000, 2100) g`,
				// Partition-key updates move rows between partitions (a key change: created is in the key).
				`UPDATE orders SET created = '2026-06-01' WHERE id BETWEEN 1 AND 40 AND created < '2026-01-01'`,
				`UPDATE orders SET created = '2031-01-01', customer_id = 5 WHERE id BETWEEN 41 AND 50`,
				// The key across partitions, and the right key across hash partitions.
				`UPDATE orders SET id = id + 50000, created = '2025-02-02' WHERE id BETWEEN 51 AND 60`,
				`UPDATE customers SET id = 100 WHERE id = 4`,
				`UPDATE orders SET customer_id = 100 WHERE id BETWEEN 61 AND 70`,
				`DELETE FROM orders WHERE id BETWEEN 71 AND 80`,
				`DELETE FROM customers WHERE id = 6`,
				`BEGIN; UPDATE orders SET amount = 0 WHERE id = 81; UPDATE orders SET created = '2025-09-09' WHERE id = 81; COMMIT`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// A partition created, and an empty one attached, while running.
			sqlExec(t, tc,
				`DELETE FROM orders WHERE created >= '2027-01-01' AND created < '2029-01-01'`,
				`CREATE TABLE orders_2027 PARTITION OF orders FOR VALUES FROM ('2027-01-01') TO ('2028-01-01')`,
				`CREATE TABLE orders_2028 (LIKE orders INCLUDING ALL)`,
				`ALTER TABLE orders ATTACH PARTITION orders_2028 FOR VALUES FROM ('2028-01-01') TO ('2029-01-01')`,
				`INSERT INTO orders VALUES (3001, '2027-05-05', 7, 1, 'p27'), (3002, '2028-05-05', 8, 1, 'p28')`,
				`UPDATE orders SET created = '2028-07-07' WHERE id BETWEEN 90 AND 95`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
			sqlExec(t, tc,
				`UPDATE orders SET created = '2025-05-05' WHERE id BETWEEN 3001 AND 3002`,
				`UPDATE customers SET tier = 'platinum' WHERE id IN (7, 8)`)
			d = startDaemon(t, cfg, opts)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			if n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE id IN (1001, 1002, 1003, 3001, 3002)`); n != 5 {
				t.Fatalf("%d of 5 orders streamed into partitions reached the target", n)
			}

			// Detaching an empty partition changes nothing; detaching one
			// with rows takes them out of orders without row changes in the
			// WAL, and the daemon follows it.
			sqlExec(t, tc, `CREATE TABLE orders_2029 PARTITION OF orders FOR VALUES FROM ('2029-01-01') TO ('2030-01-01')`,
				`ALTER TABLE orders DETACH PARTITION orders_2029`, `INSERT INTO orders VALUES (3003, '2025-05-05', 9, 1, 'x')`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			sqlExec(t, tc, `ALTER TABLE orders DETACH PARTITION orders_2025`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			if n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE created >= '2025-01-01' AND created < '2026-01-01'`); n != 0 {
				t.Fatalf("%d rows of the detached partition are still in the target", n)
			}
			// Changed while detached (not in the WAL), then attached back:
			// its rows come back as they are now.
			sqlExec(t, tc, `UPDATE orders_2025 SET amount = -1`,
				`ALTER TABLE orders ATTACH PARTITION orders_2025 FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// A table that holds rows attached while the daemon is stopped.
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
			sqlExec(t, tc, `CREATE TABLE orders_2032 (LIKE orders INCLUDING ALL)`,
				`INSERT INTO orders_2032 VALUES (5001, '2032-02-02', 1, 1, 'pre')`,
				`ALTER TABLE orders ATTACH PARTITION orders_2032 FOR VALUES FROM ('2032-01-01') TO ('2033-01-01')`)
			d = startDaemon(t, cfg, opts)
			sqlExec(t, tc, `INSERT INTO orders VALUES (5002, '2032-03-03', 2, 1, 'post')`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			assertRunning(t, d)
		})
	}
}

// selfJoinYAML joins employees to their manager, another employee.
const selfJoinYAML = `
joins:
  - name: employees_managers
    type: left
    left:
      table: public.employees
      foreign_key: [manager_id]
      columns: [id, name, manager_id, bio]
    right:
      table: public.employees
      columns: [name AS manager_name, bio AS manager_bio]
    target:
      table: public.employees_managers
  - name: employees_with_manager
    type: inner
    left:
      table: public.employees
      foreign_key: [manager_id]
      columns: [id, name]
    right:
      table: public.employees
      columns: [name AS manager_name]
    target:
      table: public.employees_with_manager
`

// TestSelfJoin: employees LEFT JOIN employees AS manager (and the inner join
// of the same, sharing the table): every change of an employee is a change
// of a left row and of a right row. Renames fan out to the reports, managers
// move, a row is its own manager, a cycle is made in one transaction, rows
// are deleted and re-keyed (with a TOASTed bio unchanged), and the daemon
// restarts.
func TestSelfJoin(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc,
		`CREATE TABLE employees (id bigint PRIMARY KEY, name text, manager_id bigint, bio text)`,
		`INSERT INTO employees SELECT g, 'e' || g, CASE WHEN g > 1 THEN g / 4 END, CASE WHEN g % 5 = 0 THEN `+bigText(300)+` END
			FROM generate_series(1, 120) g`)
	cfg := daemonConfig(t, tc, selfJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	sqlExec(t, tc,
		`UPDATE employees SET name = 'boss' WHERE id = 4`,               // fans out to its reports
		`UPDATE employees SET manager_id = 3 WHERE id BETWEEN 8 AND 11`, // manager moves
		`UPDATE employees SET manager_id = id WHERE id = 12`,            // its own manager
		`BEGIN; UPDATE employees SET manager_id = 14 WHERE id = 13; UPDATE employees SET manager_id = 13 WHERE id = 14;
		 UPDATE employees SET name = 'cyc' WHERE id IN (13, 14); COMMIT`, // a cycle made in one transaction
		`INSERT INTO employees VALUES (500, 'new', 500, NULL), (501, 'new2', 500, NULL)`,
		`UPDATE employees SET name = 'renamed' WHERE id = 500`,
		`DELETE FROM employees WHERE id = 5`,           // its reports lose their manager
		`UPDATE employees SET id = 1000 WHERE id = 20`, // re-keyed, bio unchanged-TOAST; its reports dangle
		`UPDATE employees SET id = 1001, manager_id = 1001 WHERE id = 25`,
		`UPDATE employees SET bio = 'short' WHERE id = 30`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc,
		`UPDATE employees SET name = 'after restart' WHERE id IN (3, 1000)`,
		`UPDATE employees SET manager_id = 1000 WHERE id BETWEEN 80 AND 85`,
		`DELETE FROM employees WHERE id = 12`)
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if n := queryInt(t, tc, `SELECT count(*) FROM employees_managers WHERE manager_id = 4 AND manager_name = 'boss'`); n == 0 {
		t.Fatal("no report of employee 4 shows the manager's new name")
	}
}

// rangeOrders creates orders partitioned by range of created (the key is id
// and created), with partitions for 2025 and 2026.
var rangeOrders = []string{
	`CREATE TABLE orders (id bigint, created date, customer_id bigint, amount numeric(12,2), note text,
		PRIMARY KEY (id, created)) PARTITION BY RANGE (created)`,
	`CREATE TABLE orders_2025 PARTITION OF orders FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`,
	`CREATE TABLE orders_2026 PARTITION OF orders FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`,
}

// TestCheckPartitionReplicaIdentity: pgoutput sends a partitioned table's
// old rows with each leaf partition's replica identity, so check refuses a
// leaf whose identity does not carry the key, naming the partition.
func TestCheckPartitionReplicaIdentity(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, `CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text)`)
	sqlExec(t, tc, rangeOrders...)
	cfg := daemonConfig(t, tc, partitionedYAML)
	ctx := context.Background()
	if err := fkmat.Check(ctx, cfg, fkmat.Options{}); err != nil {
		t.Fatalf("check of a partitioned table with default identities: %v", err)
	}
	sqlExec(t, tc, `ALTER TABLE orders_2026 REPLICA IDENTITY NOTHING`)
	err := fkmat.Check(ctx, cfg, fkmat.Options{})
	if err == nil || !strings.Contains(err.Error(), "orders_2026") || !strings.Contains(err.Error(), "REPLICA IDENTITY") {
		t.Fatalf("check with a partition of REPLICA IDENTITY NOTHING: %v", err)
	}
	sqlExec(t, tc, `ALTER TABLE orders_2026 REPLICA IDENTITY FULL`)
	if err := fkmat.Check(ctx, cfg, fkmat.Options{}); err != nil {
		t.Fatalf("check with a partition of REPLICA IDENTITY FULL: %v", err)
	}
}

// TestPartitionTruncate: Postgres publishes a TRUNCATE of a partitioned
// table (via the root), but not a TRUNCATE of one of its partitions. The
// first is streamed, and like a VACUUM FULL of a partition (new storage,
// same rows) needs nothing more; the second takes the partition's rows
// without row changes in the WAL, and the daemon follows it, whether the
// TRUNCATE happened while it ran or while it was stopped.
func TestPartitionTruncate(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	cfg := seedRangeOrders(t, tc, `date '2025-01-01' + g % 800`, `CREATE TABLE orders_default PARTITION OF orders DEFAULT`)
	opts := fkmat.Options{PartitionCheckInterval: 2 * time.Second}
	d := startDaemon(t, cfg, opts)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	refill := `INSERT INTO orders SELECT g, date '2025-01-01' + (g * 3) % 800, g % 12, g, 'r' FROM generate_series(1, 300) g`
	sqlExec(t, tc, `TRUNCATE orders`, refill, `VACUUM FULL orders_2025`, `UPDATE customers SET tier = 'gold' WHERE id < 5`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	count := func(partition string) int64 {
		return queryInt(t, tc, `SELECT count(*) FROM orders_enriched e WHERE EXISTS (SELECT FROM `+partition+` p WHERE p.id = e.id AND p.created = e.created)`)
	}
	if count("orders_2026") == 0 || count("orders_default") == 0 {
		t.Fatal("the test needs rows in orders_2026 and orders_default")
	}
	// Truncated while running, with a write to the partition in the same
	// transaction after it.
	sqlExec(t, tc, `BEGIN; TRUNCATE orders_2026; INSERT INTO orders VALUES (7001, '2026-04-04', 3, 1, 't'); COMMIT`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `TRUNCATE orders_default`) // while the daemon is stopped
	d = startDaemon(t, cfg, opts)
	sqlExec(t, tc, refill+` ON CONFLICT DO NOTHING`, `UPDATE customers SET name = 'x' || name`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	assertRunning(t, d)
}

// TestCheckKeyUnique: a configured key must identify one row at every
// moment. The engine keeps one state per key, so two rows sharing a key
// would be merged silently: check refuses a key without a unique index on
// NOT NULL columns, one behind a partial index, and one behind a
// DEFERRABLE constraint, each naming the fix, and accepts a unique index
// (also one on fewer columns than the key, with INCLUDE columns) or NULLS
// NOT DISTINCT.
func TestCheckKeyUnique(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, `CREATE TABLE customers (id bigint PRIMARY KEY, name text)`,
		`CREATE TABLE orders (id bigint, region int, customer_id bigint, note text)`,
		`ALTER TABLE orders REPLICA IDENTITY FULL`)
	const yaml = `
joins:
  - name: orders_enriched
    type: left
    left: {table: orders, key: [id, region], foreign_key: [customer_id]}
    right: {table: customers}
    target: {table: orders_enriched}
`
	cfg := daemonConfig(t, tc, yaml)
	ctx := context.Background()
	for _, step := range []struct {
		sql  []string
		want string // "" = accepted
	}{
		{nil, "is not unique"},
		{[]string{`CREATE UNIQUE INDEX orders_partial ON orders (id) WHERE region > 0`}, "is not unique"},
		{[]string{`CREATE UNIQUE INDEX orders_id ON orders (id) INCLUDE (note)`}, "is not unique"}, // id may be NULL
		{[]string{`ALTER TABLE orders ALTER id SET NOT NULL`}, ""},
		{[]string{`DROP INDEX orders_id`, `ALTER TABLE orders ADD CONSTRAINT orders_u UNIQUE (id, region) DEFERRABLE`,
			`ALTER TABLE orders ALTER region SET NOT NULL`}, "DEFERRABLE"},
		{[]string{`ALTER TABLE orders DROP CONSTRAINT orders_u`, `ALTER TABLE orders ALTER region DROP NOT NULL`,
			`CREATE UNIQUE INDEX orders_nnd ON orders (id, region) NULLS NOT DISTINCT`}, ""},
	} {
		sqlExec(t, tc, step.sql...)
		err := fkmat.Check(ctx, cfg, fkmat.Options{})
		switch {
		case step.want == "" && err != nil:
			t.Fatalf("after %v: check refused: %v", step.sql, err)
		case step.want != "" && (err == nil || !strings.Contains(err.Error(), step.want) || !strings.Contains(err.Error(), "left.key (id, region)")):
			t.Fatalf("after %v: check = %v, want an error with %q naming left.key", step.sql, err, step.want)
		}
	}
}
