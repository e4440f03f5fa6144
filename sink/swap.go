package sink

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// A rebuild fills a shadow table beside the target and replaces the
// target's rows with the shadow's in one transaction (Swap), so that
// readers see the old rows until the commit and the new ones after it:
// never a missing, empty or partial target.
//
// Two ways, chosen by what is attached to the target:
//
//   - rename: the target is renamed away, the shadow takes its name, the
//     grants (table and column), the comments and the primary key's name
//     are carried over, and the old table is dropped. It takes an ACCESS
//     EXCLUSIVE lock for a moment, whatever the size, and works for a
//     changed shape too.
//   - merge: the target is kept and made equal to the shadow: rows that
//     are gone are deleted, new and changed rows are upserted, identical
//     rows are not written. Everything attached to the target stays
//     (indexes, triggers, views, policies, publications, foreign keys), no
//     lock beyond a writer's is taken, and subscribers of a publication
//     that includes the target see only the rows that differ. It reads
//     both tables whole, and needs the same shape.

// ShadowOf returns the table a rebuild of t fills: the same schema,
// columns and key under a name derived from t's.
func ShadowOf(t *Table) *Table {
	s := *t
	s.Name = derivedName(t.Name, "new")
	return &s
}

// derivedName is name with a kind and a hash of name appended, cut to fit
// Postgres's 63-byte identifiers.
func derivedName(name, kind string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	base := name
	for len(base) > 40 {
		_, size := utf8.DecodeLastRuneInString(base)
		base = base[:len(base)-size]
	}
	return fmt.Sprintf("%s_fkmat_%s_%08x", base, kind, h.Sum32())
}

// CreateSQL is the statement that creates t: its columns with their exact
// types and its key as primary key.
func CreateSQL(t *Table) string {
	defs := make([]string, len(t.Columns))
	keys := make([]string, t.KeyCount)
	for i, c := range t.Columns {
		defs[i] = pgx.Identifier{c.Name}.Sanitize() + " " + c.Type
		if i < t.KeyCount {
			keys[i] = pgx.Identifier{c.Name}.Sanitize()
		}
	}
	return "CREATE TABLE " + t.Ident() + " (" + strings.Join(defs, ", ") + ", PRIMARY KEY (" + strings.Join(keys, ", ") + "))"
}

// attachedQuery lists what is attached to the table $1 (a regclass) that a
// rename would not carry over: views and rules, publications, triggers,
// row security, indexes and constraints besides the primary key, foreign
// keys from other tables, inheritance, extended statistics, storage
// parameters, a replica identity other than the key, and an owner other
// than the current user.
const attachedQuery = `
	WITH t AS (SELECT c.oid, c.relowner, c.relrowsecurity, c.reloptions, c.relreplident, c.relnamespace FROM pg_class c WHERE c.oid = $1::regclass)
	SELECT 'view or rule ' || r.ev_class::regclass FROM t JOIN pg_depend d ON d.refobjid = t.oid AND d.classid = 'pg_rewrite'::regclass
		JOIN pg_rewrite r ON r.oid = d.objid WHERE r.ev_class <> t.oid
	UNION SELECT 'rule ' || quote_ident(r.rulename) FROM t JOIN pg_rewrite r ON r.ev_class = t.oid
	UNION SELECT 'publication ' || quote_ident(p.pubname) FROM t, pg_publication p WHERE p.puballtables
		OR EXISTS (SELECT FROM pg_publication_rel pr WHERE pr.prpubid = p.oid AND pr.prrelid = t.oid)
		OR EXISTS (SELECT FROM pg_publication_namespace pn WHERE pn.pnpubid = p.oid AND pn.pnnspid = t.relnamespace)
	UNION SELECT 'trigger ' || quote_ident(tg.tgname) FROM t JOIN pg_trigger tg ON tg.tgrelid = t.oid WHERE NOT tg.tgisinternal
	UNION SELECT 'policy ' || quote_ident(po.polname) FROM t JOIN pg_policy po ON po.polrelid = t.oid
	UNION SELECT 'row level security' FROM t WHERE t.relrowsecurity
	UNION SELECT 'index ' || i.indexrelid::regclass FROM t JOIN pg_index i ON i.indrelid = t.oid WHERE NOT i.indisprimary
	UNION SELECT 'constraint ' || quote_ident(co.conname) FROM t JOIN pg_constraint co ON co.conrelid = t.oid WHERE co.contype <> 'p'
	UNION SELECT 'foreign key ' || quote_ident(co.conname) || ' of ' || co.conrelid::regclass FROM t JOIN pg_constraint co ON co.confrelid = t.oid
	UNION SELECT 'inheritance' FROM t WHERE EXISTS (SELECT FROM pg_inherits WHERE inhrelid = t.oid OR inhparent = t.oid)
	UNION SELECT 'statistics ' || quote_ident(s.stxname) FROM t JOIN pg_statistic_ext s ON s.stxrelid = t.oid
	UNION SELECT 'storage parameters' FROM t WHERE t.reloptions IS NOT NULL
	UNION SELECT 'replica identity' FROM t WHERE t.relreplident NOT IN ('d', 'p')
	UNION SELECT 'owner ' || t.relowner::regrole FROM t WHERE t.relowner <> (SELECT oid FROM pg_roles WHERE rolname = current_user)
	ORDER BY 1`

