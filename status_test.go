package fkmat

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestCountRows: status counts small targets exactly and reports the
// planner's estimate for big ones instead of scanning them.
func TestCountRows(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Docker")
	}
	tc := testenv.New(t)
	ctx := context.Background()
	for _, s := range []string{
		`CREATE TABLE "odd Name" (id int PRIMARY KEY)`,
		`INSERT INTO "odd Name" SELECT generate_series(1, 5000)`,
		`ANALYZE "odd Name"`,
		`DELETE FROM "odd Name" WHERE id <= 1000`, // the estimate is now stale
	} {
		if _, err := tc.Pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	n, est, err := countRows(ctx, tc.Pool, `"odd Name"`)
	if err != nil || est || n != 4000 {
		t.Fatalf("below the limit: %d rows, estimated %v (%v); want exactly 4000", n, est, err)
	}
	defer func(old int64) { exactCountLimit = old }(exactCountLimit)
	exactCountLimit = 1000
	n, est, err = countRows(ctx, tc.Pool, `"odd Name"`)
	if err != nil || !est || n != 5000 {
		t.Fatalf("above the limit: %d rows, estimated %v (%v); want the estimate 5000", n, est, err)
	}
}

func TestSlotProblems(t *testing.T) {
	now := time.Now()
	fresh := &DaemonStatus{HeartbeatAt: now.Add(-time.Minute), Version: "v1", Host: "h", PID: 7}
	stale := &DaemonStatus{HeartbeatAt: now.Add(-time.Hour), Version: "v1", Host: "h", PID: 7}
	ok := cdc.SlotInfo{Exists: true, WALStatus: "reserved", RetainedBytes: 100}
	for _, c := range []struct {
		name  string
		info  cdc.SlotInfo
		phase string
		d     *DaemonStatus
		want  string // a substring of the one problem; "" for none
	}{
		{"active", cdc.SlotInfo{Exists: true, Active: true, WALStatus: "reserved"}, "streaming", nil, ""},
		{"inactive, fresh heartbeat", ok, "streaming", fresh, ""},
		{"inactive, stale heartbeat", ok, "streaming", stale, "for 1h0m0s"},
		{"inactive, never reported", ok, "streaming", nil, "none has reported itself"},
		{"inactive while backfilling", ok, "backfilling", nil, ""},
		{"missing before a backfill", cdc.SlotInfo{}, "never_backfilled", nil, ""},
		{"missing", cdc.SlotInfo{}, "streaming", fresh, "is missing"},
		{"lost", cdc.SlotInfo{Exists: true, Active: true, WALStatus: "lost"}, "streaming", fresh, "fkmat backfill --force, and raise max_slot_wal_keep_size"},
		{"unreserved", cdc.SlotInfo{Exists: true, Active: true, WALStatus: "unreserved"}, "streaming", fresh, "about to be invalidated"},
	} {
		got := slotProblems("s", c.info, c.phase, c.d, 5*time.Minute, now)
		switch {
		case c.want == "" && len(got) != 0:
			t.Errorf("%s: problems %q, want none", c.name, got)
		case c.want != "" && (len(got) != 1 || !strings.Contains(got[0], c.want)):
			t.Errorf("%s: problems %q, want one with %q", c.name, got, c.want)
		}
	}
}

// streamingJoin is the status of a healthy streaming join at now.
func streamingJoin(name string, now time.Time) JoinStatus {
	return JoinStatus{Join: name, Target: "public." + name, Phase: "streaming", Slot: "fkmat_shop", SlotExists: true, SlotActive: true,
		ConfirmedFlushLSN: "0/1A2B3C8", CurrentWALLSN: "0/1A2C000", LagBytes: 3128, CheckpointLSN: "0/1A2B3C8",
		RedisCheckpoint: "0/1A2B3C8", RedisState: "ok", TargetState: "ok", Metadata: "ok", TargetRows: 1234, Subscriptions: 1200,
		RetainedWALBytes: 12 << 20, WALStatus: "reserved", SafeWALSizeBytes: -1,
		Daemon: &DaemonStatus{Host: "db1", PID: 7, Version: "v1.2.0", StartedAt: now.Add(-3 * time.Hour),
			HeartbeatAt: now.Add(-4 * time.Second), LagSeconds: 0.12, Live: true}}
}

