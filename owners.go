package fkmat

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
)

// A replication slot, its publication and a target table belong to the
// joins of one configuration file: run rewrites the publication to hold
// exactly its joins' tables, and maintains its targets alone. checkOwners
// refuses a file that would take any of them from joins it does not define,
// which fkmat.join_state records (slot, join, publication, target).

// checkOwners returns a *config.ConfigError naming each slot, publication
// or target of cfg that joins cfg does not define own, and the fix; nil
// when there is none (or no metadata yet).
func checkOwners(ctx context.Context, target plan.Querier, cfg *config.Config) error {
	var ready bool
	if err := target.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_attribute
		WHERE attrelid = to_regclass('fkmat.join_state') AND attname = 'publication' AND NOT attisdropped)`).Scan(&ready); err != nil {
		return fmt.Errorf("read fkmat.join_state: %w", err)
	}
	if !ready {
		return nil // never migrated, or before the publication was recorded
	}
	var schemas, tables []string
	targetOf := map[config.TableName]string{}
	for _, j := range cfg.Joins {
		schemas, tables = append(schemas, j.Target.Table.Schema), append(tables, j.Target.Table.Name)
		targetOf[j.Target.Table] = j.Name
	}
	rows, err := target.Query(ctx, `
		SELECT slot, join_name, coalesce(publication, ''), target_schema, target_table FROM fkmat.join_state
		WHERE slot = $1 OR publication = $2 OR (target_schema, target_table) IN (SELECT * FROM unnest($3::text[], $4::text[]))
		ORDER BY slot, join_name`, cfg.Slot, cfg.Publication, schemas, tables)
	if err != nil {
		return fmt.Errorf("read fkmat.join_state: %w", err)
	}
	defer rows.Close()
	var onSlot, onPub []string
	var problems []string
	for rows.Next() {
		var slot, name, pub string
		var t config.TableName
		if err := rows.Scan(&slot, &name, &pub, &t.Schema, &t.Name); err != nil {
			return fmt.Errorf("read fkmat.join_state: %w", err)
		}
		ours := slot == cfg.Slot && slices.ContainsFunc(cfg.Joins, func(j config.JoinConfig) bool { return j.Name == name })
		switch {
		case slot == cfg.Slot && !ours:
			onSlot = append(onSlot, name)
		case slot != cfg.Slot && pub == cfg.Publication:
			onPub = append(onPub, fmt.Sprintf("%q (slot %q)", name, slot))
		}
		if j, ok := targetOf[t]; ok && (slot != cfg.Slot || name != j) {
			problems = append(problems, fmt.Sprintf("join %q: target %s is maintained by join %q of slot %q (another configuration file's); "+
				"choose another target table for this join, or define that join in this file instead", j, t, name, slot))
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read fkmat.join_state: %w", err)
	}
	if len(onSlot) > 0 {
		problems = append(problems, fmt.Sprintf("replication slot %q belongs to joins this file does not define: %s; "+
			"add them to this file (one daemon maintains all of a slot's joins), or set another slot: and publication: for this file's joins; "+
			"if they were removed from this file on purpose, forget them first with "+
			"DELETE FROM fkmat.join_state WHERE slot = '%s' AND join_name IN (%s) in the target database (their targets and Redis state stay until you drop them)",
			cfg.Slot, strings.Join(quoted(onSlot, `"`), ", "), sqlString(cfg.Slot), strings.Join(quoted(onSlot, "'"), ", ")))
	}
	if len(onPub) > 0 {
		problems = append(problems, fmt.Sprintf("publication %q belongs to joins of another slot: %s; "+
			"set another publication: for this file (fkmat rewrites a publication to hold exactly its joins' tables)",
			cfg.Publication, strings.Join(onPub, ", ")))
	}
	if len(problems) > 0 {
		return &config.ConfigError{Problems: problems}
	}
	return nil
}

// quoted returns each of names between q, a q inside doubled.
func quoted(names []string, q string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = q + strings.ReplaceAll(n, q, q+q) + q
	}
	return out
}

// recordPublication notes the publication of the slot's joins in
// fkmat.join_state.
func recordPublication(ctx context.Context, target *pgxpool.Pool, cfg *config.Config) error {
	if _, err := target.Exec(ctx, `UPDATE fkmat.join_state SET publication = $2 WHERE slot = $1 AND publication IS DISTINCT FROM $2`,
		cfg.Slot, cfg.Publication); err != nil {
		return fmt.Errorf("record the publication in fkmat.join_state: %w", err)
	}
	return nil
}

// ownersBeforeStart is checkOwners on a connection of its own; a target it
// cannot reach is left to run's retries.
func ownersBeforeStart(ctx context.Context, cfg *config.Config) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	target, err := connectPostgres(cctx, cfg.Target, "target", cfg.TimeZone)
	if err != nil {
		return nil
	}
	defer target.Close()
	if err := checkOwners(cctx, target, cfg); errors.As(err, new(*config.ConfigError)) {
		return err
	}
	return nil
}

func readHolder(ctx context.Context, pool *pgxpool.Pool, slot string) (cdc.Holder, bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return cdc.Holder{}, false, err
	}
	defer conn.Release()
	return cdc.ReadHolder(ctx, conn.Conn(), slot)
}

// describeHolder names the holder for an operator: the fkmat run that
// reports itself in fkmat.daemon (pid and host) when the holder streams
// and that report is fresh, else the walsender and where it connected
// from.
func describeHolder(ctx context.Context, target *pgxpool.Pool, slot string, h cdc.Holder) string {
	where := "a walsender (server pid " + fmt.Sprint(h.PID)
	if h.ClientAddr != "" {
		where += ", client " + h.ClientAddr
	}
	where += ")"
	if !h.Streaming {
		return where + " that backfills from it"
	}
	var host string
	var pid int
	err := target.QueryRow(ctx, `SELECT host, pid FROM fkmat.daemon
		WHERE slot = $1 AND heartbeat_at > now() - interval '1 minute'`, slot).Scan(&host, &pid)
	if err != nil { // no fresh report (or no fkmat.daemon yet)
		return where
	}
	return fmt.Sprintf("fkmat pid %d on host %s, through %s", pid, host, where)
}
