package fkmat

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
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
	"github.com/fkmat/fkmat/join/jointest"
)

// TestChainBackfillOnRedis runs the pieces of a list-form join that exist
// against real Postgres and Redis: resolve the n-way example (testdata/nway.yaml of internal/config) from the
// catalog, backfill each step's Redis state from an exported snapshot
// (loadChainStep), then stream changes of every table through a join.Chain
// over those states, committed last step first. The target, started from
// the SQL at the snapshot, ends equal to the SQL on the source.
func TestChainBackfillOnRedis(t *testing.T) {
	tc := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	exec := func(sqls ...string) {
		t.Helper()
		for _, q := range sqls {
			if _, err := tc.Pool.Exec(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
	}
	exec(`CREATE TABLE regions (id int PRIMARY KEY, name text)`,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, region_id int)`,
		`CREATE TABLE products (id bigint PRIMARY KEY, title text)`,
		`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, product_id bigint, amount numeric(12,2))`,
		`INSERT INTO regions VALUES (1, 'north'), (2, 'south')`,
		`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 5 = 0 THEN NULL ELSE 1 + g % 3 END FROM generate_series(1, 40) g`,
		`INSERT INTO products SELECT g, 'p' || g FROM generate_series(1, 8) g`,
		`INSERT INTO orders SELECT g, CASE WHEN g % 17 = 0 THEN NULL ELSE 1 + g % 45 END, 1 + g % 10, g FROM generate_series(1, 600) g`)
	p, l := nwayExamplePlan(t, ctx, tc.Pool)

	// The exported snapshot, held open while the states load.
	conn, err := tc.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var snapshot string
	if err := tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		t.Fatal(err)
	}
	target := map[string][]join.Value{}
	oracle := func(q pgx.Tx) map[string][]join.Value {
		t.Helper()
		var rows pgx.Rows
		var err error
		// The simple protocol returns every value in text form, as pgoutput
		// and the backfill see them.
		if q != nil {
			rows, err = q.Query(ctx, OracleSQL(p), pgx.QueryExecModeSimpleProtocol)
		} else {
			rows, err = tc.Pool.Query(ctx, OracleSQL(p), pgx.QueryExecModeSimpleProtocol)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string][]join.Value{}
		for rows.Next() {
			raw := rows.RawValues()
			row := make([]join.Value, len(raw))
			for i, b := range raw {
				row[i] = join.TextValue(string(b))
				if b == nil {
					row[i] = join.NullValue()
				}
			}
			out[row[0].Text] = row
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	maps.Copy(target, oracle(tx))
	// Changes after the snapshot.
	exec(`UPDATE regions SET name = 'NORTH' WHERE id = 1`,
		`UPDATE customers SET region_id = 2 WHERE id = 4`,
		`UPDATE customers SET region_id = NULL WHERE id = 7`,
		`DELETE FROM products WHERE id = 3`,
		`INSERT INTO orders VALUES (601, 2, 4, 1.5), (602, 99, 5, 2.5)`,
		`UPDATE orders SET customer_id = 9 WHERE id = 10`)

	var stores []*redisstore.Store
	var readers []join.StateReader
	epoch := redisstore.NewEpoch()
	for i := range l.Steps {
		s, err := redisstore.Open(ctx, tc.Redis, redisstore.Config{Prefix: RedisPrefix(tc.Slot, p.Name) + "~" + strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Drop(context.Background()) })
		if err := s.Init(ctx, epoch, p.Fingerprint, redisstore.Size{LeftRows: 600, RightRows: 40}); err != nil {
			t.Fatal(err)
		}
		if err := loadChainStep(ctx, tc.Pool, snapshot, s, p, l, i, &task{}); err != nil {
			t.Fatal(err)
		}
		stores, readers = append(stores, s), append(readers, s)
	}
	_ = tx.Rollback(ctx)

	v := jointest.Values
	// The same changes as the chain's tables see them (carried columns:
	// orders customer_id, product_id, amount; customers name, region_id;
	// products title; regions name).
	changes := []join.Change{
		{Table: 3, Kind: join.RightUpsert, Right: join.RightRow{Key: v("1"), Values: v("NORTH")}},
		{Table: 1, Kind: join.RightUpsert, Right: join.RightRow{Key: v("4"), Values: v("c4", "2")}},
		{Table: 1, Kind: join.RightUpsert, Right: join.RightRow{Key: v("7"), Values: v("c7", "NULL")}},
		{Table: 2, Kind: join.RightDelete, Right: join.RightRow{Key: v("3")}},
		{Table: 0, Kind: join.LeftUpsert, Insert: true, Left: join.LeftRow{PK: v("601"), Values: v("2", "4", "1.50")}},
		{Table: 0, Kind: join.LeftUpsert, Insert: true, Left: join.LeftRow{PK: v("602"), Values: v("99", "5", "2.50")}},
		{Table: 0, Kind: join.LeftUpsert, Left: join.LeftRow{PK: v("10"), Values: v("9", "1", "10.00")}},
	}
	c, err := join.NewChain(l.Steps, readers, l.Out)
	if err != nil {
		t.Fatal(err)
	}
	rightFrom := c.TargetRightFrom()
	muts, err := c.Apply(ctx, changes, func(_ context.Context, o join.Output) error {
		for _, d := range o.Deletes {
			delete(target, d[0].Text)
		}
		for _, r := range o.Upserts {
			target[r[0].Text] = r
		}
		for _, u := range o.RightUpdates {
			for _, k := range u.Keys {
				old, ok := target[k[0].Text]
				if !ok {
					return fmt.Errorf("right update of row %v, absent from the target", k)
				}
				target[k[0].Text] = append(slices.Clone(old[:rightFrom]), u.Right...)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := len(muts) - 1; i >= 0; i-- {
		if err := stores[i].Commit(ctx, muts[i], 100); err != nil {
			t.Fatal(err)
		}
	}
	want := oracle(nil)
	if len(target) != len(want) {
		t.Fatalf("target has %d rows, the SQL %d", len(target), len(want))
	}
	for k, w := range want {
		if !join.ValuesEqual(target[k], w) {
			t.Errorf("row %s = %v, the SQL %v", k, target[k], w)
		}
	}
	if len(want) < 400 {
		t.Errorf("only %d rows: the data exercises too little", len(want))
	}
}

// nwayExamplePlan resolves the n-way example against db and returns its
// plan and chain layout.
func nwayExamplePlan(tb testing.TB, ctx context.Context, db plan.Querier) (*plan.JoinPlan, plan.ChainLayout) {
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
	return plans[0], plan.ChainOf(plans[0])
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
	p, _ := nwayExamplePlan(b, ctx, tc.Pool)
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
			table, name := p.Left.Table, "orders"
			if tab > 0 {
				table, name = p.Edges[tab-1].Table.Table, p.Edges[tab-1].Alias
			}
			prefix := RedisTablePrefix(tc.Slot, p.Name, tab)
			s, err := redisstore.Open(ctx, tc.Redis, redisstore.Config{Prefix: prefix})
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Init(ctx, redisstore.NewEpoch(), p.Fingerprint, redisstore.Size{LeftRows: int64(rows[table.Name])}); err != nil {
				b.Fatal(err)
			}
			err = scanParallel(ctx, tc.Pool, snapshot, table, l.Columns(p, tab), s, func(ctx context.Context, ld *redisstore.Loader, page [][]join.Value) error {
				m, err := l.Load(tab, page)
				if err != nil {
					return err
				}
				return ld.Add(ctx, m)
			})
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
			n := float64(rows[table.Name])
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
