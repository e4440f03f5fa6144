package main

import (
	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func backfillCommand() *cli.Command {
	return &cli.Command{
		Name:  "backfill",
		Usage: "consistent initial load from an exported snapshot (replaces previous state)",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "force", Usage: "rebuild from scratch even if the joins are already backfilled"},
		},
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			ctx, stop := signalContext(c)
			defer stop()
			return fkmat.BackfillIfNeeded(ctx, cfg, c.Bool("force"), opts)
		},
	}
}
