package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestGuaranteeCaughtUpSignal (once the slot's confirmed position covers a
// commit, the target reflects it): the slot's
// confirmed_flush_lsn never covers a transaction whose effect is not
// committed in the target, even while the server's WAL moves on and the
// transaction has long been received; and an idle daemon lets it catch up
// with pg_current_wal_lsn() within a few seconds.
func TestGuaranteeCaughtUpSignal(t *testing.T) {
	tc := testenv.New(t)
	enableWALInspect(t, tc)
	sqlExec(t, tc, shop, `CREATE TABLE unrelated (id serial PRIMARY KEY, v text)`,
		`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 10) g`,
		`INSERT INTO orders SELECT g, 1 + g % 10, g, 'n' FROM generate_series(1, 100) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)

	// Idle: WAL written to a table outside the publication is confirmed
	// within a few seconds, without any published change to carry it.
	sqlExec(t, tc, `INSERT INTO unrelated (v) SELECT 'x' FROM generate_series(1, 100)`)
	idleTarget := currentWAL(t, tc)
	took := waitConfirmed(t, tc, idleTarget, 5*time.Second)
	t.Logf("idle: confirmed_flush_lsn reached pg_current_wal_lsn() %s after %s", idleTarget, took.Round(time.Millisecond))

	// Block the sink: while another transaction holds ACCESS EXCLUSIVE on
	// the target, the daemon receives the change but cannot commit it.
	ctx := context.Background()
	lockConn, err := tc.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lockConn.Release()
	lockTx, err := lockConn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lockTx.Rollback(ctx) }()
	if _, err := lockTx.Exec(ctx, `LOCK TABLE orders_enriched IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	before := confirmedFlush(t, tc)
	end1 := commitTxn(t, tc, `UPDATE customers SET name = 'blocked' WHERE id = 1`)
	if before >= end1 {
		t.Fatalf("confirmed_flush_lsn %s already covers the transaction ending at %s before it was applied", before, end1)
	}
	// The sink must really be waiting for the lock, else the test proves
	// nothing.
	waitFor(t, 10*time.Second, "the sink to wait for the target lock", func() bool {
		return queryInt(t, tc, `SELECT count(*) FROM pg_locks WHERE relation = 'orders_enriched'::regclass AND NOT granted`) > 0
	})
	// More WAL while the change is pending: unpublished writes (the server's
	// WAL end moves past the pending transaction) and a second published
	// transaction queued behind it.
	sqlExec(t, tc, `INSERT INTO unrelated (v) SELECT 'y' FROM generate_series(1, 100)`)
	end2 := commitTxn(t, tc, `INSERT INTO orders VALUES (1000, 2, 5, 'queued')`)
	sqlExec(t, tc, `INSERT INTO unrelated (v) SELECT 'z' FROM generate_series(1, 100)`)
	walEnd := currentWAL(t, tc)
	var maxSeen = before
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		maxSeen = max(maxSeen, confirmedFlush(t, tc))
		if maxSeen >= end1 {
			t.Fatalf("confirmed_flush_lsn %s covers the transaction ending at %s while the target is locked (WAL end %s)", maxSeen, end1, walEnd)
		}
	}
	if got := queryInt(t, tc, `SELECT count(*) FROM pg_locks WHERE relation = 'orders_enriched'::regclass AND NOT granted`); got == 0 {
		t.Fatal("the sink stopped waiting for the lock while it was held")
	}
	t.Logf("while blocked: confirmed_flush_lsn stayed at %s < commit end %s (WAL end %s)", maxSeen, end1, walEnd)

	if err := lockTx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	took = waitConfirmed(t, tc, end2, 5*time.Second)
	t.Logf("after release: confirmed_flush_lsn passed %s after %s", end2, took.Round(time.Millisecond))
	// Once confirmed, the target has both transactions.
	if n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE customer_id = 1 AND customer_name IS DISTINCT FROM 'blocked'`); n != 0 {
		t.Fatalf("confirmed_flush_lsn passed the rename, but %d rows of customer 1 lack it", n)
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE id = 1000`); n != 1 {
		t.Fatalf("confirmed_flush_lsn passed the insert, but order 1000 is not in the target")
	}
	if cp := targetCheckpoint(t, tc); cp < end2 {
		t.Fatalf("target checkpoint %s is behind the confirmed transaction %s", cp, end2)
	}
	// And idle again: it catches up with the WAL end.
	waitConfirmed(t, tc, currentWAL(t, tc), 5*time.Second)
	assertOracle(t, cfg)
}

