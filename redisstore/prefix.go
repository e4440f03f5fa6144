package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

// A join's states are named by their key prefixes (Config.Prefix), all
// under the join's root prefix "fkmat:<slot>:<join>":
//
//	fkmat:<slot>:<join>              the state of a two-table join
//	fkmat:<slot>:<join>~t<n>         table n's state of a join of several tables
//	fkmat:<slot>:<join>~g<gen>[~t<n>] generation gen > 0: a rebuild beside the running join
//	fkmat:<slot>:<join>~<i>          entry i under the layout before 2026-12 (deleted on sight)
//
// Every key of a state starts with its prefix and a colon (keys.go).

// Prefix is the root key prefix of a join's states: every key of the join
// starts with it.
func Prefix(slot, joinName string) string { return "fkmat:" + slot + ":" + joinName }

// GenerationPrefix is Prefix for generation gen of the join's state
// (fkmat.join_state.generation): a rebuild beside the running join builds
// the next generation.
func GenerationPrefix(slot, joinName string, gen int) string {
	if gen == 0 {
		return Prefix(slot, joinName)
	}
	return fmt.Sprintf("%s~g%d", Prefix(slot, joinName), gen)
}

// StatePrefixes returns the prefixes of every state of generation gen of a
// join with entries entries (0: the two-table form): its one, or one per
// table (0: the left table, i+1: entry i).
func StatePrefixes(slot, joinName string, entries, gen int) []string {
	base := GenerationPrefix(slot, joinName, gen)
	if entries == 0 {
		return []string{base}
	}
	out := make([]string, entries+1)
	for t := range out {
		out[t] = fmt.Sprintf("%s~t%d", base, t)
	}
	return out
}

// TablePrefix is the prefix of table t's state (0: the left table, i+1:
// entry i) of generation 0 of a join of more than two tables.
func TablePrefix(slot, joinName string, t int) string {
	return fmt.Sprintf("%s~t%d", Prefix(slot, joinName), t)
}

// StepPrefix is the prefix of entry i's state under the layout of fkmat
// before 2026-12 (one state per entry, each holding the rows of the join so
// far), which a rebuild and teardown delete.
func StepPrefix(slot, joinName string, i int) string {
	return fmt.Sprintf("%s~%d", Prefix(slot, joinName), i)
}

// DropGeneration drops generation gen of join name's Redis state, in
// either form: one state, or one per table.
func DropGeneration(ctx context.Context, rdb redis.UniversalClient, log *slog.Logger, slot, name string, gen int) error {
	base := GenerationPrefix(slot, name, gen)
	prefixes := []string{base}
	for t := range 64 { // the tables of a join of more than two tables, while there are
		prefixes = append(prefixes, fmt.Sprintf("%s~t%d", base, t))
	}
	for i, prefix := range prefixes {
		s, err := Open(ctx, rdb, Config{Prefix: prefix})
		if err != nil {
			return err
		}
		if _, err := s.Meta(ctx); errors.Is(err, ErrNoState) {
			if i > 0 {
				return nil
			}
			continue
		} else if err != nil {
			return err
		}
		log.Info("dropping the Redis state of a rebuild's other generation", "join", name, "generation", gen, "prefix", prefix)
		if err := s.Drop(ctx); err != nil {
			return err
		}
	}
	return nil
}
