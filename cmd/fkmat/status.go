package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name: "status",
		Usage: "a verdict (ok, problem, stalled, not running), then per join: phase, target rows, Redis state, checkpoints, lag; " +
			"exit 1 on a problem (a slot missing, invalidated or long inactive, a stall, ...)",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print a JSON object (also on errors: {\"ok\": false, \"error\": ...})"},
			&cli.BoolFlag{Name: "wide", Usage: "print a table with a row per join and every column, in bytes"},
			&cli.DurationFlag{Name: "max-inactive", Value: fkmat.DefaultMaxInactive, EnvVars: []string{"FKMAT_MAX_INACTIVE"},
				Usage: "report a problem when no fkmat run has streamed from a streaming join's slot for longer than this"},
		},
		Action: func(c *cli.Context) error {
			r, err := statusReport(c)
			if err != nil {
				r = fkmat.FailedStatus(err)
			}
			var werr error
			switch {
			case c.Bool("json"):
				werr = writeStatusJSON(c.App.Writer, r)
			case err != nil: // run prints it on stderr
			case c.Bool("wide"):
				werr = writeStatusWide(c.App.Writer, r, time.Now())
			default:
				werr = writeStatus(c.App.Writer, r, time.Now())
			}
			if err != nil {
				return err
			}
			if werr != nil {
				return werr
			}
			return statusExit(r)
		},
	}
}

// statusReport loads the configuration and reports on its joins.
func statusReport(c *cli.Context) (fkmat.StatusReport, error) {
	cfg, opts, err := setup(c)
	if err != nil {
		return fkmat.StatusReport{}, err
	}
	if opts.MaxInactive = c.Duration("max-inactive"); opts.MaxInactive <= 0 {
		return fkmat.StatusReport{}, &exitError{code: exitUsage, err: fmt.Errorf("--max-inactive %s: use a positive duration", opts.MaxInactive)}
	}
	st, err := fkmat.Status(c.Context, cfg, opts)
	if err != nil {
		return fkmat.StatusReport{}, err
	}
	return fkmat.SummarizeStatus(st, time.Now()), nil
}

// statusUsageError is jsonUsageError for status.
func statusUsageError(next cli.OnUsageErrorFunc) cli.OnUsageErrorFunc {
	return jsonUsageError(next, func(w io.Writer, err error) error { return writeStatusJSON(w, fkmat.FailedStatus(err)) })
}

// jsonUsageError wraps next, the app's handler of a command line that
// does not parse, to print its error as JSON too (with write) when --json
// is among the arguments. run installs it on the commands with --json.
func jsonUsageError(next cli.OnUsageErrorFunc, write func(io.Writer, error) error) cli.OnUsageErrorFunc {
	return func(c *cli.Context, err error, isSubcommand bool) error {
		if next != nil {
			err = next(c, err, isSubcommand)
		}
		// c's own arguments are gone with its failed parse (Args would
		// panic); its parents' hold the command line from the subcommand on.
		for _, ctx := range c.Lineage()[1:] {
			if slices.ContainsFunc(ctx.Args().Slice(), func(a string) bool {
				return a == "--json" || a == "-json" || a == "--json=true" || a == "-json=true"
			}) {
				_ = write(c.App.Writer, err)
				break
			}
		}
		return err
	}
}

// writeStatusJSON writes r as an indented JSON object.
func writeStatusJSON(w io.Writer, r fkmat.StatusReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// statusExit is exit 1 when status found a problem or a stall.
func statusExit(r fkmat.StatusReport) error {
	if r.OK {
		return nil
	}
	n := len(r.Problems)
	if r.Stall != nil {
		n++
	}
	return &exitError{code: exitFailure, err: fmt.Errorf("status found %d problem(s)", n)}
}
