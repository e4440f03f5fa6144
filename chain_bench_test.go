package fkmat

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/redisstore"
)

// BenchmarkChainStateBytes backfills the SPEC's example of a join of more
// than two tables (200k orders, 20k customers in 50 regions, 1k products)
// into Redis, one state per entry, and reports the Redis memory (MEMORY
// USAGE) of each entry's state per left row, per subscription and per
// right row.
//
//	go test -run '^$' -bench BenchmarkChainStateBytes -benchtime 1x .
func BenchmarkChainStateBytes(b *testing.B) {
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
	p, l := specNWayPlan(b, ctx, tc.Pool)
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
		for i, e := range p.Edges {
			s, err := redisstore.Open(ctx, tc.Redis, redisstore.Config{Prefix: RedisStepPrefix(tc.Slot, p.Name, i)})
			if err != nil {
				b.Fatal(err)
			}
			rights := map[string]int{"customers": customers, "products": products, "regions": regions}[e.Alias]
			if err := s.Init(ctx, redisstore.NewEpoch(), p.Fingerprint, redisstore.Size{LeftRows: orders, RightRows: int64(rights)}); err != nil {
				b.Fatal(err)
			}
			if err := loadChainStep(ctx, tc.Pool, snapshot, s, p, l, i, &task{}); err != nil {
				b.Fatal(err)
			}
			bytes := map[byte]float64{}
			iter := tc.Redis.Scan(ctx, 0, RedisStepPrefix(tc.Slot, p.Name, i)+":*", 1000).Iterator()
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
			for k, key := range keys {
				if kind, ok := s.KeyKind(key); ok {
					bytes[kind] += float64(usage[k].Val())
				}
			}
			// Every order references a customer and a product, and every
			// customer a region: one subscription per order and entry.
			perLeft, perSub, perRight := bytes[redisstore.KindLeft]/orders, bytes[redisstore.KindSubs]/orders, bytes[redisstore.KindRight]/float64(rights)
			b.ReportMetric(perLeft, e.Alias+"_left_B/row")
			b.ReportMetric(perSub, e.Alias+"_B/sub")
			b.Logf("step %d (%s): %.0f B per left row, %.0f B per subscription, %.0f B per right row (%d keys)",
				i, e.Alias, perLeft, perSub, perRight, len(keys))
			_ = s.Drop(ctx)
		}
		_ = tx.Rollback(ctx)
		conn.Release()
	}
}
