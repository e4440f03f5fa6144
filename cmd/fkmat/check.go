package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/human"
)

func checkCommand() *cli.Command {
	return &cli.Command{
		Name:  "check",
		Usage: "validate the configuration against the databases and Redis; print every problem with its fix (--plan: what run will create, and its cost)",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "plan", Usage: "also print what run will create (slot, publication, targets' DDL, Redis keys) and estimate the Redis memory and the backfill time"},
			&cli.BoolFlag{Name: "json", Usage: "print the result as JSON on stdout, problems and errors included"},
		},
		Action: func(c *cli.Context) error {
			res := checkResult{}
			err := runCheck(c, &res)
			if err != nil {
				res.Error = err.Error()
				var ce *config.ConfigError
				if errors.As(err, &ce) {
					res.Problems = ce.Problems
				}
			}
			res.OK = err == nil
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				if jerr := enc.Encode(res); jerr != nil && err == nil {
					return jerr
				}
				return err
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(c.App.Writer, "ok: configuration, databases and Redis are ready")
			if res.Plan != nil {
				return printPlan(c.App.Writer, res.Plan)
			}
			return nil
		},
	}
}

// checkUsageError is jsonUsageError for check.
func checkUsageError(next cli.OnUsageErrorFunc) cli.OnUsageErrorFunc {
	return jsonUsageError(next, func(w io.Writer, err error) error {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(checkResult{Error: err.Error()})
	})
}

// checkResult is `check --json`.
type checkResult struct {
	OK       bool           `json:"ok"`
	Problems []string       `json:"problems,omitempty"`
	Error    string         `json:"error,omitempty"`
	Plan     *fkmat.RunPlan `json:"plan,omitempty"`
}

// runCheck checks the configuration and, with --plan, plans the run.
func runCheck(c *cli.Context, res *checkResult) error {
	cfg, opts, err := setup(c)
	if err != nil {
		return err
	}
	if err := fkmat.Check(c.Context, cfg, opts); err != nil {
		return err
	}
	if c.Bool("plan") {
		if res.Plan, err = fkmat.Plan(c.Context, cfg, opts); err != nil {
			return fmt.Errorf("plan: %w", err)
		}
	}
	return nil
}

// printPlan writes a RunPlan for a reader.
func printPlan(w io.Writer, p *fkmat.RunPlan) error {
	step := func(what string, s fkmat.PlanStep) {
		if s.Exists {
			fmt.Fprintf(w, "  %s %s: exists, kept\n", what, s.Name)
		} else {
			fmt.Fprintf(w, "  %s %s: %s\n", what, s.Name, s.Statement)
		}
	}
	fmt.Fprintln(w, "\nfkmat run will use:")
	step("slot", p.Slot)
	step("publication", p.Publication)
	step("metadata schema", p.Metadata)
	for _, j := range p.Joins {
		fmt.Fprintf(w, "\njoin %s:\n", j.Name)
		if j.Target.Exists {
			fmt.Fprintf(w, "  target %s: exists (its shape was checked); a backfill replaces its rows\n", j.Target.Name)
		} else {
			fmt.Fprintf(w, "  target %s: %s\n", j.Target.Name, j.Target.Statement)
		}
		fmt.Fprintf(w, "  redis keys: %s*\n", j.RedisPrefix)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "  table\trows\tB/row\treferences\tB/ref\tstate\t")
		for _, t := range j.Tables {
			refs, refBytes := "-", "-"
			if t.References > 0 {
				refs, refBytes = human.Count(t.References), fmt.Sprint(t.RefBytes)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t\n", t.Table, human.Count(t.Rows), t.RowBytes, refs, refBytes, human.Bytes(t.StateBytes))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, t := range j.Tables {
			if t.Where != "" {
				fmt.Fprintf(w, "  where %s on %s: keeps ~%s of %s rows (%.0f%%, from its statistics); state saved ~%s\n",
					t.Where, t.Table, human.Count(t.Kept), human.Count(t.Rows), 100*float64(t.Kept)/float64(max(t.Rows, 1)), human.Bytes(t.SavedBytes))
			}
		}
		fmt.Fprintf(w, "  estimate: Redis %s, backfill %s (%s rows)\n", human.Bytes(j.RedisBytes), estimate(j.BackfillSeconds), human.Count(j.BackfillRows))
		if j.Rebuild != "" {
			fmt.Fprintf(w, "  rebuild: %s\n", j.Rebuild)
		}
	}
	fmt.Fprintf(w, "\nestimate, all joins: Redis %s, backfill %s, temporary disk during the backfill %s (in $TMPDIR)\n",
		human.Bytes(p.RedisBytes), estimate(p.BackfillSeconds), human.Bytes(p.BackfillDiskBytes))
	fmt.Fprintf(w, "from: %s\n", p.Basis)
	return nil
}

// estimate writes an estimated time of s seconds: "~" and human.Duration,
// at least a second.
func estimate(s float64) string {
	return "~" + human.Duration(max(time.Duration(s*float64(time.Second)), time.Second))
}
