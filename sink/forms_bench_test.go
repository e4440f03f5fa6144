package sink_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/sink"
)

// formRows and formBatch size BenchmarkTargetWriteForms: W1-shaped target
// rows (an order with its customer's columns), written in batches as the
// pipeline writes them.
const (
	formRows  = 100_000
	formBatch = 5_000
)

// formTable is a W1-shaped target: key, foreign key, amount, note, and
// the customer's name and tier.
func formTable(name string) *sink.Table {
	return &sink.Table{Schema: "public", Name: name, KeyCount: 1, RightFrom: 4, Columns: []sink.Column{
		{Name: "id", Type: "bigint"}, {Name: "customer_id", Type: "bigint"}, {Name: "amount", Type: "numeric(12,2)"},
		{Name: "note", Type: "text"}, {Name: "name", Type: "text"}, {Name: "tier", Type: "text"}}}
}

// formRow is row i in version gen (a later gen changes amount and name).
func formRow(i, gen int) join.Row {
	return join.Row{v(fmt.Sprint(i)), v(fmt.Sprint(1 + i%10_000)), v(fmt.Sprintf("%d.%02d", i%1000+gen, i%100)),
		v(fmt.Sprintf("note %d", i)), v(fmt.Sprintf("customer %d/%d", i%10_000, gen)), v([]string{"bronze", "silver", "gold"}[i%3])}
}

// writeForm is one way of writing a batch of upserts into a target; a nil
// write is the sink's own (its transaction and Upsert).
type writeForm struct {
	name  string
	write func(ctx context.Context, tx pgx.Tx, w *sink.Writer, t *sink.Table, rows []join.Row) error
}

