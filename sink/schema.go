package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrShapeMismatch means an existing target table does not have the columns,
// types or primary key fkmat would create.
var ErrShapeMismatch = errors.New("target table shape mismatch")

// EnsureTable creates the target table with the exact column types and the
// left key as primary key, or checks that an existing one has that shape. It
// reports whether it created the table.
func (w *Writer) EnsureTable(ctx context.Context, t *Table) (bool, error) {
	if err := t.Validate(); err != nil {
		return false, err
	}
	cols, key, exists, err := w.describe(ctx, t)
	if err != nil {
		return false, err
	}
	if exists {
		return false, compareShape(t, cols, key)
	}
	sql := strings.Replace(CreateSQL(t), "CREATE TABLE ", "CREATE TABLE IF NOT EXISTS ", 1)
	if _, err := w.pool.Exec(ctx, sql); err != nil {
		return false, fmt.Errorf("create target table %s: %w", t.Ident(), err)
	}
	return true, nil
}

// CheckTable checks that the target table exists with the shape EnsureTable
// would create, without creating anything.
func (w *Writer) CheckTable(ctx context.Context, t *Table) error {
	if err := t.Validate(); err != nil {
		return err
	}
	cols, key, exists, err := w.describe(ctx, t)
	if err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("target table %s does not exist; create it with fkmat migrate (or fkmat run)", t.Ident())
	}
	return compareShape(t, cols, key)
}

// DropTable drops the target table if it exists.
func (w *Writer) DropTable(ctx context.Context, t *Table) error {
	if _, err := w.pool.Exec(ctx, "DROP TABLE IF EXISTS "+t.Ident()); err != nil {
		return fmt.Errorf("drop target table %s: %w", t.Ident(), err)
	}
	return nil
}

func (w *Writer) describe(ctx context.Context, t *Table) (cols []Column, key []string, exists bool, err error) {
	var oid *uint32
	if err := w.pool.QueryRow(ctx, `SELECT to_regclass($1)::oid`, t.Ident()).Scan(&oid); err != nil {
		return nil, nil, false, fmt.Errorf("look up target table %s: %w", t.Ident(), err)
	}
	if oid == nil {
		return nil, nil, false, nil
	}
	rows, err := w.pool.Query(ctx, `
		SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, *oid)
	if err != nil {
		return nil, nil, false, fmt.Errorf("describe target table %s: %w", t.Ident(), err)
	}
	for rows.Next() {
		var c Column
		if err := rows.Scan(&c.Name, &c.Type); err != nil {
			return nil, nil, false, err
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, false, fmt.Errorf("describe target table %s: %w", t.Ident(), err)
	}
	err = w.pool.QueryRow(ctx, `
		SELECT coalesce(array_agg(a.attname ORDER BY k.ord), '{}') FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1 AND i.indisprimary`, *oid).Scan(&key)
	if err != nil {
		return nil, nil, false, fmt.Errorf("read primary key of %s: %w", t.Ident(), err)
	}
	return cols, key, true, nil
}

func compareShape(t *Table, have []Column, haveKey []string) error {
	var p []string
	byName := map[string]string{}
	for _, c := range have {
		byName[c.Name] = c.Type
	}
	want := map[string]bool{}
	for _, c := range t.Columns {
		want[c.Name] = true
		typ, ok := byName[c.Name]
		switch {
		case !ok:
			p = append(p, fmt.Sprintf("column %q is missing", c.Name))
		case typ != c.Type:
			p = append(p, fmt.Sprintf("column %q is %s, want %s", c.Name, typ, c.Type))
		}
	}
	for _, c := range have {
		if !want[c.Name] {
			p = append(p, fmt.Sprintf("column %q is not produced by the join", c.Name))
		}
	}
	wantKey := make([]string, t.KeyCount)
	for i := range wantKey {
		wantKey[i] = t.Columns[i].Name
	}
	if strings.Join(haveKey, "\x00") != strings.Join(wantKey, "\x00") {
		p = append(p, fmt.Sprintf("primary key is (%s), want (%s)", strings.Join(haveKey, ", "), strings.Join(wantKey, ", ")))
	}
	if len(p) == 0 {
		return nil
	}
	// teardown --drop-target drops only a table fkmat built for the join.
	return fmt.Errorf("%w: %s: %s; drop it (fkmat teardown --drop-target if fkmat built it, else yourself) or choose another target.table",
		ErrShapeMismatch, t.Ident(), strings.Join(p, "; "))
}
