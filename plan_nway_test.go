package fkmat

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
	"github.com/fkmat/fkmat/redisstore"
)

// specWidePlan is the SPEC's list-form example resolved: orders with their
// customer (left), product (inner) and the customer's region (left).
func specWidePlan() *JoinPlan {
	col := func(name, typ string) SourceColumn { return SourceColumn{Name: name, Type: typ} }
	out := func(c SourceColumn, as string) OutputColumn { return OutputColumn{Source: c, Name: as} }
	id, bigint := col("id", "bigint"), col("id", "bigint")
	p := &JoinPlan{Name: "orders_wide", Type: config.JoinLeft}
	p.Left = TablePlan{Table: config.TableName{Schema: "public", Name: "orders"}, Key: []SourceColumn{id}, KeyNames: []string{"id"},
		Values: []OutputColumn{out(col("customer_id", "bigint"), "customer_id"), out(col("product_id", "bigint"), "product_id"),
			out(col("amount", "numeric"), "amount")}}
	p.Edges = []EdgePlan{
		{Alias: "customers", Parent: -1, Type: config.JoinLeft, Table: TablePlan{Table: config.TableName{Schema: "public", Name: "customers"},
			Key: []SourceColumn{bigint}, ForeignKey: []SourceColumn{col("customer_id", "bigint")},
			Values: []OutputColumn{out(col("name", "text"), "customer_name")}}},
		{Alias: "products", Parent: -1, Type: config.JoinInner, Table: TablePlan{Table: config.TableName{Schema: "public", Name: "products"},
			Key: []SourceColumn{bigint}, ForeignKey: []SourceColumn{col("product_id", "bigint")},
			Values: []OutputColumn{out(col("title", "text"), "product_title")}}},
		{Alias: "regions", Parent: 0, Type: config.JoinLeft, Table: TablePlan{Table: config.TableName{Schema: "public", Name: "regions"},
			Key: []SourceColumn{col("id", "integer")}, ForeignKey: []SourceColumn{col("region_id", "integer")},
			Values: []OutputColumn{out(col("name", "text"), "region_name")}}},
	}
	return p
}

