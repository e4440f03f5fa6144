package plan

import (
	"context"
	"fmt"
	"slices"

	"github.com/fkmat/fkmat/internal/config"
)

// GeneratedColumn is a stored generated column a join outputs. Logical
// replication before PostgreSQL 18 leaves such columns out of its
// messages: the daemon computes their values from the row's other columns
// (Inputs) with Expr, in Postgres.
type GeneratedColumn struct {
	Name string
	// Type is the column's type (format_type); TypeOID its OID.
	Type    string
	TypeOID uint32
	// Expr is the generation expression (pg_get_expr), over the table's
	// column names.
	Expr string
	// Inputs are the columns Expr reads (pg_depend), in column order.
	Inputs []GeneratedInput
}

// GeneratedInput is a column a generation expression reads.
type GeneratedInput struct {
	Name, Type string
	// Toastable says its values may be stored out of line (storage
	// extended or external): an update that leaves it unchanged then sends
	// no value for it.
	Toastable bool
}

// genInput is a generated column's input as the catalog describes it.
type genInput struct {
	generated string
	GeneratedInput
}

// readGeneratedInputs reads which columns each generated column of table
// oid reads.
func readGeneratedInputs(ctx context.Context, db Querier, oid uint32) ([]genInput, error) {
	rows, err := db.Query(ctx, `
		SELECT DISTINCT ON (g.attnum, a.attnum) g.attname, a.attname, format_type(a.atttypid, a.atttypmod), a.attstorage IN ('x', 'e')
		FROM pg_attrdef ad
		JOIN pg_attribute g ON g.attrelid = ad.adrelid AND g.attnum = ad.adnum
		JOIN pg_depend d ON d.refclassid = 'pg_class'::regclass AND d.refobjid = ad.adrelid AND d.refobjsubid > 0
			AND d.refobjsubid <> ad.adnum
			AND ((d.classid = 'pg_attrdef'::regclass AND d.objid = ad.oid)
				OR (d.classid = 'pg_class'::regclass AND d.objid = ad.adrelid AND d.objsubid = ad.adnum))
		JOIN pg_attribute a ON a.attrelid = ad.adrelid AND a.attnum = d.refobjsubid
		WHERE ad.adrelid = $1 AND g.attgenerated <> ''
		ORDER BY g.attnum, a.attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("read the inputs of generated columns: %w", err)
	}
	defer rows.Close()
	var out []genInput
	for rows.Next() {
		var in genInput
		if err := rows.Scan(&in.generated, &in.Name, &in.Type, &in.Toastable); err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, rows.Err()
}

// generatedOf returns the generated columns among cols of ct, and adds a
// problem for one whose values the stream may not let fkmat compute: an
// input that can be stored out of line, on a table whose old rows the
// stream does not carry whole (REPLICA IDENTITY FULL).
func generatedOf(ct *catalogTable, cols []OutputColumn, what string, add func(string, ...any)) []GeneratedColumn {
	var out []GeneratedColumn
	for _, c := range cols {
		expr, gen := ct.generated[c.Source.Name]
		if !gen || slices.ContainsFunc(out, func(g GeneratedColumn) bool { return g.Name == c.Source.Name }) {
			continue
		}
		g := GeneratedColumn{Name: c.Source.Name, Type: c.Source.Type, TypeOID: c.Source.TypeOID, Expr: expr}
		for _, in := range ct.genInputs {
			if in.generated != g.Name {
				continue
			}
			g.Inputs = append(g.Inputs, in.GeneratedInput)
			if in.Toastable && !ct.fullIdentity() {
				add("%s: generated column %q of %s reads column %q, whose values can be stored out of line (TOAST); an update that "+
					"leaves such a value unchanged does not send it, and fkmat could not compute %q: set REPLICA IDENTITY FULL on %s "+
					"(its old rows then come whole), or leave %q out and compute (%s) over the target",
					what, g.Name, ct.name, in.Name, g.Name, ct.name, g.Name, expr)
			}
		}
		out = append(out, g)
	}
	return out
}

// fullIdentity says the stream carries the table's old rows whole: REPLICA
// IDENTITY FULL on the table, or on every leaf of a partitioned one.
func (ct *catalogTable) fullIdentity() bool {
	if len(ct.leaves) == 0 {
		return ct.replica == "f"
	}
	for _, l := range ct.leaves {
		if l.replica != "f" {
			return false
		}
	}
	return true
}

// resolveGenerated sets p.Generated: the generated columns each table of p
// outputs.
func resolveGenerated(p *JoinPlan, lookup func(config.TableName) (*catalogTable, error), add func(string, ...any)) error {
	tables := []*TablePlan{&p.Left}
	whats := []string{"left.columns"}
	if p.Edges == nil {
		tables, whats = append(tables, &p.Right), append(whats, "right.columns")
	}
	for i := range p.Edges {
		tables, whats = append(tables, &p.Edges[i].Table), append(whats, fmt.Sprintf("right[%d].columns", i))
	}
	for i, tp := range tables {
		ct, err := lookup(tp.Table)
		if err != nil {
			return err
		}
		if len(ct.generated) == 0 {
			continue
		}
		if gs := generatedOf(ct, tp.Values, whats[i], add); len(gs) > 0 {
			if p.Generated == nil {
				p.Generated = map[config.TableName][]GeneratedColumn{}
			}
			for _, g := range gs {
				if !slices.ContainsFunc(p.Generated[tp.Table], func(h GeneratedColumn) bool { return h.Name == g.Name }) {
					p.Generated[tp.Table] = append(p.Generated[tp.Table], g)
				}
			}
		}
	}
	return nil
}
