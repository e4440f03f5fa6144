package fkmat

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/human"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// JoinStatus is one join's block of `fkmat status` (its row with --wide).
type JoinStatus struct {
	Join              string `json:"join"`
	Target            string `json:"target"`
	Phase             string `json:"phase"` // never_backfilled, backfilling, streaming
	Slot              string `json:"slot"`
	SlotExists        bool   `json:"slot_exists"`
	SlotActive        bool   `json:"slot_active"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	CurrentWALLSN     string `json:"current_wal_lsn"`
	LagBytes          int64  `json:"lag_bytes"`
	CheckpointLSN     string `json:"checkpoint_lsn"`
	RedisCheckpoint   string `json:"redis_checkpoint_lsn"`
	RedisState        string `json:"redis_state"` // ok, none (never built, or torn down), lost, foreign, other_layout
	// RedisLayout is the state's layout: version and bucket counts.
	RedisLayout string `json:"redis_layout,omitempty"`
	// TargetState is ok, missing (no target table), or wrong_shape (see
	// Problems); Metadata is ok or missing (fkmat's schema was never
	// migrated in the target database).
	TargetState string `json:"target_state"`
	Metadata    string `json:"metadata"`
	TargetRows  int64  `json:"target_rows"` // -1 when there is no target table
	// TargetRowsEstimated is set when TargetRows is the planner's estimate
	// (pg_class.reltuples): for targets above exactCountLimit rows, where
	// count(*) would scan the whole table.
	TargetRowsEstimated bool  `json:"target_rows_estimated"`
	Subscriptions       int64 `json:"subscriptions"` // -1 when unknown
	// Edges are, for a join of more than two tables, each entry's state:
	// its subscriptions (left keys per key of the entry's table) and its
	// checkpoint; Subscriptions is then their sum.
	Edges []EdgeStatus `json:"edges,omitempty"`
	// RetainedWALBytes is the WAL the slot keeps on the source's disk
	// (pg_current_wal_lsn() - restart_lsn); WALStatus its wal_status
	// (reserved, extended, unreserved, lost); SafeWALSizeBytes its
	// safe_wal_size, -1 when max_slot_wal_keep_size is unlimited.
	RetainedWALBytes int64  `json:"retained_wal_bytes"`
	WALStatus        string `json:"wal_status"`
	SafeWALSizeBytes int64  `json:"safe_wal_size_bytes"`
	// Daemon is the fkmat run that last reported itself streaming from the
	// slot (fkmat.daemon), nil when none ever did.
	Daemon *DaemonStatus `json:"daemon,omitempty"`
	// Stall is the daemon's current stall (the same error recurring at the
	// same source position), nil when it has none.
	Stall *StallStatus `json:"stall,omitempty"`
	// Problems lists what status found wrong, each with its fix.
	Problems []string `json:"problems,omitempty"`
	// Build is the backfill of the join, while it runs or after it was
	// interrupted (phase backfilling); nil otherwise.
	Build *BuildStatus `json:"build,omitempty"`
}

// DaemonStatus is the daemon as it last reported itself (every 10 s while
// it streams).
type DaemonStatus struct {
	Host        string    `json:"host"`
	PID         int       `json:"pid"`
	Version     string    `json:"version"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	// LagSeconds is how far behind the source it was at HeartbeatAt: the
	// time since the source commit of the last transaction it applied,
	// while it had a backlog; 0 without one.
	LagSeconds float64 `json:"lag_seconds"`
	// LastCommitTime is the source commit time of the last transaction it
	// applied, if any.
	LastCommitTime *time.Time `json:"last_commit_time,omitempty"`
	// Live is set when the heartbeat is recent (within a minute).
	Live bool `json:"live"`
}

// StallStatus is a stall as fkmat status shows it (from fkmat.stall).
type StallStatus struct {
	RestartLSN  string    `json:"restart_lsn"`
	LSN         string    `json:"lsn,omitempty"`
	Table       string    `json:"table,omitempty"`
	KeyColumns  string    `json:"key_columns,omitempty"`
	Error       string    `json:"error"`
	Recurrences int       `json:"recurrences"`
	Since       time.Time `json:"since"`
	UpdatedAt   time.Time `json:"updated_at"`
	// Fix names what gets the pipeline going again.
	Fix string `json:"fix"`
}

