package fkmat

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/join"
)

// nwayExamplePlan resolves the n-way example against db and returns its
// plan.
func nwayExamplePlan(tb testing.TB, ctx context.Context, db plan.Querier) *plan.JoinPlan {
	tb.Helper()
	cfg, err := config.LoadConfig("internal/config/testdata/nway.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ApplyDefaults()
	plans, err := plan.Resolve(ctx, db, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return plans[0]
}

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// BenchmarkTreeStateBytes backfills the n-way example of a join of more
// than two tables (200k orders, 20k customers in 50 regions, 1k products)
// into Redis, one state per table (its rows and its references), and
// reports the Redis memory (MEMORY USAGE) of each table's state per row,
// and of all of it per order.
//
//	go test -run '^$' -bench BenchmarkTreeStateBytes -benchtime 1x .
func BenchmarkTreeStateBytes(b *testing.B) {
	const orders, customers, regions, products = 200_000, 20_000, 50, 1_000
	tc := testenv.New(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, q := range []string{
		`CREATE TABLE regions (id int PRIMARY KEY, name text)`,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int)`,
		`CREATE TABLE products (id bigint PRIMARY KEY, title text)`,
		`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, product_id bigint, amount numeric(12,2))`,
		`INSERT INTO regions SELECT g, 'region ' || g FROM generate_series(1, ` + strconv.Itoa(regions) + `) g`,
		`INSERT INTO customers SELECT g, 'customer ' || g, 1 + g % ` + strconv.Itoa(regions) + ` FROM generate_series(1, ` + strconv.Itoa(customers) + `) g`,
		`INSERT INTO products SELECT g, 'product ' || g FROM generate_series(1, ` + strconv.Itoa(products) + `) g`,
		`INSERT INTO orders SELECT g, 1 + g % ` + strconv.Itoa(customers) + `, 1 + g % ` + strconv.Itoa(products) + `, g % 1000
			FROM generate_series(1, ` + strconv.Itoa(orders) + `) g`,
		`ANALYZE`,
	} {
		if _, err := tc.Pool.Exec(ctx, q); err != nil {
			b.Fatalf("%s: %v", q, err)
		}
	}
	p := nwayExamplePlan(b, ctx, tc.Pool)
	l := pipeline.TreeLayoutOf(p)
	rows := map[string]int{"orders": orders, "customers": customers, "products": products, "regions": regions}
	for range b.N {
		conn, err := tc.Pool.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		if err != nil {
			b.Fatal(err)
		}
		var snapshot string
		if err := tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
			b.Fatal(err)
		}
		var total float64
		for tab := range len(p.Edges) + 1 {
			table, name := &p.Left, "orders"
			if tab > 0 {
				table, name = &p.Edges[tab-1].Table, p.Edges[tab-1].Alias
			}
			prefix := redisstore.TablePrefix(tc.Slot, p.Name, tab)
			s, err := redisstore.Open(ctx, tc.Redis, redisstore.Config{Prefix: prefix})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Init(ctx, redisstore.NewEpoch(), p.Fingerprint, redisstore.Size{LeftRows: int64(rows[table.Table.Name])}); err != nil {
				b.Fatal(err)
			}
			sp, err := s.NewSpool(ctx, "", int64(rows[table.Table.Name]))
			if err != nil {
				b.Fatal(err)
			}
			err = scanParallel(ctx, tc.Pool, snapshot, table, l.Columns(p, tab), func(ctx context.Context, page [][]join.Value) error {
				m, err := l.Load(tab, page)
				if err != nil {
					return err
				}
				return sp.Add(ctx, m)
			})
			if err == nil {
				err = sp.Load(ctx)
			}
			_ = sp.Close()
			if err != nil {
				b.Fatal(err)
			}
			bytes := map[byte]float64{}
			iter := tc.Redis.Scan(ctx, 0, prefix+":*", 1000).Iterator()
			var keys []string
			for iter.Next(ctx) {
				keys = append(keys, iter.Val())
			}
			if err := iter.Err(); err != nil {
				b.Fatal(err)
			}
			pipe := tc.Redis.Pipeline()
			usage := make([]*redis.IntCmd, len(keys))
			for k, key := range keys {
				usage[k] = pipe.MemoryUsage(ctx, key, 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
			var all float64
			for k, key := range keys {
				if kind, ok := s.KeyKind(key); ok {
					bytes[kind] += float64(usage[k].Val())
				}
				all += float64(usage[k].Val())
			}
			total += all
			n := float64(rows[table.Table.Name])
			b.ReportMetric(bytes[redisstore.KindLeft]/n, name+"_B/row")
			b.Logf("table %d (%s): %.0f B per row, %.0f B of references per row (%d keys)",
				tab, name, bytes[redisstore.KindLeft]/n, bytes[redisstore.KindSubs]/n, len(keys))
			_ = s.Drop(ctx)
		}
		b.ReportMetric(total/orders, "all_B/order")
		b.Logf("all state: %.0f B per order", total/orders)
		_ = tx.Rollback(ctx)
		conn.Release()
	}
}
