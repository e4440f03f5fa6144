package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func teardownCommand() *cli.Command {
	return &cli.Command{
		Name:  "teardown",
		Usage: "drop the slot, the publication and the Redis state (--drop-target: also the targets)",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "drop-target", Usage: "also drop the target tables"}},
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			if err := fkmat.Teardown(c.Context, cfg, c.Bool("drop-target"), opts); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, "ok: slot, publication and Redis state removed")
			return nil
		},
	}
}