// Status reports each join's replication and checkpoint state. It is
// read-only (a role with SELECT on the target and fkmat's schema, and the
// Redis read commands, is enough) and reports, rather than fails on, a
// missing metadata schema, a missing target or a target of the wrong shape.
func Status(ctx context.Context, cfg *config.Config, opts Options) ([]JoinStatus, error) {
	opts.setDefaults()
	source, err := connectPostgres(ctx, cfg.Source, "source", cfg.TimeZone)
	if err != nil {
		return nil, err
	}
	defer source.Close()
	target := source
	if cfg.Target != cfg.Source {
		if target, err = connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone); err != nil {
			return nil, err
		}
		defer target.Close()
	}
	rdb, err := connectRedis(ctx, cfg.Redis)
	if err != nil {
		return nil, err
	}
	defer func() { _ = rdb.Close() }()
	plans, err := plan.Resolve(ctx, source, cfg)
	if err != nil {
		return nil, err
	}
	client, err := cdc.New(cdc.Config{ConnString: cfg.Source, Slot: cfg.Slot, Publication: cfg.Publication,
		Tables: publishedTables(plans), Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	info, err := client.SlotInfo(ctx)
	if err != nil {
		return nil, err
	}
	meta, err := readStatusMeta(ctx, target, cfg.Slot)
	if err != nil {
		return nil, err
	}
	w := sink.NewWriter(target)
	var out []JoinStatus
	for _, p := range plans {
		s := JoinStatus{
			Join: p.Name, Target: p.Target.Ident(), Slot: cfg.Slot, SlotExists: info.Exists,
			SlotActive: info.ActivePID != 0, ConfirmedFlushLSN: info.ConfirmedFlushLSN.String(),
			CurrentWALLSN: info.CurrentLSN.String(), LagBytes: info.LagBytes, CheckpointLSN: meta.checkpoint.String(),
			Phase: "never_backfilled", RedisState: "ok", Metadata: "ok", TargetState: "ok", TargetRows: -1, Subscriptions: -1,
			RetainedWALBytes: info.RetainedBytes, WALStatus: info.WALStatus, SafeWALSizeBytes: info.SafeWALSize,
			Daemon: meta.daemon, Stall: meta.stall,
		}
		st := meta.joins[p.Name]
		if !meta.migrated {
			s.Metadata = "missing"
			s.Problems = append(s.Problems, "fkmat's metadata schema is missing in the target database; run fkmat migrate (or fkmat run)")
		}
		if st.exists {
			s.Phase = st.phase
		}
		if b := meta.builds[p.Name]; b != nil && s.Phase == "streaming" {
			b.Beside, b.Unmaintained = true, st.frozenLSN != 0
			if !b.Running {
				b.ETASeconds = -1
			}
			s.Build = b
		}
		if s.Phase == "backfilling" {
			s.Build = meta.builds[p.Name]
			if b := s.Build; b != nil && !b.Running {
				s.Problems = append(s.Problems, fmt.Sprintf("the backfill of join %q was interrupted (no progress since %s): "+
					"start fkmat run or fkmat backfill to start it again; the target keeps its old rows meanwhile",
					p.Name, b.UpdatedAt.UTC().Format(time.RFC3339)))
			}
		}
		s.Problems = append(s.Problems, slotProblems(cfg.Slot, info, s.Phase, meta.daemon, opts.MaxInactive, time.Now())...)
		if err := statusRedis(ctx, rdb, cfg.Slot, opts, p, st, &s); err != nil {
			return nil, err
		}
		// The shape the target has now: the one it was built with while a
		// changed definition is rebuilt (or waits for run to be).
		shape := &p.Target
		if meta.migrated {
			if built, err := builtShape(ctx, target, cfg.Slot, p); err == nil {
				shape = built
			}
		}
		if err := statusTarget(ctx, target, w, shape, &s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// BuildStatus is a backfill of a join: why it runs, how far it is.
type BuildStatus struct {
	Reason    string    `json:"reason"`
	Phase     string    `json:"phase"` // loading
	RowsDone  int64     `json:"rows_done"`
	RowsTotal int64     `json:"rows_total"` // estimated; grows when low
	Host      string    `json:"host"`
	PID       int       `json:"pid"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Running says the build recorded progress within buildStaleAfter;
	// otherwise it was interrupted, and the next fkmat run or backfill
	// starts it again.
	Running bool `json:"running"`
	// ETASeconds is the time left at the build's average speed so far; -1
	// when unknown (not running, nothing done yet).
	ETASeconds float64 `json:"eta_seconds"`
	// Beside says it builds the join anew beside the running one (a
	// changed definition, backfill --force while the joins stream): the
	// target streams the old definition until the switch. Phase is then
	// loading, catching up (rows done are the loaded ones) or switching.
	Beside bool `json:"beside"`
	// Unmaintained says the target is not maintained until the switch: the
	// source no longer has what the old definition reads.
	Unmaintained bool `json:"unmaintained,omitempty"`
}

// buildStaleAfter is how long a build may not record progress before
// status calls it interrupted: many times its recording interval.
const buildStaleAfter = 10 * time.Second

// Verdicts of a StatusReport, worst first: the report's is the worst that
// applies.
const (
	// VerdictError: status could not look (a bad configuration, a database
	// it cannot reach).
	VerdictError = "error"
	// VerdictStalled: fkmat run fails on the same change again and again.
	VerdictStalled = "stalled"
	// VerdictNotRunning: nothing streams from the slot of a streaming join,
	// or no join was ever backfilled. Past --max-inactive it is a problem
	// too.
	VerdictNotRunning = "not_running"
	// VerdictProblem: status found something to fix (Problems).
	VerdictProblem = "problem"
	// VerdictOK: every join streams or backfills, and nothing is wrong.
	VerdictOK = "ok"
)

// StatusReport is what fkmat status says of the joins of one slot: a
// verdict, the slot, daemon and stall they share, and each join's status.
type StatusReport struct {
	// Verdict is one of the Verdict constants; Summary says it in a line.
	Verdict string `json:"verdict"`
	Summary string `json:"summary"`
	// OK is set when status exits 0: no error, no stall, no problem (a
	// daemon stopped for less than --max-inactive is OK).
	OK     bool          `json:"ok"`
	Slot   *SlotStatus   `json:"slot,omitempty"`
	Daemon *DaemonStatus `json:"daemon,omitempty"`
	Stall  *StallStatus  `json:"stall,omitempty"`
	Joins  []JoinStatus  `json:"joins"`
	// Problems are the joins' problems, each once; with Error, the
	// configuration's problems, if that is the error.
	Problems []string `json:"problems"`
	Error    string   `json:"error,omitempty"`
}

// SlotStatus is the replication slot the joins share, and the target's
// checkpoint in it.
type SlotStatus struct {
	Name              string `json:"name"`
	Exists            bool   `json:"exists"`
	Active            bool   `json:"active"`
	WALStatus         string `json:"wal_status"`
	ConfirmedFlushLSN string `json:"confirmed_flush_lsn"`
	CurrentWALLSN     string `json:"current_wal_lsn"`
	LagBytes          int64  `json:"lag_bytes"`
	RetainedWALBytes  int64  `json:"retained_wal_bytes"`
	SafeWALSizeBytes  int64  `json:"safe_wal_size_bytes"` // -1: max_slot_wal_keep_size is unlimited
	CheckpointLSN     string `json:"checkpoint_lsn"`
}

// SummarizeStatus gives the verdict on the joins' statuses (of one slot,
// as Status returns them) at now.
func SummarizeStatus(st []JoinStatus, now time.Time) StatusReport {
	r := StatusReport{Joins: st, Problems: []string{}}
	if r.Joins == nil {
		r.Joins = []JoinStatus{}
	}
	seen := map[string]bool{}
	troubled := 0
	for _, s := range st {
		if len(s.Problems) > 0 {
			troubled++
		}
		for _, p := range s.Problems {
			if !seen[p] {
				seen[p] = true
				r.Problems = append(r.Problems, p)
			}
		}
	}
	if len(st) > 0 {
		s := st[0]
		r.Daemon, r.Stall = s.Daemon, s.Stall
		r.Slot = &SlotStatus{Name: s.Slot, Exists: s.SlotExists, Active: s.SlotActive, WALStatus: s.WALStatus,
			ConfirmedFlushLSN: s.ConfirmedFlushLSN, CurrentWALLSN: s.CurrentWALLSN, LagBytes: s.LagBytes,
			RetainedWALBytes: s.RetainedWALBytes, SafeWALSizeBytes: s.SafeWALSizeBytes, CheckpointLSN: s.CheckpointLSN}
	}
	r.OK = r.Stall == nil && len(r.Problems) == 0
	phases := countPhases(st)
	switch {
	case r.Stall != nil:
		r.Verdict, r.Summary = VerdictStalled, stallSummary(r.Stall, now)
	case phases.notRunning(r):
		r.Verdict, r.Summary = VerdictNotRunning, notRunningSummary(r, phases, now)
	case len(r.Problems) > 0:
		r.Verdict = VerdictProblem
		switch {
		case len(st) == 1:
			r.Summary = fmt.Sprintf("join %s has %s (see below)", st[0].Join, plural(len(st[0].Problems), "a problem", "%d problems"))
		case troubled == 1:
			r.Summary = fmt.Sprintf("1 of %d joins has a problem (see below)", len(st))
		default:
			r.Summary = fmt.Sprintf("%d of %d joins have problems (see below)", troubled, len(st))
		}
		return r
	default:
		r.Verdict, r.Summary = VerdictOK, okSummary(r, phases)
	}
	if len(r.Problems) > 0 { // a stall or no daemon, and more
		r.Summary += " (" + plural(len(r.Problems), "1 problem", "%d problems") + " below)"
	}
	return r
}

// FailedStatus is the report of a status that could not look: err, and the
// configuration's problems if err is a *config.ConfigError.
func FailedStatus(err error) StatusReport {
	msg := err.Error()
	summary, _, _ := strings.Cut(msg, "\n")
	r := StatusReport{Verdict: VerdictError, Summary: strings.TrimSuffix(summary, ":"), Joins: []JoinStatus{}, Problems: []string{}, Error: msg}
	if ce, ok := errors.AsType[*config.ConfigError](err); ok {
		r.Problems = append(r.Problems, ce.Problems...)
	}
	return r
}

// phaseCounts counts joins by phase.
type phaseCounts struct{ streaming, backfilling, never int }

func countPhases(st []JoinStatus) phaseCounts {
	var c phaseCounts
	for _, s := range st {
		switch s.Phase {
		case "streaming":
			c.streaming++
		case "backfilling":
			c.backfilling++
		default:
			c.never++
		}
	}
	return c
}

// notRunning is whether r's joins want fkmat run and nothing streams from
// their slot: a join streams, or none was ever backfilled. The slot's
// activity says it, not the heartbeat, which stays recent for a minute
// after a stop. A backfill does not use the slot, so a backfilling join
// counts as running.
func (c phaseCounts) notRunning(r StatusReport) bool {
	if r.Slot == nil || r.Slot.Active {
		return false
	}
	return c.streaming > 0 || c.backfilling == 0
}

func stallSummary(s *StallStatus, now time.Time) string {
	at := s.RestartLSN
	if s.LSN != "" {
		at = s.LSN
	}
	if s.Table != "" {
		at += " on " + s.Table
	}
	return fmt.Sprintf("fkmat run failed %s in %s at %s", plural(s.Recurrences+1, "once", "%d times"), human.Duration(max(now.Sub(s.Since), 0)), at)
}

func notRunningSummary(r StatusReport, c phaseCounts, now time.Time) string {
	if c.streaming == 0 {
		return plural(c.never, "1 join", "%d joins") + " never backfilled: start fkmat run"
	}
	out := "no fkmat run ever reported itself"
	if d := r.Daemon; d != nil {
		out = "last seen " + human.Duration(max(now.Sub(d.HeartbeatAt), 0)) + " ago"
	}
	if r.Slot.Exists {
		out += fmt.Sprintf(", slot %s retains %s", r.Slot.Name, human.Bytes(r.Slot.RetainedWALBytes))
	}
	return out
}

func okSummary(r StatusReport, c phaseCounts) string {
	var parts []string
	if c.streaming > 0 {
		parts = append(parts, plural(c.streaming, "1 join", "%d joins")+" streaming")
	}
	if c.backfilling > 0 {
		if len(parts) == 0 {
			parts = append(parts, plural(c.backfilling, "1 join", "%d joins")+" backfilling")
		} else {
			parts = append(parts, fmt.Sprintf("%d backfilling", c.backfilling))
		}
	}
	if d := r.Daemon; c.streaming > 0 && r.Slot.Active && d != nil && d.Live {
		parts = append(parts, fmt.Sprintf("lag %.1f s", d.LagSeconds))
	}
	if r.Slot != nil && r.Slot.Exists {
		parts = append(parts, fmt.Sprintf("slot %s retains %s", r.Slot.Name, human.Bytes(r.Slot.RetainedWALBytes)))
	}
	if len(parts) == 0 {
		return "no joins"
	}
	return strings.Join(parts, ", ")
}

// plural is one when n is 1, else other formatted with n:
// plural(n, "1 join", "%d joins").
func plural(n int, one, other string) string {
	if n == 1 {
		return one
	}
	return fmt.Sprintf(other, n)
}

// statusMeta is what status reads of fkmat's metadata in the target.
type statusMeta struct {
	migrated   bool
	checkpoint wal.LSN
	joins      map[string]joinState
	stall      *StallStatus
	daemon     *DaemonStatus
	builds     map[string]*BuildStatus
}

// slotProblems lists what is wrong with the slot of a join in phase: it is
// missing, invalidated or about to be, or nobody has streamed from it for
// longer than maxInactive (by the daemon's heartbeat).
func slotProblems(slot string, info cdc.SlotInfo, phase string, d *DaemonStatus, maxInactive time.Duration, now time.Time) []string {
	var out []string
	switch {
	case !info.Exists:
		if phase != "never_backfilled" {
			out = append(out, fmt.Sprintf("replication slot %q is missing (dropped?): the changes since the checkpoint are lost; run fkmat backfill --force", slot))
		}
		return out
	case info.WALStatus == "lost":
		out = append(out, fmt.Sprintf("replication slot %q is invalidated (wal_status lost: it retained more than max_slot_wal_keep_size): "+
			"run fkmat backfill --force, and raise max_slot_wal_keep_size", slot))
	case info.WALStatus == "unreserved":
		out = append(out, fmt.Sprintf("replication slot %q is about to be invalidated (wal_status unreserved: it retains %s, past max_slot_wal_keep_size): "+
			"get fkmat run streaming from it, or raise max_slot_wal_keep_size", slot, human.Bytes(info.RetainedBytes)))
	}
	if info.Active || phase != "streaming" {
		return out
	}
	switch {
	case d == nil:
		out = append(out, fmt.Sprintf("no fkmat run streams from replication slot %q (none has reported itself in fkmat.daemon); "+
			"it retains %s of WAL on the source's disk: start fkmat run, or fkmat teardown if the join is no longer wanted", slot, human.Bytes(info.RetainedBytes)))
	case now.Sub(d.HeartbeatAt) > maxInactive:
		out = append(out, fmt.Sprintf("no fkmat run has streamed from replication slot %q for %s (last: %s on %s, pid %d); "+
			"it retains %s of WAL on the source's disk: start fkmat run, or fkmat teardown if the join is no longer wanted",
			slot, now.Sub(d.HeartbeatAt).Round(time.Second), d.Version, d.Host, d.PID, human.Bytes(info.RetainedBytes)))
	}
	return out
}

func readStatusMeta(ctx context.Context, target *pgxpool.Pool, slot string) (statusMeta, error) {
	m := statusMeta{joins: map[string]joinState{}}
	var hasStall, hasDaemon, hasBuild bool
	err := target.QueryRow(ctx, `SELECT to_regclass('fkmat.join_state') IS NOT NULL AND to_regclass('fkmat.checkpoint') IS NOT NULL,
		to_regclass('fkmat.stall') IS NOT NULL, to_regclass('fkmat.daemon') IS NOT NULL, to_regclass('fkmat.build') IS NOT NULL`).Scan(
		&m.migrated, &hasStall, &hasDaemon, &hasBuild)
	if err != nil || !m.migrated {
		return m, err
	}
	if hasDaemon {
		var d DaemonStatus
		err := target.QueryRow(ctx, `SELECT host, pid, version, started_at, heartbeat_at, lag_seconds, last_commit_time,
			heartbeat_at > now() - interval '1 minute' FROM fkmat.daemon WHERE slot = $1`, slot).Scan(
			&d.Host, &d.PID, &d.Version, &d.StartedAt, &d.HeartbeatAt, &d.LagSeconds, &d.LastCommitTime, &d.Live)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return m, fmt.Errorf("read fkmat.daemon: %w", err)
		default:
			m.daemon = &d
		}
	}
	lsn, err := sink.NewWriter(target).Checkpoint(ctx, slot)
	if err != nil {
		return m, err
	}
	m.checkpoint = lsn
	rows, err := target.Query(ctx, `SELECT join_name, epoch, phase, coalesce((to_jsonb(s) ->> 'generation')::int, 0), coalesce(to_jsonb(s) ->> 'frozen_lsn', '')
		FROM fkmat.join_state s WHERE slot = $1`, slot)
	if err != nil {
		return m, fmt.Errorf("read fkmat.join_state: %w", err)
	}
	for rows.Next() {
		var name string
		st := joinState{exists: true}
		var frozen string
		if err := rows.Scan(&name, &st.epoch, &st.phase, &st.generation, &frozen); err != nil {
			rows.Close()
			return m, fmt.Errorf("read fkmat.join_state: %w", err)
		}
		if frozen != "" {
			if st.frozenLSN, err = wal.ParseLSN(frozen); err != nil {
				rows.Close()
				return m, fmt.Errorf("read fkmat.join_state: %w", err)
			}
		}
		m.joins[name] = st
	}
	if err := rows.Err(); err != nil {
		return m, fmt.Errorf("read fkmat.join_state: %w", err)
	}
	if hasBuild {
		if m.builds, err = readBuilds(ctx, target, slot); err != nil {
			return m, err
		}
	}
	if !hasStall {
		return m, nil
	}
	var st StallStatus
	var lsnText *string
	err = target.QueryRow(ctx, `SELECT restart_lsn::text, lsn::text, table_name, key_columns, error, recurrences, since, updated_at
		FROM fkmat.stall WHERE slot = $1`, slot).Scan(&st.RestartLSN, &lsnText, &st.Table, &st.KeyColumns, &st.Error,
		&st.Recurrences, &st.Since, &st.UpdatedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return m, nil
	case err != nil:
		return m, fmt.Errorf("read fkmat.stall: %w", err)
	}
	if lsnText != nil {
		st.LSN = *lsnText
	}
	restart, err := wal.ParseLSN(st.RestartLSN)
	if err != nil {
		return m, fmt.Errorf("read fkmat.stall: %w", err)
	}
	st.Fix = stallFix(Stall{Position: restart})
	m.stall = &st
	return m, nil
}

// EdgeStatus is the Redis state of one table of a join of more than two
// tables: its rows, and its references to the entries it references.
type EdgeStatus struct {
	Entry           string `json:"entry"` // the left table's name, or the entry's as name
	Subscriptions   int64  `json:"subscriptions"`
	RedisCheckpoint string `json:"redis_checkpoint_lsn"`
}

// statusRedis fills the Redis part of s, reading the join's meta hashes
// only: its state's, or each step's of a join of more than two tables.
func statusRedis(ctx context.Context, rdb redis.UniversalClient, slot string, opts Options, p *plan.JoinPlan, st joinState, s *JoinStatus) error {
	if p.Edges == nil {
		return statusStore(ctx, rdb, redisstore.GenerationPrefix(slot, p.Name, st.generation), opts, p, st, s)
	}
	var total int64
	for t := range p.States() {
		one := JoinStatus{RedisState: "ok"}
		if err := statusStore(ctx, rdb, redisstore.StatePrefixes(slot, p.Name, p.States()-1, st.generation)[t], opts, p, st, &one); err != nil {
			return err
		}
		for _, problem := range one.Problems { // a join's tables lose their states together
			if !slices.Contains(s.Problems, problem) {
				s.Problems = append(s.Problems, problem)
			}
		}
		if one.RedisState != "ok" && s.RedisState == "ok" {
			s.RedisState = one.RedisState
		}
		if t == 0 {
			s.RedisCheckpoint, s.RedisLayout = one.RedisCheckpoint, one.RedisLayout
		}
		if one.Subscriptions >= 0 && total >= 0 {
			total += one.Subscriptions
		} else {
			total = -1
		}
		s.Edges = append(s.Edges, EdgeStatus{Entry: stateName(p, t), Subscriptions: one.Subscriptions, RedisCheckpoint: one.RedisCheckpoint})
	}
	s.Subscriptions = total
	return nil
}

// stateName names Redis state t of tree p: its table's (the left table's
// name, an entry's as), or a roll-up's results and children.
func stateName(p *plan.JoinPlan, t int) string {
	switch e, r := len(p.Edges), len(p.Rollups); {
	case t == 0:
		return p.Left.Table.String()
	case t <= e:
		return p.Edges[t-1].Alias
	case t <= e+r:
		return "roll-up " + p.Rollups[t-e-1].Table.Table.String() + " (results)"
	default:
		return "roll-up " + p.Rollups[t-e-r-1].Table.Table.String()
	}
}

// statusStore fills the Redis part of s from one state's meta hash.
func statusStore(ctx context.Context, rdb redis.UniversalClient, prefix string, opts Options, p *plan.JoinPlan, st joinState, s *JoinStatus) error {
	store, err := redisstore.Open(ctx, rdb, redisstore.Config{Prefix: prefix,
		SubShards: opts.SubShards, RowShards: opts.RowShards})
	if err != nil {
		return fmt.Errorf("join %q: %w", p.Name, err)
	}
	meta, err := store.Meta(ctx)
	// Before its first backfill a join has no state; after, run rebuilds a
	// lost or foreign one from a new snapshot (or refuses, by
	// --on-lost-state), so status says so.
	streaming := st.exists && st.phase == "streaming"
	switch {
	case errors.Is(err, redisstore.ErrNoState) && !st.exists:
		s.RedisState = "none" // never built, or torn down: nothing was lost
	case errors.Is(err, redisstore.ErrNoState):
		s.RedisState = "lost"
		if streaming {
			s.Problems = append(s.Problems, fmt.Sprintf("the Redis state of join %q is lost (flushed, evicted, or a Redis restarted without persistence): "+
				"fkmat run rebuilds it from a new snapshot (unless --on-lost-state refuse; then run fkmat backfill --force)", p.Name))
		}
	case err != nil:
		return fmt.Errorf("join %q: %w", p.Name, err)
	case st.exists && meta.Epoch != st.epoch:
		s.RedisState = "foreign"
		if streaming {
			s.Problems = append(s.Problems, fmt.Sprintf("the Redis state of join %q belongs to another build of the target (epoch %s, the target's %s): "+
				"fkmat run rebuilds it from a new snapshot (unless --on-lost-state refuse; then run fkmat backfill --force)", p.Name, meta.Epoch, st.epoch))
		}
	default:
		s.RedisCheckpoint = meta.Checkpoint.String()
		s.Subscriptions = meta.Subscriptions
		s.RedisLayout = meta.Layout
		if err := store.CheckLayout(meta); err != nil {
			s.RedisState = "other_layout"
			s.Problems = append(s.Problems, fmt.Sprintf("the Redis state of join %q has another layout (%s): fkmat run rebuilds it, or run fkmat backfill --force", p.Name, meta.Layout))
		} else if perBucket := meta.Subscriptions / int64(meta.Shape.LeftBuckets); perBucket > redisstore.BucketFields {
			s.Problems = append(s.Problems, fmt.Sprintf("the Redis state of join %q outgrew its %d left-row buckets (some %d rows each, over %d: Redis keeps them, but 2-3 times less compactly); fkmat run resizes it within --grow-check-interval of its start (fkmat backfill --force sizes it at once)",
				p.Name, meta.Shape.LeftBuckets, perBucket, redisstore.BucketFields))
		}
	}
	return nil
}

// statusTarget fills the target part of s without creating anything.
func statusTarget(ctx context.Context, target *pgxpool.Pool, w *sink.Writer, shape *sink.Table, s *JoinStatus) error {
	var exists bool
	if err := target.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, shape.Ident()).Scan(&exists); err != nil {
		return fmt.Errorf("look up target %s: %w", shape.Ident(), err)
	}
	if !exists {
		s.TargetState = "missing"
		s.Problems = append(s.Problems, fmt.Sprintf("target table %s does not exist; create it with fkmat migrate (or fkmat run)", shape.Ident()))
		return nil
	}
	if err := w.CheckTable(ctx, shape); err != nil {
		s.TargetState = "wrong_shape"
		s.Problems = append(s.Problems, err.Error())
	}
	var err error
	s.TargetRows, s.TargetRowsEstimated, err = countRows(ctx, target, shape.Ident())
	return err
}

// exactCountLimit is the estimated size above which status reports a
// table's planner estimate instead of scanning it with count(*).
var exactCountLimit int64 = 1_000_000

// countRows returns the rows of table (a quoted identifier): exact below
// exactCountLimit by the planner's estimate, else the estimate itself.
func countRows(ctx context.Context, db *pgxpool.Pool, table string) (n int64, estimated bool, err error) {
	var est int64
	if err := db.QueryRow(ctx, `SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = $1::regclass`, table).Scan(&est); err != nil {
		return 0, false, fmt.Errorf("estimate rows of %s: %w", table, err)
	}
	if est >= exactCountLimit {
		return est, true, nil
	}
	if err := db.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		return 0, false, fmt.Errorf("count rows of %s: %w", table, err)
	}
	return n, false, nil
}

// readBuilds reads fkmat.build for slot, by join.
func readBuilds(ctx context.Context, target *pgxpool.Pool, slot string) (map[string]*BuildStatus, error) {
	rows, err := target.Query(ctx, `SELECT join_name, reason, phase, rows_done, rows_total, host, pid, started_at, updated_at,
			updated_at > now() - $2::interval, extract(epoch FROM now() - started_at)
		FROM fkmat.build WHERE slot = $1`, slot, buildStaleAfter.String())
	if err != nil {
		return nil, fmt.Errorf("read fkmat.build: %w", err)
	}
	defer rows.Close()
	out := map[string]*BuildStatus{}
	for rows.Next() {
		var name string
		var elapsed float64
		b := &BuildStatus{ETASeconds: -1}
		if err := rows.Scan(&name, &b.Reason, &b.Phase, &b.RowsDone, &b.RowsTotal, &b.Host, &b.PID, &b.StartedAt, &b.UpdatedAt,
			&b.Running, &elapsed); err != nil {
			return nil, fmt.Errorf("read fkmat.build: %w", err)
		}
		if b.Running && b.RowsDone > 0 && elapsed > 0 {
			b.ETASeconds = max(float64(b.RowsTotal-b.RowsDone), 0) / (float64(b.RowsDone) / elapsed)
		}
		out[name] = b
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read fkmat.build: %w", err)
	}
	return out, nil
}
