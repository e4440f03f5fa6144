package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/fkmat/fkmat"
)

func statusCommand() *cli.Command {
	return &cli.Command{
		Name:  "status",
		Usage: "per join: slot, confirmed_flush_lsn, current WAL LSN, lag, retained WAL, checkpoints, target rows; exit 1 on a problem (a slot missing, invalidated or long inactive, a stall, ...)",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			&cli.DurationFlag{Name: "max-inactive", Value: fkmat.DefaultMaxInactive, EnvVars: []string{"FKMAT_MAX_INACTIVE"},
				Usage: "report a problem when no fkmat run has streamed from a streaming join's slot for longer than this"},
		},
		Action: func(c *cli.Context) error {
			cfg, opts, err := setup(c)
			if err != nil {
				return err
			}
			if opts.MaxInactive = c.Duration("max-inactive"); opts.MaxInactive <= 0 {
				return &exitError{code: exitUsage, err: fmt.Errorf("--max-inactive %s: use a positive duration", opts.MaxInactive)}
			}
			st, err := fkmat.Status(c.Context, cfg, opts)
			if err != nil {
				return err
			}
			if c.Bool("json") {
				enc := json.NewEncoder(c.App.Writer)
				enc.SetIndent("", "  ")
				if err := enc.Encode(st); err != nil {
					return err
				}
				return statusExit(st)
			}
			w := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "JOIN\tPHASE\tSLOT\tCONFIRMED_FLUSH\tCURRENT_WAL\tLAG_BYTES\tLAG_SECONDS\tRETAINED_WAL\tWAL_STATUS\tCHECKPOINT\tREDIS\tTARGET\tTARGET_ROWS\tSUBSCRIPTIONS")
			for _, s := range st {
				subs := fmt.Sprint(s.Subscriptions)
				if s.Subscriptions < 0 {
					subs = "unknown"
				}
				if len(s.Edges) > 0 { // per table of a join of more than two tables: its references
					var per []string
					for _, e := range s.Edges {
						per = append(per, fmt.Sprintf("%s=%d", e.Entry, e.Subscriptions))
					}
					subs += " (" + strings.Join(per, " ") + ")"
				}
				rows := fmt.Sprint(s.TargetRows)
				switch {
				case s.TargetRows < 0:
					rows = "-"
				case s.TargetRowsEstimated:
					rows = "~" + rows
				}
				lag := "-"
				if s.Daemon != nil && s.Daemon.Live {
					lag = fmt.Sprintf("%.1f", s.Daemon.LagSeconds)
				}
				walStatus := s.WALStatus
				if walStatus == "" {
					walStatus = "-"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Join, s.Phase, s.Slot, s.ConfirmedFlushLSN,
					s.CurrentWALLSN, s.LagBytes, lag, s.RetainedWALBytes, walStatus, s.CheckpointLSN, s.RedisState, s.TargetState, rows, subs)
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
			if len(st) > 0 && st[0].Daemon != nil {
				d := st[0].Daemon
				fmt.Fprintf(c.App.Writer, "daemon: fkmat %s on %s (pid %d), started %s, last seen %s ago\n", d.Version, d.Host, d.PID,
					d.StartedAt.Format(time.RFC3339), time.Since(d.HeartbeatAt).Round(time.Second))
			}
			if len(st) > 0 && st[0].SafeWALSizeBytes >= 0 && st[0].SlotExists {
				fmt.Fprintf(c.App.Writer, "slot %s: safe_wal_size %d bytes (WAL that can still be written before max_slot_wal_keep_size invalidates it)\n",
					st[0].Slot, st[0].SafeWALSizeBytes)
			}
			return statusExit(st)
		},
	}
}

// statusExit is exit 1 when status found a problem or a stall.
func statusExit(st []fkmat.JoinStatus) error {
	n := 0
	for _, s := range st {
		n += len(s.Problems)
		if s.Stall != nil {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	return &exitError{code: exitFailure, err: fmt.Errorf("status found %d problem(s); see above", n)}
}
