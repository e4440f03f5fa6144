package bench

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

const w4Schema = `
CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text);
CREATE INDEX ON orders (customer_id);
`

const w4Join = `
joins:
  - name: orders_enriched
    type: left
    left: {table: orders, foreign_key: [customer_id]}
    right: {table: customers}
    target: {table: orders_enriched}
`

// BenchmarkBackfill (W4): 1M orders over 50k customers already present, then
// `fkmat backfill`, next to the in-database limit `INSERT INTO t SELECT …
// FROM orders LEFT JOIN customers` into a table of the same shape, in the
// same run. Reports rows/s of both, their ratio, and fkmat's peak RSS.
func BenchmarkBackfill(b *testing.B) {
	for i := 0; i < b.N; i++ {
		r := runW4(b, 1_000_000, 50_000)
		b.ReportMetric(r.rate, "fkmat_rows/s")
		b.ReportMetric(r.limitRate, "insert_select_rows/s")
		b.ReportMetric(r.limitRate/r.rate, "x_slower_than_limit")
		b.ReportMetric(r.rssMB, "fkmat_peak_rss_MB")
	}
}

// TestBackfillSmoke runs the W4 code at a tiny size in make test, so that the
// benchmark does not rot.
func TestBackfillSmoke(t *testing.T) {
	runW4(t, 20_000, 1_000)
}

type w4Result struct{ rate, limitRate, rssMB float64 }

func runW4(b testing.TB, nOrders, nCustomers int) w4Result {
	tc := testenv.New(b)
	ctx := context.Background()
	mustExec(b, tc, w4Schema,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['bronze','silver','gold'])[1 + g %% 3] FROM generate_series(1, %d) g`, nCustomers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, CASE WHEN g %% 50 = 0 THEN NULL ELSE 1 + g %% %d END, (g %% 1000) * 0.25, md5(g::text) FROM generate_series(1, %d) g`,
			nCustomers+nCustomers/20, nOrders),
		`VACUUM ANALYZE customers, orders`)
	bin := buildFkmat(b)
	env := cliEnv(b, tc, w4Join)

	{
		// The limit: the same join, written by Postgres itself.
		mustExec(b, tc, `DROP TABLE IF EXISTS limit_t`,
			`CREATE TABLE limit_t (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text, name text, tier text)`)
		start := time.Now()
		mustExec(b, tc, `INSERT INTO limit_t SELECT o.id, o.customer_id, o.amount, o.note, c.name, c.tier
			FROM orders o LEFT JOIN customers c ON o.customer_id = c.id`)
		limit := time.Since(start)

		redisCPU0 := redisCPU(b, tc)
		cmd := exec.Command(bin, "backfill", "--force", "--log-format", "json")
		cmd.Env = env
		start = time.Now()
		out, err := cmd.CombinedOutput()
		took := time.Since(start)
		if err != nil {
			b.Fatalf("fkmat backfill: %v\n%s", err, out)
		}
		if os.Getenv("FKMAT_BENCH_VERBOSE") != "" {
			fmt.Printf("%s\n", out)
		}
		rss := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss // KiB on Linux
		fkmatCPU := (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
		rcpu := redisCPU(b, tc) - redisCPU0
		var rows int64
		if err := tc.Pool.QueryRow(ctx, `SELECT count(*) FROM orders_enriched`).Scan(&rows); err != nil || rows != int64(nOrders) {
			b.Fatalf("target has %d rows (err %v), want %d", rows, err, nOrders)
		}
		limitRate := float64(nOrders) / limit.Seconds()
		rate := float64(nOrders) / took.Seconds()
		fmt.Printf("\nW4 backfill, %d orders over %d customers (same run):\n", nOrders, nCustomers)
		fmt.Printf("  %-44s %8.2f s  %9.0f rows/s\n", "INSERT INTO t SELECT … LEFT JOIN (limit)", limit.Seconds(), limitRate)
		fmt.Printf("  %-44s %8.2f s  %9.0f rows/s  (%.2fx the limit's time)\n", "fkmat backfill (target + Redis state)", took.Seconds(), rate, took.Seconds()/limit.Seconds())
		fmt.Printf("  %-44s %8.1f MB\n", "fkmat peak RSS", float64(rss)/1024)
		fmt.Printf("  %-44s %8.2f s fkmat, %.2f s redis-server\n", "CPU during the backfill", fkmatCPU, rcpu)
		return w4Result{rate: rate, limitRate: limitRate, rssMB: float64(rss) / 1024}
	}
}

func mustExec(b testing.TB, tc *testenv.Case, sqls ...string) {
	b.Helper()
	for _, s := range sqls {
		if _, err := tc.Pool.Exec(context.Background(), s); err != nil {
			b.Fatalf("%s: %v", s, err)
		}
	}
}

func buildFkmat(b testing.TB) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "fkmat")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fkmat/fkmat/cmd/fkmat").CombinedOutput(); err != nil {
		b.Fatalf("build fkmat: %v\n%s", err, out)
	}
	return bin
}

func cliEnv(b testing.TB, tc *testenv.Case, joins string) []string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "fkmat.yaml")
	if err := os.WriteFile(path, []byte("slot: "+tc.Slot+"\n"+joins), 0o600); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), tc.Redis, "fkmat:"+tc.Slot+":") })
	return append(os.Environ(), "FKMAT_CONFIG="+path, "FKMAT_SOURCE_URL="+tc.DatabaseURL,
		"FKMAT_REDIS_URL="+(&url.URL{Scheme: "redis", Host: tc.Env.RedisAddr, Path: "/0"}).String())
}

// redisCPU returns the Redis server's CPU seconds so far.
func redisCPU(b testing.TB, tc *testenv.Case) float64 {
	b.Helper()
	info, err := tc.Redis.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return total
}