// waitFor polls cond every 50 ms until it holds, failing after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGuaranteeTransactionBoundaries (a source transaction is applied whole
// or not at all): a reader of the
// target never sees half of a source transaction. Every source transaction
// keeps three invariants of the join: the number of orders, the total
// amount, and one tier for all customers. Writers move amounts between
// orders, replace orders (delete + insert), and retier every customer at
// once (a fan-out over all target rows, resolved in several pages) while
// readers check the invariants on the target, statement by statement.
func TestGuaranteeTransactionBoundaries(t *testing.T) {
	tc := testenv.New(t)
	const orders, customers = 400, 20
	sqlExec(t, tc, shop,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'c' || g, 'g0' FROM generate_series(1, %d) g`, customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% %d, 100, 'n' FROM generate_series(1, %d) g`, customers, orders))
	cfg := daemonConfig(t, tc, leftJoinYAML)
	// Small pages and batches: a fan-out emits several outputs and batches
	// hold varying numbers of transactions.
	d := startDaemon(t, cfg, fkmat.Options{PageSize: 7, Batch: pipeline.BatchLimits{Changes: 40, Delay: 20 * time.Millisecond, Idle: 20 * time.Millisecond}})
	waitCaughtUp(t, tc, d)

	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var txns atomic.Int64
	errs := make(chan error, 16)
	writer := func(seed uint64) {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 1))
		for i := 0; !stop.Load(); i++ {
			// Each statement must change exactly want rows, else the
			// transaction is rolled back (a concurrent writer moved the
			// order away), so that every commit keeps the invariants.
			var sqls []string
			want := int64(1)
			time.Sleep(2 * time.Millisecond) // keep the daemon's lag short
			switch rng.IntN(8) {
			case 0, 1, 2, 3:
				a, b, amt := rng.IntN(orders), rng.IntN(orders), 1+rng.IntN(50)
				sqls = []string{
					fmt.Sprintf(`UPDATE orders SET amount = amount - %d WHERE id = (SELECT id FROM orders ORDER BY id OFFSET %d LIMIT 1)`, amt, a),
					fmt.Sprintf(`UPDATE orders SET amount = amount + %d WHERE id = (SELECT id FROM orders ORDER BY id OFFSET %d LIMIT 1)`, amt, b),
				}
			case 4, 5, 6:
				sqls = []string{fmt.Sprintf(`WITH d AS (DELETE FROM orders WHERE id = (SELECT id FROM orders ORDER BY id OFFSET %d LIMIT 1) RETURNING customer_id, amount)
					INSERT INTO orders SELECT nextval('order_ids'), customer_id, amount, 'moved' FROM d`, rng.IntN(orders))}
			case 7:
				sqls, want = []string{fmt.Sprintf(`UPDATE customers SET tier = 'g%d-%d'`, seed, i)}, customers
			}
			ok, err := execTxExact(ctx, tc, sqls, want)
			if err != nil {
				if ctx.Err() == nil && !isSerialization(err) {
					errs <- err
				}
				continue
			}
			if ok {
				txns.Add(1)
			}
		}
	}
	sqlExec(t, tc, fmt.Sprintf(`CREATE SEQUENCE order_ids START %d`, orders+1))
	var reads, sawTiers atomic.Int64
	reader := func() {
		defer wg.Done()
		seen := map[string]bool{}
		for !stop.Load() {
			var n, tiers int64
			var sum string
			var tier *string
			err := tc.Pool.QueryRow(ctx, `SELECT count(*), sum(amount)::text, count(DISTINCT tier), min(tier) FROM orders_enriched`).Scan(&n, &sum, &tiers, &tier)
			if err != nil {
				if ctx.Err() == nil {
					errs <- err
				}
				return
			}
			reads.Add(1)
			if n != orders || sum != fmt.Sprint(orders*100)+".00" || tiers != 1 {
				errs <- fmt.Errorf("reader saw half a transaction: %d orders (want %d), total %s (want %d.00), %d distinct tiers (want 1)",
					n, orders, sum, orders*100, tiers)
				return
			}
			if tier != nil && !seen[*tier] {
				seen[*tier] = true
				sawTiers.Add(1)
			}
		}
	}
	wg.Add(4)
	go writer(1)
	go writer(2)
	go reader()
	go reader()
	// At least 3 s, and on a loaded machine until there was enough
	// concurrency to prove something (at most 30 s).
	for start := time.Now(); time.Since(start) < 30*time.Second; time.Sleep(100 * time.Millisecond) {
		if time.Since(start) >= 3*time.Second && reads.Load() >= 200 && txns.Load() >= 50 && sawTiers.Load() >= 3 {
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	t.Logf("%d source transactions, %d target reads, %d tier generations observed", txns.Load(), reads.Load(), sawTiers.Load())
	if reads.Load() < 200 || txns.Load() < 50 {
		t.Fatalf("too little concurrency to prove anything: %d reads, %d transactions", reads.Load(), txns.Load())
	}
	if sawTiers.Load() < 3 {
		t.Fatalf("readers saw only %d tier generations: the target did not change while they read", sawTiers.Load())
	}
	start := time.Now()
	waitCaughtUp(t, tc, d)
	t.Logf("caught up %s after the workload", time.Since(start).Round(time.Millisecond))
	assertOracle(t, cfg)
}

// execTxExact runs sqls in one transaction and commits it only when each
// statement changed exactly want rows.
func execTxExact(ctx context.Context, tc *testenv.Case, sqls []string, want int64) (bool, error) {
	tx, err := tc.Pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, s := range sqls {
		tag, err := tx.Exec(ctx, s)
		if err != nil {
			return false, err
		}
		if tag.RowsAffected() != want {
			return false, nil
		}
	}
	return true, tx.Commit(ctx)
}

// isSerialization reports a deadlock between the concurrent writers, which
// is the workload's problem, not fkmat's.
func isSerialization(err error) bool {
	return strings.Contains(err.Error(), "deadlock detected") || strings.Contains(err.Error(), "could not serialize")
}

// auditTarget records every row written to table (and every write
// statement, even one that changes no row) in target_writes.
func auditTarget(t *testing.T, tc *testenv.Case, table string) {
	t.Helper()
	sqlExec(t, tc, `CREATE TABLE IF NOT EXISTS target_writes (seq bigserial PRIMARY KEY, tbl text, op text, id bigint, stmt boolean NOT NULL)`,
		`CREATE OR REPLACE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO target_writes (tbl, op, id, stmt) VALUES (TG_TABLE_NAME, TG_OP, CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END, false);
			RETURN NULL;
		END $$`,
		`CREATE OR REPLACE FUNCTION audit_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO target_writes (tbl, op, stmt) VALUES (TG_TABLE_NAME, TG_OP, true);
			RETURN NULL;
		END $$`,
		fmt.Sprintf(`CREATE TRIGGER audit_row AFTER INSERT OR UPDATE OR DELETE ON %s FOR EACH ROW EXECUTE FUNCTION audit_row()`, table),
		fmt.Sprintf(`CREATE TRIGGER audit_stmt AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION audit_stmt()`, table))
}

// targetWrites returns the rows written (e.g. "UPDATE 3") and the write
// statements since the last call, and forgets them.
func targetWrites(t *testing.T, tc *testenv.Case) (rows []string, stmts []string) {
	t.Helper()
	r, err := tc.Pool.Query(context.Background(), `DELETE FROM target_writes RETURNING seq, op, id, stmt`)
	if err != nil {
		t.Fatal(err)
	}
	type w struct {
		seq  int64
		text string
		stmt bool
	}
	var ws []w
	for r.Next() {
		var x w
		var op string
		var id *int64
		if err := r.Scan(&x.seq, &op, &id, &x.stmt); err != nil {
			t.Fatal(err)
		}
		x.text = op
		if id != nil {
			x.text += fmt.Sprint(" ", *id)
		}
		ws = append(ws, x)
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].seq < ws[j].seq })
	for _, x := range ws {
		if x.stmt {
			stmts = append(stmts, x.text)
		} else {
			rows = append(rows, x.text)
		}
	}
	return rows, stmts
}