// TestChainOfSpecExample lays out the SPEC's example as a join.Chain (the
// customers' region_id carried hidden for the regions step) and runs it:
// the target rows are the SPEC's SQL, and a region rename reaches the
// orders of the customers in it.
func TestChainOfSpecExample(t *testing.T) {
	l := chainOf(specWidePlan())
	names := func(cols []SourceColumn) (out []string) {
		for _, c := range cols {
			out = append(out, c.Name)
		}
		return out
	}
	for i, want := range [][]string{{"customer_id", "product_id", "amount"}, {"name", "region_id"}, {"title"}, {"name"}} {
		if got := names(l.Carried[i]); !slices.Equal(got, want) {
			t.Errorf("table %d carries %v, want %v", i-1, got, want)
		}
	}
	for i, want := range []struct{ left, right, fk int }{{3, 2, 0}, {5, 1, 1}, {6, 1, 4}} {
		s := l.Steps[i]
		if s.Spec.LeftValues != want.left || s.Spec.RightValues != want.right || !slices.Equal(s.FK, []int{want.fk}) {
			t.Errorf("step %d: %d left, %d right values, foreign key at %v; want %d, %d, [%d]",
				i, s.Spec.LeftValues, s.Spec.RightValues, s.FK, want.left, want.right, want.fk)
		}
	}
	if want := []int{0, 1, 2, 3, 4, 6, 7}; !slices.Equal(l.Out, want) {
		t.Fatalf("out = %v, want %v", l.Out, want)
	}

	var stores []*jointest.Store
	var readers []join.StateReader
	for range l.Steps {
		s := jointest.NewStore()
		stores, readers = append(stores, s), append(readers, s)
	}
	c, err := join.NewChain(l.Steps, readers, l.Out)
	if err != nil {
		t.Fatal(err)
	}
	v := values
	left := func(pk string, vals ...string) join.Change {
		return join.Change{Table: 0, Kind: join.LeftUpsert, Left: join.LeftRow{PK: v(pk), Values: v(vals...)}}
	}
	right := func(table int, key string, vals ...string) join.Change {
		return join.Change{Table: table, Kind: join.RightUpsert, Right: join.RightRow{Key: v(key), Values: v(vals...)}}
	}
	rows := map[string][]join.Value{}
	apply := func(changes ...join.Change) {
		t.Helper()
		muts, err := c.Apply(context.Background(), changes, func(_ context.Context, o join.Output) error {
			for _, d := range o.Deletes {
				delete(rows, d[0].Text)
			}
			for _, r := range o.Upserts {
				rows[r[0].Text] = r
			}
			for _, u := range o.RightUpdates {
				for _, k := range u.Keys {
					rows[k[0].Text] = append(slices.Clone(rows[k[0].Text][:c.TargetRightFrom()]), u.Right...)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range muts {
			if err := stores[i].Apply(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	apply(right(3, "7", "north"), right(1, "1", "ann", "7"), right(1, "2", "bob", "NULL"),
		right(2, "10", "pen"), left("100", "1", "10", "5"), left("101", "2", "10", "6"),
		left("102", "3", "10", "7"), left("103", "1", "99", "8"))
	check := func(want map[string][]join.Value) {
		t.Helper()
		if len(rows) != len(want) {
			t.Fatalf("target %v, want %v", rows, want)
		}
		for k, w := range want {
			if !join.ValuesEqual(rows[k], w) {
				t.Errorf("row %s = %v, want %v", k, rows[k], w)
			}
		}
	}
	// Order 103's product does not exist: the inner products entry drops
	// it. Order 102's customer does not exist: its name and region are NULL.
	check(map[string][]join.Value{
		"100": v("100", "1", "10", "5", "ann", "pen", "north"),
		"101": v("101", "2", "10", "6", "bob", "pen", "NULL"),
		"102": v("102", "3", "10", "7", "NULL", "pen", "NULL"),
	})
	apply(right(3, "7", "NORTH"), right(1, "2", "bob", "7"))
	check(map[string][]join.Value{
		"100": v("100", "1", "10", "5", "ann", "pen", "NORTH"),
		"101": v("101", "2", "10", "6", "bob", "pen", "NORTH"),
		"102": v("102", "3", "10", "7", "NULL", "pen", "NULL"),
	})
}

// TestOracleListSQL: the oracle of a list-form join is the SPEC's SQL, the
// entries joined in list order on their parents' foreign keys.
func TestOracleListSQL(t *testing.T) {
	got := OracleSQL(specWidePlan())
	want := `SELECT l."id" AS "id", l."customer_id" AS "customer_id", l."product_id" AS "product_id", l."amount" AS "amount", ` +
		`e0."name" AS "customer_name", e1."title" AS "product_title", e2."name" AS "region_name" ` +
		`FROM "public"."orders" l LEFT JOIN "public"."customers" e0 ON l."customer_id" = e0."id" ` +
		`JOIN "public"."products" e1 ON l."product_id" = e1."id" LEFT JOIN "public"."regions" e2 ON e0."region_id" = e2."id"`
	if got != want {
		t.Errorf("OracleSQL =\n%s\nwant\n%s", got, want)
	}
}

// TestTargetOfListForm: the target of a list-form join holds the key, the
// left columns and every entry's columns in list order; the last entry's
// columns are the right part (RightUpdates), as the Chain projects them.
func TestTargetOfListForm(t *testing.T) {
	p := specWidePlan()
	tt := targetTable(config.TableName{Schema: "public", Name: "orders_wide"}, p)
	var names []string
	for _, c := range tt.Columns {
		names = append(names, c.Name)
	}
	if want := []string{"id", "customer_id", "product_id", "amount", "customer_name", "product_title", "region_name"}; !slices.Equal(names, want) {
		t.Errorf("target columns %v, want %v", names, want)
	}
	c, err := join.NewChain(chainOf(p).Steps, []join.StateReader{jointest.NewStore(), jointest.NewStore(), jointest.NewStore()}, chainOf(p).Out)
	if err != nil {
		t.Fatal(err)
	}
	if tt.KeyCount != 1 || tt.RightFrom != 6 || c.TargetRightFrom() != tt.RightFrom {
		t.Errorf("key count %d, right from %d (chain %d); want 1, 6, 6", tt.KeyCount, tt.RightFrom, c.TargetRightFrom())
	}
	if fp := fingerprint(p); fp == fingerprint(&JoinPlan{Name: p.Name, Type: p.Type, Left: p.Left, Target: tt}) {
		t.Error("the fingerprint ignores the entries")
	}
}

// TestChainLeftSQL: the backfill query of each step's left rows is the
// SPEC's SQL up to the entries before it, selecting the key and the carried
// columns (customers.region_id, hidden, for the regions step).
func TestChainLeftSQL(t *testing.T) {
	p := specWidePlan()
	l := chainOf(p)
	for i, want := range []string{
		`SELECT l."id", l."customer_id", l."product_id", l."amount" FROM "public"."orders" l`,
		`SELECT l."id", l."customer_id", l."product_id", l."amount", e0."name", e0."region_id" FROM "public"."orders" l ` +
			`LEFT JOIN "public"."customers" e0 ON l."customer_id" = e0."id"`,
		`SELECT l."id", l."customer_id", l."product_id", l."amount", e0."name", e0."region_id", e1."title" FROM "public"."orders" l ` +
			`LEFT JOIN "public"."customers" e0 ON l."customer_id" = e0."id" JOIN "public"."products" e1 ON l."product_id" = e1."id"`,
	} {
		if got := chainLeftSQL(p, l, i); got != want {
			t.Errorf("step %d:\n%s\nwant\n%s", i, got, want)
		}
	}
}

// TestChainMapper maps source changes of the SPEC's example, with customers
// joined a second time as seller, to the chain's table changes: the left
// table's rows carry their projected columns, a customer carries its name
// and its hidden region_id, a customers change reaches both entries, and a
// TRUNCATE reaches the entries of its table.
func TestChainMapper(t *testing.T) {
	p := specWidePlan()
	seller := p.Edges[0]
	seller.Alias, seller.Table.ForeignKey = "seller", []SourceColumn{{Name: "seller_id", Type: "bigint", TypeOID: oidInt8}}
	seller.Table.Values = []OutputColumn{{Source: SourceColumn{Name: "name", Type: "text"}, Name: "seller_name"}}
	p.Edges = append(p.Edges, seller)
	p.Left.Values = append(p.Left.Values, OutputColumn{Source: SourceColumn{Name: "seller_id", Type: "bigint"}, Name: "seller_id"})
	for _, tp := range []*TablePlan{&p.Left, &p.Edges[0].Table, &p.Edges[1].Table, &p.Edges[2].Table, &p.Edges[3].Table} {
		for i := range tp.Key {
			tp.Key[i].TypeOID = oidInt8
		}
		for i := range tp.Values {
			tp.Values[i].Source.TypeOID = oidText
		}
		for i := range tp.ForeignKey {
			tp.ForeignKey[i].TypeOID = oidText
		}
	}
	l := chainOf(p)
	m := newChainMapper(p, l)
	orders := rel("orders", cdc.Column{Name: "id", Type: oidInt8}, cdc.Column{Name: "amount", Type: oidText},
		cdc.Column{Name: "customer_id", Type: oidText}, cdc.Column{Name: "product_id", Type: oidText}, cdc.Column{Name: "seller_id", Type: oidText})
	customers := rel("customers", cdc.Column{Name: "region_id", Type: oidText}, cdc.Column{Name: "id", Type: oidInt8},
		cdc.Column{Name: "name", Type: oidText})
	regions := rel("regions", cdc.Column{Name: "id", Type: oidInt8}, cdc.Column{Name: "name", Type: oidText})
	var got []join.Change
	for _, c := range []cdc.Change{
		{Kind: cdc.ChangeInsert, Relation: orders, New: []cdc.Value{txt("100"), txt("5"), txt("1"), txt("10"), txt("2")}},
		{Kind: cdc.ChangeUpdate, Relation: customers, OldKind: cdc.OldKey, Old: []cdc.Value{cNull, txt("1"), cNull},
			New: []cdc.Value{txt("7"), txt("3"), cToast}},
		{Kind: cdc.ChangeTruncate, Truncate: &cdc.Truncate{Relations: []*cdc.Relation{regions}}},
	} {
		var err error
		if got, err = m.appendChanges(got, &c); err != nil {
			t.Fatal(err)
		}
	}
	v := values
	want := []join.Change{
		{Table: 0, Kind: join.LeftUpsert, Insert: true, Left: join.LeftRow{PK: v("100"), FK: []join.Value{}, Values: v("1", "10", "5", "2")}},
		{Table: 1, Kind: join.RightKeyChange, OldKey: v("1"), Right: join.RightRow{Key: v("3"), Values: v("TOAST", "7")}},
		{Table: 4, Kind: join.RightKeyChange, OldKey: v("1"), Right: join.RightRow{Key: v("3"), Values: v("TOAST")}},
		{Table: 3, Kind: join.RightTruncate},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d changes, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Table != w.Table || g.Kind != w.Kind || g.Insert != w.Insert ||
			!join.ValuesEqual(g.OldKey, w.OldKey) || !join.ValuesEqual(g.Left.PK, w.Left.PK) ||
			!join.ValuesEqual(g.Left.Values, w.Left.Values) || !join.ValuesEqual(g.Right.Key, w.Right.Key) ||
			!join.ValuesEqual(g.Right.Values, w.Right.Values) {
			t.Errorf("change %d = %+v, want %+v", i, g, w)
		}
	}
}

// TestChainBackfillOnRedis runs the pieces of a list-form join that exist
// against real Postgres and Redis: resolve the SPEC's example from the
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
	p, l := specNWayPlan(t, ctx, tc.Pool)

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

	v := values
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

// values returns s as join values: "NULL" is NULL, "TOAST" an unchanged
// TOASTed value, anything else text.
func values(s ...string) []join.Value {
	out := make([]join.Value, len(s))
	for i, x := range s {
		switch x {
		case "NULL":
			out[i] = join.NullValue()
		case "TOAST":
			out[i] = join.ToastValue()
		default:
			out[i] = join.TextValue(x)
		}
	}
	return out
}

// specNWayPlan resolves the SPEC's n-way example against db and returns its
// plan and chain layout.
func specNWayPlan(tb testing.TB, ctx context.Context, db Querier) (*JoinPlan, chainLayout) {
	tb.Helper()
	cfg, err := config.LoadConfig("internal/config/testdata/nway.yaml")
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ApplyDefaults()
	plans, err := Resolve(ctx, db, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return plans[0], chainOf(plans[0])
}
