package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestMeasurePartitionMoves measures, for a join of a range-partitioned
// orders of FKMAT_MEASURE_PARTITIONS rows (twenty partitions) with
// customers, how long the target is stale after each partition change
// that moves rows: from the DDL's commit to the slot confirmed past it
// (the move applied). It only runs when the variable is set; it ends with
// the SQL comparison like every test.
func TestMeasurePartitionMoves(t *testing.T) {
	rows, _ := strconv.Atoi(os.Getenv("FKMAT_MEASURE_PARTITIONS"))
	if rows == 0 {
		t.Skip("set FKMAT_MEASURE_PARTITIONS to a row count to measure")
	}
	tc := testenv.New(t)
	per := rows / 20
	sqlExec(t, tc, `CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text)`,
		`CREATE TABLE orders (id bigint, created int, customer_id bigint, amount numeric(12,2), note text,
			PRIMARY KEY (id, created)) PARTITION BY RANGE (created)`)
	for p := range 20 {
		sqlExec(t, tc, fmt.Sprintf(`CREATE TABLE orders_%d PARTITION OF orders FOR VALUES FROM (%d) TO (%d)`, p, p, p+1))
	}
	sqlExec(t, tc, `INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 100000) g`,
		fmt.Sprintf(`INSERT INTO orders SELECT g, g %% 20, 1 + g %% 100000, g %% 1000, 'n' FROM generate_series(1, %d) g`, rows),
		`ANALYZE orders`, `ANALYZE customers`)
	cfg := daemonConfig(t, tc, partitionedYAML)
	start := time.Now()
	logs := &syncBuffer{}
	d := startDaemon(t, cfg, fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	defer func() {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "followed a partition change") || strings.Contains(line, "level=ERROR") || strings.Contains(line, "level=WARN") {
				t.Log(line)
			}
		}
	}()
	waitCaughtUp(t, tc, d)
	t.Logf("backfill and catch-up of %d orders: %s", rows, time.Since(start).Round(100*time.Millisecond))
	stale := func(what string, ddl ...string) {
		t.Helper()
		start := time.Now()
		sqlExec(t, tc, ddl...)
		after := walPosition(t, tc)
		for {
			var past bool
			if err := tc.Pool.QueryRow(context.Background(), `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2`,
				after, tc.Slot).Scan(&past); err != nil {
				t.Fatal(err)
			}
			if past {
				break
			}
			select {
			case err := <-d.done:
				d.cancel = nil
				t.Fatalf("%s: run stopped: %v", what, err)
			case <-time.After(20 * time.Millisecond):
			}
		}
		t.Logf("%s (%d rows): target stale for %s", what, per, time.Since(start).Round(10*time.Millisecond))
	}
	stale("DETACH PARTITION", `ALTER TABLE orders DETACH PARTITION orders_3`)
	stale("ATTACH PARTITION of a filled table", `ALTER TABLE orders ATTACH PARTITION orders_3 FOR VALUES FROM (3) TO (4)`)
	stale("TRUNCATE of one partition", `TRUNCATE orders_4`)
	stale("DETACH then DROP", `ALTER TABLE orders DETACH PARTITION orders_5`, `DROP TABLE orders_5`)
	stale("DROP of a partition", `DROP TABLE orders_6`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmHWM") {
				t.Logf("peak RSS of the test process (the daemon runs in it): %s", strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:")))
			}
		}
	}
}
