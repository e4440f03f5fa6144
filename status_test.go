package fkmat

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/cdc"
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
