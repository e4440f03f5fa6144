package plan

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/sink"
)

// SourceColumn is a column of a source table as the catalog describes it.
type SourceColumn struct {
	Name    string
	Type    string // format_type, e.g. "numeric(12,2)"
	TypeOID uint32
	// TypeMod is the type's modifier (atttypmod: numeric's precision and
	// scale, varchar's length, -1 for none) when HasTypeMod says the
	// catalog gave it.
	TypeMod    int32
	HasTypeMod bool
	NotNull    bool
	// Expr is the SQL expression of a column fkmat computes (an
	// expression of `columns`); Name is then its ComputedName.
	Expr string `json:",omitempty"`
}

// OutputColumn maps a source column to a target column.
type OutputColumn struct {
	Source SourceColumn
	Name   string // output name (alias)
}

// TablePlan is one resolved source table of a join.
type TablePlan struct {
	Table config.TableName
	// Key is the left primary key (left) or the referenced key (right).
	Key []SourceColumn
	// ForeignKey are the left columns referencing the right key (left only).
	ForeignKey []SourceColumn
	// Values are the projected columns other than the left key, in output order.
	Values []OutputColumn
	// KeyNames are the output names of the key columns (left only).
	KeyNames []string
	// Replica is the table's replica identity: d(efault), f(ull), i(ndex), n(othing).
	Replica string `json:"-"`
	// Partitioned says it is a partitioned table: partition DDL may move
	// its rows without row changes in the WAL, so an insert streamed for it
	// does not prove that the join state has no row of that key.
	Partitioned bool `json:"-"`
	// Where is the table's filter (config where), "" for none: its rows
	// for which it is not true are not part of the join.
	Where string `json:",omitempty"`
	// Computed are the columns fkmat computes for the table: the
	// expressions of its columns, and its where (FilterColumn).
	Computed []GeneratedColumn `json:",omitempty"`
}

// JoinPlan is a join resolved against the source catalog: everything the
// daemon needs to map changes to the engine and the engine's output to the
// target.
type JoinPlan struct {
	Name        string
	Type        string
	Left        TablePlan
	Right       TablePlan
	Target      sink.Table
	Spec        join.Spec
	Fingerprint string
	// Edges are the entries of the list form (joins of more than two
	// tables), in order; nil in the two-table form (Right).
	Edges []EdgePlan
	// Rollups are the child tables rolled up into the left rows: a join
	// with roll-ups has the list form (its right, if any, is Edges[0]).
	Rollups []RollupPlan `json:",omitempty"`
	// WidenedBefore is the source WAL position before which changes may
	// hold columns narrower than the plan's: they were written before a
	// widening the daemon followed (fkmat.join_state.widened_lsn); 0 when
	// none. Not part of the definition.
	WidenedBefore uint64
	// Generated are the stored generated columns each source table
	// outputs, which the daemon computes (the stream lacks them). Not part
	// of the definition: their columns are.
	Generated map[config.TableName][]GeneratedColumn
}

// tables returns the join's source tables: the left one, then the right
// one or each entry's (a table may repeat).
func (p *JoinPlan) Tables() []config.TableName {
	if p.Edges == nil {
		return []config.TableName{p.Left.Table, p.Right.Table}
	}
	out := []config.TableName{p.Left.Table}
	for _, e := range p.Edges {
		out = append(out, e.Table.Table)
	}
	for _, r := range p.Rollups {
		out = append(out, r.Table.Table)
	}
	return out
}

// States returns how many Redis states the join has: one for two tables;
// for a tree one per table, one per roll-up's aggregates (the tree's
// entry of its results), and one per roll-up's children.
func (p *JoinPlan) States() int {
	if p.Edges == nil {
		return 1
	}
	return 1 + len(p.Edges) + 2*len(p.Rollups)
}

// EdgePlan is one entry of the list form resolved: the foreign-key edge
// from the table of entry Parent (-1: the left table) to Table.Table. In
// Table, Key is the referenced key, ForeignKey the parent's referencing
// columns, Values the projected columns.
type EdgePlan struct {
	Alias  string
	Parent int
	Type   string
	Table  TablePlan
}

