package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// targetColumns returns the column names of a table in order.
func targetColumns(t *testing.T, tc *testenv.Case, table string) string {
	t.Helper()
	var cols string
	err := tc.Pool.QueryRow(context.Background(), `SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, table).Scan(&cols)
	if err != nil {
		t.Fatal(err)
	}
	return cols
}

// TestColumnAddedMidStream: columns added to both source tables while the
// daemon streams (between transactions and in the middle of one) do not
// disturb the join, with explicit column lists and with the default "all
// columns": the target keeps the columns it was built with and keeps
// following every change.
func TestColumnAddedMidStream(t *testing.T) {
	const defaultColumnsYAML = `
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
    right:
      table: public.customers
    target:
      table: public.orders_enriched
`
	for _, c := range []struct{ name, yml string }{{"explicit", leftJoinYAML}, {"default", defaultColumnsYAML}} {
		t.Run(c.name, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, shop,
				`INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 10) g`,
				`INSERT INTO orders SELECT g, 1 + g % 11, g, 'n' FROM generate_series(1, 50) g`)
			cfg := daemonConfig(t, tc, c.yml)
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			before := targetColumns(t, tc, "orders_enriched")

			sqlExec(t, tc,
				`ALTER TABLE customers ADD COLUMN extra_c text DEFAULT 'x'`,
				`UPDATE customers SET name = name || '+', extra_c = 'y' WHERE id % 2 = 0`,
				`BEGIN; INSERT INTO orders VALUES (51, 2, 1, 'a'); ALTER TABLE orders ADD COLUMN extra int DEFAULT 7;
				 INSERT INTO orders VALUES (52, 3, 1, 'b', 8); UPDATE orders SET customer_id = 4, extra = 9 WHERE id = 1; COMMIT`,
				`UPDATE orders SET amount = amount + 1, extra = 10 WHERE id % 5 = 0`,
				`DELETE FROM customers WHERE id = 5`)
			waitCaughtUp(t, tc, d)
			if after := targetColumns(t, tc, "orders_enriched"); after != before {
				t.Fatalf("target columns changed from %s to %s", before, after)
			}
			// The SQL join the target was built for: with the default "all
			// columns" the definition now resolves to more columns, so the
			// oracle uses the columns resolved at the start.
			oracle := daemonConfig(t, tc, leftJoinYAML)
			if c.name == "default" {
				oracle = daemonConfig(t, tc, `
joins:
  - name: orders_enriched
    type: left
    left: {table: public.orders, foreign_key: [customer_id], columns: [id, customer_id, amount, note]}
    right: {table: public.customers, columns: [name, tier]}
    target: {table: public.orders_enriched}
`)
			}
			assertOracle(t, oracle)
			if c.name == "default" {
				// verify with the grown definition says that run builds it
				// (not a raw SQL error, nor a comparison with the old target).
				_, err := fkmat.Verify(context.Background(), cfg, fkmat.Options{})
				if !errors.Is(err, fkmat.ErrDefinitionPending) || !strings.Contains(err.Error(), "columns added: extra") {
					t.Errorf("verify with the grown default columns: %v, want ErrDefinitionPending naming the added columns", err)
				}
			}
			if err := d.stop(t); err != nil {
				t.Fatalf("clean shutdown returned %v", err)
			}
			if c.name != "default" {
				return
			}
			// The grown definition: run builds it beside the running join
			// and switches the target to it, without stopping.
			d = startDaemon(t, cfg, fkmat.Options{})
			deadline := time.Now().Add(2 * time.Minute)
			for !strings.Contains(targetColumns(t, tc, "orders_enriched"), "extra") {
				select {
				case err := <-d.done:
					d.cancel = nil
					t.Fatalf("run with the grown definition stopped: %v", err)
				case <-time.After(50 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatal("run did not switch the target to the grown definition within 2 minutes")
				}
			}
			sqlExec(t, tc, `UPDATE orders SET extra = 11 WHERE id = 2`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
		})
	}
}

// TestJoinColumnChangedMidStream: a join column dropped or retyped while
// the daemon streams stops it at the first transaction laid out the new way,
// with an error that names the column and the fix, and that transaction is
// not acknowledged (confirmed_flush_lsn and the target checkpoint stay before
// its commit). Applying the fix the message names (following a renamed
// column in the configuration, or nothing for a retyped one) and starting
// run again builds the changed definition beside the running joins, the
// target keeping its rows meanwhile, and brings the target back to its SQL
// join.
func TestJoinColumnChangedMidStream(t *testing.T) {
	cases := []struct {
		name  string
		alter string   // the change while streaming
		want  []string // in the error
		// fix is applied before the restart; nil: the restart alone is
		// the fix (the definition changed with the catalog).
		fix func(t *testing.T, tc *testenv.Case)
		// after is the configuration of the restart and the oracle (nil:
		// the same).
		after string
		// offline says the fix rebuilt the join before the restart.
		offline bool
	}{{
		name:  "renamed",
		alter: `ALTER TABLE orders RENAME COLUMN amount TO total`,
		want:  []string{`"amount"`, "public.orders", "renamed", "configuration", "start fkmat run again"},
		after: strings.ReplaceAll(leftJoinYAML, "columns: [id, customer_id, amount]", "columns: [id, customer_id, total AS amount]"),
	}, {
		name:  "dropped",
		alter: `ALTER TABLE orders DROP COLUMN customer_id`,
		want:  []string{`"customer_id"`, "public.orders", "dropped", "configuration", "start fkmat run again", "restore it", "fkmat backfill --force"},
		// Restored: the transactions without it are still in the slot,
		// and only a rebuild from a new slot gets past them.
		fix: func(t *testing.T, tc *testenv.Case) {
			sqlExec(t, tc, `ALTER TABLE orders ADD COLUMN customer_id bigint`, `UPDATE orders SET customer_id = 1 + id % 6`)
			backfillForce(t, daemonConfig(t, tc, leftJoinYAML))
		},
		offline: true,
	}, {
		name:  "target column retyped",
		alter: `ALTER TABLE orders ALTER COLUMN customer_id TYPE integer`,
		want:  []string{`"customer_id"`, "public.orders", "changed type", "start fkmat run again", "keeps its rows"},
	}, {
		// Same type, a lower precision: not every value the target
		// column holds would survive it (a widening is followed instead:
		// TestWidenedColumns).
		name:  "numeric precision narrowed",
		alter: `ALTER TABLE orders ALTER COLUMN amount TYPE numeric(10,2)`,
		want:  []string{`"amount"`, "public.orders", "type modifier", "only when it widens", "start fkmat run again"},
		fix: func(t *testing.T, tc *testenv.Case) {
			sqlExec(t, tc, `UPDATE orders SET amount = amount + 0.0001 WHERE id % 3 = 0`)
		},
	}, {
		name:  "right key retyped",
		alter: `ALTER TABLE customers ALTER COLUMN id TYPE integer`,
		want:  []string{`"id"`, "public.customers", "changed type", "start fkmat run again"},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tc := testenv.New(t)
			enableWALInspect(t, tc)
			sqlExec(t, tc, shop,
				`INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 5) g`,
				`INSERT INTO orders SELECT g, 1 + g % 6, g, 'n' FROM generate_series(1, 30) g`)
			cfg := daemonConfig(t, tc, leftJoinYAML)
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)

			sqlExec(t, tc, c.alter)
			end := commitTxn(t, tc, `INSERT INTO customers (id, name, tier) VALUES (100, 'new', 'n')`,
				`INSERT INTO orders (id, note) VALUES (100, 'new')`)
			var err error
			select {
			case err = <-d.done:
				d.cancel = nil
			case <-time.After(10 * time.Second):
				t.Fatalf("the daemon kept running after a join column was %s", c.name)
			}
			if !errors.Is(err, pipeline.ErrSchemaChanged) {
				t.Errorf("error %v is not ErrSchemaChanged", err)
			}
			for _, w := range c.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v does not mention %s", err, w)
				}
			}
			checkNotAcknowledged(t, tc, end)

			if c.fix != nil {
				c.fix(t, tc)
			}
			next := cfg
			if c.after != "" {
				next = daemonConfig(t, tc, c.after)
			}
			// The restart builds the changed definition beside the running
			// joins; the target keeps its rows meanwhile, and the slot is
			// not confirmed past the change until the switch.
			before := queryInt(t, tc, `SELECT count(*) FROM orders_enriched`)
			d = startDaemon(t, next, fkmat.Options{})
			deadline := time.Now().Add(2 * time.Minute)
			for !c.offline && queryInt(t, tc, `SELECT count(*) FROM fkmat.join_state WHERE slot = $1 AND generation = 1`, tc.Slot) == 0 {
				// Read before the generation: a count read after the switch
				// finds the generation switched too.
				n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched`)
				cf := confirmedFlush(t, tc)
				if gen := queryInt(t, tc, `SELECT generation FROM fkmat.join_state WHERE slot = $1`, tc.Slot); gen == 0 {
					if n != before {
						t.Fatalf("the target changed from %d to %d rows before the rebuild switched in", before, n)
					}
					if cf >= end {
						t.Fatalf("confirmed_flush_lsn %s covers the change at %s while the target is not maintained", cf, end)
					}
				}
				select {
				case err := <-d.done:
					d.cancel = nil
					t.Fatalf("run after the change stopped: %v", err)
				case <-time.After(20 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatal("the rebuild did not switch in within 2 minutes")
				}
			}
			waitCaughtUp(t, tc, d)
			sqlExec(t, tc, `UPDATE customers SET name = 'after fix' WHERE id = 1`, `UPDATE orders SET customer_id = 100 WHERE id = 1`)
			waitCaughtUp(t, tc, d)
			assertOracle(t, next)
			assertRebuildClean(t, tc, "orders_enriched")
		})
	}
}