// Attached lists what is attached to table t that a rename swap would not
// carry over (see attachedQuery); none when t does not exist.
func (w *Writer) Attached(ctx context.Context, t *Table) ([]string, error) {
	var oid *uint32
	if err := w.pool.QueryRow(ctx, `SELECT to_regclass($1)::oid`, t.Ident()).Scan(&oid); err != nil {
		return nil, fmt.Errorf("look up target table %s: %w", t.Ident(), err)
	}
	if oid == nil {
		return nil, nil
	}
	rows, err := w.pool.Query(ctx, attachedQuery, t.Ident())
	if err != nil {
		return nil, fmt.Errorf("list what is attached to %s: %w", t.Ident(), err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list what is attached to %s: %w", t.Ident(), err)
	}
	return out, nil
}

// SwapKind is how Swap replaced a target's rows.
type SwapKind string

const (
	SwapCreated SwapKind = "created" // there was no target: the shadow took its name
	SwapRenamed SwapKind = "renamed"
	SwapMerged  SwapKind = "merged"
)

// ErrCannotSwap means the target has attachments that a rename swap would
// lose while its shape differs from the new one, so that neither way works.
var ErrCannotSwap = errors.New("cannot replace the target")

// Swap replaces the rows of target with those of shadow, inside the
// transaction, and drops shadow: by a rename when nothing that a rename
// loses is attached to the target, else by a merge (see the comment at
// the top of this file). It reports the way it took.
func (t *Tx) Swap(ctx context.Context, target, shadow *Table) (SwapKind, error) {
	var oid *uint32
	if err := t.tx.QueryRow(ctx, `SELECT to_regclass($1)::oid`, target.Ident()).Scan(&oid); err != nil {
		return "", fmt.Errorf("look up target table %s: %w", target.Ident(), err)
	}
	if oid == nil {
		if _, err := t.tx.Exec(ctx, "ALTER TABLE "+shadow.Ident()+" RENAME TO "+pgx.Identifier{target.Name}.Sanitize()); err != nil {
			return "", fmt.Errorf("create target %s: %w", target.Ident(), err)
		}
		return SwapCreated, nil
	}
	rows, err := t.tx.Query(ctx, attachedQuery, target.Ident())
	if err != nil {
		return "", fmt.Errorf("list what is attached to %s: %w", target.Ident(), err)
	}
	attached, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("list what is attached to %s: %w", target.Ident(), err)
	}
	if len(attached) == 0 {
		return SwapRenamed, t.rename(ctx, target, shadow)
	}
	if err := t.sameShape(ctx, target); err != nil {
		return "", fmt.Errorf("%w %s with the join's new shape: %s are attached to it, and a rename would lose them: %w",
			ErrCannotSwap, target.Ident(), strings.Join(attached, ", "), err)
	}
	return SwapMerged, t.merge(ctx, target, shadow)
}

// sameShape checks that the target has the shape of table.
func (t *Tx) sameShape(ctx context.Context, table *Table) error {
	rows, err := t.tx.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, table.Ident())
	if err != nil {
		return fmt.Errorf("describe target table %s: %w", table.Ident(), err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Column, error) {
		var c Column
		return c, r.Scan(&c.Name, &c.Type)
	})
	if err != nil {
		return fmt.Errorf("describe target table %s: %w", table.Ident(), err)
	}
	var key []string
	err = t.tx.QueryRow(ctx, `
		SELECT coalesce(array_agg(a.attname ORDER BY k.ord), '{}') FROM pg_index i
		CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1::regclass AND i.indisprimary`, table.Ident()).Scan(&key)
	if err != nil {
		return fmt.Errorf("read primary key of %s: %w", table.Ident(), err)
	}
	return compareShape(table, cols, key)
}