// Resolve looks every join up in the source catalog: tables, keys (primary
// keys by default), columns (all by default), types and FK/key compatibility.
// It reports every problem at once as a *ConfigError.
func Resolve(ctx context.Context, db Querier, cfg *config.Config) ([]*JoinPlan, error) {
	var problems []string
	plans := make([]*JoinPlan, 0, len(cfg.Joins))
	cache := map[config.TableName]*catalogTable{}
	lookup := func(t config.TableName) (*catalogTable, error) {
		if ct, ok := cache[t]; ok {
			return ct, nil
		}
		ct, err := describeTable(ctx, db, t)
		if err != nil {
			return nil, err
		}
		cache[t] = ct
		return ct, nil
	}
	for _, jc := range cfg.Joins {
		p, probs, err := resolveJoin(jc, lookup)
		if err != nil {
			return nil, err
		}
		problems = append(problems, probs...)
		if p != nil {
			err := resolveGenerated(p, lookup, func(format string, args ...any) {
				problems = append(problems, fmt.Sprintf("join %q: ", jc.Name)+fmt.Sprintf(format, args...))
			})
			if err != nil {
				return nil, err
			}
			computedInto(p)
			plans = append(plans, p)
		}
	}
	if len(problems) > 0 {
		// A table joined twice (as) reports its own problems once.
		seen := map[string]bool{}
		problems = slices.DeleteFunc(problems, func(p string) bool {
			dup := seen[p]
			seen[p] = true
			return dup
		})
		return nil, &config.ConfigError{Problems: problems}
	}
	return plans, nil
}

// Querier is the part of pgx used for catalog queries.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type catalogTable struct {
	name    config.TableName
	exists  bool
	columns []SourceColumn
	byName  map[string]SourceColumn
	pk      []string
	replica string
	// partitioned says relkind is 'p'.
	partitioned bool
	// identity are the columns of the replica identity index (replica "i").
	identity []string
	// leaves are the leaf partitions of a partitioned table: pgoutput sends
	// each change with the replica identity of the leaf that holds the row.
	leaves []replicaOf
	// uniques are the table's valid unique indexes on plain columns, not
	// partial (the primary key among them).
	uniques []uniqueIndex
	// generated holds the generation expression of each stored generated
	// column, and genInputs the columns each reads: logical replication
	// leaves them out of its messages.
	generated map[string]string
	genInputs []genInput
	// collations are the columns' collations (the database's for
	// "default"; "" for a type without one), and exprCollation those of the
	// expressions probed.
	collations    map[string]string
	exprCollation map[string]string
	// toastable says a column's values may be stored out of line (storage
	// extended, external or main): an update that leaves such a value
	// unchanged does not send it.
	toastable map[string]bool
	// probe resolves an expression over the table (probeExpr).
	probe func(expr string) (exprInfo, string, error)
	// similar, for a table that does not exist, is the one of a close name
	// ("" when none is close).
	similar string
}

