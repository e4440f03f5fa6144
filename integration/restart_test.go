package integration

import (
	"context"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestDaemonSurvivesRestarts: Redis and then Postgres are restarted under a
// running daemon (with writes before, during and after); the daemon
// reconnects by itself and the target converges to the SQL join.
func TestDaemonSurvivesRestarts(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 100) g`,
		`INSERT INTO orders SELECT g, g % 110, g, 'n' FROM generate_series(1, 2000) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

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
}
