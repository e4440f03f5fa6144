package plan

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fkmat/fkmat/internal/config"
)

// Filters (`where:`) and expressions in `columns` are columns fkmat
// computes: each is a GeneratedColumn of its table, named by ComputedName,
// which the pipeline appends to the table's rows in the stream (computed
// in Postgres, batch by batch) and which the SQL of the backfill and of
// verify computes in a subquery over the table (FromSQL). A filter is a
// boolean column; a row whose filter is not true is absent from the join.

// ComputedName is the name of the column fkmat computes for expr (kind
// "where" or "expr"): one per expression, whatever the join, not a name
// Postgres gives a column of a table ("?" starts no unquoted name, and
// fkmat refuses a table that has one).
func ComputedName(kind, expr string) string {
	sum := sha256.Sum256([]byte(kind + "\x00" + expr))
	return "?fkmat:" + kind + ":" + hex.EncodeToString(sum[:6])
}

// IsFilterColumn reports whether name is a where's ComputedName.
func IsFilterColumn(name string) bool { return strings.HasPrefix(name, "?fkmat:where:") }

// FilterColumn is the name of tp's filter column, "" when it has no where.
func (tp *TablePlan) FilterColumn() string {
	if tp.Where == "" {
		return ""
	}
	return ComputedName("where", tp.Where)
}

// FromSQL is the SQL of tp's rows as a join reads them: the table, or,
// when tp has a filter or computed columns, a subquery of the rows that
// pass the filter with the computed columns appended (named ComputedName).
// Expressions see the table under its own name, unqualified.
func FromSQL(tp *TablePlan) string { return FromSQLWhere(tp, "") }

// FromSQLWhere is FromSQL with the table's rows further limited by cond, a
// condition on the table's own columns, system columns included (a range
// of ctid); "" is no condition.
func FromSQLWhere(tp *TablePlan, cond string) string {
	table := pgx.Identifier{tp.Table.Schema, tp.Table.Name}.Sanitize()
	if tp.Where == "" && len(tp.Computed) == 0 {
		if cond == "" {
			return table
		}
		return "(SELECT * FROM " + table + " WHERE " + cond + ")"
	}
	alias := pgx.Identifier{tp.Table.Name}.Sanitize()
	sel := []string{alias + ".*"}
	for _, c := range tp.Computed {
		if c.Name != tp.FilterColumn() {
			sel = append(sel, "("+c.Expr+")::"+c.Type+" AS "+pgx.Identifier{c.Name}.Sanitize())
		}
	}
	q := "(SELECT " + strings.Join(sel, ", ") + " FROM " + table + " AS " + alias
	var where []string
	if tp.Where != "" {
		where = append(where, "("+tp.Where+")")
	}
	if cond != "" {
		where = append(where, cond)
	}
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q + ")"
}

// exprInfo is what the source says of an expression over a table.
type exprInfo struct {
	col       SourceColumn
	inputs    []GeneratedInput
	collation string
}