// rowVersions returns the xmin of every target row by key.
func rowVersions(t *testing.T, tc *testenv.Case, table string) map[int64]string {
	t.Helper()
	r, err := tc.Pool.Query(context.Background(), `SELECT id, xmin::text FROM `+table)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	out := map[int64]string{}
	for r.Next() {
		var id int64
		var x string
		if err := r.Scan(&id, &x); err != nil {
			t.Fatal(err)
		}
		out[id] = x
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGuaranteeNoRedundantWrites (a change that alters no joined row writes
// nothing): source changes that do
// not change a joined row write nothing to the target (no row is inserted,
// updated or deleted, no write statement runs, every row keeps its xmin);
// a real change writes exactly the affected rows, each once.
func TestGuaranteeNoRedundantWrites(t *testing.T) {
	for _, typ := range []string{"left", "inner"} {
		t.Run(typ, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc,
				`CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text, email text)`,
				`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text)`,
				`INSERT INTO customers SELECT g, 'c' || g, 'silver', 'c' || g || '@x' FROM generate_series(1, 10) g`,
				// Customers 9 and 10 have no orders; orders 91-100 reference
				// customer 99, which does not exist (absent from the inner join).
				`INSERT INTO orders SELECT g, CASE WHEN g > 90 THEN 99 ELSE 1 + g % 8 END, g, 'n' FROM generate_series(1, 100) g`)
			cfg := daemonConfig(t, tc, leftJoinYAML)
			cfg.Joins[0].Type = typ
			d := startDaemon(t, cfg, fkmat.Options{})
			waitCaughtUp(t, tc, d)
			assertOracle(t, cfg)
			auditTarget(t, tc, "orders_enriched")
			versions := rowVersions(t, tc, "orders_enriched")

			noops := []string{
				`UPDATE orders SET note = note || '!'`,                         // column not projected
				`UPDATE orders SET amount = amount, customer_id = customer_id`, // same values
				`UPDATE customers SET email = upper(email)`,                    // not projected
				`UPDATE customers SET name = name, tier = tier`,                // same values
				`DELETE FROM customers WHERE id IN (9, 10)`,                    // no dependents
				`INSERT INTO customers VALUES (11, 'nobody', 'x', NULL)`,       // no dependents
				`BEGIN; UPDATE orders SET amount = amount + 1 WHERE id = 5; UPDATE orders SET amount = amount - 1 WHERE id = 5; COMMIT`,
				`BEGIN; INSERT INTO orders VALUES (500, 1, 1, 'tmp'); DELETE FROM orders WHERE id = 500; COMMIT`,
				`BEGIN; UPDATE customers SET name = 'tmp' WHERE id = 2; UPDATE customers SET name = 'c2' WHERE id = 2; COMMIT`,
			}
			if typ == "inner" {
				noops = append(noops,
					`UPDATE orders SET amount = amount + 1 WHERE id = 91`, // not in the inner join
					`DELETE FROM orders WHERE id = 92`,                    // not in the target: nothing to delete
					`UPDATE orders SET customer_id = 98 WHERE id = 95`,    // from one missing customer to another
				)
			}
			sqlExec(t, tc, noops...)
			waitCaughtUp(t, tc, d)
			if rows, stmts := targetWrites(t, tc); len(rows)+len(stmts) > 0 {
				t.Errorf("changes that do not change a joined row wrote rows %v with statements %v; want no target write", rows, stmts)
			}
			after := rowVersions(t, tc, "orders_enriched")
			for id, x := range versions {
				if after[id] != x {
					t.Errorf("order %d was rewritten (xmin %s -> %s) by changes that do not change it", id, x, after[id])
				}
			}
			if len(after) != len(versions) {
				t.Errorf("target has %d rows, had %d", len(after), len(versions))
			}
			assertOracle(t, cfg)

			// Real changes write exactly the affected rows, once each.
			var ofCustomer3 []string
			for id := int64(1); id <= 90; id++ {
				if 1+id%8 == 3 {
					ofCustomer3 = append(ofCustomer3, fmt.Sprint("UPDATE ", id))
				}
			}
			real := []struct {
				sql  string
				want []string
			}{
				{`UPDATE customers SET name = 'renamed' WHERE id = 3`, ofCustomer3},
				{`UPDATE orders SET amount = amount + 1 WHERE id = 7`, []string{"UPDATE 7"}},
				{`INSERT INTO orders VALUES (600, 4, 1, 'new')`, []string{"INSERT 600"}},
				{`DELETE FROM orders WHERE id = 8`, []string{"DELETE 8"}},
				{`BEGIN; UPDATE orders SET amount = 1 WHERE id = 10; UPDATE orders SET amount = 2 WHERE id = 10; UPDATE customers SET tier = 'gold' WHERE id = 11; COMMIT`, []string{"UPDATE 10"}},
			}
			for _, r := range real {
				sqlExec(t, tc, r.sql)
				waitCaughtUp(t, tc, d)
				rows, _ := targetWrites(t, tc)
				sort.Strings(rows)
				want := append([]string(nil), r.want...)
				sort.Strings(want)
				if strings.Join(rows, ",") != strings.Join(want, ",") {
					t.Errorf("%s: wrote %v, want exactly %v", r.sql, rows, want)
				}
			}
			assertOracle(t, cfg)
		})
	}
}
