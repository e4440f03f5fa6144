package fkmat

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/sink"
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
// target. It compares only caught-up targets: while a daemon streams from
// the slot it first waits, up to Options.VerifyWait, until the slot has
// confirmed the source's position at the call; a target behind the source
// (no daemon, or still behind at the deadline) is a *BehindError
// (ErrBehind), and nothing is compared.
func Verify(ctx context.Context, cfg *config.Config, opts Options) ([]VerifyReport, error) {
	opts.setDefaults()
	source, plans, err := resolveSource(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer source.Close()
	reports := make([]VerifyReport, 0, len(plans))
	if cfg.Target == cfg.Source {
		if err := checkTargets(ctx, source, source, cfg.Slot, plans); err != nil {
			return nil, err
		}
		if err := awaitCaughtUp(ctx, source, source, cfg, opts.VerifyWait); err != nil {
			return nil, err
		}
		for _, p := range plans {
			r, err := verifySameDB(ctx, source, p)
			if err != nil {
				return nil, err
			}
			reports = append(reports, r)
		}
		return reports, nil
	}
	target, err := connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := checkTargets(ctx, source, target, cfg.Slot, plans); err != nil {
		return nil, err
	}
	if err := awaitCaughtUp(ctx, source, target, cfg, opts.VerifyWait); err != nil {
		return nil, err
	}
	for _, p := range plans {
		r, err := verifyMerge(ctx, source, target, p)
		if err != nil {
			return nil, err
		}
		reports = append(reports, r)
	}
	return reports, nil
}

// checkTargets makes sure every target holds the join the configuration
// defines, with the columns the comparison reads: the join's definition
// may have changed since the target was built (run then builds the new one
// beside it), or resolve differently (a column added to a source table
// under the default "all columns").
func checkTargets(ctx context.Context, source, target *pgxpool.Pool, slot string, plans []*plan.JoinPlan) error {
	w := sink.NewWriter(target)
	for _, p := range plans {
		if err := pendingDefinition(ctx, source, target, slot, p); err != nil {
			return fmt.Errorf("verify join %q: %w", p.Name, err)
		}
		if err := w.CheckTable(ctx, &p.Target); err != nil {
			return fmt.Errorf("verify join %q: %w", p.Name, err)
		}
	}
	return nil
}

// ErrDefinitionPending means a join's target was built with another
// definition than the configuration's, which run builds beside it and
// switches in once it has caught up: until then the target holds the old
// definition's rows, and verify cannot compare it with the new SQL.
var ErrDefinitionPending = errors.New("the join's definition changed since its target was built")

// pendingDefinition returns ErrDefinitionPending, saying what changed, when
// the target of p was built with another definition that run replaces by a
// rebuild (a widening run makes in place does not count).
func pendingDefinition(ctx context.Context, source, target *pgxpool.Pool, slot string, p *plan.JoinPlan) error {
	st, err := readJoinState(ctx, target, slot, p.Name)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (pgErr.Code == "42P01" || pgErr.Code == "42703" || pgErr.Code == "3F000") {
		return nil // fkmat's schema is older or absent: nothing was built by this version
	}
	if err != nil || !st.exists || st.phase != "streaming" || st.fingerprint == p.Fingerprint || st.definition == nil {
		return err
	}
	if _, widen, err := plan.Widenings(st.definition, plan.Definition(p)); err != nil || widen {
		return err
	}
	was, _, err := plan.Stored(ctx, source, p.Name, st.definition)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w (%s): fkmat run builds the new one beside it and switches it in once it has caught up, "+
		"and fkmat status shows how far it is; verify compares the target once it is switched in",
		ErrDefinitionPending, describeChange(was, p))
}

func verifySameDB(ctx context.Context, db plan.Querier, p *plan.JoinPlan) (VerifyReport, error) {
	r := VerifyReport{Join: p.Name, Target: p.Target.Ident()}
	var keyE, keyT, keyJoin, restE, restT []string
	approx := approxColumns(p)
	for i, c := range p.Target.Columns {
		id := ident(c.Name)
		switch {
		case i < p.Target.KeyCount:
			keyE = append(keyE, "e."+id)
			keyT = append(keyT, "t."+id)
			keyJoin = append(keyJoin, "e."+id+" = t."+id)
		case approx == nil || !approx[i]:
			restE = append(restE, "e."+id)
			restT = append(restT, "t."+id)
		}
	}
	differs := approxDiffer(p, approx)
	if len(restE) > 0 {
		differs = append(differs, "ROW("+strings.Join(restE, ", ")+") IS DISTINCT FROM ROW("+strings.Join(restT, ", ")+")")
	}
	differ := "false"
	if len(differs) > 0 {
		differ = "(" + strings.Join(differs, " OR ") + ")"
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

// verifyMerge compares a join evaluated on the source with a target in
// another database: both sides are streamed in the same key order (the keys'
// text forms in byte order) and merged, so memory stays bounded.
func verifyMerge(ctx context.Context, source, target *pgxpool.Pool, p *plan.JoinPlan) (VerifyReport, error) {
	r := VerifyReport{Join: p.Name, Target: p.Target.Ident()}
	nk := p.Target.KeyCount
	var cols, order []string
	for i, c := range p.Target.Columns {
		cols = append(cols, ident(c.Name))
		if i < nk {
			order = append(order, ident(c.Name)+`::text COLLATE "C"`)
		}
	}
	orderBy := " ORDER BY " + strings.Join(order, ", ")
	approx := approxColumns(p)
	expected, err := openRows(ctx, source, "SELECT "+strings.Join(cols, ", ")+" FROM ("+OracleSQL(p)+") e"+orderBy)
	if err != nil {
		return r, fmt.Errorf("verify join %q on the source: %w", p.Name, err)
	}
	defer expected.close()
	actual, err := openRows(ctx, target, "SELECT "+strings.Join(cols, ", ")+" FROM "+p.Target.Ident()+orderBy)
	if err != nil {
		return r, fmt.Errorf("verify join %q on the target: %w", p.Name, err)
	}
	defer actual.close()
	example := func(kind string, row []*string) {
		if len(r.Examples) < 5 {
			r.Examples = append(r.Examples, kind+" "+keyText(row[:nk]))
		}
	}
	e, a := expected.next(), actual.next()
	for e != nil || a != nil {
		c := 0
		switch {
		case e == nil:
			c = 1
		case a == nil:
			c = -1
		default:
			c = compareKeys(e[:nk], a[:nk])
		}
		switch {
		case c < 0:
			r.Expected++
			r.Missing++
			example("missing", e)
			e = expected.next()
		case c > 0:
			r.Actual++
			r.Extra++
			example("extra", a)
			a = actual.next()
		default:
			r.Expected++
			r.Actual++
			if !rowsEqual(e, a, approx) {
				r.Different++
				example("different", e)
			}
			e, a = expected.next(), actual.next()
		}
	}
	for _, rs := range []*textRows{expected, actual} {
		if err := rs.err(); err != nil {
			return r, fmt.Errorf("verify join %q: %w", p.Name, err)
		}
	}
	return r, nil
}
