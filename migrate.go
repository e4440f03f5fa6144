package fkmat

import (
	"context"
	"fmt"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/fkmat/fkmat/sink"
)

// Migrate creates fkmat's metadata schema and the target tables (or checks
// that existing ones have the right shape). It is idempotent.
func Migrate(ctx context.Context, cfg *config.Config, opts Options) error {
	source, plans, err := resolveSource(ctx, cfg)
	if err != nil {
		return err
	}
	defer source.Close()
	target, err := openTarget(ctx, cfg)
	if err != nil {
		return err
	}
	defer target.Close()
	w := sink.NewWriter(target)
	for _, p := range plans {
		if _, err := w.EnsureTable(ctx, &p.Target); err != nil {
			return fmt.Errorf("join %q: %w", p.Name, err)
		}
	}
	return nil
}