func backfillForce(t *testing.T, cfg *config.Config) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := fkmat.BackfillIfNeeded(ctx, cfg, true, fkmat.Options{}); err != nil {
		t.Fatalf("fkmat backfill --force: %v", err)
	}
}

// checkNotAcknowledged checks for a second that neither the slot nor the
// target checkpoint covers the transaction ending at end.
func checkNotAcknowledged(t *testing.T, tc *testenv.Case, e wal.LSN) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if c := confirmedFlush(t, tc); c >= e {
			t.Fatalf("confirmed_flush_lsn %s covers the transaction ending at %s, which was not applied", c, e)
		}
		if cp := targetCheckpoint(t, tc); cp >= e {
			t.Fatalf("target checkpoint %s covers the transaction ending at %s, which was not applied", cp, e)
		}
	}
}

// TestTeardownDropTarget: teardown --drop-target works from the
// configuration alone, so it also drops a target fkmat built whose source
// columns have since been retyped (the fix a stopped daemon names), but it
// never drops a table of the configured name that fkmat did not build and
// that does not have the join's shape.
func TestTeardownDropTarget(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'a', 'x')`, `INSERT INTO orders VALUES (1, 1, 1, 'n')`,
		`CREATE TABLE orders_enriched (mine int)`, `INSERT INTO orders_enriched VALUES (42)`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := fkmat.Teardown(ctx, cfg, true, fkmat.Options{})
	if err == nil || !strings.Contains(err.Error(), "not dropping") {
		t.Fatalf("teardown --drop-target of a foreign table: %v, want a refusal", err)
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE mine = 42`); n != 1 {
		t.Fatal("teardown dropped or changed a table fkmat did not build")
	}

	sqlExec(t, tc, `DROP TABLE orders_enriched`)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `ALTER TABLE orders ALTER COLUMN customer_id TYPE integer`)
	if err := fkmat.Teardown(ctx, cfg, true, fkmat.Options{}); err != nil {
		t.Fatalf("teardown --drop-target after a retype: %v", err)
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_class WHERE relname = 'orders_enriched'`); n != 0 {
		t.Fatal("the target still exists after teardown --drop-target")
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot); n != 0 {
		t.Fatal("the slot still exists after teardown")
	}
	if n, err := tc.Redis.Keys(ctx, "fkmat:"+tc.Slot+":*").Result(); err != nil || len(n) != 0 {
		t.Fatalf("redis keys after teardown: %v, %v", n, err)
	}
	// And a fresh start rebuilds it with the new type.
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// TestEnumGainsValue: an enum used by joined columns on both sides gains a
// value (ALTER TYPE … ADD VALUE) while the daemon streams; rows then take
// the new value on either side (a right change fanning out too) and the
// daemon keeps streaming, before and after a restart, with no rebuild, and
// the target equals the SQL join.
func TestEnumGainsValue(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc,
		`CREATE TYPE tier AS ENUM ('bronze', 'silver')`,
		`CREATE TYPE state AS ENUM ('new', 'paid')`,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier tier)`,
		`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, state state, note text)`,
		`INSERT INTO customers SELECT g, 'c' || g, (ARRAY['bronze','silver']::tier[])[1 + g % 2] FROM generate_series(1, 20) g`,
		`INSERT INTO orders SELECT g, 1 + g % 21, (ARRAY['new','paid']::state[])[1 + g % 2], 'n' FROM generate_series(1, 300) g`)
	const enumYAML = `
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, state]
    right:
      table: public.customers
      columns: [name, tier]
    target:
      table: public.orders_enriched
`
	cfg := daemonConfig(t, tc, enumYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	epoch := joinEpochs(t, tc)

	sqlExec(t, tc,
		`ALTER TYPE tier ADD VALUE 'gold'`,
		`ALTER TYPE state ADD VALUE 'shipped' AFTER 'paid'`,
		`UPDATE customers SET tier = 'gold' WHERE id IN (2, 3)`, // a fan-out with the new value
		`UPDATE orders SET state = 'shipped' WHERE id % 7 = 0`,
		`INSERT INTO orders VALUES (301, 2, 'shipped', 'x'), (302, NULL, 'shipped', 'y')`,
		`BEGIN; INSERT INTO customers VALUES (21, 'new one', 'gold'); UPDATE orders SET customer_id = 21 WHERE id = 20; COMMIT`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatalf("clean shutdown: %v", err)
	}

	d = startDaemon(t, cfg, fkmat.Options{})
	sqlExec(t, tc, `ALTER TYPE tier ADD VALUE 'platinum' BEFORE 'bronze'`,
		`UPDATE customers SET tier = 'platinum' WHERE id = 4`, `UPDATE orders SET state = 'new' WHERE state = 'shipped' AND id < 50`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if after := joinEpochs(t, tc); after != epoch {
		t.Errorf("the join was rebuilt (epochs %v, then %v): an enum gaining a value needs no rebuild", epoch, after)
	}
	if err := d.stop(t); err != nil {
		t.Fatalf("clean shutdown: %v", err)
	}
}

// TestSchemaChangeThenBigTransaction: a column dropped from the left table
// and a joined column of the right one widened while run streams, then one
// transaction of more than 1,280 changes (more than half a slab of changes,
// with the new shapes announced inside it), on a plain and on a
// range-partitioned left table. The daemon must follow it, not panic, and
// the target end equal to its SQL join.
func TestSchemaChangeThenBigTransaction(t *testing.T) {
	const yml = `
joins:
  - name: orders_cust
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, qty]
    right:
      table: public.customers
      columns: [name, score]
    target:
      table: public.orders_cust
`
	for _, tt := range []struct{ name, orders string }{
		{"plain", `CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, qty int, note text)`},
		{"partitioned", `CREATE TABLE orders (id bigint, customer_id bigint, qty int, note text, PRIMARY KEY (id)) PARTITION BY RANGE (id);
			CREATE TABLE orders_1 PARTITION OF orders FOR VALUES FROM (MINVALUE) TO (50000);
			CREATE TABLE orders_2 PARTITION OF orders FOR VALUES FROM (50000) TO (100000);
			CREATE TABLE orders_3 PARTITION OF orders FOR VALUES FROM (100000) TO (150000);
			CREATE TABLE orders_4 PARTITION OF orders FOR VALUES FROM (150000) TO (MAXVALUE)`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, `CREATE TABLE customers (id bigint PRIMARY KEY, name text, score int)`, tt.orders,
				`INSERT INTO customers SELECT g, 'c' || g, g FROM generate_series(1, 1000) g`,
				`INSERT INTO orders SELECT g, 1 + g % 1100, 1, 'n' FROM generate_series(1, 200000) g`)
			cfg := daemonConfig(t, tc, yml)
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			// Streamed changes of both tables: the stream knows their
			// shapes before they change.
			sqlExec(t, tc, `UPDATE orders SET qty = 2 WHERE id % 1000 = 0`, `UPDATE customers SET name = name || '!' WHERE id % 100 = 0`)
			waitCaughtUp(t, tc, d)
			sqlExec(t, tc, `ALTER TABLE orders DROP COLUMN note; ALTER TABLE customers ALTER COLUMN score TYPE bigint`,
				// 2,247 orders, then customers laid out the new way, in
				// one transaction.
				`BEGIN; UPDATE orders SET qty = qty + 1 WHERE id % 89 = 0;
				 UPDATE customers SET score = score + 5000000000 WHERE id % 7 = 0;
				 UPDATE orders SET qty = qty + 1 WHERE id % 97 = 0; COMMIT`)
			waitCaughtUp(t, tc, d)
			// The shape changes of a transaction that came after a restart.
			if err := d.stop(t); err != nil {
				t.Fatalf("clean shutdown returned %v", err)
			}
			sqlExec(t, tc, `ALTER TABLE orders ADD COLUMN note2 text; ALTER TABLE customers ADD COLUMN extra int`,
				`BEGIN; UPDATE orders SET qty = qty + 1, note2 = 'x' WHERE id % 83 = 0;
				 UPDATE customers SET extra = 1, name = name || '+' WHERE id % 5 = 0;
				 DELETE FROM orders WHERE id % 101 = 0; COMMIT`)
			d = startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
		})
	}
}

