package integration

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestMeasureDefinitionChange measures, for a join of FKMAT_MEASURE_REBUILD
// orders with 100k customers, a definition change (a column added) built
// beside the running join: the time from the restart to the switch, its
// phases, and how stale the target got meanwhile (a probe row changed every
// 100 ms; the age of the newest change the target shows), writers changing
// the tables all along; then the same for fkmat backfill --force. It only
// runs when the variable is set; it ends with the SQL comparison. With
// FKMAT_MEASURE_REBUILD_TARGET=separate the target is another database of
// the same server.
func TestMeasureDefinitionChange(t *testing.T) {
	rows, _ := strconv.Atoi(os.Getenv("FKMAT_MEASURE_REBUILD"))
	if rows == 0 {
		t.Skip("set FKMAT_MEASURE_REBUILD to a row count to measure")
	}
	tc := testenv.New(t)
	separate := os.Getenv("FKMAT_MEASURE_REBUILD_TARGET") == "separate"
	var dst *testenv.Case
	if separate {
		dst = testenv.New(t)
	}
	meta := tc
	if separate {
		meta = dst
	}
	withTarget := func(c *config.Config) *config.Config {
		if separate {
			c.Target = dst.DatabaseURL
		}
		return c
	}
	sqlExec(t, tc, shop,
		`INSERT INTO customers SELECT g, 'c' || g, 'silver' FROM generate_series(1, 100000) g`,
		fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% 100000, g %% 1000, 'n' || g FROM generate_series(1, %d) g`, rows),
		`ANALYZE orders`, `ANALYZE customers`)
	cfg := withTarget(daemonConfig(t, tc, leftJoinYAML))
	start := time.Now()
	caughtUp := func(c *config.Config) {
		t.Helper()
		d := startDaemon(t, c, fkmat.Options{})
		waitCaughtUpMeta(t, tc, meta.Pool, d)
		if err := d.stop(t); err != nil {
			t.Fatal(err)
		}
	}
	caughtUp(cfg)
	t.Logf("first backfill and catch-up of %d orders: %s", rows, time.Since(start).Round(100*time.Millisecond))
	// A change the join applies, so that the target's checkpoint passes
	// the backfill's own transaction: a restart from before it decodes that
	// transaction again (in the source database, it wrote every row of the
	// target), which is not the rebuild's cost.
	sqlExec(t, tc, `UPDATE customers SET tier = 'gold' WHERE id = 2`)
	start = time.Now()
	caughtUp(cfg)
	t.Logf("a restart, and the target's checkpoint past the backfill: %s", time.Since(start).Round(100*time.Millisecond))

	measure := func(what string, run func(logs *syncBuffer) *daemon, switched func() bool) {
		t.Helper()
		stopWriters := churn(t, tc, 100000, rows)
		// The probe: customer 1's name, changed every 100 ms; the target's
		// staleness is the age of the first value it does not show yet.
		var worst atomic.Int64
		probeCtx, stopProbe := context.WithCancel(context.Background())
		probed := make(chan struct{})
		go func() {
			defer close(probed)
			var written []time.Time // when probe-k was committed
			for k := 0; probeCtx.Err() == nil; k++ {
				if _, err := tc.Pool.Exec(probeCtx, `UPDATE customers SET name = $1 WHERE id = 1`, fmt.Sprintf("probe-%d", k)); err != nil {
					return
				}
				written = append(written, time.Now())
				var seen string
				if err := meta.Pool.QueryRow(probeCtx, `SELECT coalesce(max(customer_name), '') FROM orders_enriched WHERE customer_id = 1`).Scan(&seen); err != nil {
					continue // during a swap, for a moment
				}
				// The age of the first value the target does not show yet.
				shown, err := strconv.Atoi(strings.TrimPrefix(seen, "probe-"))
				if err != nil {
					shown = -1 // no probe yet
				}
				var age time.Duration
				if shown+1 < len(written) {
					age = time.Since(written[shown+1])
				}
				for {
					w := worst.Load()
					if int64(age) <= w || worst.CompareAndSwap(w, int64(age)) {
						break
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		logs := &syncBuffer{}
		began := time.Now()
		d := run(logs)
		for !switched() || !strings.Contains(logs.String(), "rebuild switched in") {
			select {
			case err := <-d.done:
				if err != nil {
					t.Fatalf("%s: stopped: %v", what, err)
				}
			case <-time.After(50 * time.Millisecond):
			}
		}
		took := time.Since(began)
		stopProbe()
		<-probed
		stopWriters()
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "rebuild switched in") || strings.Contains(line, "backfill done") || strings.Contains(line, "level=ERROR") {
				t.Log(line)
			}
		}
		t.Logf("%s of %d orders: %s from the start to the switch; the target was at most %s stale meanwhile",
			what, rows, took.Round(100*time.Millisecond), time.Duration(worst.Load()).Round(10*time.Millisecond))
		if d.cancel != nil {
			waitCaughtUpMeta(t, tc, meta.Pool, d)
			if err := d.stop(t); err != nil {
				t.Fatal(err)
			}
		}
	}
	wider := withTarget(daemonConfig(t, tc, widerJoinYAML))
	measure("a column added, run restarted", func(logs *syncBuffer) *daemon {
		return startDaemon(t, wider, fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	}, func() bool {
		return queryInt(t, meta, `SELECT generation FROM fkmat.join_state WHERE slot = $1`, tc.Slot) == 1
	})
	assertOracle(t, wider)
	measure("fkmat backfill --force", func(logs *syncBuffer) *daemon {
		d := &daemon{done: make(chan error, 1)}
		go func() {
			d.done <- fkmat.BackfillIfNeeded(context.Background(), wider, true, fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
		}()
		return d
	}, func() bool {
		return queryInt(t, meta, `SELECT generation FROM fkmat.join_state WHERE slot = $1`, tc.Slot) == 2
	})
	caughtUp(wider)
	assertOracle(t, wider)
}
