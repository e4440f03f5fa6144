package fkmat

// SQL text shared by the commands and the daemon: identifiers and literals,
// quoted; the interface of a pool, a connection or a transaction.

import (
	"context"
	"strings"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/jackc/pgx/v5"
)

// querier is a pool, a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ident quotes one SQL identifier.
func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

// tableIdent quotes a schema-qualified table name.
func tableIdent(t config.TableName) string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// quoteLiteral is s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + sqlString(s) + "'" }

// sqlString is s with its single quotes doubled, for a string literal in a
// message a user may paste.
func sqlString(s string) string { return strings.ReplaceAll(s, "'", "''") }
