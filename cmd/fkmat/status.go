package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "per join: slot, confirmed_flush_lsn, current WAL LSN, lag, checkpoints, target rows",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			st, err := fkmat.Status(c.Context, cfg, opts)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "JOIN\tPHASE\tSLOT\tCONFIRMED_FLUSH\tCURRENT_WAL\tLAG_BYTES\tCHECKPOINT\tREDIS\tTARGET\tTARGET_ROWS\tSUBSCRIPTIONS")
			for _, s := range st {
				subs := fmt.Sprint(s.Subscriptions)
				if s.Subscriptions < 0 {
					subs = "unknown"
				}
				rows := fmt.Sprint(s.TargetRows)
				switch {
				case s.TargetRows < 0:
					rows = "-"
				case s.TargetRowsEstimated:
					rows = "~" + rows
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Join, s.Phase, s.Slot, s.ConfirmedFlushLSN,
					s.CurrentWALLSN, s.LagBytes, s.CheckpointLSN, s.RedisState, s.TargetState, rows, subs)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			printed := map[string]bool{}
			for _, s := range st {
				for _, p := range s.Problems {
					if !printed[p] {
						printed[p] = true
						fmt.Fprintf(c.App.Writer, "problem: %s\n", p)
					}
				}
			}
			if len(st) > 0 && st[0].Stall != nil {
				sl := st[0].Stall
				where := "restart position " + sl.RestartLSN
				if sl.LSN != "" {
					where += ", failing transaction at " + sl.LSN
				}
				if sl.Table != "" {
					where += ", table " + sl.Table + " (key " + sl.KeyColumns + ")"
				}
				fmt.Fprintf(c.App.Writer, "STALLED since %s (%d recurrences; %s): %s\n",
					sl.Since.Format(time.RFC3339), sl.Recurrences, where, sl.Error)
			}
			return nil
		},
	}
}
