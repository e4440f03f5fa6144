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
		Usage: "compare each caught-up target with the SQL join evaluated on the source (exit 1 on any difference, 3 when behind the source)",
		Flags: []cli.Flag{
			&cli.DurationFlag{Name: "wait", Value: fkmat.DefaultVerifyWait,
				Usage: "how long to wait for a streaming daemon to pass the source's current position before comparing"},
		},
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			if opts.VerifyWait = c.Duration("wait"); opts.VerifyWait <= 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--wait %s: use a positive duration (e.g. 30s)", opts.VerifyWait)}
			}
			reports, err := fkmat.Verify(c.Context, cfg, opts)
			if err != nil { // ErrBehind: exit 3 (fkmat.ExitCode)
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
