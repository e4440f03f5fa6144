package sink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

// Column is one target column: its name and its exact type as format_type
// prints it ("numeric(12,2)", "character varying(40)").
type Column struct {
	Name string
	Type string
}

// Table describes one target table. The first KeyCount columns are the
// primary key (the left key); RightFrom is the index of the first column that
// comes from the right table (len(Columns) when there is none).
type Table struct {
	Schema    string
	Name      string
	Columns   []Column
	KeyCount  int
	RightFrom int
}

// Validate checks the description.
func (t *Table) Validate() error {
	switch {
	case t.Name == "":
		return errors.New("target table: no name")
	case t.KeyCount < 1 || t.KeyCount > len(t.Columns):
		return fmt.Errorf("target table %s: key count %d out of range", t.Ident(), t.KeyCount)
	case t.RightFrom < t.KeyCount || t.RightFrom > len(t.Columns):
		return fmt.Errorf("target table %s: right columns start %d out of range", t.Ident(), t.RightFrom)
	}
	seen := map[string]bool{}
	for _, c := range t.Columns {
		if seen[c.Name] {
			return fmt.Errorf("target table %s: column %q appears twice; give one of them an alias (col AS other_name)", t.Ident(), c.Name)
		}
		seen[c.Name] = true
	}
	return nil
}

// Ident returns the quoted, schema-qualified table name.
func (t *Table) Ident() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// Writer writes joined rows to target tables.
type Writer struct {
	pool *pgxpool.Pool
	// owner is the token Fence wrote for slot: every Begin and Commit
	// checks that the slot is still this writer's. Empty until Fence: no
	// check.
	owner, slot string
}

// NewWriter returns a Writer on pool.
func NewWriter(pool *pgxpool.Pool) *Writer { return &Writer{pool: pool} }

// Tx is one target transaction: the rows of one or more whole source
// transactions plus the checkpoint, committed together or not at all.
type Tx struct {
	tx    pgx.Tx
	owner string // Writer.owner at Begin
	Stats Stats
	// tables are the Stats of Apply by table, for metrics per join.
	tables map[*Table]Stats
}

// Stats counts the rows a transaction really changed.
type Stats struct {
	Upserted  int64 // rows inserted or changed (identical rows are not rewritten)
	Deleted   int64 // rows deleted (absent rows are not counted)
	Nulled    int64 // rows whose right columns were set to NULL
	Truncates int64
}

// Begin starts a target transaction. After Fence, it first checks that
// no other writer fenced the slot since (ErrFenced): a run that was frozen
// and comes back writes nothing, not even rows its commit would refuse.
func (w *Writer) Begin(ctx context.Context) (*Tx, error) {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin target transaction: %w", err)
	}
	if w.owner != "" {
		var owner string
		if err := tx.QueryRow(ctx, `SELECT token FROM fkmat.owner WHERE slot = $1`, w.slot).Scan(&owner); err != nil || owner != w.owner {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return nil, fmt.Errorf("begin target transaction: check the slot's owner: %w", err)
			}
			return nil, fmt.Errorf("slot %s: %w; this run stops (with --standby it waits for the slot again)", w.slot, ErrFenced)
		}
	}
	return &Tx{tx: tx, owner: w.owner}, nil
}

// Rollback abandons the transaction; safe after Commit.
func (t *Tx) Rollback(ctx context.Context) error {
	err := t.tx.Rollback(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		return nil
	}
	return err
}

// TableStats returns the rows Apply changed in table. Tables count by
// pointer, as passed to Apply: two joins whose targets have one name count
// apart.
func (t *Tx) TableStats(table *Table) Stats { return t.tables[table] }