// BenchmarkTargetWriteForms compares, side by side on one Postgres, the
// statements a batch's upserts can take: the sink's INSERT … SELECT FROM
// unnest(text[]) ON CONFLICT DO UPDATE … WHERE IS DISTINCT FROM (what fkmat
// runs), COPY into a temporary table then the same INSERT … ON CONFLICT,
// COPY then MERGE, and (for rows that exist) UPDATE … FROM unnest. It
// writes formRows new rows, then changes every one, in batches of
// formBatch, each batch its own transaction, and reports ms per 1k rows
// and the ratio to the sink's form. Statements are prepared (pgx's cache)
// in every form. Run:
//
//	go test -run '^$' -bench BenchmarkTargetWriteForms -benchtime 1x ./sink
func BenchmarkTargetWriteForms(b *testing.B) {
	tc := testenv.New(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	forms := []writeForm{
		{"insert_on_conflict_unnest", nil}, // the sink's own Upsert
		{"copy_temp_insert_on_conflict", func(ctx context.Context, tx pgx.Tx, _ *sink.Writer, t *sink.Table, rows []join.Row) error {
			return copyThen(ctx, tx, t, rows, `INSERT INTO `+t.Ident()+` AS t SELECT c1::bigint, c2::bigint, c3::numeric(12,2), c4, c5, c6 FROM fkmat_in
				ON CONFLICT (id) DO UPDATE SET customer_id = EXCLUDED.customer_id, amount = EXCLUDED.amount, note = EXCLUDED.note, name = EXCLUDED.name, tier = EXCLUDED.tier
				WHERE ROW(t.customer_id, t.amount, t.note, t.name, t.tier) IS DISTINCT FROM ROW(EXCLUDED.customer_id, EXCLUDED.amount, EXCLUDED.note, EXCLUDED.name, EXCLUDED.tier)`)
		}},
		{"copy_temp_merge", func(ctx context.Context, tx pgx.Tx, _ *sink.Writer, t *sink.Table, rows []join.Row) error {
			return copyThen(ctx, tx, t, rows, `MERGE INTO `+t.Ident()+` AS t
				USING (SELECT c1::bigint AS id, c2::bigint AS customer_id, c3::numeric(12,2) AS amount, c4 AS note, c5 AS name, c6 AS tier FROM fkmat_in) AS s ON t.id = s.id
				WHEN MATCHED AND ROW(t.customer_id, t.amount, t.note, t.name, t.tier) IS DISTINCT FROM ROW(s.customer_id, s.amount, s.note, s.name, s.tier) THEN
					UPDATE SET customer_id = s.customer_id, amount = s.amount, note = s.note, name = s.name, tier = s.tier
				WHEN NOT MATCHED THEN INSERT VALUES (s.id, s.customer_id, s.amount, s.note, s.name, s.tier)`)
		}},
		{"update_from_unnest (existing rows only)", func(ctx context.Context, tx pgx.Tx, _ *sink.Writer, t *sink.Table, rows []join.Row) error {
			cols := columnsOf(rows)
			_, err := tx.Exec(ctx, `UPDATE `+t.Ident()+` AS t SET customer_id = u.c2::bigint, amount = u.c3::numeric(12,2), note = u.c4, name = u.c5, tier = u.c6
				FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS u(c1, c2, c3, c4, c5, c6)
				WHERE t.id = u.c1::bigint AND ROW(t.customer_id, t.amount, t.note, t.name, t.tier) IS DISTINCT FROM ROW(u.c2::bigint, u.c3::numeric(12,2), u.c4, u.c5, u.c6)`,
				cols...)
			return err
		}},
	}
	type result struct{ insert, update time.Duration }
	results := make([]result, len(forms))
	// Two rounds, forms alternating, each on a fresh table: the machine's
	// drift hits every form alike.
	for round := range 2 {
		for f, form := range forms {
			t := formTable(fmt.Sprintf("forms_%d_%d", round, f))
			w := sink.NewWriter(tc.Pool)
			if _, err := w.EnsureTable(ctx, t); err != nil {
				b.Fatal(err)
			}
			insertOnly := strings.HasPrefix(form.name, "update_from_unnest")
			if insertOnly { // it cannot insert: fill the table the sink's way
				if err := writeAll(ctx, tc.Pool, w, t, 0, forms[0]); err != nil {
					b.Fatal(err)
				}
			} else {
				start := time.Now()
				if err := writeAll(ctx, tc.Pool, w, t, 0, form); err != nil {
					b.Fatalf("%s, new rows: %v", form.name, err)
				}
				results[f].insert += time.Since(start)
			}
			start := time.Now()
			if err := writeAll(ctx, tc.Pool, w, t, 1, form); err != nil {
				b.Fatalf("%s, changed rows: %v", form.name, err)
			}
			results[f].update += time.Since(start)
			checkForm(b, ctx, tc.Pool, t)
			if _, err := tc.Pool.Exec(ctx, "DROP TABLE "+t.Ident()); err != nil {
				b.Fatal(err)
			}
		}
	}
	per1k := func(d time.Duration) float64 { return float64(d.Milliseconds()) / 2 / (formRows / 1000) }
	for f, form := range forms {
		r := results[f]
		if r.insert > 0 {
			b.Logf("%-42s new rows %6.2f ms per 1k (%.2fx the sink's); changed rows %6.2f ms per 1k (%.2fx)", form.name,
				per1k(r.insert), float64(r.insert)/float64(results[0].insert), per1k(r.update), float64(r.update)/float64(results[0].update))
		} else {
			b.Logf("%-42s changed rows %6.2f ms per 1k (%.2fx the sink's)", form.name, per1k(r.update), float64(r.update)/float64(results[0].update))
		}
	}
}

// writeAll writes every row in version gen with form, a batch per
// transaction.
func writeAll(ctx context.Context, pool *pgxpool.Pool, w *sink.Writer, t *sink.Table, gen int, form writeForm) error {
	rows := make([]join.Row, 0, formBatch)
	for start := 0; start < formRows; start += formBatch {
		rows = rows[:0]
		for i := start; i < start+formBatch; i++ {
			rows = append(rows, formRow(i, gen))
		}
		if form.write == nil { // the sink's own transaction and Upsert
			stx, err := w.Begin(ctx)
			if err != nil {
				return err
			}
			if err := stx.Upsert(ctx, t, rows); err != nil {
				_ = stx.Rollback(ctx)
				return err
			}
			if err := stx.CommitRows(ctx); err != nil {
				return err
			}
			continue
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := form.write(ctx, tx, w, t, rows); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// copyThen copies rows into a temporary table of text columns (made once
// per transaction, dropped at its commit) and runs sql.
func copyThen(ctx context.Context, tx pgx.Tx, t *sink.Table, rows []join.Row, sql string) error {
	if _, err := tx.Exec(ctx, `CREATE TEMP TABLE IF NOT EXISTS fkmat_in (c1 text, c2 text, c3 text, c4 text, c5 text, c6 text) ON COMMIT DROP`); err != nil {
		return err
	}
	src := make([][]any, len(rows))
	for i, r := range rows {
		src[i] = make([]any, len(r))
		for c := range r {
			if !r[c].Null {
				src[i][c] = r[c].Text
			}
		}
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"fkmat_in"}, []string{"c1", "c2", "c3", "c4", "c5", "c6"}, pgx.CopyFromRows(src)); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, sql)
	return err
}

// columnsOf turns rows into one text array per column.
func columnsOf(rows []join.Row) []any {
	out := make([]any, len(rows[0]))
	for c := range out {
		col := make([]*string, len(rows))
		for r := range rows {
			if !rows[r][c].Null {
				col[r] = &rows[r][c].Text
			}
		}
		out[c] = col
	}
	return out
}

// checkForm fails unless t holds every row in its last version.
func checkForm(b *testing.B, ctx context.Context, pool *pgxpool.Pool, t *sink.Table) {
	b.Helper()
	var n, wrong int
	err := pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE name NOT LIKE '%/1') FROM `+t.Ident()).Scan(&n, &wrong)
	if err != nil {
		b.Fatal(err)
	}
	if n != formRows || wrong != 0 {
		b.Fatalf("%s: %d rows, %d not in their last version; want %d, 0", t.Name, n, wrong, formRows)
	}
}
