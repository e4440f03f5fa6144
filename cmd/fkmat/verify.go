package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name:  "verify",
		Usage: "compare each target with the SQL join evaluated on the source (exit 1 on any difference)",
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			reports, err := fkmat.Verify(c.Context, cfg, opts)
			if err != nil {
				return err
			}
			differ := false
			for _, r := range reports {
				state := "equal"
				if !r.Equal() {
					state, differ = "DIFFERENT", true
				}
				fmt.Fprintf(c.App.Writer, "%s -> %s: %s (sql join %d rows, target %d rows; missing %d, extra %d, different %d)\n",
					r.Join, r.Target, state, r.Expected, r.Actual, r.Missing, r.Extra, r.Different)
				for _, e := range r.Examples {
					fmt.Fprintf(c.App.Writer, "  %s\n", e)
				}
			}
			if differ {
				return &exitError{code: exitFailure, err: errors.New("targets differ from their SQL joins")}
			}
			return nil
		},
	}
}
