package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func teardownCommand() *cli.Command {
	return &cli.Command{
		Name:  "teardown",
		Usage: "drop the slot, the publication and the Redis state (--drop-target: also the targets); the replication position is lost: a later run starts over with a full backfill",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "drop-target", Usage: "also drop the target tables"},
			&cli.BoolFlag{Name: "dry-run", Usage: "print what teardown would drop, and drop nothing"},
		},
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			if c.Bool("dry-run") {
				fmt.Fprintln(c.App.Writer, "fkmat teardown would drop, where they exist:")
				for _, s := range fkmat.TeardownPlan(cfg, c.Bool("drop-target")) {
					fmt.Fprintln(c.App.Writer, "  - "+s)
				}
				return nil
			}
			if err := fkmat.Teardown(c.Context, cfg, c.Bool("drop-target"), opts); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, "ok: slot, publication and Redis state removed")
			return nil
		},
	}
}