// rename is Swap by renaming: the old table's grants, comments and
// primary key name go to the shadow, which takes the target's name.
func (t *Tx) rename(ctx context.Context, target, shadow *Table) error {
	old := *target
	old.Name = derivedName(target.Name, "old")
	// What the old table carries, read before it is renamed, as
	// statements for the new one.
	rows, err := t.tx.Query(ctx, `
		WITH t AS (SELECT c.oid, c.relowner, c.relacl FROM pg_class c WHERE c.oid = $1::regclass)
		SELECT format('GRANT %s ON %s TO %s%s', a.privilege_type, $2::text,
				CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
				CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
			FROM t, aclexplode(t.relacl) a WHERE a.grantee <> t.relowner
		UNION ALL
		SELECT format('GRANT %s (%s) ON %s TO %s%s', a.privilege_type, quote_ident(att.attname), $2::text,
				CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
				CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
			FROM t JOIN pg_attribute att ON att.attrelid = t.oid AND att.attnum > 0 AND NOT att.attisdropped,
				aclexplode(att.attacl) a WHERE a.grantee <> t.relowner
		UNION ALL
		SELECT format('COMMENT ON TABLE %s IS %L', $2::text, d.description)
			FROM t JOIN pg_description d ON d.objoid = t.oid AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0
		UNION ALL
		SELECT format('COMMENT ON COLUMN %s.%s IS %L', $2::text, quote_ident(att.attname), d.description)
			FROM t JOIN pg_description d ON d.objoid = t.oid AND d.classoid = 'pg_class'::regclass AND d.objsubid > 0
			JOIN pg_attribute att ON att.attrelid = t.oid AND att.attnum = d.objsubid AND NOT att.attisdropped
			WHERE EXISTS (SELECT FROM pg_attribute n WHERE n.attrelid = $3::regclass AND n.attname = att.attname AND NOT n.attisdropped)`,
		target.Ident(), target.Ident(), shadow.Ident())
	if err != nil {
		return fmt.Errorf("read the grants and comments of %s: %w", target.Ident(), err)
	}
	carry, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("read the grants and comments of %s: %w", target.Ident(), err)
	}
	var pkey string
	if err := t.tx.QueryRow(ctx, `SELECT coalesce((SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'), '')`,
		target.Ident()).Scan(&pkey); err != nil {
		return fmt.Errorf("read the primary key of %s: %w", target.Ident(), err)
	}
	stmts := []string{
		"ALTER TABLE " + target.Ident() + " RENAME TO " + pgx.Identifier{old.Name}.Sanitize(),
		"ALTER TABLE " + shadow.Ident() + " RENAME TO " + pgx.Identifier{target.Name}.Sanitize(),
	}
	stmts = append(stmts, carry...)
	stmts = append(stmts, "DROP TABLE "+old.Ident())
	for _, s := range stmts {
		if _, err := t.tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("replace %s: %s: %w", target.Ident(), s, err)
		}
	}
	if pkey == "" {
		return nil
	}
	// The old primary key's name is free now that its table is dropped.
	var cur string
	if err := t.tx.QueryRow(ctx, `SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'p'`,
		target.Ident()).Scan(&cur); err != nil {
		return fmt.Errorf("read the primary key of %s: %w", target.Ident(), err)
	}
	if cur != pkey {
		if _, err := t.tx.Exec(ctx, "ALTER TABLE "+target.Ident()+" RENAME CONSTRAINT "+pgx.Identifier{cur}.Sanitize()+
			" TO "+pgx.Identifier{pkey}.Sanitize()); err != nil {
			return fmt.Errorf("name the primary key of %s: %w", target.Ident(), err)
		}
	}
	return nil
}

// merge is Swap in place: the target becomes equal to the shadow, writing
// only the rows that differ.
func (t *Tx) merge(ctx context.Context, target, shadow *Table) error {
	key := make([]string, target.KeyCount)
	for i := range key {
		key[i] = pgx.Identifier{target.Columns[i].Name}.Sanitize()
	}
	cols := make([]string, len(target.Columns))
	for i, c := range target.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	keys := strings.Join(key, ", ")
	del := "DELETE FROM " + target.Ident() + " t WHERE NOT EXISTS (SELECT FROM " + shadow.Ident() + " s WHERE (" +
		prefixed("s.", key) + ") = (" + prefixed("t.", key) + "))"
	ins := "INSERT INTO " + target.Ident() + " AS t (" + strings.Join(cols, ", ") + ") SELECT " + strings.Join(cols, ", ") +
		" FROM " + shadow.Ident() + " ON CONFLICT (" + keys + ") DO "
	if rest := cols[target.KeyCount:]; len(rest) == 0 {
		ins += "NOTHING"
	} else {
		ins += "UPDATE SET (" + strings.Join(rest, ", ") + ") = ROW(" + prefixed("EXCLUDED.", rest) + ") WHERE (" +
			prefixed("t.", rest) + ") IS DISTINCT FROM (" + prefixed("EXCLUDED.", rest) + ")"
	}
	for _, s := range []string{del, ins, "DROP TABLE " + shadow.Ident()} {
		if _, err := t.tx.Exec(ctx, s); err != nil {
			return fmt.Errorf("refill %s: %w", target.Ident(), err)
		}
	}
	return nil
}

func prefixed(prefix string, idents []string) string {
	out := make([]string, len(idents))
	for i, s := range idents {
		out[i] = prefix + s
	}
	return strings.Join(out, ", ")
}
