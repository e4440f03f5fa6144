package fkmat

import (
	"context"
	"fmt"
	"strings"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat/migrations"
)

// sourceGrantProblems checks the source role's least privileges (README
// "Security"): USAGE on the source schemas, SELECT on the source tables, and
// ownership of the publication, or, when it does not exist yet, what
// creating it takes (CREATE on the database and ownership of the tables).
// REPLICATION is checked by cdc's Preflight. Each problem names the
// statement that fixes it.
func sourceGrantProblems(ctx context.Context, db plan.Querier, cfg *config.Config, plans []*plan.JoinPlan) ([]string, error) {
	var p []string
	var role, database string
	if err := db.QueryRow(ctx, `SELECT current_user, current_database()`).Scan(&role, &database); err != nil {
		return nil, fmt.Errorf("read current role: %w", err)
	}
	r := ident(role)
	var tables []config.TableName
	seen := map[config.TableName]bool{}
	for _, pl := range plans {
		for _, t := range pl.Tables() {
			if !seen[t] {
				seen[t] = true
				tables = append(tables, t)
			}
		}
	}
	schemas := map[string]bool{}
	ownsAll := true
	for _, t := range tables {
		q := pgx.Identifier{t.Schema, t.Name}.Sanitize()
		if !schemas[t.Schema] {
			schemas[t.Schema] = true
			var usage bool
			if err := db.QueryRow(ctx, `SELECT has_schema_privilege($1, 'USAGE')`, t.Schema).Scan(&usage); err != nil {
				return nil, fmt.Errorf("check privileges on schema %s: %w", ident(t.Schema), err)
			}
			if !usage {
				p = append(p, fmt.Sprintf("source role %s lacks USAGE on schema %s: GRANT USAGE ON SCHEMA %s TO %s", r, ident(t.Schema), ident(t.Schema), r))
			}
		}
		var sel, owner bool
		err := db.QueryRow(ctx, `SELECT has_table_privilege(c.oid, 'SELECT'), pg_has_role(c.relowner, 'USAGE')
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
			t.Schema, t.Name).Scan(&sel, &owner)
		if err != nil {
			return nil, fmt.Errorf("check privileges on %s: %w", q, err)
		}
		if !sel {
			p = append(p, fmt.Sprintf("source role %s cannot read %s: GRANT SELECT ON TABLE %s TO %s", r, q, q, r))
		}
		ownsAll = ownsAll && owner
	}
	var pubOwner *bool
	err := db.QueryRow(ctx, `SELECT pg_has_role(pubowner, 'USAGE') FROM pg_publication WHERE pubname = $1`, cfg.Publication).Scan(&pubOwner)
	if err != nil && err != pgx.ErrNoRows {
		return nil, fmt.Errorf("look up publication %s: %w", ident(cfg.Publication), err)
	}
	pub := ident(cfg.Publication)
	switch {
	case err == nil && !*pubOwner:
		p = append(p, fmt.Sprintf("source role %s does not own publication %s (fkmat adjusts its tables and drops it on teardown): ALTER PUBLICATION %s OWNER TO %s",
			r, pub, pub, r))
	case err == pgx.ErrNoRows:
		var create bool
		if err := db.QueryRow(ctx, `SELECT has_database_privilege(current_database(), 'CREATE')`).Scan(&create); err != nil {
			return nil, fmt.Errorf("check privileges on database: %w", err)
		}
		if !create || !ownsAll {
			list := make([]string, len(tables))
			for i, t := range tables {
				list[i] = pgx.Identifier{t.Schema, t.Name}.Sanitize()
			}
			fix := fmt.Sprintf("as the tables' owner: CREATE PUBLICATION %s FOR TABLE %s; ALTER PUBLICATION %s OWNER TO %s",
				pub, strings.Join(list, ", "), pub, r)
			if !create {
				fix = fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s, then %s", ident(database), r, fix)
			}
			p = append(p, fmt.Sprintf("publication %s does not exist and source role %s cannot create it (that takes CREATE on the database and ownership of the tables): %s",
				pub, r, fix))
		}
	}
	return p, nil
}

// targetGrantProblems checks the target role's least privileges: CREATE on
// the database while fkmat's metadata schema does not exist, else USAGE and
// CREATE on it; for each target, ownership when it exists, else USAGE and
// CREATE on its schema.
func targetGrantProblems(ctx context.Context, db plan.Querier, plans []*plan.JoinPlan) ([]string, error) {
	var p []string
	var role, database string
	if err := db.QueryRow(ctx, `SELECT current_user, current_database()`).Scan(&role, &database); err != nil {
		return nil, fmt.Errorf("read current role: %w", err)
	}
	r := ident(role)
	meta := ident(migrations.Schema)
	var exists, usage, create, dbCreate bool
	err := db.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL,
		coalesce(has_schema_privilege(to_regnamespace($1), 'USAGE'), false),
		coalesce(has_schema_privilege(to_regnamespace($1), 'CREATE'), false),
		has_database_privilege(current_database(), 'CREATE')`, migrations.Schema).Scan(&exists, &usage, &create, &dbCreate)
	if err != nil {
		return nil, fmt.Errorf("check privileges on schema %s: %w", meta, err)
	}
	switch {
	case !exists && !dbCreate:
		p = append(p, fmt.Sprintf("target role %s cannot create fkmat's metadata schema %s: GRANT CREATE ON DATABASE %s TO %s (or, as an admin: CREATE SCHEMA %s AUTHORIZATION %s)",
			r, meta, ident(database), r, meta, r))
	case exists && !(usage && create):
		p = append(p, fmt.Sprintf("target role %s lacks USAGE or CREATE on fkmat's metadata schema %s: GRANT USAGE, CREATE ON SCHEMA %s TO %s",
			r, meta, meta, r))
	}
	for _, pl := range plans {
		t := pl.Target
		q := t.Ident()
		var owner *bool
		var sUsage, sCreate bool
		err := db.QueryRow(ctx, `SELECT (SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c
				WHERE c.relnamespace = n.oid AND c.relname = $2),
			has_schema_privilege(n.oid, 'USAGE'), has_schema_privilege(n.oid, 'CREATE')
			FROM pg_namespace n WHERE n.nspname = $1`, t.Schema, t.Name).Scan(&owner, &sUsage, &sCreate)
		if err == pgx.ErrNoRows {
			p = append(p, fmt.Sprintf("join %q: target schema %s does not exist: CREATE SCHEMA %s AUTHORIZATION %s", pl.Name, ident(t.Schema), ident(t.Schema), r))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("check privileges on %s: %w", q, err)
		}
		switch {
		case owner != nil && !*owner:
			p = append(p, fmt.Sprintf("join %q: target role %s does not own the existing target %s: ALTER TABLE %s OWNER TO %s", pl.Name, r, q, q, r))
		case owner == nil && !(sUsage && sCreate):
			p = append(p, fmt.Sprintf("join %q: target role %s cannot create %s: GRANT USAGE, CREATE ON SCHEMA %s TO %s", pl.Name, r, q, ident(t.Schema), r))
		}
	}
	return p, nil
}
