package pipeline

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/wal"
)

// TestBatchSizer: the delay of the next batch follows the last batch's
// work, between Delay and MaxDelay (10 × Delay by default).
func TestBatchSizer(t *testing.T) {
	t.Parallel()
	l := BatchLimits{}
	l.SetDefaults()
	s := batchSizer{limits: l}
	for _, c := range []struct{ work, want time.Duration }{
		{0, 100 * time.Millisecond},
		{30 * time.Millisecond, 100 * time.Millisecond},  // cheap batches: Delay
		{400 * time.Millisecond, 400 * time.Millisecond}, // a fan-out batch lengthens the next
		{5 * time.Second, time.Second},                   // within MaxDelay
		{10 * time.Millisecond, 100 * time.Millisecond},  // and back
	} {
		s.worked(c.work)
		if got := s.delay(); got != c.want {
			t.Fatalf("after a batch of %s of work, delay %s; want %s", c.work, got, c.want)
		}
	}
	small := BatchLimits{Changes: 40, Delay: 20 * time.Millisecond}
	small.SetDefaults()
	if small.MaxDelay != 200*time.Millisecond || small.Idle != 20*time.Millisecond {
		t.Fatalf("defaults for Delay 20ms = %+v", small)
	}
}

// TestBatchSizerFanOut: after a batch one of whose joins wrote fanOutRatio
// times more target rows than it had changes, the next may take
// fanOutChanges times the change limit and wait fanOutWait times its work,
// up to fanOutChanges × MaxDelay; after an ordinary batch, the limits are
// back. Several joins writing a row per change each are no fan-out.
func TestBatchSizerFanOut(t *testing.T) {
	t.Parallel()
	l := BatchLimits{}
	l.SetDefaults()
	s := batchSizer{limits: l}
	s.worked(400 * time.Millisecond)
	for _, c := range []struct {
		changes, rows int
		wantLimit     int
		wantDelay     time.Duration
	}{
		{1000, 1000, l.Changes, 400 * time.Millisecond},                                 // one row per change
		{1000, fanOutRatio*1000 - 1, l.Changes, 400 * time.Millisecond},                 // just under the ratio
		{1000, 200_000, fanOutChanges * l.Changes, fanOutWait * 400 * time.Millisecond}, // a fan-out
		{0, 0, l.Changes, 400 * time.Millisecond},                                       // nothing
	} {
		s.fanOut = fannedOut(c.changes, c.rows)
		if got := s.changeLimit(); got != c.wantLimit {
			t.Errorf("after %d changes making %d rows: change limit %d, want %d", c.changes, c.rows, got, c.wantLimit)
		}
		if got := s.delay(); got != c.wantDelay {
			t.Errorf("after %d changes making %d rows: delay %s, want %s", c.changes, c.rows, got, c.wantDelay)
		}
	}
	s.fanOut = fannedOut(10, 10_000)
	s.worked(10 * time.Second)
	if got, want := s.delay(), fanOutChanges*l.MaxDelay; got != want {
		t.Errorf("a long fan-out: delay %s, want %s", got, want)
	}
}

// TestPrepareFanOut: whether a batch fanned out is told by each join's own
// rows per change. Four joins of orders, each writing a row per new
// order, are no fan-out (all their rows together are four per change); a
// customer renamed with twenty orders is.
func TestPrepareFanOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var joins []Join
	for range 4 {
		w := newFakeWorld(t, nil)
		w.targetLSN = wal.LSN(math.MaxUint64) // the target has it: nothing is written, rows are counted
		pj, err := newPair(w.plan, fakeState{w, 0}, 3)
		if err != nil {
			t.Fatal(err)
		}
		pj.epoch = "e"
		joins = append(joins, pj)
	}
	p := New(Config{Slot: "s", Joins: joins})
	p.targetLSN.Store(math.MaxUint64)
	orders := rel("orders", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "customer_id", Type: oidInt8},
		cdc.Column{Name: "note", Type: oidText})
	customers := rel("customers", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "name", Type: oidText})
	prepare := func(end wal.LSN, changes ...cdc.Change) {
		t.Helper()
		txn := &cdc.Txn{CommitLSN: end - 1, EndLSN: end, Final: true, Changes: changes}
		job, err := p.prepare(ctx, &batch{txns: []*cdc.Txn{txn}, changes: len(changes)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i, j := range joins {
			if err := j.state().Commit(ctx, job.muts[i], end); err != nil {
				t.Fatal(err)
			}
		}
	}
	prepare(10, cdc.Change{Kind: cdc.ChangeInsert, Relation: customers, New: []cdc.Value{txt("1"), txt("ann")}})
	var changes []cdc.Change
	for id := range 20 {
		changes = append(changes, cdc.Change{Kind: cdc.ChangeInsert, Relation: orders, New: []cdc.Value{itxt(id + 1), txt("1"), txt("n")}})
	}
	prepare(20, changes...)
	if p.sizer.fanOut {
		t.Fatal("four joins writing a row per change each were taken for a fan-out")
	}
	prepare(30, cdc.Change{Kind: cdc.ChangeUpdate, Relation: customers, New: []cdc.Value{txt("1"), txt("bob")}})
	if !p.sizer.fanOut {
		t.Fatal("a customer renamed with twenty orders was not taken for a fan-out")
	}
}
