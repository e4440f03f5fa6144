package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "validate the configuration against the databases and Redis; print every problem with its fix",
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			if err := fkmat.Check(c.Context, cfg, opts); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, "ok: configuration, databases and Redis are ready")
			return nil
		},
	}
}
