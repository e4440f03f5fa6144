package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// BenchmarkHotFanout (W2): one customer with 200k orders (plus 999 customers
// x 100 orders), then 200 updates of the hot customer's name, one per
// transaction, with fkmat running; next to the same updates maintained by
// row-level PL/pgSQL triggers, in the same run. Trigger updates are measured
// on the first triggerUpdates of them (each rewrites 200k rows); the total
// for 200 is extrapolated and printed as such.
func BenchmarkHotFanout(b *testing.B) {
	const hot, updates, triggerUpdates = 200_000, 200, 5
	for i := 0; i < b.N; i++ {
		tc := testenv.New(b)
		ctx := context.Background()
		mustExec(b, tc, w4Schema,
			`INSERT INTO customers SELECT g, 'customer ' || g, 'gold' FROM generate_series(1, 1000) g`,
			fmt.Sprintf(`INSERT INTO orders SELECT g, 1, g %% 100, 'n' FROM generate_series(1, %d) g`, hot),
			fmt.Sprintf(`INSERT INTO orders SELECT %d + g, 2 + g %% 999, 1, 'n' FROM generate_series(1, 99900) g`, hot),
			`VACUUM ANALYZE customers, orders`)

		// fkmat.
		cfg, err := fkmat.ParseConfig([]byte(w4Join))
		if err != nil {
			b.Fatal(err)
		}
		cfg.Source = tc.DatabaseURL
		cfg.Redis = (&url.URL{Scheme: "redis", Host: tc.Env.RedisAddr, Path: "/0"}).String()
		cfg.Slot = tc.Slot
		cfg.ApplyDefaults()
		b.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), tc.Redis, "fkmat:"+tc.Slot+":") })
		bound := make(chan net.Addr, 1)
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- fkmat.Run(rctx, cfg, fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { bound <- a }})
		}()
		metrics := "http://" + (<-bound).String() + "/metrics"
		waitCaught(b, tc)
		written0 := metric(b, metrics, "fkmat_sink_rows_upserted_total")
		start := time.Now()
		for u := 1; u <= updates; u++ {
			mustExec(b, tc, fmt.Sprintf(`UPDATE customers SET name = 'hot %d' WHERE id = 1`, u))
		}
		waitCaught(b, tc)
		fk := time.Since(start)
		written := metric(b, metrics, "fkmat_sink_rows_upserted_total") - written0
		stop()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		var wrong int
		if err := tc.Pool.QueryRow(ctx, `SELECT count(*) FROM orders_enriched WHERE customer_id = 1 AND name <> 'hot 200'`).Scan(&wrong); err != nil || wrong != 0 {
			b.Fatalf("%d hot rows not updated (%v)", wrong, err)
		}

		// Triggers maintaining the same join in trig_t.
		mustExec(b, tc, `CREATE TABLE trig_t AS SELECT o.id, o.customer_id, o.amount, o.note, c.name, c.tier
				FROM orders o LEFT JOIN customers c ON o.customer_id = c.id`,
			`ALTER TABLE trig_t ADD PRIMARY KEY (id)`, `CREATE INDEX ON trig_t (customer_id)`,
			`CREATE FUNCTION trig_customers() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				UPDATE trig_t SET name = NEW.name, tier = NEW.tier WHERE customer_id = NEW.id
					AND (name, tier) IS DISTINCT FROM (NEW.name, NEW.tier);
				RETURN NEW;
			END $$`,
			`CREATE TRIGGER trig_customers AFTER UPDATE ON customers FOR EACH ROW EXECUTE FUNCTION trig_customers()`)
		start = time.Now()
		for u := 1; u <= triggerUpdates; u++ {
			mustExec(b, tc, fmt.Sprintf(`UPDATE customers SET name = 'trig %d' WHERE id = 1`, u))
		}
		perTrigger := time.Since(start) / triggerUpdates
		trigTotal := perTrigger * updates

		b.ReportMetric(fk.Seconds(), "fkmat_s")
		b.ReportMetric(trigTotal.Seconds()/fk.Seconds(), "x_faster_than_triggers")
		fmt.Printf("\nW2 hot fan-out: 1 customer with %d orders (+99,900 others), %d name updates, one per transaction:\n", hot, updates)
		fmt.Printf("  %-52s %8.2f s, %d target rows written (%.0f per update)\n", "fkmat (commit to caught up)", fk.Seconds(), int64(written), written/updates)
		fmt.Printf("  %-52s %8.2f s per update (%d measured)\n", "row-level PL/pgSQL trigger", perTrigger.Seconds(), triggerUpdates)
		fmt.Printf("  %-52s %8.0f s (extrapolated: %d x per update)\n", "triggers, all updates", trigTotal.Seconds(), updates)
		fmt.Printf("  %-52s %8.1fx\n", "fkmat faster than triggers", trigTotal.Seconds()/fk.Seconds())
	}
}

// waitCaught waits until the slot's confirmed_flush_lsn covers every commit
// so far and the join is streaming.
func waitCaught(b testing.TB, tc *testenv.Case) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var target string
	if err := tc.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		b.Fatal(err)
	}
	for {
		var ok bool
		err := tc.Pool.QueryRow(ctx, `SELECT coalesce((SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2), false)
			AND coalesce((SELECT bool_and(phase = 'streaming') FROM fkmat.join_state WHERE slot = $2), false)`, target, tc.Slot).Scan(&ok)
		if err == nil && ok {
			return
		}
		if ctx.Err() != nil {
			b.Fatalf("not caught up with %s", target)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metric reads one unlabelled value from a Prometheus text page.
func metric(b testing.TB, url, name string) float64 {
	b.Helper()
	resp, err := http.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		b.Fatalf("no %s in /metrics", name)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}
