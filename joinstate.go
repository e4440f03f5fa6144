package fkmat

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/sink"
	"github.com/jackc/pgx/v5"
)

// joinState is a join's row in fkmat.join_state.
type joinState struct {
	exists        bool
	epoch         string
	fingerprint   string
	phase         string
	consistentLSN wal.LSN
	// definition is the one the join was built with (plan.Definition); nil
	// for a join built before fkmat kept it.
	definition []byte
	// widenedLSN is where the last widening was followed (0: none).
	widenedLSN wal.LSN
	// generation is the Redis state's (GenerationPrefix).
	generation int
	// frozenLSN, when set, is where the join stopped being maintained
	// until a rebuild beside it switches in (planRebuild).
	frozenLSN wal.LSN
}

// definitionChanged is the error run stops with when the definition of join
// name changed since its backfill other than by widened types (which open
// follows, daemon.widen); check reports the same.
func definitionChanged(name string) error {
	return &config.ConfigError{Problems: []string{fmt.Sprintf(
		"the definition of join %q (tables, keys, columns or types) changed since its backfill, other than by widened column types; "+
			"run fkmat backfill --force to rebuild it (the target keeps its rows until the rebuild replaces them)", name)}}
}

// readJoinState reads join name's row of fkmat.join_state for slot.
func readJoinState(ctx context.Context, db querier, slot, name string) (joinState, error) {
	var s joinState
	var lsn, widened, frozen *string
	err := db.QueryRow(ctx, `
		SELECT epoch, fingerprint, phase, consistent_lsn::text, definition::text, widened_lsn::text, generation, frozen_lsn::text FROM fkmat.join_state
		WHERE slot = $1 AND join_name = $2`, slot, name).Scan(&s.epoch, &s.fingerprint, &s.phase, &lsn, &s.definition, &widened, &s.generation, &frozen)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read state of join %q: %w", name, err)
	}
	s.exists = true
	for _, f := range []struct {
		text *string
		lsn  *wal.LSN
	}{{lsn, &s.consistentLSN}, {widened, &s.widenedLSN}, {frozen, &s.frozenLSN}} {
		if f.text != nil {
			if *f.lsn, err = wal.ParseLSN(*f.text); err != nil {
				return s, fmt.Errorf("read state of join %q: %w", name, err)
			}
		}
	}
	return s, nil
}

// rebuildSlot is the name of the second slot of slot's rebuilds.
func rebuildSlot(slot string) string { return cdc.DerivedSlot(slot, "_rebuild") }

// describeChange says how definition now differs from was, for the
// operator: target columns added, removed or retyped, or else the rest.
func describeChange(was, now *plan.JoinPlan) string {
	var added, removed, retyped []string
	for _, c := range now.Target.Columns {
		i := slices.IndexFunc(was.Target.Columns, func(o sink.Column) bool { return o.Name == c.Name })
		switch {
		case i < 0:
			added = append(added, c.Name)
		case was.Target.Columns[i].Type != c.Type:
			retyped = append(retyped, fmt.Sprintf("%s %s -> %s", c.Name, was.Target.Columns[i].Type, c.Type))
		}
	}
	for _, c := range was.Target.Columns {
		if !slices.ContainsFunc(now.Target.Columns, func(n sink.Column) bool { return n.Name == c.Name }) {
			removed = append(removed, c.Name)
		}
	}
	var parts []string
	for _, p := range []struct {
		what string
		cols []string
	}{{"columns added", added}, {"columns removed", removed}, {"columns retyped", retyped}} {
		if len(p.cols) > 0 {
			parts = append(parts, p.what+": "+strings.Join(p.cols, ", "))
		}
	}
	if !slices.Equal(was.Tables(), now.Tables()) {
		parts = append(parts, "tables: "+tableList(was.Tables())+" -> "+tableList(now.Tables()))
	}
	if len(parts) == 0 {
		return "its keys, source columns or join type"
	}
	return strings.Join(parts, "; ")
}

func tableList(ts []config.TableName) string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.String()
	}
	return strings.Join(out, ", ")
}