// Apply writes one join output (truncate, null-right, deletes, upserts,
// right-column updates, in that order) to table.
func (t *Tx) Apply(ctx context.Context, table *Table, out join.Output) error {
	before := t.Stats
	defer func() {
		if t.tables == nil {
			t.tables = map[*Table]Stats{}
		}
		s := t.tables[table]
		s.Upserted += t.Stats.Upserted - before.Upserted
		s.Deleted += t.Stats.Deleted - before.Deleted
		s.Nulled += t.Stats.Nulled - before.Nulled
		s.Truncates += t.Stats.Truncates - before.Truncates
		t.tables[table] = s
	}()
	if out.Truncate {
		if err := t.Truncate(ctx, table); err != nil {
			return err
		}
	}
	if out.NullRight {
		if err := t.NullRight(ctx, table); err != nil {
			return err
		}
	}
	if len(out.NullColumns) > 0 {
		if err := t.NullColumns(ctx, table, out.NullColumns, out.NullValues); err != nil {
			return err
		}
	}
	if err := t.Delete(ctx, table, out.Deletes); err != nil {
		return err
	}
	if err := t.Upsert(ctx, table, out.Upserts); err != nil {
		return err
	}
	for _, u := range out.RightUpdates {
		if err := t.UpdateRight(ctx, table, u); err != nil {
			return err
		}
	}
	return t.updateColumnGroups(ctx, table, out.ColumnUpdates)
}