// TestSummarizeStatus: the verdict and its line for each state of the
// joins, and OK exactly when status exits 0.
func TestSummarizeStatus(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	joins := func(edit func(s *JoinStatus, i int)) []JoinStatus {
		st := []JoinStatus{streamingJoin("orders_enriched", now), streamingJoin("order_lines", now)}
		for i := range st {
			edit(&st[i], i)
		}
		return st
	}
	stopped := func(ago time.Duration) func(*JoinStatus, int) {
		return func(s *JoinStatus, _ int) {
			d := *s.Daemon
			d.HeartbeatAt, d.Live = now.Add(-ago), false
			s.Daemon, s.SlotActive = &d, false
		}
	}
	stall := &StallStatus{RestartLSN: "0/16B3F28", LSN: "0/16B4000", Table: "public.orders", KeyColumns: "id",
		Error: "boom", Recurrences: 5, Since: now.Add(-12 * time.Minute)}
	for _, c := range []struct {
		name     string
		st       []JoinStatus
		verdict  string
		summary  string
		ok       bool
		problems int
	}{
		{"ok", joins(func(*JoinStatus, int) {}), VerdictOK, "2 joins streaming, lag 0.1 s, slot fkmat_shop retains 12 MiB", true, 0},
		{"backfilling", joins(func(s *JoinStatus, _ int) { s.Phase, s.Daemon, s.SlotActive = "backfilling", nil, false }),
			VerdictOK, "2 joins backfilling, slot fkmat_shop retains 12 MiB", true, 0},
		{"one join with a problem", joins(func(s *JoinStatus, i int) {
			if i == 1 {
				s.Problems = []string{"target table public.order_lines does not exist"}
			}
		}), VerdictProblem, "1 of 2 joins has a problem (see below)", false, 1},
		{"a slot problem in both joins", joins(func(s *JoinStatus, _ int) { s.Problems = []string{"slot", "target"} }),
			VerdictProblem, "2 of 2 joins have problems (see below)", false, 2},
		{"one join, two problems", joins(func(s *JoinStatus, _ int) { s.Problems = []string{"a", "b"} })[:1],
			VerdictProblem, "join orders_enriched has 2 problems (see below)", false, 2},
		{"stalled", joins(func(s *JoinStatus, _ int) { s.Stall = stall }),
			VerdictStalled, "fkmat run failed 6 times in 12m at 0/16B4000 on public.orders", false, 0},
		{"stopped within --max-inactive", joins(stopped(3 * time.Minute)), VerdictNotRunning,
			"last seen 3m ago, slot fkmat_shop retains 12 MiB", true, 0},
		{"stopped a moment ago", joins(func(s *JoinStatus, _ int) { s.SlotActive = false }), VerdictNotRunning,
			"last seen 4s ago, slot fkmat_shop retains 12 MiB", true, 0},
		{"stopped past --max-inactive", joins(func(s *JoinStatus, i int) {
			stopped(time.Hour)(s, i)
			s.Problems = []string{"no fkmat run has streamed from replication slot \"fkmat_shop\" for 1h0m0s"}
		}), VerdictNotRunning, "last seen 1h ago, slot fkmat_shop retains 12 MiB (1 problem below)", false, 1},
		{"never reported itself", joins(func(s *JoinStatus, _ int) {
			s.Daemon, s.SlotActive, s.Problems = nil, false, []string{"no fkmat run streams from replication slot"}
		}), VerdictNotRunning, "no fkmat run ever reported itself, slot fkmat_shop retains 12 MiB (1 problem below)", false, 1},
		{"never started", joins(func(s *JoinStatus, _ int) {
			*s = JoinStatus{Join: s.Join, Slot: s.Slot, Phase: "never_backfilled", RedisState: "lost", TargetState: "ok", Metadata: "ok", SafeWALSizeBytes: -1}
		}), VerdictNotRunning, "2 joins never backfilled: start fkmat run", true, 0},
	} {
		r := SummarizeStatus(c.st, now)
		if r.Verdict != c.verdict || r.Summary != c.summary || r.OK != c.ok || len(r.Problems) != c.problems {
			t.Errorf("%s: %s: %q (ok %v, %d problems); want %s: %q (ok %v, %d problems)", c.name,
				r.Verdict, r.Summary, r.OK, len(r.Problems), c.verdict, c.summary, c.ok, c.problems)
		}
		if r.Slot == nil || r.Slot.Name != "fkmat_shop" || len(r.Joins) != len(c.st) {
			t.Errorf("%s: slot %+v, %d joins", c.name, r.Slot, len(r.Joins))
		}
	}
}

// TestFailedStatus: an error's report carries the configuration's problems.
func TestFailedStatus(t *testing.T) {
	t.Parallel()
	r := FailedStatus(&config.ConfigError{Problems: []string{"no source database", "no Redis"}})
	if r.Verdict != VerdictError || r.OK || r.Summary != "configuration has 2 problems" || len(r.Problems) != 2 ||
		!strings.Contains(r.Error, "no Redis") || r.Joins == nil {
		t.Errorf("report of a configuration error = %+v", r)
	}
	r = FailedStatus(errors.New("connect to source database: refused"))
	if r.Verdict != VerdictError || r.Error != "connect to source database: refused" || r.Problems == nil || len(r.Problems) != 0 {
		t.Errorf("report of an error = %+v", r)
	}
}

// TestStatusLostState: a Redis state missing after the join's backfill is
// lost, and a problem; while the backfill runs it is not a problem; with no
// join state (never built, or torn down) it is none.
func TestStatusLostState(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Docker")
	}
	tc := testenv.New(t)
	var opts Options
	opts.setDefaults()
	for _, c := range []struct {
		st      joinState
		want    string
		problem bool
	}{
		{joinState{}, "none", false},
		{joinState{exists: true, phase: "backfilling"}, "lost", false},
		{joinState{exists: true, phase: "streaming"}, "lost", true},
	} {
		s := JoinStatus{RedisState: "ok"}
		if err := statusStore(context.Background(), tc.Redis, tc.RedisPrefix, opts, &plan.JoinPlan{Name: "j"}, c.st, &s); err != nil {
			t.Fatal(err)
		}
		if s.RedisState != c.want || (len(s.Problems) == 1 && strings.Contains(s.Problems[0], `join "j" is lost`)) != c.problem {
			t.Errorf("state %+v: redis %s, problems %q; want %s, a problem %v", c.st, s.RedisState, s.Problems, c.want, c.problem)
		}
	}
}
