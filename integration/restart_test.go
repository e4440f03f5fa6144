package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestDaemonSurvivesRestarts: Redis hung (paused), then Redis and Postgres
// restarted under a running daemon, then Redis stopped for 40 s (with
// writes before, during and after); the daemon says not ready while it
// stands still, reconnects by itself within seconds of each server's
// return, and the target converges to the SQL join.
func TestDaemonSurvivesRestarts(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 100) g`,
		`INSERT INTO orders SELECT g, g % 110, g, 'n' FROM generate_series(1, 2000) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	var addr atomic.Value
	logs := &syncBuffer{}
	d := startDaemon(t, cfg, fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { addr.Store(a.String()) },
		StuckAfter: 3 * time.Second, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	waitCaughtUp(t, tc, d)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	get := metricsGetter(&addr)

	// Redis hung (its process frozen): the daemon cannot move, and says
	// so on /readyz after --stuck-after, without counting a stall; thawed,
	// it is ready again and catches up.
	if err := tc.Env.PauseRedis(ctx); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE customers SET name = name || '0' WHERE id % 5 = 0`)
	waitFor(t, time.Minute, "/readyz to say the stream stands still", func() bool {
		code, body := get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "has not moved")
	})
	if err := tc.Env.UnpauseRedis(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "/readyz to say ready again", func() bool {
		code, _ := get("/readyz")
		return code == http.StatusOK
	})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	sqlExec(t, tc, `UPDATE customers SET name = name || '1'`)
	if err := tc.Env.RestartRedis(ctx); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE orders SET customer_id = customer_id + 1 WHERE id % 3 = 0`, `DELETE FROM customers WHERE id % 10 = 0`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	sqlExec(t, tc, `UPDATE customers SET tier = 'u' WHERE id % 2 = 0`)
	if err := tc.Env.RestartPostgres(ctx); err != nil {
		t.Fatal(err)
	}
	tc.Pool.Reset()
	sqlExec(t, tc, `INSERT INTO orders SELECT g, g % 110, 1, 'm' FROM generate_series(2001, 3000) g`,
		`UPDATE orders SET customer_id = NULL WHERE id % 17 = 0`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)

	// An outage long enough for the backoff to reach its cap (30 s): once
	// Redis is back, the daemon probes its way back within seconds rather
	// than sleeping out a wait of up to 30 s.
	if err := tc.Env.StopRedis(ctx); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE customers SET name = name || '2' WHERE id % 4 = 0`)
	time.Sleep(40 * time.Second) // the outage itself
	if err := tc.Env.StartRedis(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	sqlExec(t, tc, `INSERT INTO orders VALUES (5000, 1, 1, 'back')`)
	waitFor(t, time.Minute, "the order written after the outage", func() bool {
		return queryInt(t, tc, `SELECT count(*) FROM orders_enriched WHERE id = 5000`) == 1
	})
	took := time.Since(back)
	// When its backoff had scheduled the next restart well after Redis's
	// return, the daemon must have come back before it.
	scheduled := nextRetry(t, logs.String(), back)
	t.Logf("streaming again %s after Redis came back from a 40 s outage; the backoff's next restart was due %s after it",
		took.Round(10*time.Millisecond), scheduled.Round(10*time.Millisecond))
	if scheduled > 4*time.Second && took > scheduled-time.Second {
		t.Errorf("the daemon took %s to apply a change after Redis came back, its backoff's wait; it should probe its way back", took)
	}
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}

// nextRetry returns when, after back, the last restart the daemon's JSON
// log scheduled before back was due (0 if none was due after it).
func nextRetry(t *testing.T, log string, back time.Time) time.Duration {
	t.Helper()
	var due time.Time
	for _, line := range strings.Split(log, "\n") {
		var rec struct {
			Time    time.Time     `json:"time"`
			RetryIn time.Duration `json:"retry_in"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.RetryIn == 0 || rec.Time.After(back) {
			continue
		}
		due = rec.Time.Add(rec.RetryIn)
	}
	return max(due.Sub(back), 0)
}
