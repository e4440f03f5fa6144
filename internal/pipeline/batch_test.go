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

// chanSource hands out the transactions sent on its channel.
type chanSource struct{ c chan *cdc.Txn }

func (s chanSource) Next(ctx context.Context) (*cdc.Txn, error) {
	select {
	case t := <-s.c:
		return t, nil
	default:
	}
	select {
	case t := <-s.c:
		return t, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (chanSource) Ack(wal.LSN)            {}
func (chanSource) Stats() cdc.StreamStats { return cdc.StreamStats{} }

// TestCollectClosesWhenFree: a batch takes what is queued and closes at
// once when nothing more is, while the pipeline is free (nothing in
// flight, or the last batch done with the target), however long its delay;
// while the pipeline is busy it keeps taking what arrives, and closes when
// the pipeline frees up; after a fan-out batch it waits out its delay.
func TestCollectClosesWhenFree(t *testing.T) {
	t.Parallel()
	src := chanSource{c: make(chan *cdc.Txn, 100)}
	lsn := wal.LSN(100)
	txn := func() *cdc.Txn {
		lsn += 10
		return &cdc.Txn{Final: true, CommitLSN: lsn, EndLSN: lsn + 1, Changes: make([]cdc.Change, 2)}
	}
	p := &Pipeline{source: src, limits: BatchLimits{Changes: 1000, Bytes: 1 << 20, Delay: 5 * time.Second, Idle: 5 * time.Second, MaxDelay: 5 * time.Second}}
	p.sizer = batchSizer{limits: p.limits}
	ctx := context.Background()

	// Free: three queued, then none.
	for range 3 {
		src.c <- txn()
	}
	start := time.Now()
	if b := p.collect(ctx, txn(), nil); len(b.txns) != 4 || time.Since(start) > 2*time.Second {
		t.Fatalf("free pipeline: a batch of %d transactions after %s, want 4 at once", len(b.txns), time.Since(start))
	}
	done := &commitJob{targetDone: make(chan struct{})}
	close(done.targetDone)
	if b := p.collect(ctx, txn(), []*commitJob{done}); len(b.txns) != 1 {
		t.Fatalf("last batch done with the target: a batch of %d transactions, want 1", len(b.txns))
	}

	// Busy: what arrives joins the batch until the last batch in flight is
	// done with the target.
	busy := &commitJob{targetDone: make(chan struct{})}
	late := txn()
	go func() {
		time.Sleep(50 * time.Millisecond)
		src.c <- late
		time.Sleep(50 * time.Millisecond)
		close(busy.targetDone)
	}()
	start = time.Now()
	b := p.collect(ctx, txn(), []*commitJob{busy})
	if len(b.txns) != 2 || time.Since(start) < 100*time.Millisecond || time.Since(start) > 2*time.Second {
		t.Fatalf("busy pipeline: a batch of %d transactions after %s, want 2 once the pipeline freed up", len(b.txns), time.Since(start))
	}

	// Spacing: a batch closes no sooner than Spacing after the previous
	// one, and takes what arrives meanwhile.
	p.limits.Spacing = 300 * time.Millisecond
	p.collect(ctx, txn(), nil)
	late = txn()
	go func() {
		time.Sleep(100 * time.Millisecond)
		src.c <- late
	}()
	start = time.Now()
	b = p.collect(ctx, txn(), nil)
	if len(b.txns) != 2 || time.Since(start) < 250*time.Millisecond || time.Since(start) > 2*time.Second {
		t.Fatalf("spaced: a batch of %d transactions after %s, want 2 after the spacing", len(b.txns), time.Since(start))
	}
	p.limits.Spacing = 0

	// After a fan-out batch: the delay.
	p.limits.Delay, p.limits.Idle = 200*time.Millisecond, 200*time.Millisecond
	p.sizer = batchSizer{limits: p.limits, fanOut: true}
	start = time.Now()
	if b := p.collect(ctx, txn(), nil); len(b.txns) != 1 || time.Since(start) < 200*time.Millisecond {
		t.Fatalf("after a fan-out: a batch of %d transactions after %s, want 1 after the delay", len(b.txns), time.Since(start))
	}
}
