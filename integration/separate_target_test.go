package integration

import (
	"context"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestDaemonSeparateTarget: the target is another database; the daemon keeps
// its metadata there, and verify compares the two databases by a streamed
// merge that finds missing, extra and different rows.
func TestDaemonSeparateTarget(t *testing.T) {
	src := testenv.New(t)
	dst := testenv.New(t)
	sqlExec(t, src, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 30) g`,
		`INSERT INTO orders SELECT g, g % 35, g * 0.5, 'n' FROM generate_series(1, 300) g`)
	cfg := daemonConfig(t, src, leftJoinYAML)
	cfg.Target = dst.DatabaseURL
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUpMeta(t, src, dst.Pool, d)
	sqlExec(t, src, `UPDATE customers SET name = 'x' || name WHERE id % 4 = 0`, `DELETE FROM orders WHERE id % 9 = 0`,
		`UPDATE orders SET customer_id = NULL WHERE id % 10 = 0`)
	waitCaughtUpMeta(t, src, dst.Pool, d)
	assertOracle(t, cfg)

	sqlExec(t, dst, `UPDATE orders_enriched SET amount = amount + 1 WHERE id = 1`, `DELETE FROM orders_enriched WHERE id = 2`,
		`INSERT INTO orders_enriched (id) VALUES (100000)`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	reports, err := fkmat.Verify(ctx, cfg, fkmat.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := reports[0]
	if r.Missing != 1 || r.Extra != 1 || r.Different != 1 {
		t.Fatalf("verify after tampering: %+v", r)
	}
}