// updateColumnGroups applies column updates: one statement for an update
// alone in setting its columns (the keys it names, its values), one for
// all the updates of the same columns otherwise (each key with its own
// values: a roll-up's results, one row each).
func (t *Tx) updateColumnGroups(ctx context.Context, table *Table, us []join.ColumnUpdate) error {
	if len(us) == 1 {
		return t.UpdateColumns(ctx, table, us[0])
	}
	var groups [][]join.ColumnUpdate
	for _, u := range us {
		i := slices.IndexFunc(groups, func(g []join.ColumnUpdate) bool { return slices.Equal(g[0].Columns, u.Columns) })
		if i < 0 {
			groups = append(groups, nil)
			i = len(groups) - 1
		}
		groups[i] = append(groups[i], u)
	}
	for _, g := range groups {
		var err error
		if len(g) == 1 {
			err = t.UpdateColumns(ctx, table, g[0])
		} else {
			err = t.UpdateRows(ctx, table, g)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// UpdateRows applies updates us of the same columns in one statement: each
// key named gets its update's values, the last update's when several name
// it (as one statement per update would leave it), touching only the rows
// where they differ; keys without a row are skipped.
func (t *Tx) UpdateRows(ctx context.Context, table *Table, us []join.ColumnUpdate) error {
	cols := us[0].Columns
	if len(cols) == 0 {
		return nil
	}
	width := table.KeyCount + len(cols)
	var rows [][]join.Value
	seen := map[string]int{}
	var key []byte
	for _, u := range us {
		if !slices.Equal(u.Columns, cols) || len(u.Values) != len(cols) {
			return fmt.Errorf("update rows of %s: updates of different columns", table.Ident())
		}
		for _, k := range u.Keys {
			if len(k) < table.KeyCount {
				return fmt.Errorf("update rows of %s: a key of %d values, want %d", table.Ident(), len(k), table.KeyCount)
			}
			key = key[:0]
			for _, v := range k[:table.KeyCount] {
				key = strconv.AppendQuote(strconv.AppendBool(key, v.Null), v.Text)
			}
			row := append(append(make([]join.Value, 0, width), k[:table.KeyCount]...), u.Values...)
			if i, ok := seen[string(key)]; ok {
				rows[i] = row
				continue
			}
			seen[string(key)] = len(rows)
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	sql, err := updateRowsSQL(table, cols)
	if err != nil {
		return err
	}
	n, err := t.exec(ctx, sql, func(p *params) error { return columns(p, rows, width) })
	if err != nil {
		return fmt.Errorf("update columns of %s: %w", table.Ident(), err)
	}
	t.Stats.Upserted += n
	return nil
}

// UpdateColumns sets the columns u.Columns of the rows with keys u.Keys to
// u.Values, touching only the rows where they differ; keys without a row
// are skipped.
func (t *Tx) UpdateColumns(ctx context.Context, table *Table, u join.ColumnUpdate) error {
	if len(u.Keys) == 0 || len(u.Columns) == 0 {
		return nil
	}
	if len(u.Values) != len(u.Columns) {
		return fmt.Errorf("update columns of %s: %d values for %d columns", table.Ident(), len(u.Values), len(u.Columns))
	}
	sql, err := updateColumnsSQL(table, u.Columns)
	if err != nil {
		return err
	}
	n, err := t.exec(ctx, sql, func(p *params) error { return keysAndValues(p, u.Keys, table.KeyCount, u.Values) })
	if err != nil {
		return fmt.Errorf("update columns of %s: %w", table.Ident(), err)
	}
	t.Stats.Upserted += n
	return nil
}

// NullColumns sets the columns cols of every row to NULL, or to values
// when set, touching only the rows that differ.
func (t *Tx) NullColumns(ctx context.Context, table *Table, cols []int, values []join.Value) error {
	set := make([]string, len(cols))
	cond := make([]string, len(cols))
	var args []any
	for i, c := range cols {
		if c < table.KeyCount || c >= len(table.Columns) {
			return fmt.Errorf("null columns of %s: column %d is not a value column", table.Ident(), c)
		}
		id := pgx.Identifier{table.Columns[c].Name}.Sanitize()
		set[i] = id + " = NULL"
		cond[i] = id + " IS NOT NULL"
		if values != nil && !values[i].Null {
			args = append(args, values[i].Text)
			v := fmt.Sprintf("$%d::%s", len(args), table.Columns[c].Type)
			set[i] = id + " = " + v
			cond[i] = id + " IS DISTINCT FROM " + v
		}
	}
	tag, err := t.tx.Exec(ctx, "UPDATE "+table.Ident()+" SET "+strings.Join(set, ", ")+" WHERE "+strings.Join(cond, " OR "), args...)
	if err != nil {
		return fmt.Errorf("null columns of %s: %w", table.Ident(), err)
	}
	t.Stats.Nulled += tag.RowsAffected()
	return nil
}

// UpdateRight sets the right columns of the rows with keys u.Keys to
// u.Right, touching only the rows whose right columns differ: the left
// columns are neither read nor written.
func (t *Tx) UpdateRight(ctx context.Context, table *Table, u join.RightUpdate) error {
	if len(u.Keys) == 0 {
		return nil
	}
	right := table.Columns[table.RightFrom:]
	if len(u.Right) != len(right) {
		return fmt.Errorf("update right columns of %s: %d values for %d columns", table.Ident(), len(u.Right), len(right))
	}
	if len(right) == 0 {
		return nil
	}
	n, err := t.exec(ctx, updateRightSQL(table), func(p *params) error { return keysAndValues(p, u.Keys, table.KeyCount, u.Right) })
	if err != nil {
		return fmt.Errorf("update right columns of %s: %w", table.Ident(), err)
	}
	t.Stats.Upserted += n
	return nil
}

// Truncate empties the table (inside the transaction: readers see the old
// rows until commit).
func (t *Tx) Truncate(ctx context.Context, table *Table) error {
	if _, err := t.tx.Exec(ctx, "DELETE FROM "+table.Ident()); err != nil {
		return fmt.Errorf("empty target %s: %w", table.Ident(), err)
	}
	t.Stats.Truncates++
	return nil
}

// NullRight sets the right columns of every row to NULL, touching only rows
// that have a non-NULL right value.
func (t *Tx) NullRight(ctx context.Context, table *Table) error {
	right := table.Columns[table.RightFrom:]
	if len(right) == 0 {
		return nil
	}
	set := make([]string, len(right))
	cond := make([]string, len(right))
	for i, c := range right {
		id := pgx.Identifier{c.Name}.Sanitize()
		set[i] = id + " = NULL"
		cond[i] = id + " IS NOT NULL"
	}
	sql := "UPDATE " + table.Ident() + " SET " + strings.Join(set, ", ") + " WHERE " + strings.Join(cond, " OR ")
	tag, err := t.tx.Exec(ctx, sql)
	if err != nil {
		return fmt.Errorf("null right columns of %s: %w", table.Ident(), err)
	}
	t.Stats.Nulled += tag.RowsAffected()
	return nil
}

// Upsert inserts rows or updates the existing ones whose values differ; an
// identical row is not rewritten.
func (t *Tx) Upsert(ctx context.Context, table *Table, rows []join.Row) error {
	if len(rows) == 0 {
		return nil
	}
	n, err := t.exec(ctx, upsertSQL(table), func(p *params) error { return columns(p, rows, len(table.Columns)) })
	if err != nil {
		return fmt.Errorf("upsert into %s: %w", table.Ident(), err)
	}
	t.Stats.Upserted += n
	return nil
}

// Delete deletes the rows with the given keys; absent keys are no-ops.
func (t *Tx) Delete(ctx context.Context, table *Table, keys [][]join.Value) error {
	if len(keys) == 0 {
		return nil
	}
	n, err := t.exec(ctx, deleteSQL(table), func(p *params) error { return columns(p, keys, table.KeyCount) })
	if err != nil {
		return fmt.Errorf("delete from %s: %w", table.Ident(), err)
	}
	t.Stats.Deleted += n
	return nil
}

// ErrCheckpointBackwards means a commit tried to move a slot's checkpoint
// back: the caller replayed something it had already committed.
var ErrCheckpointBackwards = errors.New("target checkpoint would move backwards")

// ErrFenced means another run took the slot over (Fence) since this
// writer's Fence: its commits are refused.
var ErrFenced = errors.New("another fkmat run took the replication slot over")

// Fence makes this writer the owner of slot's commits: it writes a new
// token in fkmat.owner, and every Commit from then on checks it. A writer
// that fenced the slot before is refused from then on (ErrFenced). Call it
// once the replication stream holds the slot, before the first commit; a
// commit of the old owner in flight finishes first (its FOR SHARE lock),
// so read the checkpoint after Fence.
//
// session names this writer's process's sessions (their application_name
// is "fkmat <session>"), for the next owner to end them (Owner).
func (w *Writer) Fence(ctx context.Context, slot, host string, pid int, session string) error {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return fmt.Errorf("fence slot %s: %w", slot, err)
	}
	token := hex.EncodeToString(b)
	if _, err := w.pool.Exec(ctx, `
		INSERT INTO fkmat.owner (slot, token, host, pid, session) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (slot) DO UPDATE SET token = EXCLUDED.token, host = EXCLUDED.host, pid = EXCLUDED.pid,
			session = EXCLUDED.session, since = now()`,
		slot, token, host, pid, session); err != nil {
		return fmt.Errorf("fence slot %s: %w", slot, err)
	}
	w.owner, w.slot = token, slot
	return nil
}

// Owner returns the session the slot's owner recorded at its Fence ("" if
// none), without waiting for its commits.
func (w *Writer) Owner(ctx context.Context, slot string) (string, error) {
	var session *string
	err := w.pool.QueryRow(ctx, `SELECT session FROM fkmat.owner WHERE slot = $1`, slot).Scan(&session)
	if errors.Is(err, pgx.ErrNoRows) || session == nil {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the owner of slot %s: %w", slot, err)
	}
	return *session, nil
}

// Commit records lsn as the slot's checkpoint and commits. The checkpoint
// never moves backwards: an older lsn fails with ErrCheckpointBackwards and
// nothing is committed. After Fence, a commit of a slot another writer
// fenced since fails with ErrFenced, and nothing is committed.
func (t *Tx) Commit(ctx context.Context, slot string, lsn wal.LSN) error {
	var tag pgconn.CommandTag
	var err error
	if t.owner == "" {
		tag, err = t.tx.Exec(ctx, `
			INSERT INTO fkmat.checkpoint AS c (slot, lsn) VALUES ($1, $2::pg_lsn)
			ON CONFLICT (slot) DO UPDATE SET lsn = EXCLUDED.lsn, updated_at = now()
			WHERE c.lsn <= EXCLUDED.lsn`, slot, lsn.String())
	} else {
		tag, err = t.tx.Exec(ctx, `
			WITH o AS (SELECT FROM fkmat.owner WHERE slot = $1 AND token = $3 FOR SHARE)
			INSERT INTO fkmat.checkpoint AS c (slot, lsn) SELECT $1, $2::pg_lsn FROM o
			ON CONFLICT (slot) DO UPDATE SET lsn = EXCLUDED.lsn, updated_at = now()
			WHERE c.lsn <= EXCLUDED.lsn`, slot, lsn.String(), t.owner)
	}
	if err != nil {
		_ = t.Rollback(ctx)
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if tag.RowsAffected() != 1 {
		fenced := false
		if t.owner != "" {
			var owner string
			if err := t.tx.QueryRow(ctx, `SELECT token FROM fkmat.owner WHERE slot = $1`, slot).Scan(&owner); err == nil && owner != t.owner {
				fenced = true
			}
		}
		_ = t.Rollback(ctx)
		if fenced {
			return fmt.Errorf("slot %s at %s: %w; this run stops (with --standby it waits for the slot again)", slot, lsn, ErrFenced)
		}
		return fmt.Errorf("slot %s at %s: %w", slot, lsn, ErrCheckpointBackwards)
	}
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit target transaction: %w", err)
	}
	return nil
}

// CommitRows commits without touching any checkpoint: for the initial load,
// whose rows are not usable until the load marks itself complete.
func (t *Tx) CommitRows(ctx context.Context) error {
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit target transaction: %w", err)
	}
	return nil
}

// Exec runs a statement inside the transaction (metadata updates that must
// commit with the rows).
func (t *Tx) Exec(ctx context.Context, sql string, args ...any) error {
	if _, err := t.tx.Exec(ctx, sql, args...); err != nil {
		return err
	}
	return nil
}

// Checkpoint returns the slot's committed checkpoint (0 when none).
func (w *Writer) Checkpoint(ctx context.Context, slot string) (wal.LSN, error) {
	var s string
	err := w.pool.QueryRow(ctx, `SELECT lsn::text FROM fkmat.checkpoint WHERE slot = $1`, slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read target checkpoint: %w", err)
	}
	return wal.ParseLSN(s)
}

// unnestFrom renders `unnest($1::text[], ...) AS u(c1, ...)` and the list of
// typed expressions selecting from it.
func unnestFrom(cols []Column) (from string, exprs []string) {
	params := make([]string, len(cols))
	names := make([]string, len(cols))
	exprs = make([]string, len(cols))
	for i, c := range cols {
		params[i] = fmt.Sprintf("$%d::text[]", i+1)
		names[i] = fmt.Sprintf("c%d", i+1)
		exprs[i] = fmt.Sprintf("u.c%d::%s", i+1, c.Type)
	}
	from = "unnest(" + strings.Join(params, ", ") + ") AS u(" + strings.Join(names, ", ") + ")"
	return from, exprs
}

func upsertSQL(t *Table) string {
	from, exprs := unnestFrom(t.Columns)
	names := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		names[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	keys := strings.Join(names[:t.KeyCount], ", ")
	sql := "INSERT INTO " + t.Ident() + " AS t (" + strings.Join(names, ", ") + ") SELECT " +
		strings.Join(exprs, ", ") + " FROM " + from + " ON CONFLICT (" + keys + ") DO "
	rest := names[t.KeyCount:]
	if len(rest) == 0 {
		return sql + "NOTHING"
	}
	set := make([]string, len(rest))
	cur := make([]string, len(rest))
	exc := make([]string, len(rest))
	for i, n := range rest {
		set[i] = n + " = EXCLUDED." + n
		cur[i] = "t." + n
		exc[i] = "EXCLUDED." + n
	}
	return sql + "UPDATE SET " + strings.Join(set, ", ") +
		" WHERE ROW(" + strings.Join(cur, ", ") + ") IS DISTINCT FROM ROW(" + strings.Join(exc, ", ") + ")"
}

// updateRightSQL renders the statement of UpdateRight: the keys as text
// arrays $1..$k, then one text parameter per right column.
func updateRightSQL(t *Table) string {
	cols := make([]int, 0, len(t.Columns)-t.RightFrom)
	for c := t.RightFrom; c < len(t.Columns); c++ {
		cols = append(cols, c)
	}
	// The right columns are value columns of the table: no error.
	sql, _ := updateColumnsSQL(t, cols)
	return sql
}

// updateColumnsSQL is updateRightSQL for the value columns cols.
func updateColumnsSQL(t *Table, cols []int) (string, error) {
	from, exprs := unnestFrom(t.Columns[:t.KeyCount])
	cond := make([]string, t.KeyCount)
	for i, c := range t.Columns[:t.KeyCount] {
		cond[i] = "t." + pgx.Identifier{c.Name}.Sanitize() + " = " + exprs[i]
	}
	set := make([]string, len(cols))
	cur := make([]string, len(cols))
	vals := make([]string, len(cols))
	for i, ci := range cols {
		if ci < t.KeyCount || ci >= len(t.Columns) {
			return "", fmt.Errorf("update columns of %s: column %d is not a value column", t.Ident(), ci)
		}
		c := t.Columns[ci]
		n := pgx.Identifier{c.Name}.Sanitize()
		vals[i] = fmt.Sprintf("$%d::text::%s", t.KeyCount+i+1, c.Type)
		set[i] = n + " = " + vals[i]
		cur[i] = "t." + n
	}
	return "UPDATE " + t.Ident() + " AS t SET " + strings.Join(set, ", ") + " FROM " + from +
		" WHERE " + strings.Join(cond, " AND ") +
		" AND ROW(" + strings.Join(cur, ", ") + ") IS DISTINCT FROM ROW(" + strings.Join(vals, ", ") + ")", nil
}

// updateRowsSQL is UpdateRows's statement: the keys' columns, then the
// values', as text[] parameters.
func updateRowsSQL(t *Table, cols []int) (string, error) {
	all := slices.Clone(t.Columns[:t.KeyCount])
	for _, ci := range cols {
		if ci < t.KeyCount || ci >= len(t.Columns) {
			return "", fmt.Errorf("update columns of %s: column %d is not a value column", t.Ident(), ci)
		}
		all = append(all, t.Columns[ci])
	}
	from, exprs := unnestFrom(all)
	cond := make([]string, t.KeyCount)
	for i, c := range t.Columns[:t.KeyCount] {
		cond[i] = "t." + pgx.Identifier{c.Name}.Sanitize() + " = " + exprs[i]
	}
	set := make([]string, len(cols))
	cur := make([]string, len(cols))
	for i, ci := range cols {
		n := pgx.Identifier{t.Columns[ci].Name}.Sanitize()
		set[i] = n + " = " + exprs[t.KeyCount+i]
		cur[i] = "t." + n
	}
	return "UPDATE " + t.Ident() + " AS t SET " + strings.Join(set, ", ") + " FROM " + from +
		" WHERE " + strings.Join(cond, " AND ") +
		" AND ROW(" + strings.Join(cur, ", ") + ") IS DISTINCT FROM ROW(" + strings.Join(exprs[t.KeyCount:], ", ") + ")", nil
}

func deleteSQL(t *Table) string {
	from, exprs := unnestFrom(t.Columns[:t.KeyCount])
	cond := make([]string, t.KeyCount)
	for i, c := range t.Columns[:t.KeyCount] {
		cond[i] = "t." + pgx.Identifier{c.Name}.Sanitize() + " = " + exprs[i]
	}
	return "DELETE FROM " + t.Ident() + " AS t USING " + from + " WHERE " + strings.Join(cond, " AND ")
}