// TestGeneratedColumns: logical replication before PostgreSQL 18 leaves
// stored generated columns out of its messages; fkmat computes those a
// join outputs, on the left table and a right one, plain and partitioned,
// from each row's other columns with the column's own expression. Updates
// of their inputs, of other columns, key changes, deletes and TOASTed
// inputs (with REPLICA IDENTITY FULL) end equal to the SQL join. check
// refuses one as a foreign key, and one reading a column that can be
// stored out of line without REPLICA IDENTITY FULL, naming the fix.
func TestGeneratedColumns(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc,
		`CREATE TABLE studios (id int PRIMARY KEY, name text)`,
		`INSERT INTO studios VALUES (1, 'a'), (2, 'b')`,
		`CREATE TABLE films (id bigint PRIMARY KEY, title text, length int, studio_id int,
			length_hours numeric GENERATED ALWAYS AS (length / 60.0) STORED,
			title_lc text GENERATED ALWAYS AS (lower(title)) STORED)`,
		`ALTER TABLE films REPLICA IDENTITY FULL`,
		`CREATE TABLE shows (id bigint, film_id bigint, seats int, day date NOT NULL, note text,
			film_key bigint GENERATED ALWAYS AS (film_id * 1) STORED,
			weekday int GENERATED ALWAYS AS (extract(isodow FROM day)::int * 100 + seats) STORED,
			PRIMARY KEY (id, day)) PARTITION BY RANGE (day)`,
		`CREATE TABLE shows_a PARTITION OF shows FOR VALUES FROM (MINVALUE) TO ('2026-06-01')`,
		`CREATE TABLE shows_b PARTITION OF shows FOR VALUES FROM ('2026-06-01') TO (MAXVALUE)`,
		`INSERT INTO films SELECT g, 'T' || g || (SELECT string_agg(md5(i::text), '') FROM generate_series(1, CASE WHEN g % 5 = 0 THEN 400 ELSE 1 END) i), 60 + g, 1 + g % 3 FROM generate_series(1, 20) g`,
		`INSERT INTO shows SELECT g, 1 + g % 21, g, date '2026-01-01' + g, 'n' FROM generate_series(1, 300) g`)
	for _, c := range []struct{ name, yml, want string }{
		{"foreign key", `
joins:
  - name: shows_films
    type: left
    left: {table: public.shows, foreign_key: [film_key], columns: [id, day]}
    right: {table: public.films, columns: [title]}
    target: {table: public.shows_films}
`, `column "film_key" of public.shows is generated (GENERATED ALWAYS AS ((film_id * 1)) STORED): fkmat follows generated columns in the output, not as a key or foreign key`},
		{"out-of-line input", `
joins:
  - name: shows_films
    type: left
    left: {table: public.shows, foreign_key: [film_id], columns: [id, day]}
    right: {table: public.shows_notes, columns: [note_lc]}
    target: {table: public.shows_films}
`, `generated column "note_lc" of public.shows_notes reads column "note", whose values can be stored out of line (TOAST)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			sqlExec(t, tc, `CREATE TABLE IF NOT EXISTS shows_notes (id bigint PRIMARY KEY, note text, note_lc text GENERATED ALWAYS AS (lower(note)) STORED)`)
			r := runCLI(t, cliEnv(t, tc, c.yml), "check")
			if r.code != 2 || !strings.Contains(r.stderr+r.stdout, c.want) {
				t.Fatalf("check: exit %d\n%s%s\nwant it to say %s", r.code, r.stdout, r.stderr, c.want)
			}
		})
	}
	cfg := daemonConfig(t, tc, `
joins:
  - name: shows_films
    type: left
    left: {table: public.shows, foreign_key: [film_id], columns: [id, day, film_id, seats, weekday, film_key]}
    right: {table: public.films, columns: [title, length_hours, title_lc]}
    target: {table: public.shows_films}
  - name: films_studios
    type: inner
    left: {table: public.films, foreign_key: [studio_id], columns: [id, length, length_hours, title_lc]}
    right: {table: public.studios, columns: [name]}
    target: {table: public.films_studios}
`)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	sqlExec(t, tc, `UPDATE films SET length = length + 30 WHERE id % 3 = 0`, // an input changed
		`UPDATE films SET title = 'New ' || id WHERE id % 4 = 0`, // the other input, TOASTed before
		`UPDATE films SET length = length + 1 WHERE id % 5 = 0`,  // TOASTed title unchanged, old row whole
		`UPDATE shows SET seats = seats + 1 WHERE id % 4 = 0`,
		`UPDATE shows SET day = day + 200 WHERE id % 7 = 0`, // moves to the other partition, key change
		`UPDATE shows SET film_id = 1 + (film_id + 1) % 21 WHERE id % 6 = 0`,
		`UPDATE shows SET note = 'm' WHERE id % 9 = 0`, // no input of a generated column
		`BEGIN; INSERT INTO shows (id, film_id, seats, day) VALUES (1000, 5, 7, '2026-07-01');
		 UPDATE shows SET seats = 9 WHERE id = 1000; UPDATE films SET length = 1 WHERE id = 5; COMMIT`,
		`INSERT INTO films (id, title, length) VALUES (21, 'Late', NULL)`, `DELETE FROM films WHERE id = 7`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if cols := targetColumns(t, tc, "shows_films"); !strings.Contains(cols, "length_hours") || !strings.Contains(cols, "weekday") {
		t.Errorf("target columns %s lack a generated column", cols)
	}
	// A restart reads the stream again from the checkpoint.
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE films SET length = length * 2 WHERE id % 2 = 0`, `UPDATE shows SET seats = 0 WHERE id % 10 = 0`)
	d = startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}