// probeExpr asks the source what expr means over the table ct names: its
// type and the columns it reads, through a temporary view created and
// dropped in a transaction that is rolled back. It returns a problem (not
// an error) for an expression fkmat cannot follow.
func probeExpr(ctx context.Context, db Querier, ct *catalogTable, expr string) (exprInfo, string, error) {
	b, ok := db.(interface {
		Begin(context.Context) (pgx.Tx, error)
	})
	if !ok {
		return exprInfo{}, "", errors.New("check an expression: the source connection cannot begin a transaction")
	}
	tx, err := b.Begin(ctx)
	if err != nil {
		return exprInfo{}, "", fmt.Errorf("check an expression: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	table := pgx.Identifier{ct.name.Schema, ct.name.Name}.Sanitize()
	alias := pgx.Identifier{ct.name.Name}.Sanitize()
	if _, err := tx.Exec(ctx, "CREATE TEMPORARY VIEW fkmat_probe AS SELECT ("+expr+") AS v FROM "+table+" AS "+alias); err != nil {
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok {
			return exprInfo{}, exprProblem(ct, pgErr), nil
		}
		return exprInfo{}, "", fmt.Errorf("check an expression over %s: %w", ct.name, err)
	}
	var info exprInfo
	var tree string
	err = tx.QueryRow(ctx, `
		SELECT format_type(a.atttypid, a.atttypmod), a.atttypid, a.atttypmod, r.ev_action::text, `+collationSQL+`
		FROM pg_attribute a JOIN pg_rewrite r ON r.ev_class = a.attrelid
		WHERE a.attrelid = 'pg_temp.fkmat_probe'::regclass AND a.attnum = 1`).Scan(
		&info.col.Type, &info.col.TypeOID, &info.col.TypeMod, &tree, &info.collation)
	if err != nil {
		return exprInfo{}, "", fmt.Errorf("check an expression over %s: %w", ct.name, err)
	}
	if p := treeProblem(tree); p != "" {
		return exprInfo{}, p, nil
	}
	var funcs, ops []uint32
	for _, m := range calledFunction.FindAllStringSubmatch(tree, -1) {
		var oid uint32
		_, _ = fmt.Sscan(m[1], &oid)
		funcs = append(funcs, oid)
	}
	for _, m := range calledOperator.FindAllStringSubmatch(tree, -1) {
		var oid uint32
		_, _ = fmt.Sscan(m[1], &oid)
		ops = append(ops, oid)
	}
	rows, err := tx.Query(ctx, `
		SELECT p.oid::regprocedure::text, p.proname, n.nspname, p.provolatile::text, p.prokind::text, p.proretset,
			p.pronargs, coalesce(p.proargtypes[0]::regtype::text, '')
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE p.oid = ANY($1::oid[]) OR p.oid IN (SELECT oprcode FROM pg_operator WHERE oid = ANY($2::oid[])) ORDER BY 1`, funcs, ops)
	if err != nil {
		return exprInfo{}, "", fmt.Errorf("check an expression over %s: %w", ct.name, err)
	}
	var fns []function
	for rows.Next() {
		var f function
		if err := rows.Scan(&f.sig, &f.name, &f.schema, &f.volatility, &f.kind, &f.set, &f.nargs, &f.arg0); err != nil {
			rows.Close()
			return exprInfo{}, "", err
		}
		fns = append(fns, f)
	}
	if err := rows.Err(); err != nil {
		return exprInfo{}, "", fmt.Errorf("check an expression over %s: %w", ct.name, err)
	}
	for _, f := range fns {
		if p := f.problem(); p != "" {
			return exprInfo{}, p, nil
		}
	}
	var names []string
	err = tx.QueryRow(ctx, `
		SELECT coalesce(array_agg(a.attname ORDER BY a.attnum), '{}')
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
			AND (a.attnum IN (SELECT d.refobjsubid FROM pg_depend d JOIN pg_rewrite r ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
				WHERE r.ev_class = 'pg_temp.fkmat_probe'::regclass AND d.refobjid = $1::regclass) OR $2)`,
		table, wholeRow.MatchString(tree)).Scan(&names)
	if err != nil {
		return exprInfo{}, "", fmt.Errorf("check an expression over %s: %w", ct.name, err)
	}
	for _, n := range names {
		c := ct.byName[n]
		if _, gen := ct.generated[n]; gen {
			return exprInfo{}, fmt.Sprintf("reads generated column %q: write its expression over the columns it is computed from", n), nil
		}
		info.inputs = append(info.inputs, GeneratedInput{Name: n, Type: c.Type, Toastable: ct.toastable[n]})
	}
	return info, "", nil
}

// wholeRow matches a whole-row reference (orders.*, to_jsonb(orders)) in a
// query tree.
var wholeRow = regexp.MustCompile(`\{VAR :varno \d+ :varattno 0 `)

// systemColumn matches a system column reference (ctid, xmin, ...).
var systemColumn = regexp.MustCompile(`\{VAR :varno \d+ :varattno -`)

// calledFunction matches the function a node of a query tree calls
// (functions, operators' functions); calledOperator an operator. Built-in
// functions are pinned: pg_depend records no dependency on them.
var (
	calledFunction = regexp.MustCompile(`:(?:funcid|opfuncid) (\d+)`)
	calledOperator = regexp.MustCompile(`:opno (\d+)`)
)

// treeProblem names what the query tree of an expression holds that fkmat
// cannot follow, or "".
func treeProblem(tree string) string {
	switch {
	case strings.Contains(tree, "{SUBLINK"):
		return "holds a subquery: a where or an expression reads its own row only (a roll-up of another table goes in rollups)"
	case strings.Contains(tree, "{AGGREF") || strings.Contains(tree, "{GROUPINGFUNC"):
		return "holds an aggregate: a where or an expression is computed per row; aggregate children in rollups, or in a view over the target"
	case strings.Contains(tree, "{WINDOWFUNC"):
		return "holds a window function: a where or an expression is computed per row"
	case strings.Contains(tree, "{SQLVALUEFUNCTION"):
		return "reads the clock or the session (current_timestamp, current_date, current_user, ...): its value would depend on when fkmat " +
			"computes it, not on the row; keep the column and compute this in a view over the target"
	case strings.Contains(tree, "{NEXTVALUEEXPR"):
		return "reads a sequence: its value would depend on when fkmat computes it"
	case systemColumn.MatchString(tree):
		return "reads a system column (ctid, xmin, ...): its value is not part of the row in the stream"
	}
	return ""
}

// function is a function an expression calls (an operator's included).
type function struct {
	sig, name, schema string
	volatility, kind  string
	set               bool
	nargs             int
	arg0              string
}

// sessionFunctions are the stable functions of pg_catalog whose result
// depends on more than their arguments and the settings fkmat fixes (the
// clock, the transaction, the session, the catalog or the statistics).
var sessionFunctions = regexp.MustCompile(`^(now|transaction_timestamp|statement_timestamp|current_.*|session_user|getpgusername|version|` +
	`row_security_active|get_current_ts_config|format_type|(col|obj|shobj)_description|enum_(first|last|range)|mxid_age|regclass|` +
	`has_.*|pg_.*|to_reg.*|reg.*(in|out)|txid_.*|inet_.*|(database|schema|table|query|cursor)_to_.*|ts_(debug|parse|token_type))$`)

// defaultConfigFunctions use the session's default_text_search_config when
// their first argument is not a regconfig.
var defaultConfigFunctions = []string{"to_tsvector", "to_tsquery", "plainto_tsquery", "phraseto_tsquery", "websearch_to_tsquery",
	"ts_headline", "json_to_tsvector", "jsonb_to_tsvector"}

// problem names why an expression calling f cannot be followed, or "".
func (f function) problem() string {
	switch {
	case f.kind == "a" || f.kind == "w":
		return fmt.Sprintf("calls %s, an aggregate or window function: a where or an expression is computed per row", f.sig)
	case f.set:
		return fmt.Sprintf("calls %s, which returns a set of rows: an expression computes one value per row", f.sig)
	case f.volatility == "v":
		return fmt.Sprintf("calls %s, which is VOLATILE: its value may change at each call (random(), clock_timestamp(), nextval(), ...), "+
			"so fkmat would not compute what SQL shows; compute it in a view over the target", f.sig)
	case f.volatility == "s" && f.schema != "pg_catalog":
		return fmt.Sprintf("calls %s, which is STABLE: fkmat accepts immutable user functions; if its result depends only on its "+
			"arguments, declare it IMMUTABLE (ALTER FUNCTION %s IMMUTABLE)", f.sig, f.sig)
	case f.volatility == "s" && (sessionFunctions.MatchString(f.name) || (f.name == "age" && f.nargs == 1) ||
		(slices.Contains(defaultConfigFunctions, f.name) && f.arg0 != "regconfig")):
		return fmt.Sprintf("calls %s, which reads the clock, the transaction, the session or the catalog: its value would depend on when "+
			"fkmat computes it, not on the row alone; compute it in a view over the target", f.sig)
	}
	return ""
}

// undefinedColumn reads the name in `column "x" does not exist`.
var undefinedColumn = regexp.MustCompile(`column "((?:[^"]|"")*)" does not exist`)

// missingTable reads the name in `missing FROM-clause entry for table "c"`.
var missingTable = regexp.MustCompile(`missing FROM-clause entry for table "((?:[^"]|"")*)"`)

// exprProblem says why Postgres refused an expression over ct.
func exprProblem(ct *catalogTable, e *pgconn.PgError) string {
	switch e.Code {
	case "42703":
		if m := undefinedColumn.FindStringSubmatch(e.Message); m != nil {
			name := strings.ReplaceAll(m[1], `""`, `"`)
			if i := strings.LastIndexByte(name, '.'); i >= 0 {
				name = name[i+1:]
			}
			return fmt.Sprintf("table %s has no column %q%s", ct.name, name, suggest(ct, name))
		}
	case "42P01":
		if m := missingTable.FindStringSubmatch(e.Message); m != nil {
			return fmt.Sprintf("reads table %q: a where or an expression reads only its own table's columns (%s's), unqualified or "+
				"qualified by %s; a column of another entry belongs to that entry", m[1], ct.name, pgx.Identifier{ct.name.Name}.Sanitize())
		}
	case "42501":
		return "fkmat checks expressions with a temporary view, and the source user may not create one: " +
			"GRANT TEMPORARY ON DATABASE to it (" + e.Message + ")"
	case "42601":
		return "is not valid SQL: " + e.Message
	}
	msg := e.Message
	if e.Hint != "" {
		msg += " (" + e.Hint + ")"
	}
	return msg
}

// expression resolves the expression of a `columns` item, or of a where
// (where), over ct: the source column it becomes, named ComputedName, and
// adds it to tp's computed columns. It reports a problem with what.
func expression(ct *catalogTable, tp *TablePlan, expr string, where bool, what string, add func(string, ...any)) (SourceColumn, bool) {
	info, prob, err := ct.probe(expr)
	if err != nil {
		add("%s %q: %v", what, expr, err)
		return SourceColumn{}, false
	}
	if prob != "" {
		add("%s %q: %s", what, expr, prob)
		return SourceColumn{}, false
	}
	kind := "expr"
	if where {
		kind = "where"
		if info.col.TypeOID != boolOID {
			add("%s %q: is of type %s, not boolean: a where keeps the rows for which it is true (e.g. status <> 'draft')",
				what, expr, info.col.Type)
			return SourceColumn{}, false
		}
	}
	col := info.col
	ct.exprCollation[expr] = info.collation
	col.Name, col.Expr = ComputedName(kind, expr), expr
	// The stream's rows carry no type modifier for a computed column:
	// compare its type alone (the target column has the modifier).
	col.TypeMod, col.HasTypeMod = -1, false
	if _, clash := ct.byName[col.Name]; clash {
		add("%s: table %s has a column named %q, which fkmat names its computed columns; rename it", what, ct.name, col.Name)
		return SourceColumn{}, false
	}
	if !slices.ContainsFunc(tp.Computed, func(g GeneratedColumn) bool { return g.Name == col.Name }) {
		tp.Computed = append(tp.Computed, GeneratedColumn{Name: col.Name, Type: col.Type, TypeOID: col.TypeOID, Expr: expr, Inputs: info.inputs})
	}
	return col, true
}

// boolOID is the OID of type boolean.
const boolOID = 16

// resolveWhere resolves the where of the table tp (config text w).
func resolveWhere(ct *catalogTable, tp *TablePlan, w, what string, add func(string, ...any)) {
	w = strings.TrimSpace(w)
	if w == "" {
		return
	}
	if _, ok := expression(ct, tp, w, true, what, add); ok {
		tp.Where = w
	}
}

// TablePlans returns the plans of p's tables: the left table's, then the
// right one's or each entry's, then each roll-up's children's.
func (p *JoinPlan) TablePlans() []*TablePlan {
	tables := []*TablePlan{&p.Left}
	if p.Edges == nil {
		tables = append(tables, &p.Right)
	}
	for i := range p.Edges {
		tables = append(tables, &p.Edges[i].Table)
	}
	for i := range p.Rollups {
		tables = append(tables, &p.Rollups[i].Table)
	}
	return tables
}

// computedInto adds the computed columns of p's tables to p.Generated,
// which the pipeline fills into the stream's rows.
func computedInto(p *JoinPlan) {
	for _, tp := range p.TablePlans() {
		for _, c := range tp.Computed {
			if p.Generated == nil {
				p.Generated = map[config.TableName][]GeneratedColumn{}
			}
			if !slices.ContainsFunc(p.Generated[tp.Table], func(h GeneratedColumn) bool { return h.Name == c.Name }) {
				p.Generated[tp.Table] = append(p.Generated[tp.Table], c)
			}
		}
	}
}
