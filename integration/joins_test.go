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

// threeJoinsYAML maintains three joins from one slot: orders→customers as a
// left and as an inner join (other columns, default right columns), and a
// second pair of tables, items→products.
const threeJoinsYAML = `
joins:
  - name: orders_left
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, amount]
    right:
      table: public.customers
      columns: [name AS customer_name, tier]
    target:
      table: public.orders_left
  - name: orders_inner
    type: inner
    left:
      table: orders
      foreign_key: [customer_id]
      columns: [id AS order_id, amount, note]
    right:
      table: customers
    target:
      table: public.orders_inner
  - name: items_enriched
    type: left
    left:
      table: public.items
      foreign_key: [sku]
    right:
      table: public.products
      columns: [title, price]
    target:
      table: public.items_enriched
`

// TestJoinsShareOneSlot: three joins in one config (a left and an inner join
// of the same tables, and a join of two other tables) run from one slot and
// one daemon; a workload over all four tables, with transactions that touch
// several joins at once and a restart in the middle, leaves every target
// equal to its SQL join.
func TestJoinsShareOneSlot(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc, shop,
		`CREATE TABLE products (sku text PRIMARY KEY, title text, price numeric(10,2), stock int)`,
		`CREATE TABLE items (order_id bigint, line int, sku text, qty int, PRIMARY KEY (order_id, line))`,
		`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 3 = 0 THEN 'gold' END FROM generate_series(1, 30) g`,
		`INSERT INTO orders SELECT g, CASE WHEN g % 9 = 0 THEN NULL ELSE g % 35 END, g, 'n' || g FROM generate_series(1, 200) g`,
		`INSERT INTO products SELECT 'sku-' || g, 'product ' || g, g * 2.5, g FROM generate_series(1, 20) g`,
		`INSERT INTO items SELECT o, l, 'sku-' || ((o * l) % 23), l FROM generate_series(1, 100) o, generate_series(1, 3) l`)
	cfg := daemonConfig(t, tc, threeJoinsYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`); n != 1 {
		t.Fatalf("%d replication slots for one config, want 1", n)
	}

	sqlExec(t, tc,
		`UPDATE customers SET name = name || '*', tier = coalesce(tier, 'basic') WHERE id % 4 = 0`,
		`UPDATE orders SET customer_id = 31 WHERE id % 10 = 1`, // 31 does not exist yet
		`INSERT INTO customers VALUES (31, 'late', 'new')`,
		`UPDATE products SET price = price + 1 WHERE sku IN ('sku-1', 'sku-2')`,
		`DELETE FROM products WHERE sku = 'sku-3'`,
		`INSERT INTO items VALUES (1, 9, 'sku-99', 1), (2, 9, 'sku-3', 2)`,
		// One transaction touching all three joins.
		`BEGIN;
		 UPDATE customers SET tier = 'platinum' WHERE id = 5;
		 UPDATE orders SET note = 'changed', customer_id = 5 WHERE id = 7;
		 INSERT INTO products VALUES ('sku-99', 'ninety-nine', 9.9, 0);
		 DELETE FROM orders WHERE id = 8;
		 DELETE FROM items WHERE order_id = 8;
		 COMMIT`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	// A restart resumes every join from the shared checkpoint.
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc,
		`DELETE FROM customers WHERE id % 5 = 0`,
		`UPDATE items SET sku = 'sku-1' WHERE line = 2`,
		`INSERT INTO orders SELECT g, g % 31, 1, 'after restart' FROM generate_series(201, 260) g`)
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	var orderIDs int64
	if err := tc.Pool.QueryRow(context.Background(), `SELECT count(*) FROM orders_inner WHERE note = 'after restart'`).Scan(&orderIDs); err != nil || orderIDs == 0 {
		t.Fatalf("inner join after restart: %d rows, %v", orderIDs, err)
	}
}

// TestCompositeKeys: a left table with a composite primary key (a, b) and a
// composite foreign key (x, y) referencing a right table's composite primary
// key, text keys that are prefixes of each other ('1', '10', '11'), tuples
// whose concatenations collide (('1', 10) vs ('11', 0)), the empty string,
// NULL in one foreign-key column (SQL: no match), and compatible key types
// (text/varchar, bigint/int) — for the left and the inner join. A second
// join of the same tables lists the keys in the other order (text last), so
// that a key encoding that is not prefix-free shows up in fan-outs.
func TestCompositeKeys(t *testing.T) {
	const yml = `
joins:
  - name: lines_xy
    type: left
    left:
      table: public.lines
      foreign_key: [x, y]
    right:
      table: public.parts
    target:
      table: public.lines_xy
  - name: lines_yx
    type: left
    left:
      table: public.lines
      key: [b, a]
      foreign_key: [y, x]
      columns: [qty]
    right:
      table: public.parts
      key: [y, x]
      columns: [label AS part_label]
    target:
      table: public.lines_yx
`
	for _, typ := range []string{"left", "inner"} {
		t.Run(typ, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc,
				`CREATE TABLE parts (x varchar(10), y int, label text, PRIMARY KEY (x, y))`,
				`CREATE TABLE lines (a text, b bigint, x text, y bigint, qty int, PRIMARY KEY (a, b))`,
				`INSERT INTO parts VALUES ('1', 0, '1/0'), ('10', 0, '10/0'), ('1', 10, '1/10'), ('11', 0, '11/0'),
					('', 1, 'empty/1'), ('1', 1, '1/1'), ('01', 1, '01/1')`,
				`INSERT INTO lines VALUES
					('1', 1, '1', 0, 1), ('1', 10, '10', 0, 2), ('11', 0, '1', 10, 3), ('1', 0, '11', 0, 4),
					('10', 1, '', 1, 5), ('', 1, '1', 1, 6), ('1', 11, '01', 1, 7),
					('2', 1, '1', NULL, 8), ('2', 2, NULL, 0, 9), ('2', 3, NULL, NULL, 10),
					('3', 1, '10', 10, 11), ('3', 2, '1', 100, 12)`)
			cfg := daemonConfig(t, tc, yml)
			cfg.Joins[0].Type, cfg.Joins[1].Type = typ, typ
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			sqlExec(t, tc,
				`UPDATE parts SET label = label || '!' WHERE x = '1'`,               // fan-out to ('1', *) only
				`DELETE FROM parts WHERE x = '1' AND y = 10`,                        // not ('11', 0)
				`INSERT INTO parts VALUES ('10', 10, '10/10'), ('1', 100, '1/100')`, // dependents appear
				`UPDATE lines SET y = NULL WHERE a = '1' AND b = 1`,                 // NULL in one FK column: no match
				`UPDATE lines SET x = '1', y = 1 WHERE a = '2' AND b = 1`,           // NULL -> match
				`UPDATE lines SET y = 0 WHERE a = '2' AND b = 2`,                    // still NULL x: no match
				`UPDATE lines SET b = b + 100 WHERE a = '1' AND b = 10`,             // primary key change
				`UPDATE lines SET a = '11', b = 1 WHERE a = '1' AND b = 11`,         // prefix neighbour key
				`UPDATE parts SET x = '1', y = 1000 WHERE x = '' AND y = 1`,         // right key change
				`INSERT INTO lines VALUES ('', 2, '1', 1000, 13), ('4', 1, '01', 1, 14)`,
				`UPDATE parts SET label = NULL WHERE x = '01'`,
				`DELETE FROM lines WHERE a = '11' AND b = 0`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
		})
	}
}

// bigText is SQL for an incompressible text of n×32 characters (chained
// md5 of random values): stored out of line even after TOAST compression.
func bigText(n int) string {
	return fmt.Sprintf(`(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, %d) g)`, n)
}

// TestToastUnchanged: projected text columns larger than a page on both
// sides (random, so TOAST cannot compress them inline). Updates of other
// columns send them as unchanged-TOAST in pgoutput; the target keeps the
// real values (never NULL, never stale): for left updates, FK moves,
// right updates fanning out, new dependents of a TOASTed right row, an
// insert followed by an update in the same transaction, a value changed to
// another big value or to NULL, and after a restart (values from Redis).
func TestToastUnchanged(t *testing.T) {
	testenv.Race(t)
	tc := testenv.New(t)
	sqlExec(t, tc,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text, bio text)`,
		`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text)`,
		`INSERT INTO customers SELECT g, 'c' || g, 'silver', CASE WHEN g <> 4 THEN `+bigText(400)+` || g END FROM generate_series(1, 5) g`,
		`INSERT INTO orders SELECT g, 1 + g % 5, g, CASE WHEN g % 7 <> 0 THEN `+bigText(300)+` || g END FROM generate_series(1, 40) g`)
	for _, table := range []string{"orders", "customers"} {
		if n := queryInt(t, tc, `SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = $1`, table); n == 0 {
			t.Fatalf("the big values of %s are not stored out of line; the test would not exercise unchanged TOAST", table)
		}
	}
	cfg := daemonConfig(t, tc, toastJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	sqlExec(t, tc,
		`UPDATE orders SET amount = amount + 1 WHERE id <= 20`,              // note unchanged-TOAST
		`UPDATE orders SET customer_id = 4 WHERE id IN (3, 4)`,              // FK move, note unchanged-TOAST
		`UPDATE customers SET tier = 'gold' WHERE id IN (1, 2)`,             // bio unchanged-TOAST, fan-out
		`INSERT INTO orders VALUES (100, 1, 1, 'small'), (101, 2, 1, NULL)`, // new dependents of TOASTed bios
		`BEGIN;
		 INSERT INTO orders VALUES (102, 3, 1, `+bigText(300)+`);
		 UPDATE orders SET amount = 2 WHERE id = 102;
		 INSERT INTO customers VALUES (6, 'six', 'new', `+bigText(400)+`);
		 UPDATE customers SET tier = 'newer' WHERE id = 6;
		 INSERT INTO orders VALUES (103, 6, 1, NULL);
		 COMMIT`,
		`UPDATE orders SET note = `+bigText(300)+` WHERE id = 5`, // changed to another big value
		`UPDATE orders SET amount = 0 WHERE id = 5`,
		`UPDATE orders SET note = NULL WHERE id = 6`,
		`UPDATE orders SET amount = 0 WHERE id = 6`,
		`UPDATE customers SET bio = 'short now' WHERE id = 3`,
		`UPDATE customers SET name = 'three' WHERE id = 3`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	// After a restart the unchanged values come from the Redis state.
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc,
		`UPDATE orders SET amount = amount + 10 WHERE id BETWEEN 8 AND 15`,
		`UPDATE customers SET name = 'restarted' WHERE id IN (1, 5)`,
		`UPDATE orders SET customer_id = 5 WHERE id = 9`)
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE length(note) > 8000 AND length(bio) > 8000`); n < 15 {
		t.Fatalf("only %d target rows hold both big values", n)
	}
}

// TestTruncate: TRUNCATE of the left table, of the right table (left join:
// right columns NULL; inner join: empty) and of both in one statement, each
// followed by inserts in the same and in later transactions, and a TRUNCATE
// between other changes of one batch.
func TestTruncate(t *testing.T) {
	testenv.Race(t)
	for _, typ := range []string{"left", "inner"} {
		t.Run(typ, func(t *testing.T) {
			tc := testenv.New(t)
			seed := []string{
				`INSERT INTO customers SELECT g, 'c' || g, 't' || g FROM generate_series(1, 10) g`,
				`INSERT INTO orders SELECT g, 1 + g % 12, g, 'n' FROM generate_series(1, 60) g`,
			}
			sqlExec(t, tc, shop)
			sqlExec(t, tc, seed...)
			cfg := daemonConfig(t, tc, leftJoinYAML)
			cfg.Joins[0].Type = typ
			// A long batch delay: back-to-back transactions share a batch.
			d := startDaemon(t, cfg, fkmat.Options{Batch: pipeline.BatchLimits{Delay: 300 * time.Millisecond, Idle: 300 * time.Millisecond}})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// Left table, then inserts in the same and a later transaction.
			sqlExec(t, tc, `BEGIN; TRUNCATE orders; INSERT INTO orders VALUES (100, 1, 1, 'a'), (101, 11, 1, 'b'); COMMIT`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			sqlExec(t, tc, `INSERT INTO orders SELECT g, 1 + g % 12, g, 'n' FROM generate_series(1, 60) g`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// Right table alone.
			sqlExec(t, tc, `TRUNCATE customers`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			rows := queryInt(t, tc, `SELECT count(*) FROM orders_enriched`)
			withRight := queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE customer_name IS NOT NULL OR tier IS NOT NULL`)
			if typ == "left" && (rows != 62 || withRight != 0) {
				t.Fatalf("left join after TRUNCATE of the right table: %d rows, %d with right values; want 62, 0", rows, withRight)
			}
			if typ == "inner" && rows != 0 {
				t.Fatalf("inner join after TRUNCATE of the right table: %d rows, want 0", rows)
			}
			// The left rows still reference their keys: new right rows find them.
			sqlExec(t, tc, `INSERT INTO customers VALUES (1, 'one', 'x'), (2, 'two', NULL)`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// Right table, then inserts in the same transaction.
			sqlExec(t, tc, `BEGIN; TRUNCATE customers; INSERT INTO customers VALUES (3, 'three', 'y'), (1, 'uno', 'z'); COMMIT`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// Both in one statement, then inserts in the same and later
			// transactions.
			sqlExec(t, tc, `BEGIN; TRUNCATE orders, customers; INSERT INTO customers VALUES (5, 'five', 'f'); INSERT INTO orders VALUES (1, 5, 1, 'x'), (2, 6, 2, 'y'); COMMIT`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			sqlExec(t, tc, `INSERT INTO customers VALUES (6, 'six', 's')`, `INSERT INTO orders VALUES (3, 5, 3, 'z')`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			// Truncates between other transactions of one batch.
			sqlExec(t, tc, seed[0]+` ON CONFLICT DO NOTHING`,
				`UPDATE orders SET amount = 7`,
				`TRUNCATE customers`,
				`INSERT INTO customers VALUES (5, 'cinq', 'c')`,
				`TRUNCATE orders`,
				`INSERT INTO orders VALUES (10, 5, 1, 'p'), (11, 6, 1, 'q')`,
				`UPDATE customers SET tier = 'after' WHERE id = 5`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			if n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched`); (typ == "left" && n != 2) || (typ == "inner" && n != 1) {
				t.Fatalf("after the last truncates the target has %d rows", n)
			}
		})
	}
}
