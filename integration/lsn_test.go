package integration

import (
	"context"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/internal/wal"
)

// enableWALInspect installs pg_walinspect in the test database, for
// commitTxn.
func enableWALInspect(t *testing.T, tc *testenv.Case) {
	t.Helper()
	sqlExec(t, tc, `CREATE EXTENSION IF NOT EXISTS pg_walinspect`)
}

// commitTxn runs sqls in one source transaction and returns the end of its
// commit record: the EndLSN pgoutput reports for it and the position fkmat
// acknowledges once the transaction is in the target. It needs
// enableWALInspect.
func commitTxn(t *testing.T, tc *testenv.Case, sqls ...string) wal.LSN {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := tc.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var start string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, s := range sqls {
		if _, err := tx.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	var xid string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var end string
	err = conn.QueryRow(ctx, `SELECT end_lsn::text FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())
		WHERE resource_manager = 'Transaction' AND record_type = 'COMMIT' AND xid::text = $2`, start, xid).Scan(&end)
	if err != nil {
		t.Fatalf("find the commit record of transaction %s: %v", xid, err)
	}
	return parseLSN(t, end)
}

func parseLSN(t *testing.T, s string) wal.LSN {
	t.Helper()
	l, err := wal.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// confirmedFlush returns the slot's confirmed_flush_lsn.
func confirmedFlush(t *testing.T, tc *testenv.Case) wal.LSN {
	t.Helper()
	var s string
	err := tc.Pool.QueryRow(context.Background(),
		`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot).Scan(&s)
	if err != nil {
		t.Fatalf("read confirmed_flush_lsn of slot %s: %v", tc.Slot, err)
	}
	return parseLSN(t, s)
}

// currentWAL returns pg_current_wal_lsn().
func currentWAL(t *testing.T, tc *testenv.Case) wal.LSN {
	t.Helper()
	var s string
	if err := tc.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return parseLSN(t, s)
}

// targetCheckpoint returns fkmat's checkpoint of the test's slot in the
// target (0 when none).
func targetCheckpoint(t *testing.T, tc *testenv.Case) wal.LSN {
	t.Helper()
	var s *string
	err := tc.Pool.QueryRow(context.Background(),
		`SELECT (SELECT lsn::text FROM fkmat.checkpoint WHERE slot = $1)`, tc.Slot).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		return 0
	}
	return parseLSN(t, *s)
}

// waitConfirmed waits up to timeout for confirmed_flush_lsn >= lsn and
// returns how long it took; it fails the test on timeout.
func waitConfirmed(t *testing.T, tc *testenv.Case, lsn wal.LSN, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		c := confirmedFlush(t, tc)
		if c >= lsn {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("confirmed_flush_lsn %s did not reach %s within %s", c, lsn, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// queryInt runs a query returning one integer.
func queryInt(t *testing.T, tc *testenv.Case, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := tc.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}
