package fkmat

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/plan"
)

// sourceGenerator computes generated columns in the source database, with
// the table's own expressions and types: one query per call, over the
// rows' inputs in arrays.
type sourceGenerator struct {
	db *pgxpool.Pool
	mu sync.Mutex
	// sql is the query per table and input types; types the type names.
	sql   map[string]string
	types map[[2]int64]string
}

var _ pipeline.Generator = (*sourceGenerator)(nil)

// generator returns the Generator of the plans' generated columns, nil
// when they output none.
func (d *daemon) generator(plans ...*plan.JoinPlan) pipeline.Generator {
	for _, p := range plans {
		if p != nil && len(p.Generated) > 0 {
			return &sourceGenerator{db: d.source, sql: map[string]string{}, types: map[[2]int64]string{}}
		}
	}
	return nil
}

// Generate evaluates, as
//
//	SELECT (CAST((expr) AS type))::text, ... FROM (SELECT u.i0::t0 AS "in0", ..., u.ord AS "?fkmat:ord"
//	  FROM unnest($1::text[], ..., $n::int[]) WITH ORDINALITY AS u(i0, ..., n, ord)) AS "table" ORDER BY "?fkmat:ord"
//
// The expressions see the inputs under their names, unqualified or
// qualified by the table's name, as in the backfill's SQL (plan.FromSQL).
func (g *sourceGenerator) Generate(ctx context.Context, table config.TableName, cols []plan.GeneratedColumn,
	inputs []plan.GeneratedInput, rows [][]*string) ([][]*string, error) {
	key := table.String()
	for _, in := range inputs {
		key += "\x00" + in.Type
	}
	g.mu.Lock()
	q, ok := g.sql[key]
	if !ok {
		q = generateSQL(table, cols, inputs)
		g.sql[key] = q
	}
	g.mu.Unlock()
	args := make([]any, 0, len(inputs)+1)
	for i := range inputs {
		col := make([]*string, len(rows))
		for r, row := range rows {
			col[r] = row[i]
		}
		args = append(args, col)
	}
	args = append(args, make([]int32, len(rows))) // the row count, when no column is read
	return g.textRows(ctx, q, args, len(cols), len(rows))
}

// TypeName returns format_type(oid, mod), asked of the source once per type.
func (g *sourceGenerator) TypeName(ctx context.Context, oid uint32, mod int32) (string, error) {
	k := [2]int64{int64(oid), int64(mod)}
	g.mu.Lock()
	name, ok := g.types[k]
	g.mu.Unlock()
	if ok {
		return name, nil
	}
	var got *string
	if err := g.db.QueryRow(ctx, `SELECT format_type($1::oid, $2)`, oid, mod).Scan(&got); err != nil {
		return "", err
	}
	if got == nil {
		return "", fmt.Errorf("no type of oid %d", oid)
	}
	g.mu.Lock()
	g.types[k] = *got
	g.mu.Unlock()
	return *got, nil
}

// textRows runs q and returns its rows of n text values (nil for NULL),
// which must be want rows.
func (g *sourceGenerator) textRows(ctx context.Context, q string, args []any, n, want int) ([][]*string, error) {
	res, err := g.db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(res, func(r pgx.CollectableRow) ([]*string, error) {
		vals := make([]*string, n)
		ptrs := make([]any, n)
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		return vals, r.Scan(ptrs...)
	})
	if err != nil {
		return nil, err
	}
	if len(out) != want {
		return nil, fmt.Errorf("%d rows, want %d", len(out), want)
	}
	return out, nil
}

func generateSQL(table config.TableName, cols []plan.GeneratedColumn, inputs []plan.GeneratedInput) string {
	var sel, typed, arrays, names []string
	for _, c := range cols {
		sel = append(sel, fmt.Sprintf("(CAST((%s) AS %s))::text", c.Expr, c.Type))
	}
	for i, in := range inputs {
		typed = append(typed, fmt.Sprintf("u.i%d::%s AS %s", i, in.Type, pgx.Identifier{in.Name}.Sanitize()))
		arrays = append(arrays, fmt.Sprintf("$%d::text[]", i+1))
		names = append(names, fmt.Sprintf("i%d", i))
	}
	arrays = append(arrays, fmt.Sprintf("$%d::int[]", len(inputs)+1))
	names = append(names, "n", "ord")
	typed = append(typed, `u.ord AS "?fkmat:ord"`)
	alias := pgx.Identifier{table.Name}.Sanitize()
	return "SELECT " + strings.Join(sel, ", ") + " FROM (SELECT " + strings.Join(typed, ", ") +
		" FROM unnest(" + strings.Join(arrays, ", ") + ") WITH ORDINALITY AS u(" + strings.Join(names, ", ") + ")) AS " + alias +
		` ORDER BY ` + alias + `."?fkmat:ord"`
}

// Fetch reads, as
//
//	SELECT c1::text, ... FROM unnest($1::text[], ...) WITH ORDINALITY AS k(k0, ..., ord)
//	  LEFT JOIN table t ON t.key0 = k.k0::type0 AND ... ORDER BY k.ord
func (g *sourceGenerator) Fetch(ctx context.Context, table config.TableName, key []plan.SourceColumn, keys [][]*string,
	cols []string) ([][]*string, error) {
	var sel, on, names []string
	args := make([]any, 0, len(key))
	for _, c := range cols {
		sel = append(sel, "t."+pgx.Identifier{c}.Sanitize()+"::text")
	}
	for i, k := range key {
		on = append(on, fmt.Sprintf("t.%s = k.k%d::%s", pgx.Identifier{k.Name}.Sanitize(), i, k.Type))
		names = append(names, fmt.Sprintf("k%d", i))
		col := make([]*string, len(keys))
		for r, row := range keys {
			col[r] = row[i]
		}
		args = append(args, col)
	}
	var arrays []string
	for i := range key {
		arrays = append(arrays, fmt.Sprintf("$%d::text[]", i+1))
	}
	q := "SELECT " + strings.Join(sel, ", ") + " FROM unnest(" + strings.Join(arrays, ", ") + ") WITH ORDINALITY AS k(" +
		strings.Join(names, ", ") + ", ord) LEFT JOIN " + pgx.Identifier{table.Schema, table.Name}.Sanitize() + " t ON " +
		strings.Join(on, " AND ") + " ORDER BY k.ord"
	return g.textRows(ctx, q, args, len(cols), len(keys))
}
