package fkmat

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// VerifyReport compares one target with its SQL join.
type VerifyReport struct {
	Join      string
	Target    string
	Expected  int64 // rows of the SQL join
	Actual    int64 // rows of the target
	Missing   int64 // in the SQL join, not in the target
	Extra     int64 // in the target, not in the SQL join
	Different int64 // same key, different values
	// Examples are a few differing keys, each "missing", "extra" or
	// "different" followed by the key in text form.
	Examples []string
}

// Equal reports whether the target equals the SQL join.
func (r VerifyReport) Equal() bool { return r.Missing == 0 && r.Extra == 0 && r.Different == 0 }

// Verify evaluates each join's SQL on the source and compares it with the
// target. The source and the target must be the same database.
func Verify(ctx context.Context, cfg *Config, opts Options) ([]VerifyReport, error) {
	opts.setDefaults()
	source, err := connectPostgres(ctx, cfg.Source, "source")
	if err != nil {
		return nil, err
	}
	defer source.Close()
	plans, err := Resolve(ctx, source, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Target != cfg.Source {
		return nil, fmt.Errorf("verify: the target database differs from the source; only same-database verification is implemented")
	}
	reports := make([]VerifyReport, 0, len(plans))
	for _, p := range plans {
		r, err := verifySameDB(ctx, source, p)
		if err != nil {
			return nil, err
		}
		reports = append(reports, r)
	}
	return reports, nil
}

// OracleSQL returns the SQL join a plan maintains, with the target's column
// names, in the target's column order.
func OracleSQL(p *JoinPlan) string {
	var sel []string
	for i, k := range p.Left.Key {
		sel = append(sel, "l."+ident(k.Name)+" AS "+ident(p.Left.KeyNames[i]))
	}
	for _, v := range p.Left.Values {
		sel = append(sel, "l."+ident(v.Source.Name)+" AS "+ident(v.Name))
	}
	for _, v := range p.Right.Values {
		sel = append(sel, "r."+ident(v.Source.Name)+" AS "+ident(v.Name))
	}
	var on []string
	for i, fk := range p.Left.ForeignKey {
		on = append(on, "l."+ident(fk.Name)+" = r."+ident(p.Right.Key[i].Name))
	}
	kind := "LEFT JOIN"
	if p.Type == JoinInner {
		kind = "JOIN"
	}
	return "SELECT " + strings.Join(sel, ", ") + " FROM " + tableIdent(p.Left.Table) + " l " + kind + " " +
		tableIdent(p.Right.Table) + " r ON " + strings.Join(on, " AND ")
}

func verifySameDB(ctx context.Context, db Querier, p *JoinPlan) (VerifyReport, error) {
	r := VerifyReport{Join: p.Name, Target: p.Target.Ident()}
	var keyE, keyT, keyJoin, restE, restT []string
	for i, c := range p.Target.Columns {
		id := ident(c.Name)
		if i < p.Target.KeyCount {
			keyE = append(keyE, "e."+id)
			keyT = append(keyT, "t."+id)
			keyJoin = append(keyJoin, "e."+id+" = t."+id)
		} else {
			restE = append(restE, "e."+id)
			restT = append(restT, "t."+id)
		}
	}
	differ := "false"
	if len(restE) > 0 {
		differ = "ROW(" + strings.Join(restE, ", ") + ") IS DISTINCT FROM ROW(" + strings.Join(restT, ", ") + ")"
	}
	eNull, tNull := keyE[0]+" IS NULL", keyT[0]+" IS NULL"
	sql := "WITH e AS (" + OracleSQL(p) + "), d AS (SELECT " +
		"CASE WHEN " + tNull + " THEN 'missing' WHEN " + eNull + " THEN 'extra' WHEN " + differ + " THEN 'different' END AS kind, " +
		"CASE WHEN " + eNull + " THEN ROW(" + strings.Join(keyT, ", ") + ")::text ELSE ROW(" + strings.Join(keyE, ", ") + ")::text END AS k, " +
		eNull + " AS no_e, " + tNull + " AS no_t " +
		"FROM e FULL JOIN " + p.Target.Ident() + " t ON " + strings.Join(keyJoin, " AND ") + ") " +
		"SELECT count(*) FILTER (WHERE NOT no_e), count(*) FILTER (WHERE NOT no_t), " +
		"count(*) FILTER (WHERE kind = 'missing'), count(*) FILTER (WHERE kind = 'extra'), count(*) FILTER (WHERE kind = 'different'), " +
		"coalesce((SELECT array_agg(x) FROM (SELECT kind || ' ' || k AS x FROM d WHERE kind IS NOT NULL ORDER BY k LIMIT 5) s), '{}') FROM d"
	err := db.QueryRow(ctx, sql).Scan(&r.Expected, &r.Actual, &r.Missing, &r.Extra, &r.Different, &r.Examples)
	if err != nil {
		return r, fmt.Errorf("verify join %q: %w", p.Name, err)
	}
	return r, nil
}

func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

func tableIdent(t TableName) string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }
