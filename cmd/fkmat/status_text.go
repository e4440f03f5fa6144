package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/human"
)

// statusWidth is the terminal width the text of fkmat status fits in
// (but for a word longer than a line: a long table name, an LSN).
const statusWidth = 80

// statusKeyWidth is the width of the keys of a block, "checkpoint".
const statusKeyWidth = len("checkpoint")

// writeStatus writes r for a person: the verdict, a block per join, a block
// for the slot and the daemon they share, the stall, then the problems.
func writeStatus(w io.Writer, r fkmat.StatusReport, now time.Time) error {
	var b strings.Builder
	writeVerdict(&b, r)
	for _, s := range r.Joins {
		b.WriteString("\n")
		writeJoin(&b, s, now)
	}
	writeShared(&b, r, now)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeStatusWide writes r as the verdict, a table with a row per join and
// every column, in bytes, then what writeStatus writes after the joins.
func writeStatusWide(w io.Writer, r fkmat.StatusReport, now time.Time) error {
	var b strings.Builder
	writeVerdict(&b, r)
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOIN\tPHASE\tSLOT\tCONFIRMED_FLUSH\tCURRENT_WAL\tLAG_BYTES\tLAG_SECONDS\tRETAINED_WAL\tWAL_STATUS\tCHECKPOINT\tREDIS\tTARGET\tTARGET_ROWS\tSUBSCRIPTIONS")
	for _, s := range r.Joins {
		subs := fmt.Sprint(s.Subscriptions)
		if s.Subscriptions < 0 {
			subs = "unknown"
		}
		if len(s.Edges) > 0 {
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Join, s.Phase, s.Slot, s.ConfirmedFlushLSN,
			s.CurrentWALLSN, s.LagBytes, lag, s.RetainedWALBytes, dash(s.WALStatus), s.CheckpointLSN, s.RedisState, s.TargetState, rows, subs)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	writeShared(&b, r, now)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeVerdict writes the verdict line: "ok: 2 joins streaming, ...".
func writeVerdict(b *strings.Builder, r fkmat.StatusReport) {
	writeWrapped(b, strings.ReplaceAll(r.Verdict, "_", " ")+": ", "  ", r.Summary)
}

// writeJoin writes the block of one join.
func writeJoin(b *strings.Builder, s fkmat.JoinStatus, now time.Time) {
	b.WriteString("join " + s.Join + "\n")
	writeField(b, "phase", phaseText(s))
	if s.Build != nil && s.Build.Beside {
		writeField(b, "rebuild", rebuildText(*s.Build, now))
	} else if s.Build != nil {
		writeField(b, "backfill", buildText(*s.Build, now))
	}
	writeField(b, "target", targetText(s))
	writeField(b, "redis", redisText(s))
	if len(s.Edges) > 0 {
		var per []string
		for _, e := range s.Edges {
			per = append(per, e.Entry+" "+countText(e.Subscriptions))
		}
		// Each table's state holds its rows' references to the entries
		// they point to (their subscriptions); a table no entry hangs
		// from holds none.
		writeField(b, "references", strings.Join(per, ", ")+" (the foreign-key references each table's rows hold)")
	}
	lsn := s.CheckpointLSN
	if s.SlotExists {
		lsn += " (slot confirmed " + s.ConfirmedFlushLSN + ", WAL at " + s.CurrentWALLSN + ")"
	}
	writeField(b, "checkpoint", lsn)
	var lag []string
	if s.Daemon != nil && s.Daemon.Live && s.SlotActive {
		lag = append(lag, fmt.Sprintf("%.1f s", s.Daemon.LagSeconds))
	}
	if s.SlotExists {
		lag = append(lag, human.Bytes(s.LagBytes)+" of WAL")
	}
	if len(lag) > 0 {
		writeField(b, "lag", strings.Join(lag, ", "))
	}
	if s.Metadata != "ok" {
		writeField(b, "metadata", s.Metadata)
	}
}

// writeShared writes what the joins share: the slot and its daemon, the
// stall, and the problems, each once.
func writeShared(b *strings.Builder, r fkmat.StatusReport, now time.Time) {
	if sl := r.Slot; sl != nil {
		b.WriteString("\nslot " + sl.Name + "\n")
		switch {
		case !sl.Exists:
			writeField(b, "state", "missing")
		case sl.Active:
			writeField(b, "state", "active, wal_status "+dash(sl.WALStatus))
		default:
			writeField(b, "state", "inactive, wal_status "+dash(sl.WALStatus))
		}
		if sl.Exists {
			retains := human.Bytes(sl.RetainedWALBytes) + " of WAL"
			if sl.SafeWALSizeBytes >= 0 {
				retains += " (" + human.Bytes(sl.SafeWALSizeBytes) + " more before max_slot_wal_keep_size)"
			}
			writeField(b, "retains", retains)
		}
		if d := r.Daemon; d != nil {
			writeField(b, "daemon", fmt.Sprintf("fkmat %s on %s, pid %d, started %s ago", d.Version, d.Host, d.PID,
				human.Duration(max(now.Sub(d.StartedAt), 0))))
			writeField(b, "last seen", human.Duration(max(now.Sub(d.HeartbeatAt), 0))+" ago")
		} else {
			writeField(b, "daemon", "none has reported itself")
		}
	}
	if st := r.Stall; st != nil {
		fmt.Fprintf(b, "\nstall since %s (%s ago), the same error %d times\n", st.Since.Format(time.RFC3339),
			human.Duration(max(now.Sub(st.Since), 0)), st.Recurrences+1)
		at := "restart position " + st.RestartLSN
		if st.LSN != "" {
			at += ", transaction committed at " + st.LSN
		}
		writeField(b, "at", at)
		if st.Table != "" {
			writeField(b, "table", st.Table+" (key "+st.KeyColumns+")")
		}
		writeField(b, "error", st.Error)
		if st.Fix != "" {
			writeField(b, "fix", st.Fix)
		}
	}
	if len(r.Problems) > 0 {
		b.WriteString("\n")
	}
	for _, p := range r.Problems {
		writeWrapped(b, "problem: ", "  ", p)
	}
}

// targetText is the target table, its state and rows.
func targetText(s fkmat.JoinStatus) string {
	switch {
	case s.TargetState == "missing":
		return s.Target + ", missing"
	case s.TargetRows < 0:
		return s.Target + ", " + strings.ReplaceAll(s.TargetState, "_", " ")
	}
	out := s.Target
	if s.TargetState != "ok" {
		out += " (" + strings.ReplaceAll(s.TargetState, "_", " ") + ")"
	}
	rows := human.Count(s.TargetRows) + " rows"
	if s.TargetRows == 1 {
		rows = "1 row"
	}
	if s.TargetRowsEstimated {
		rows = "~" + rows + " (estimated)"
	}
	return out + ", " + rows
}

// redisText is the Redis state, its subscriptions, and its checkpoint when
// it is not the target's.
func redisText(s fkmat.JoinStatus) string {
	out := strings.ReplaceAll(s.RedisState, "_", " ")
	if s.Subscriptions >= 0 {
		out += ", " + countText(s.Subscriptions) + " subscriptions"
	}
	if s.RedisCheckpoint != "" && s.RedisCheckpoint != s.CheckpointLSN {
		out += ", at " + s.RedisCheckpoint
	}
	return out
}

// phaseText is the join's phase; "streaming" only while a daemon streams
// it (the phase fkmat.join_state records stays when run stops).
func phaseText(s fkmat.JoinStatus) string {
	phase := strings.ReplaceAll(s.Phase, "_", " ")
	if s.Phase == "streaming" && (s.Daemon == nil || !s.Daemon.Live || !s.SlotActive) {
		return "built, not streaming: no fkmat run streams it"
	}
	return phase
}

// countText is n readable, or "unknown" for -1.
func countText(n int64) string {
	if n < 0 {
		return "unknown"
	}
	return human.Count(n)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeField writes "  key:       value" of a block, the value wrapped to
// statusWidth under its first column.
func writeField(b *strings.Builder, key, value string) {
	first := fmt.Sprintf("  %-*s", statusKeyWidth+2, key+":")
	writeWrapped(b, first, strings.Repeat(" ", len(first)), value)
}

// writeWrapped writes text after first, wrapped at spaces to statusWidth,
// with each further line after indent.
func writeWrapped(b *strings.Builder, first, indent, text string) {
	prefix, line := first, ""
	flush := func() {
		b.WriteString(strings.TrimRight(prefix+line, " ") + "\n")
		prefix, line = indent, ""
	}
	width := utf8.RuneCountInString
	for _, word := range strings.Fields(text) {
		if line != "" && width(prefix)+width(line)+1+width(word) > statusWidth {
			flush()
		}
		if line != "" {
			line += " "
		}
		line += word
	}
	flush()
}

// rebuildText says how far a rebuild beside the running join is.
func rebuildText(bs fkmat.BuildStatus, now time.Time) string {
	if !bs.Running {
		return fmt.Sprintf("interrupted while %s, last progress %s ago; the next fkmat run builds it again (it ran because: %s); "+
			"the target streams the old definition meanwhile", bs.Phase, human.Duration(max(now.Sub(bs.UpdatedAt), 0)), bs.Reason)
	}
	what := bs.Phase
	switch bs.Phase {
	case "loading":
		what = "loading " + human.Count(bs.RowsDone) + " of " + human.Count(bs.RowsTotal) + " rows"
		if bs.ETASeconds >= 0 {
			what += ", about " + human.Duration(time.Duration(bs.ETASeconds*float64(time.Second))) + " left"
		}
	case "catching up":
		what = "catching up with the stream (" + human.Count(bs.RowsDone) + " rows loaded)"
	}
	meanwhile := "the target streams the old definition until the switch"
	if bs.Unmaintained {
		meanwhile = "the target keeps its rows, not maintained, until the switch"
	}
	return fmt.Sprintf("%s; %s, Redis holds the old and the new state, "+
		"the target database a shadow of the target, and the source the WAL of a second slot (fkmat check --plan estimates them); "+
		"started %s ago on %s (pid %d) because: %s",
		what, meanwhile, human.Duration(max(now.Sub(bs.StartedAt), 0)), bs.Host, bs.PID, bs.Reason)
}

// buildText says how far a backfill is, or where it was interrupted.
func buildText(bs fkmat.BuildStatus, now time.Time) string {
	done := human.Count(bs.RowsDone) + " of " + human.Count(bs.RowsTotal) + " rows"
	if bs.RowsTotal > 0 {
		done += fmt.Sprintf(" (%d%%)", min(100*bs.RowsDone/bs.RowsTotal, 100))
	}
	if !bs.Running {
		return fmt.Sprintf("interrupted at %s, last progress %s ago; the next fkmat run or fkmat backfill starts it again (it ran because: %s)",
			done, human.Duration(max(now.Sub(bs.UpdatedAt), 0)), bs.Reason)
	}
	left := ""
	if bs.ETASeconds >= 0 {
		left = ", about " + human.Duration(time.Duration(bs.ETASeconds*float64(time.Second))) + " left"
	}
	return fmt.Sprintf("%s%s; started %s ago on %s (pid %d) because: %s", done, left,
		human.Duration(max(now.Sub(bs.StartedAt), 0)), bs.Host, bs.PID, bs.Reason)
}
