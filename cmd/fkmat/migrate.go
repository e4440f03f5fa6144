package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "create fkmat's metadata schema and the target tables (idempotent)",
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			if err := fkmat.Migrate(c.Context, cfg, opts); err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, "ok: metadata schema and target tables are in place")
			return nil
		},
	}
}
