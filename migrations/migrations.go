package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// Schema is the schema that holds fkmat's metadata and goose's version table.
const Schema = "fkmat"

//go:embed sql/*.sql
var files embed.FS

// Up applies every pending migration in order. It is idempotent and safe to
// run from several processes at once (a Postgres advisory lock serializes
// them).
func Up(ctx context.Context, db *sql.DB) error {
	if err := createSchema(ctx, db); err != nil {
		return err
	}
	p, err := provider(db)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("apply migrations: %w", err)
	}
	return nil
}

// createSchema creates the schema under a transaction-scoped advisory lock:
// CREATE SCHEMA IF NOT EXISTS alone races between concurrent processes
// (unique violation on pg_namespace).
func createSchema(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create schema %s: %w", Schema, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock(hashtext('fkmat.migrations'))"); err != nil {
		return fmt.Errorf("create schema %s: lock: %w", Schema, err)
	}
	// CREATE SCHEMA IF NOT EXISTS checks CREATE on the database before it
	// looks for the schema: a least-privilege role that was given an
	// existing schema (CREATE SCHEMA fkmat AUTHORIZATION role) must not
	// need it.
	var exists bool
	if err := tx.QueryRowContext(ctx, "SELECT to_regnamespace($1) IS NOT NULL", Schema).Scan(&exists); err != nil {
		return fmt.Errorf("look up schema %s: %w", Schema, err)
	}
	if !exists {
		if _, err := tx.ExecContext(ctx, "CREATE SCHEMA IF NOT EXISTS "+Schema); err != nil {
			return fmt.Errorf("create schema %s: %w", Schema, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("create schema %s: %w", Schema, err)
	}
	return nil
}

// Version returns the current schema version (0 when none is applied).
func Version(ctx context.Context, db *sql.DB) (int64, error) {
	p, err := provider(db)
	if err != nil {
		return 0, err
	}
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// Latest returns the version the embedded migrations lead to.
func Latest() (int64, error) {
	sub, err := fs.Sub(files, "sql")
	if err != nil {
		return 0, err
	}
	names, err := fs.Glob(sub, "*.sql")
	if err != nil || len(names) == 0 {
		return 0, fmt.Errorf("list migrations: %v", err)
	}
	var v int64
	_, err = fmt.Sscanf(names[len(names)-1], "%d_", &v)
	return v, err
}

func provider(db *sql.DB) (*goose.Provider, error) {
	sub, err := fs.Sub(files, "sql")
	if err != nil {
		return nil, err
	}
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("create migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithTableName(Schema+".goose_db_version"),
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, nil
}