// similarTable returns the table or partitioned table of the source whose
// name t's is likely a misspelling of (in t's schema, or of the same name
// in another), or "".
func similarTable(ctx context.Context, db Querier, t config.TableName) (string, error) {
	rows, err := db.Query(ctx, `SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND (n.nspname = $1 OR c.relname = $2)
			AND n.nspname NOT IN ('pg_catalog', 'information_schema')`, t.Schema, t.Name)
	if err != nil {
		return "", fmt.Errorf("look up tables like %s: %w", t, err)
	}
	var names []string
	byName := map[string]config.TableName{}
	for rows.Next() {
		var o config.TableName
		if err := rows.Scan(&o.Schema, &o.Name); err != nil {
			rows.Close()
			return "", err
		}
		if o.Name == t.Name { // the same name in another schema
			return o.String(), nil
		}
		names = append(names, o.Name)
		byName[o.Name] = o
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if near := config.Closest(t.Name, names); near != "" {
		return byName[near].String(), nil
	}
	return "", nil
}

// notFound is how a missing table is reported: with the table of a close
// name, when there is one.
func (ct *catalogTable) notFound() string {
	if ct.similar != "" {
		return fmt.Sprintf("table %s does not exist in the source database (did you mean %s?)", ct.name, ct.similar)
	}
	return fmt.Sprintf("table %s does not exist in the source database", ct.name)
}

// uniqueIndex is a unique index (or constraint) of a table.
type uniqueIndex struct {
	Name    string
	Columns []string
	// Immediate is false for a DEFERRABLE constraint: inside a
	// transaction two rows may then hold one key.
	Immediate bool
	// NullsNotDistinct is set by NULLS NOT DISTINCT.
	NullsNotDistinct bool
}

// replicaOf is one relation's replica identity.
type replicaOf struct {
	name     string
	replica  string
	pk       []string
	identity []string
}

// collationSQL is the name of the collation of pg_attribute a: the
// database's own for "default", "" for a type without one.
const collationSQL = `coalesce((SELECT CASE co.collname WHEN 'default' THEN (SELECT datcollate FROM pg_database WHERE datname = current_database())
	ELSE co.collname END FROM pg_collation co WHERE co.oid = a.attcollation), '')`

func describeTable(ctx context.Context, db Querier, t config.TableName) (*catalogTable, error) {
	ct := &catalogTable{name: t, byName: map[string]SourceColumn{}, toastable: map[string]bool{},
		collations: map[string]string{}, exprCollation: map[string]string{}}
	ct.probe = func(expr string) (exprInfo, string, error) { return probeExpr(ctx, db, ct, expr) }
	var oid uint32
	err := db.QueryRow(ctx, `
		SELECT c.oid, c.relreplident::text, c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')`, t.Schema, t.Name).Scan(&oid, &ct.replica, &ct.partitioned)
	if errors.Is(err, pgx.ErrNoRows) {
		ct.similar, err = similarTable(ctx, db, t)
		return ct, err
	}
	if err != nil {
		return nil, fmt.Errorf("look up table %s: %w", t, err)
	}
	ct.exists = true
	rows, err := db.Query(ctx, `
		SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid, a.atttypmod, a.attnotnull,
			CASE WHEN a.attgenerated <> '' THEN pg_get_expr(d.adbin, d.adrelid) END, a.attstorage IN ('x', 'e', 'm'),
			`+collationSQL+`
		FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("describe table %s: %w", t, err)
	}
	for rows.Next() {
		c := SourceColumn{HasTypeMod: true}
		var gen *string
		var toast bool
		var coll string
		if err := rows.Scan(&c.Name, &c.Type, &c.TypeOID, &c.TypeMod, &c.NotNull, &gen, &toast, &coll); err != nil {
			return nil, err
		}
		ct.collations[c.Name] = coll
		ct.toastable[c.Name] = toast
		ct.columns = append(ct.columns, c)
		ct.byName[c.Name] = c
		if gen != nil {
			if ct.generated == nil {
				ct.generated = map[string]string{}
			}
			ct.generated[c.Name] = *gen
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("describe table %s: %w", t, err)
	}
	if len(ct.generated) > 0 {
		if ct.genInputs, err = readGeneratedInputs(ctx, db, oid); err != nil {
			return nil, fmt.Errorf("describe table %s: %w", t, err)
		}
	}
	err = db.QueryRow(ctx, `
		SELECT coalesce(array_agg(a.attname ORDER BY k.ord), '{}') FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1 AND i.indisprimary`, oid).Scan(&ct.pk)
	if err != nil {
		return nil, fmt.Errorf("read primary key of %s: %w", t, err)
	}
	if ct.identity, err = indexColumns(ctx, db, oid, "indisreplident"); err != nil {
		return nil, fmt.Errorf("read replica identity of %s: %w", t, err)
	}
	rows, err = db.Query(ctx, `
		SELECT i.indexrelid::regclass::text,
			(SELECT array_agg(a.attname ORDER BY k.ord) FROM unnest(i.indkey[:i.indnkeyatts - 1]) WITH ORDINALITY AS k(attnum, ord)
				JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum),
			i.indimmediate,
			-- NULLS NOT DISTINCT is new in Postgres 15: read it so that older servers answer too
			coalesce((to_jsonb(i) ->> 'indnullsnotdistinct')::boolean, false)
		FROM pg_index i WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid
			AND i.indpred IS NULL AND i.indexprs IS NULL ORDER BY 1`, oid)
	if err != nil {
		return nil, fmt.Errorf("read unique indexes of %s: %w", t, err)
	}
	if ct.uniques, err = pgx.CollectRows(rows, pgx.RowToStructByPos[uniqueIndex]); err != nil {
		return nil, fmt.Errorf("read unique indexes of %s: %w", t, err)
	}
	// The leaves with their keys in one statement, one snapshot: a
	// partition dropped (or detached) between two reads would show no
	// primary key, and fail the check for a table that is fine.
	rows, err = db.Query(ctx, `
		SELECT p.relid::regclass::text, c.relreplident::text,
			(`+indexColumnsSQL("c.oid", "indisprimary")+`), (`+indexColumnsSQL("c.oid", "indisreplident")+`)
		FROM pg_partition_tree($1::oid) p
		JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf AND p.relid <> $1::oid ORDER BY 1`, oid)
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t, err)
	}
	for rows.Next() {
		var l replicaOf
		if err := rows.Scan(&l.name, &l.replica, &l.pk, &l.identity); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list partitions of %s: %w", t, err)
		}
		ct.leaves = append(ct.leaves, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list partitions of %s: %w", t, err)
	}
	return ct, nil
}

// indexColumns returns the columns of the relation's index marked by flag
// (indisprimary or indisreplident), empty when it has none.
func indexColumns(ctx context.Context, db Querier, oid uint32, flag string) ([]string, error) {
	var cols []string
	err := db.QueryRow(ctx, indexColumnsSQL("$1", flag), oid).Scan(&cols)
	return cols, err
}

// indexColumnsSQL is the query of the columns, in order, of the index of
// the relation rel (an expression) that has flag set: an empty array when
// there is none.
func indexColumnsSQL(rel, flag string) string {
	return `SELECT coalesce(array_agg(a.attname ORDER BY k.ord), '{}') FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = ` + rel + ` AND i.` + flag
}

func resolveJoin(jc config.JoinConfig, lookup func(config.TableName) (*catalogTable, error)) (*JoinPlan, []string, error) {
	if len(jc.Rollups) > 0 && !jc.IsList() {
		// A join with roll-ups runs as a tree: its right, if any, is its
		// one entry.
		jc.Rights = []config.RightConfig{}
		if !jc.Right.Table.IsZero() {
			r := jc.Right
			r.ForeignKey = jc.Left.ForeignKey
			jc.Rights = append(jc.Rights, r)
		}
	}
	if jc.IsList() {
		return resolveList(jc, lookup)
	}
	probs := &joinProblems{join: jc.Name}
	add := probs.add
	left, err := lookup(jc.Left.Table)
	if err != nil {
		return nil, nil, err
	}
	right, err := lookup(jc.Right.Table)
	if err != nil {
		return nil, nil, err
	}
	if !left.exists {
		add("left %s; check left.table", left.notFound())
	}
	if !right.exists {
		add("right %s; check right.table", right.notFound())
	}
	if !left.exists || !right.exists {
		return nil, probs.list, nil
	}

	p := &JoinPlan{Name: jc.Name, Type: jc.Type}
	p.Left.Table, p.Right.Table = jc.Left.Table, jc.Right.Table
	p.Left.Replica, p.Right.Replica = left.replica, right.replica
	p.Left.Partitioned, p.Right.Partitioned = left.partitioned, right.partitioned

	p.Left.Key = resolveKey(left, jc.Left.Key, "left", add)
	p.Right.Key = resolveKey(right, jc.Right.Key, "right", add)
	p.Left.ForeignKey = resolveColumns(left, jc.Left.ForeignKey, "left.foreign_key", add)
	for i, c := range p.Left.ForeignKey {
		if i < len(p.Right.Key) {
			if err := join.CheckKeyTypes(c.Type, p.Right.Key[i].Type); err != nil {
				add("left.foreign_key %q -> right.key %q: %v", c.Name, p.Right.Key[i].Name, err)
			}
		}
	}
	if len(p.Left.ForeignKey) != len(p.Right.Key) && len(p.Left.ForeignKey) > 0 && len(p.Right.Key) > 0 {
		add("left.foreign_key has %d columns but right.key has %d; they must match in number and order",
			len(p.Left.ForeignKey), len(p.Right.Key))
	}
	resolveLeft(left, jc.Left, &p.Left, add)
	p.Right.Values = rightOutput(right, jc.Right, &p.Right, "right", add)
	resolveWhere(right, &p.Right, jc.Right.Where, "right.where", add)
	checkReplicaIdentity(right, p.Right.Key, "right", add)
	checkUnique(right, p.Right.Key, "right", add)
	if len(probs.list) > 0 || !finishPlan(p, jc, add) {
		return nil, probs.list, nil
	}
	p.Spec = SpecOf(p)
	return p, nil, nil
}

// resolveLeft fills the left table's output and checks its key: types,
// replica identity, uniqueness. tp.Key is resolved already.
func resolveLeft(ct *catalogTable, lc config.LeftConfig, tp *TablePlan, add func(string, ...any)) {
	for _, c := range tp.Key {
		if err := join.CheckKeyTypes(c.Type, c.Type); err != nil {
			add("left.key %q: %v", c.Name, err)
		}
	}
	tp.KeyNames, tp.Values = leftOutput(ct, lc, tp, add)
	resolveWhere(ct, tp, lc.Where, "left.where", add)
	checkReplicaIdentity(ct, tp.Key, "left", add)
	checkUnique(ct, tp.Key, "left", add)
}

// finishPlan sets p's target and fingerprint, and reports whether the
// target is valid.
func finishPlan(p *JoinPlan, jc config.JoinConfig, add func(string, ...any)) bool {
	p.Target = TargetTable(jc.Target.Table, p)
	if err := p.Target.Validate(); err != nil {
		add("%v", err)
		return false
	}
	p.Fingerprint = Fingerprint(p)
	return true
}

func resolveKey(ct *catalogTable, names []string, side string, add func(string, ...any)) []SourceColumn {
	if len(names) == 0 {
		if len(ct.pk) == 0 {
			add("table %s has no primary key; set %s.key in the config", ct.name, side)
			return nil
		}
		names = ct.pk
	}
	return resolveColumns(ct, names, side+".key", add)
}

func resolveColumns(ct *catalogTable, names []string, what string, add func(string, ...any)) []SourceColumn {
	out := make([]SourceColumn, 0, len(names))
	for _, n := range names {
		c, ok := ct.byName[n]
		if !ok {
			add("%s: table %s has no column %q%s", what, ct.name, n, suggest(ct, n))
			continue
		}
		if expr, gen := ct.generated[n]; gen {
			add("%s: column %q of %s is generated (GENERATED ALWAYS AS (%s) STORED): fkmat follows generated columns in the output, "+
				"not as a key or foreign key; use the columns it is computed from", what, n, ct.name, expr)
			continue
		}
		out = append(out, c)
	}
	return out
}

func suggest(ct *catalogTable, name string) string {
	for _, c := range ct.columns {
		if strings.EqualFold(c.Name, name) {
			return fmt.Sprintf(" (did you mean %q? names are case-sensitive)", c.Name)
		}
	}
	names := make([]string, len(ct.columns))
	for i, c := range ct.columns {
		names[i] = c.Name
	}
	return "; its columns are " + strings.Join(names, ", ")
}

// leftOutput returns the output names of the key columns and the other
// projected left columns, in order.
func leftOutput(ct *catalogTable, lc config.LeftConfig, tp *TablePlan, add func(string, ...any)) ([]string, []OutputColumn) {
	key := tp.Key
	refs := lc.Columns
	if len(refs) == 0 {
		for _, c := range ct.columns {
			refs = append(refs, config.ColumnRef{Name: c.Name, Alias: c.Name})
		}
	}
	keyNames := make([]string, len(key))
	isKey := map[string]int{}
	for i, k := range key {
		keyNames[i] = k.Name
		isKey[k.Name] = i
	}
	var values []OutputColumn
	for _, r := range refs {
		if r.Expr != "" {
			if c, ok := expression(ct, tp, r.Expr, false, "left.columns", add); ok {
				values = append(values, OutputColumn{Source: c, Name: r.Alias})
			}
			continue
		}
		c, ok := ct.byName[r.Name]
		if !ok {
			add("left.columns: table %s has no column %q%s", ct.name, r.Name, suggest(ct, r.Name))
			continue
		}
		if i, k := isKey[r.Name]; k {
			keyNames[i] = r.Alias
			continue
		}
		values = append(values, OutputColumn{Source: c, Name: r.Alias})
	}
	return keyNames, values
}

func rightOutput(ct *catalogTable, rc config.RightConfig, tp *TablePlan, side string, add func(string, ...any)) []OutputColumn {
	key := tp.Key
	refs := rc.Columns
	if len(refs) == 0 {
		isKey := map[string]bool{}
		for _, k := range key {
			isKey[k.Name] = true
		}
		for _, c := range ct.columns {
			if !isKey[c.Name] {
				refs = append(refs, config.ColumnRef{Name: c.Name, Alias: c.Name})
			}
		}
	}
	var values []OutputColumn
	for _, r := range refs {
		if r.Expr != "" {
			if c, ok := expression(ct, tp, r.Expr, false, side+".columns", add); ok {
				values = append(values, OutputColumn{Source: c, Name: r.Alias})
			}
			continue
		}
		c, ok := ct.byName[r.Name]
		if !ok {
			add("%s.columns: table %s has no column %q%s", side, ct.name, r.Name, suggest(ct, r.Name))
			continue
		}
		values = append(values, OutputColumn{Source: c, Name: r.Alias})
	}
	return values
}

// checkReplicaIdentity makes sure UPDATEs and DELETEs carry the key:
// pgoutput sends only the replica identity columns of the old row. For a
// partitioned table, the identity that counts is each leaf partition's.
// checkUnique checks that key identifies one row at every moment: a unique
// index on some of its columns (the primary key, or a unique constraint
// that is not DEFERRABLE, and NULLS NOT DISTINCT unless its columns are NOT
// NULL). The engine keeps one state per key; two rows sharing a key would
// be merged into one, silently.
func checkUnique(ct *catalogTable, key []SourceColumn, side string, add func(string, ...any)) {
	if len(key) == 0 {
		return // already reported
	}
	in := map[string]SourceColumn{}
	var names []string
	for _, c := range key {
		in[c.Name] = c
		names = append(names, c.Name)
	}
	var deferrable string
	for _, u := range ct.uniques {
		covered := len(u.Columns) > 0
		for _, c := range u.Columns {
			if k, ok := in[c]; !ok || (!k.NotNull && !u.NullsNotDistinct) {
				covered = false
			}
		}
		if !covered {
			continue
		}
		if u.Immediate {
			return
		}
		deferrable = u.Name
	}
	if deferrable != "" {
		add("%s.key (%s) of %s is unique only through %s, which is DEFERRABLE: inside a transaction two rows may hold one key; "+
			"make the constraint NOT DEFERRABLE, or set %s.key to columns of another unique index", side, strings.Join(names, ", "), ct.name, deferrable, side)
		return
	}
	add("%s.key (%s) of %s is not unique: no primary key or unique index on NOT NULL columns among them (not partial, not on expressions); "+
		"fkmat keeps one state per key: create such an index, or set %s.key to the primary key", side, strings.Join(names, ", "), ct.name, side)
}

func checkReplicaIdentity(ct *catalogTable, key []SourceColumn, side string, add func(string, ...any)) {
	if len(ct.leaves) == 0 {
		checkIdentity(replicaOf{name: ct.name.String(), replica: ct.replica, pk: ct.pk, identity: ct.identity}, ct.name, key, side, add)
		return
	}
	for _, l := range ct.leaves {
		if !checkIdentity(l, ct.name, key, side, add) {
			return // one message is enough: the others have the same fix
		}
	}
}

// checkIdentity checks one relation's replica identity against key and
// reports whether it is fine.
func checkIdentity(r replicaOf, table config.TableName, key []SourceColumn, side string, add func(string, ...any)) bool {
	of := ""
	if r.name != table.String() {
		of = fmt.Sprintf(" (partition %s of %s)", r.name, table)
	}
	var cols []string
	switch r.replica {
	case "f":
		return true
	case "n":
		add("table %s%s has REPLICA IDENTITY NOTHING, so its deletes cannot be followed; run ALTER TABLE %s REPLICA IDENTITY DEFAULT (or FULL)",
			r.name, of, r.name)
		return false
	case "i":
		cols = r.identity
	default:
		cols = r.pk
	}
	have := map[string]bool{}
	for _, n := range cols {
		have[n] = true
	}
	for _, k := range key {
		if !have[k.Name] {
			what := "the primary key"
			if r.replica == "i" {
				what = "the replica identity index"
			}
			add("%s.key column %q is not part of %s of %s%s, so updates and deletes do not carry it; "+
				"use the primary key or run ALTER TABLE %s REPLICA IDENTITY FULL", side, k.Name, what, r.name, of, r.name)
			return false
		}
	}
	return true
}

func TargetTable(name config.TableName, p *JoinPlan) sink.Table {
	t := sink.Table{Schema: name.Schema, Name: name.Name, KeyCount: len(p.Left.Key)}
	for i, k := range p.Left.Key {
		t.Columns = append(t.Columns, sink.Column{Name: p.Left.KeyNames[i], Type: k.Type})
	}
	for _, v := range p.Left.Values {
		t.Columns = append(t.Columns, sink.Column{Name: v.Name, Type: v.Source.Type})
	}
	right := p.Right.Values
	for i, e := range p.Edges { // the list form: every entry's columns, in order
		if i == len(p.Edges)-1 {
			right = e.Table.Values
			break
		}
		for _, v := range e.Table.Values {
			t.Columns = append(t.Columns, sink.Column{Name: v.Name, Type: v.Source.Type})
		}
	}
	t.RightFrom = len(t.Columns)
	for _, v := range right {
		t.Columns = append(t.Columns, sink.Column{Name: v.Name, Type: v.Source.Type})
	}
	for _, r := range p.Rollups {
		for _, a := range r.Aggregates {
			t.Columns = append(t.Columns, sink.Column{Name: a.Name, Type: a.Type})
		}
	}
	return t
}

// Families returns the key families of cols.
func Families(cols []SourceColumn) []join.Family {
	f := make([]join.Family, len(cols))
	for i, c := range cols {
		f[i] = join.FamilyOf(c.Type)
	}
	return f
}

func SpecOf(p *JoinPlan) join.Spec {
	typ := join.Left
	if p.Type == config.JoinInner {
		typ = join.Inner
	}
	return join.Spec{
		Name:        p.Name,
		Type:        typ,
		PK:          Families(p.Left.Key),
		FK:          Families(p.Left.ForeignKey),
		RightKey:    Families(p.Right.Key),
		LeftValues:  len(p.Left.Values),
		RightValues: len(p.Right.Values),

		LeftPartitioned:  p.Left.Partitioned,
		RightPartitioned: p.Right.Partitioned,
	}
}

// Fingerprint hashes what the target and the state depend on: tables, keys,
// columns and their types, join type.
func Fingerprint(p *JoinPlan) string {
	sum := sha256.Sum256(Definition(p))
	return hex.EncodeToString(sum[:12])
}

// joinProblems gathers the problems of one join, each named by the join.
type joinProblems struct {
	join string
	list []string
}

func (p *joinProblems) add(format string, args ...any) {
	p.list = append(p.list, fmt.Sprintf("join %q: ", p.join)+fmt.Sprintf(format, args...))
}

// resolveList resolves the list form of a join (README, "Joins of more than
// two tables"): every table, key, foreign key (in its `from` table),
// FK/key types per edge, replica identities, unique keys, and output names.
// A list form that resolves runs as a join.Tree (pipeline.TreeLayoutOf).
func resolveList(jc config.JoinConfig, lookup func(config.TableName) (*catalogTable, error)) (*JoinPlan, []string, error) {
	probs := &joinProblems{join: jc.Name}
	add := probs.add
	left, err := lookup(jc.Left.Table)
	if err != nil {
		return nil, nil, err
	}
	cts := []*catalogTable{left} // index k+1: entry k
	if !left.exists {
		add("left %s; check left.table", left.notFound())
	}
	for i, r := range jc.Rights {
		ct, err := lookup(r.Table)
		if err != nil {
			return nil, nil, err
		}
		if !ct.exists {
			add("right[%d] (%s): %s; check its table", i, r.Alias(), ct.notFound())
		}
		cts = append(cts, ct)
	}
	if len(probs.list) > 0 {
		return nil, probs.list, nil
	}
	// The list form is a tree, even of the left table alone (with roll-ups).
	p := &JoinPlan{Name: jc.Name, Type: jc.Type, Edges: []EdgePlan{}}
	p.Left.Table, p.Left.Replica, p.Left.Partitioned = jc.Left.Table, left.replica, left.partitioned
	p.Left.Key = resolveKey(left, jc.Left.Key, "left", add)
	resolveLeft(left, jc.Left, &p.Left, add)
	for i, r := range jc.Rights {
		where := fmt.Sprintf("right[%d] (%s)", i, r.Alias())
		parent, err := jc.ParentOf(i)
		if err != nil {
			add("%s: %v", where, err)
			continue
		}
		ct, from := cts[i+1], cts[parent+1]
		e := EdgePlan{Alias: r.Alias(), Parent: parent, Type: r.Type}
		e.Table.Table, e.Table.Replica, e.Table.Partitioned = r.Table, ct.replica, ct.partitioned
		e.Table.Key = resolveKey(ct, r.Key, where, add)
		e.Table.ForeignKey = resolveColumns(from, r.ForeignKey, where+".foreign_key", add)
		for k, c := range e.Table.ForeignKey {
			if k < len(e.Table.Key) {
				if err := join.CheckKeyTypes(c.Type, e.Table.Key[k].Type); err != nil {
					add("%s: foreign_key %q -> key %q: %v", where, c.Name, e.Table.Key[k].Name, err)
				}
			}
		}
		if len(e.Table.ForeignKey) != len(e.Table.Key) && len(e.Table.ForeignKey) > 0 && len(e.Table.Key) > 0 {
			add("%s: foreign_key has %d columns but key has %d; they must match in number and order", where, len(e.Table.ForeignKey), len(e.Table.Key))
		}
		e.Table.Values = rightOutput(ct, r, &e.Table, where, add)
		resolveWhere(ct, &e.Table, r.Where, where+".where", add)
		checkReplicaIdentity(ct, e.Table.Key, where, add)
		checkUnique(ct, e.Table.Key, where, add)
		p.Edges = append(p.Edges, e)
	}
	if err := resolveRollups(jc, p, lookup, add); err != nil {
		return nil, nil, err
	}
	// Output names: one column per name in the target.
	owner := map[string]string{}
	claim := func(name, from string) {
		if prev, dup := owner[name]; dup {
			add("output column %q comes from %s and from %s; rename one with `AS` in its columns", name, prev, from)
			return
		}
		owner[name] = from
	}
	for _, n := range p.Left.KeyNames {
		claim(n, "the left table")
	}
	for _, v := range p.Left.Values {
		claim(v.Name, "the left table")
	}
	for _, e := range p.Edges {
		for _, v := range e.Table.Values {
			claim(v.Name, e.Alias)
		}
	}
	for _, r := range p.Rollups {
		for _, a := range r.Aggregates {
			claim(a.Name, "the roll-up of "+r.Table.Table.String())
		}
	}
	if len(probs.list) > 0 || !finishPlan(p, jc, add) {
		return nil, probs.list, nil
	}
	return p, nil, nil
}

// Carried is what the rows of each table of a list-form join carry past
// their key.
type Carried struct {
	// Columns[t] (t = 0 the left table, i+1 entry i) are, in order, the
	// table's output columns, then the foreign-key columns of the entries
	// that reference the table, when they are not output.
	Columns [][]SourceColumn
	// Shown[t] is how many of Columns[t] the target shows.
	Shown []int
}

// CarriedOf returns what the rows of each table of p carry.
func CarriedOf(p *JoinPlan) Carried {
	var l Carried
	carry := func(values []OutputColumn, children []int) ([]SourceColumn, int) {
		var cols []SourceColumn
		for _, v := range values {
			cols = append(cols, v.Source)
		}
		shown := len(cols)
		for _, c := range children {
			for _, fk := range p.Edges[c].Table.ForeignKey {
				if !slices.ContainsFunc(cols, func(s SourceColumn) bool { return s.Name == fk.Name }) {
					cols = append(cols, fk)
				}
			}
		}
		return cols, shown
	}
	children := make([][]int, len(p.Edges)+1)
	for i, e := range p.Edges {
		children[e.Parent+1] = append(children[e.Parent+1], i)
	}
	cols, shown := carry(p.Left.Values, children[0])
	l.Columns, l.Shown = append(l.Columns, cols), append(l.Shown, shown)
	for i, e := range p.Edges {
		cols, shown := carry(e.Table.Values, children[i+1])
		l.Columns, l.Shown = append(l.Columns, cols), append(l.Shown, shown)
	}
	// A roll-up is an entry of the tree whose rows are its results, by
	// parent key: they carry the aggregates.
	for _, r := range p.Rollups {
		var cols []SourceColumn
		for _, a := range r.Aggregates {
			cols = append(cols, SourceColumn{Name: a.Name, Type: a.Type, TypeMod: -1})
		}
		l.Columns, l.Shown = append(l.Columns, cols), append(l.Shown, len(cols))
	}
	return l
}
