package fkmat

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fkmat/fkmat/internal/plan"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// JoinStatus is one join's line of `fkmat status`.
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
	RedisState        string `json:"redis_state"` // ok, lost, foreign, other_layout
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
}

// Status reports each join's replication and checkpoint state. It is
// read-only (a role with SELECT on the target and fkmat's schema, and the
// Redis read commands, is enough) and reports, rather than fails on, a
// missing metadata schema, a missing target or a target of the wrong shape.
func Status(ctx context.Context, cfg *config.Config, opts Options) ([]JoinStatus, error) {
	opts.setDefaults()
	source, err := connectPostgres(ctx, cfg.Source, "source")
	if err != nil {
		return nil, err
	}
	defer source.Close()
	target := source
	if cfg.Target != cfg.Source {
		if target, err = connectPostgres(ctx, cfg.Target, "target"); err != nil {
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
		s.Problems = append(s.Problems, slotProblems(cfg.Slot, info, s.Phase, meta.daemon, opts.MaxInactive, time.Now())...)
		if err := statusRedis(ctx, rdb, cfg.Slot, opts, p, st, &s); err != nil {
			return nil, err
		}
		if err := statusTarget(ctx, target, w, p, &s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// statusMeta is what status reads of fkmat's metadata in the target.
type statusMeta struct {
	migrated   bool
	checkpoint cdc.LSN
	joins      map[string]joinState
	stall      *StallStatus
	daemon     *DaemonStatus
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
		out = append(out, fmt.Sprintf("replication slot %q is about to be invalidated (wal_status unreserved: it retains %d bytes, past max_slot_wal_keep_size): "+
			"get fkmat run streaming from it, or raise max_slot_wal_keep_size", slot, info.RetainedBytes))
	}
	if info.Active || phase != "streaming" {
		return out
	}
	switch {
	case d == nil:
		out = append(out, fmt.Sprintf("no fkmat run streams from replication slot %q (none has reported itself in fkmat.daemon); "+
			"it retains %d bytes of WAL on the source's disk: start fkmat run, or fkmat teardown if the join is no longer wanted", slot, info.RetainedBytes))
	case now.Sub(d.HeartbeatAt) > maxInactive:
		out = append(out, fmt.Sprintf("no fkmat run has streamed from replication slot %q for %s (last: %s on %s, pid %d); "+
			"it retains %d bytes of WAL on the source's disk: start fkmat run, or fkmat teardown if the join is no longer wanted",
			slot, now.Sub(d.HeartbeatAt).Round(time.Second), d.Version, d.Host, d.PID, info.RetainedBytes))
	}
	return out
}

func readStatusMeta(ctx context.Context, target *pgxpool.Pool, slot string) (statusMeta, error) {
	m := statusMeta{joins: map[string]joinState{}}
	var hasStall, hasDaemon bool
	err := target.QueryRow(ctx, `SELECT to_regclass('fkmat.join_state') IS NOT NULL AND to_regclass('fkmat.checkpoint') IS NOT NULL,
		to_regclass('fkmat.stall') IS NOT NULL, to_regclass('fkmat.daemon') IS NOT NULL`).Scan(&m.migrated, &hasStall, &hasDaemon)
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
	rows, err := target.Query(ctx, `SELECT join_name, epoch, phase FROM fkmat.join_state WHERE slot = $1`, slot)
	if err != nil {
		return m, fmt.Errorf("read fkmat.join_state: %w", err)
	}
	for rows.Next() {
		var name string
		st := joinState{exists: true}
		if err := rows.Scan(&name, &st.epoch, &st.phase); err != nil {
			rows.Close()
			return m, fmt.Errorf("read fkmat.join_state: %w", err)
		}
		m.joins[name] = st
	}
	if err := rows.Err(); err != nil {
		return m, fmt.Errorf("read fkmat.join_state: %w", err)
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
		return statusStore(ctx, rdb, RedisPrefix(slot, p.Name), opts, p, st, s)
	}
	var total int64
	for t := range len(p.Edges) + 1 {
		one := JoinStatus{RedisState: "ok"}
		if err := statusStore(ctx, rdb, RedisTablePrefix(slot, p.Name, t), opts, p, st, &one); err != nil {
			return err
		}
		s.Problems = append(s.Problems, one.Problems...)
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
		name := p.Left.Table.String()
		if t > 0 {
			name = p.Edges[t-1].Alias
		}
		s.Edges = append(s.Edges, EdgeStatus{Entry: name, Subscriptions: one.Subscriptions, RedisCheckpoint: one.RedisCheckpoint})
	}
	s.Subscriptions = total
	return nil
}

// statusStore fills the Redis part of s from one state's meta hash.
func statusStore(ctx context.Context, rdb redis.UniversalClient, prefix string, opts Options, p *plan.JoinPlan, st joinState, s *JoinStatus) error {
	store, err := redisstore.Open(ctx, rdb, redisstore.Config{Prefix: prefix,
		SubShards: opts.SubShards, RowShards: opts.RowShards})
	if err != nil {
		return fmt.Errorf("join %q: %w", p.Name, err)
	}
	meta, err := store.Meta(ctx)
	switch {
	case errors.Is(err, redisstore.ErrNoState):
		s.RedisState = "lost"
	case err != nil:
		return fmt.Errorf("join %q: %w", p.Name, err)
	case st.exists && meta.Epoch != st.epoch:
		s.RedisState = "foreign"
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
func statusTarget(ctx context.Context, target *pgxpool.Pool, w *sink.Writer, p *plan.JoinPlan, s *JoinStatus) error {
	var exists bool
	if err := target.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, p.Target.Ident()).Scan(&exists); err != nil {
		return fmt.Errorf("look up target %s: %w", p.Target.Ident(), err)
	}
	if !exists {
		s.TargetState = "missing"
		s.Problems = append(s.Problems, fmt.Sprintf("target table %s does not exist; create it with fkmat migrate (or fkmat run)", p.Target.Ident()))
		return nil
	}
	if err := w.CheckTable(ctx, &p.Target); err != nil {
		s.TargetState = "wrong_shape"
		s.Problems = append(s.Problems, err.Error())
	}
	var err error
	s.TargetRows, s.TargetRowsEstimated, err = countRows(ctx, target, p.Target.Ident())
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
