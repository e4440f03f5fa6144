package fkmat

import (
	"context"
	"fmt"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/jackc/pgx/v5/pgxpool"
)

// publishedTables lists the tables of the joins, each once: joins may share
// tables, and a self-referencing join uses one table on both sides.
func publishedTables(plans []*plan.JoinPlan) []cdc.TableName {
	tables := make([]config.TableName, 0, 2*len(plans))
	for _, p := range plans {
		tables = append(tables, p.Tables()...)
	}
	return uniqueTables(tables)
}

// configuredTables is publishedTables from the configuration alone, for the
// commands that work without resolving the joins (teardown).
func configuredTables(cfg *config.Config) []cdc.TableName {
	tables := make([]config.TableName, 0, 2*len(cfg.Joins))
	for _, j := range cfg.Joins {
		tables = append(tables, j.Tables()...)
	}
	return uniqueTables(tables)
}

func uniqueTables(tables []config.TableName) []cdc.TableName {
	seen := map[config.TableName]bool{}
	var out []cdc.TableName
	for _, t := range tables {
		if !seen[t] {
			seen[t] = true
			out = append(out, cdc.TableName{Schema: t.Schema, Name: t.Name})
		}
	}
	return out
}

// loadsAtOnce is the number of tables and targets a backfill loads at once.
const loadsAtOnce = 4

// tableRows is the rows of a table: the larger of pg_class.reltuples (set
// by ANALYZE and VACUUM) and the statistics' live rows (n_live_tup, kept
// by every write, so it follows a table growing between two analyses),
// summed over its partitions for a partitioned table; 0 when empty or
// unknown. The backfill sizes the state by it, check --plan estimates by it.
func tableRows(ctx context.Context, db *pgxpool.Pool, t config.TableName) (int64, error) {
	var n float64
	err := db.QueryRow(ctx, `SELECT coalesce(sum(greatest(c.reltuples, s.n_live_tup, 0)), 0)
		FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid
		WHERE (c.oid = to_regclass($1) AND c.relkind <> 'p')
		   OR c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)) WHERE isleaf)`, tableIdent(t)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("estimate the rows of %s: %w", t, err)
	}
	return int64(n), nil
}
