package pipeline

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/join/jointest"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// The pipeline's unit tests: Run with in-memory fakes for its three
// interfaces (Source, Target, State) and the real mapper and
// engine, over a generated workload of orders LEFT JOIN customers. Every
// transaction's end LSN has a snapshot of the SQL join at that point, and
// the fake target must always equal the snapshot at its checkpoint.

// fakeWorld is the fakes of one test: a source of scripted transactions,
// the target and the join's state, with failure injection and the
// invariants checked as they happen.
type fakeWorld struct {
	t    *testing.T
	plan *plan.JoinPlan

	mu sync.Mutex
	// source
	txns  []*cdc.Txn
	next  int
	acked wal.LSN
	// target: rows and checkpoint, committed together
	target     *jointest.Target
	targetLSN  wal.LSN
	targetOpen int
	// state: rows and checkpoint, committed together; one per table of a
	// tree (tree set), one for a pair
	states    []*jointest.Store
	stateLSNs []wal.LSN
	tree      bool

	// failTarget and failState, when set, fail the commit of a batch
	// ending at that LSN (once), failState that of table failTable's
	// state; blockTarget blocks it until released.
	failTarget, failState wal.LSN
	// epoch, when set, is the epoch the states' meta shows ("e" else).
	epoch            string
	failTable        int
	blockTarget      wal.LSN
	blocked, release chan struct{}
	violations       []string
	// counted is the running pipeline's count of changes applied, which
	// covers every transaction after countFrom up to what it acknowledges.
	counted   *atomic.Int64
	countFrom wal.LSN
	// gen computes the filters of a filtered plan (withFilters).
	gen Generator
}

func newFakeWorld(t *testing.T, txns []*cdc.Txn) *fakeWorld {
	jp := testPlan()
	jp.Spec = plan.SpecOf(jp)
	return &fakeWorld{t: t, plan: jp, txns: txns, target: jointest.NewTarget(jp.Spec),
		states: []*jointest.Store{jointest.NewStore()}, stateLSNs: make([]wal.LSN, 1)}
}

// newTreeWorld is newFakeWorld for the tree orders → customers → regions
// (testTreePlan): one state per table.
func newTreeWorld(t *testing.T) *fakeWorld {
	jp := testTreePlan()
	spec := join.Spec{Name: jp.Name, PK: []join.Family{join.FamilyInt}, LeftValues: 4}
	w := &fakeWorld{t: t, plan: jp, target: jointest.NewTarget(spec), tree: true, stateLSNs: make([]wal.LSN, 3)}
	w.target.Rewrites = true
	for range 3 {
		w.states = append(w.states, jointest.NewStore())
	}
	return w
}

// stateLSN is the lowest checkpoint of the states (the caller holds mu).
func (w *fakeWorld) stateLSN() wal.LSN { return slices.Min(w.stateLSNs) }

func (w *fakeWorld) violate(format string, args ...any) {
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

// fakeSource is the world as a Source.
type fakeSource struct{ w *fakeWorld }

func (s fakeSource) Next(ctx context.Context) (*cdc.Txn, error) {
	for {
		s.w.mu.Lock()
		if s.w.next < len(s.w.txns) {
			t := s.w.txns[s.w.next]
			s.w.next++
			s.w.mu.Unlock()
			return t, nil
		}
		s.w.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// Ack checks that acknowledgements only grow and never pass what the
// target and the state both committed.
func (s fakeSource) Ack(lsn wal.LSN) {
	w := s.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if lsn < w.acked {
		w.violate("ack %s after %s", lsn, w.acked)
	}
	if lsn > w.stateLSN() || lsn > w.targetLSN && w.targetLSN != 0 {
		w.violate("ack %s ahead of the commits (state %s, target %s)", lsn, w.stateLSN(), w.targetLSN)
	}
	if w.counted != nil {
		want := 0
		for _, t := range w.txns {
			if t.EndLSN > w.countFrom && t.EndLSN <= lsn {
				want += len(t.Changes)
			}
		}
		if got := w.counted.Load(); got < int64(want) {
			w.violate("ack %s before its changes are counted (%d of %d): a caught-up reader would miss them in the metrics", lsn, got, want)
		}
	}
	w.acked = lsn
}

func (s fakeSource) Stats() cdc.StreamStats { return cdc.StreamStats{} }

// fakeTarget is the world as a Target.
type fakeTarget struct{ w *fakeWorld }

func (f fakeTarget) Begin(context.Context) (TargetTx, error) {
	f.w.mu.Lock()
	defer f.w.mu.Unlock()
	if f.w.targetOpen++; f.w.targetOpen > 1 {
		f.w.violate("%d target transactions open at once", f.w.targetOpen)
	}
	return &fakeTx{w: f.w}, nil
}

type fakeTx struct {
	w    *fakeWorld
	outs []join.Output
	done bool
}

func (tx *fakeTx) Apply(_ context.Context, _ *sink.Table, out join.Output) error {
	tx.outs = append(tx.outs, out)
	return nil
}

func (tx *fakeTx) Exec(context.Context, string, ...any) error { return nil }

func (tx *fakeTx) Commit(ctx context.Context, _ string, lsn wal.LSN) error {
	w := tx.w
	w.mu.Lock()
	block := w.blockTarget == lsn
	w.mu.Unlock()
	if block {
		close(w.blocked)
		select {
		case <-w.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failTarget == lsn {
		w.failTarget = 0
		return errors.New("injected target commit failure")
	}
	w.target.Begin()
	for _, out := range tx.outs {
		if err := w.target.Apply(out); err != nil {
			w.violate("target write at %s: %v", lsn, err)
		}
	}
	if lsn <= w.targetLSN {
		w.violate("target checkpoint %s after %s", lsn, w.targetLSN)
	}
	w.targetLSN = lsn
	tx.done = true
	w.targetOpen--
	return nil
}

func (tx *fakeTx) Rollback(context.Context) error {
	tx.w.mu.Lock()
	defer tx.w.mu.Unlock()
	if !tx.done {
		tx.done = true
		tx.w.targetOpen--
	}
	return nil
}

func (tx *fakeTx) Counts(*sink.Table) sink.Stats { return sink.Stats{} }

// fakeState is the world as the join's State: table i's of a tree, the
// one of a pair. Reads and commits run on different goroutines, as on
// Redis.
type fakeState struct {
	w *fakeWorld
	i int
}

func (s fakeState) GetLeft(ctx context.Context, keys []join.Key) (map[join.Key]join.LeftState, error) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	return s.w.states[s.i].GetLeft(ctx, keys)
}

func (s fakeState) GetRight(ctx context.Context, keys []join.Key) (map[join.Key]join.RightState, error) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	return s.w.states[s.i].GetRight(ctx, keys)
}

func (s fakeState) Dependents(ctx context.Context, fk, after join.Key, limit int) ([]join.Key, error) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	return s.w.states[s.i].Dependents(ctx, fk, after, limit)
}

func (s fakeState) DependentsMany(ctx context.Context, fks []join.Key, limits []int) ([][]join.Key, error) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	return s.w.states[s.i].DependentsMany(ctx, fks, limits)
}

func (s fakeState) Meta(context.Context) (redisstore.Meta, error) {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	epoch := "e"
	if s.w.epoch != "" {
		epoch = s.w.epoch
	}
	return redisstore.Meta{Epoch: epoch, Checkpoint: s.w.stateLSNs[s.i]}, nil
}

func (s fakeState) Checkpoint() wal.LSN {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	return s.w.stateLSNs[s.i]
}

// Commit applies m strictly (jointest.Store refuses mutations that are not
// net against the state) with the checkpoint, skipping a replayed batch.
func (s fakeState) Commit(ctx context.Context, m join.Mutations, lsn wal.LSN) error {
	w := s.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failState == lsn && w.failTable == s.i {
		w.failState = 0
		return errors.New("injected state commit failure")
	}
	if lsn <= w.stateLSNs[s.i] {
		return nil
	}
	if lsn > w.targetLSN {
		w.violate("state commit at %s ahead of the target's %s", lsn, w.targetLSN)
	}
	if err := w.states[s.i].Apply(ctx, m); err != nil {
		w.violate("state %d commit at %s: %v", s.i, lsn, err)
	}
	w.stateLSNs[s.i] = lsn
	return nil
}

var errNoPartial = errors.New("fake state: large transactions are not faked")

func (fakeState) CommitPartial(context.Context, join.Mutations, wal.LSN) error { return errNoPartial }
func (fakeState) FinishPartial(context.Context, wal.LSN) error                 { return errNoPartial }
func (fakeState) Recover(context.Context) (bool, error)                        { return false, nil }

// pipeline returns a pipeline over the world, starting from its
// checkpoints as run.go does: the source replays from the older one.
func (w *fakeWorld) pipeline(limits BatchLimits) *Pipeline {
	w.t.Helper()
	var (
		j    Join
		cuts []wal.LSN
	)
	if w.tree {
		stores := make([]State, len(w.states))
		for i := range stores {
			stores[i] = fakeState{w, i}
		}
		tj, err := newTree(w.plan, stores, 3) // several pages per walk
		if err != nil {
			w.t.Fatal(err)
		}
		r, err := tj.Resume(context.Background())
		if err != nil {
			w.t.Fatal(err)
		}
		for _, cp := range r.Ahead {
			cuts = append(cuts, cp)
		}
		j = tj
	} else {
		pj, err := newPair(w.plan, fakeState{w, 0}, 3) // several pages per fan-out
		if err != nil {
			w.t.Fatal(err)
		}
		pj.epoch = "e"
		j = pj
	}
	p := New(Config{Slot: "s", Joins: []Join{j}, Target: fakeTarget{w}, Source: fakeSource{w}, Limits: limits, Cuts: cuts, Generator: w.gen})
	w.mu.Lock()
	defer w.mu.Unlock()
	p.targetLSN.Store(uint64(w.targetLSN))
	start := min(w.stateLSN(), w.targetLSN)
	w.next = 0
	for w.next < len(w.txns) && w.txns[w.next].EndLSN <= start {
		w.next++
	}
	w.acked = start
	w.counted, w.countFrom = &p.changes, start
	return p
}

// runUntil runs p until the source is drained and every transaction up to
// the last is acknowledged, or run fails; it returns run's result.
func (w *fakeWorld) runUntil(p *Pipeline, last wal.LSN) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case err := <-done:
			return err
		case <-deadline:
			cancel()
			<-done
			return errors.New("timed out")
		case <-time.After(2 * time.Millisecond):
		}
		w.mu.Lock()
		acked := w.acked
		w.mu.Unlock()
		if acked >= last {
			cancel()
			return <-done
		}
	}
}

// check fails the test on any violation and unless the target equals the
// SQL join at its checkpoint and the state is consistent.
func (w *fakeWorld) check(want map[wal.LSN]map[join.Key]join.Row) {
	w.t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range w.violations {
		w.t.Error(v)
	}
	rows, ok := want[w.targetLSN]
	if !ok {
		w.t.Fatalf("target checkpoint %s is not a transaction end", w.targetLSN)
	}
	if !maps.EqualFunc(w.target.Rows, rows, func(a, b join.Row) bool { return join.ValuesEqual(a, b) }) {
		w.t.Errorf("target at %s: %d rows, want %d:\n got %v\nwant %v", w.targetLSN, len(w.target.Rows), len(rows), w.target.Rows, rows)
	}
	if !w.tree {
		if err := w.states[0].Check(w.plan.Spec); err != nil {
			w.t.Errorf("state: %v", err)
		}
	}
	if w.targetOpen != 0 {
		w.t.Errorf("%d target transactions left open", w.targetOpen)
	}
}

// shopModel generates transactions on orders (id, customer_id, note) and
// customers (id, name) and computes the SQL join after each one.
type shopModel struct {
	r                         *rand.Rand
	orders, customer, regions *cdc.Relation
	spec                      join.Spec
	ord                       map[int]order
	cust                      map[int]customer
	reg                       map[int]string
	lsn                       wal.LSN
	// filtered applies the filters of withFilters in join, and makes some
	// notes fail the orders' one.
	filtered bool
}

type order struct {
	cust *int
	note string
}

type customer struct {
	name   string
	region *int
}

// newShopModel returns the model of orders and customers, and with
// regions of the customers' regions too (the tree's third table).
func newShopModel(seed uint64, spec join.Spec, regions bool) *shopModel {
	m := &shopModel{
		r: rand.New(rand.NewPCG(seed, 7)),
		orders: rel("orders", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "customer_id", Type: oidInt8},
			cdc.Column{Name: "note", Type: oidText}),
		customer: rel("customers", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "name", Type: oidText},
			cdc.Column{Name: "region_id", Type: oidInt8}),
		spec: spec, ord: map[int]order{}, cust: map[int]customer{}, reg: map[int]string{},
	}
	if regions {
		m.regions = rel("regions", cdc.Column{Name: "id", Type: oidInt8, Key: true}, cdc.Column{Name: "name", Type: oidText})
	}
	return m
}

func itxt(n int) cdc.Value { return txt(strconv.Itoa(n)) }

// optional returns n's value, or NULL.
func optional(n *int) cdc.Value {
	if n == nil {
		return cNull
	}
	return itxt(*n)
}

// change returns one random change, applied to the model: every kind on
// every table, NULL and dangling foreign keys, TOAST markers, key changes,
// a hot customer, and (with regions) a TRUNCATE of the last table.
func (m *shopModel) change() cdc.Change {
	r := m.r
	id := 1 + r.IntN(30)
	kinds := 10
	if m.regions != nil {
		kinds = 12
	}
	switch k := r.IntN(kinds); {
	case k < 4: // order insert or update, maybe keeping its TOASTed note
		o, exists := m.ord[id]
		var cust *int
		if r.IntN(8) != 0 {
			c := 1 + r.IntN(7) // 6 and 7 are often dangling
			cust = &c
		}
		note, nv := "n"+strconv.Itoa(r.IntN(1000)), cdc.Value{}
		if m.filtered && r.IntN(3) == 0 {
			note = "x" + note // out of the orders' filter
		}
		nv = txt(note)
		if exists && r.IntN(3) == 0 {
			note, nv = o.note, cToast
		}
		m.ord[id] = order{cust: cust, note: note}
		kind := cdc.ChangeInsert
		if exists {
			kind = cdc.ChangeUpdate
		}
		return cdc.Change{Kind: kind, Relation: m.orders, New: []cdc.Value{itxt(id), optional(cust), nv}}
	case k < 5: // order key change, with its note unchanged
		o, exists := m.ord[id]
		to := 1 + r.IntN(30)
		if _, taken := m.ord[to]; !exists || taken {
			return m.change()
		}
		delete(m.ord, id)
		nv := cToast
		if m.filtered && r.IntN(2) == 0 { // a new note, in or out of the filter
			o.note = []string{"n", "x"}[r.IntN(2)] + strconv.Itoa(r.IntN(1000))
			nv = txt(o.note)
		}
		m.ord[to] = o
		return cdc.Change{Kind: cdc.ChangeUpdate, Relation: m.orders, OldKind: cdc.OldKey,
			Old: []cdc.Value{itxt(id), cNull, cNull}, New: []cdc.Value{itxt(to), optional(o.cust), nv}}
	case k < 6: // order delete
		if _, exists := m.ord[id]; !exists {
			return m.change()
		}
		delete(m.ord, id)
		return cdc.Change{Kind: cdc.ChangeDelete, Relation: m.orders, OldKind: cdc.OldKey, Old: []cdc.Value{itxt(id), cNull, cNull}}
	case k < 9: // customer upsert; customer 1 is hot; region 4 often dangles
		c := 1 + r.IntN(7)
		if r.IntN(2) == 0 {
			c = 1
		}
		old, exists := m.cust[c]
		cu := customer{name: "c" + strconv.Itoa(r.IntN(1000)), region: old.region}
		if !exists || r.IntN(2) == 0 {
			cu.region = nil
			if r.IntN(6) != 0 {
				reg := 1 + r.IntN(4)
				cu.region = &reg
			}
		}
		m.cust[c] = cu
		kind := cdc.ChangeInsert
		if exists {
			kind = cdc.ChangeUpdate
		}
		return cdc.Change{Kind: kind, Relation: m.customer, New: []cdc.Value{itxt(c), txt(cu.name), optional(cu.region)}}
	case k < 10: // customer delete
		c := 1 + r.IntN(7)
		if _, exists := m.cust[c]; !exists {
			return m.change()
		}
		delete(m.cust, c)
		return cdc.Change{Kind: cdc.ChangeDelete, Relation: m.customer, OldKind: cdc.OldKey, Old: []cdc.Value{itxt(c), cNull, cNull}}
	case r.IntN(20) == 0: // TRUNCATE regions
		clear(m.reg)
		return cdc.Change{Kind: cdc.ChangeTruncate, Truncate: &cdc.Truncate{Relations: []*cdc.Relation{m.regions}}}
	case k < 11: // region upsert or key change
		g := 1 + r.IntN(4)
		_, exists := m.reg[g]
		if to := 1 + r.IntN(4); exists && to != g && r.IntN(3) == 0 {
			if _, taken := m.reg[to]; !taken {
				m.reg[to] = m.reg[g]
				delete(m.reg, g)
				return cdc.Change{Kind: cdc.ChangeUpdate, Relation: m.regions, OldKind: cdc.OldKey,
					Old: []cdc.Value{itxt(g), cNull}, New: []cdc.Value{itxt(to), txt(m.reg[to])}}
			}
		}
		m.reg[g] = "r" + strconv.Itoa(r.IntN(1000))
		kind := cdc.ChangeInsert
		if exists {
			kind = cdc.ChangeUpdate
		}
		return cdc.Change{Kind: kind, Relation: m.regions, New: []cdc.Value{itxt(g), txt(m.reg[g])}}
	default: // region delete
		g := 1 + r.IntN(4)
		if _, exists := m.reg[g]; !exists {
			return m.change()
		}
		delete(m.reg, g)
		return cdc.Change{Kind: cdc.ChangeDelete, Relation: m.regions, OldKind: cdc.OldKey, Old: []cdc.Value{itxt(g), cNull}}
	}
}

// txn returns a transaction of 1-5 changes (the same row may change several
// times), applied to the model.
func (m *shopModel) txn() *cdc.Txn {
	t := &cdc.Txn{Xid: uint32(m.lsn), Final: true, CommitTime: time.Now()}
	for range 1 + m.r.IntN(5) {
		t.Changes = append(t.Changes, m.change())
	}
	m.lsn += 0x100
	t.CommitLSN, t.EndLSN = m.lsn, m.lsn+8
	t.Bytes = 100 * len(t.Changes)
	return t
}

// join returns SELECT o.id, o.customer_id, o.note, c.name FROM orders o
// LEFT JOIN customers c ON c.id = o.customer_id, keyed like the target;
// with regions, r.name too (LEFT JOIN regions r ON r.id = c.region_id).
func (m *shopModel) join(t *testing.T) map[join.Key]join.Row {
	rows := map[join.Key]join.Row{}
	for id, o := range m.ord {
		fams := m.spec.PK
		if fams == nil { // the tree's target
			fams = []join.Family{join.FamilyInt}
		}
		k, err := join.EncodeKey(fams, []join.Value{join.TextValue(strconv.Itoa(id))})
		if err != nil {
			t.Fatal(err)
		}
		if m.filtered && !orderPasses(o.note) {
			continue
		}
		fk, name, region := join.NullValue(), join.NullValue(), join.NullValue()
		if o.cust != nil {
			fk = join.TextValue(strconv.Itoa(*o.cust))
			if c, ok := m.cust[*o.cust]; ok && (!m.filtered || customerPasses(c.name)) {
				name = join.TextValue(c.name)
				if c.region != nil {
					if n, ok := m.reg[*c.region]; ok && (!m.filtered || regionPasses(n)) {
						region = join.TextValue(n)
					}
				}
			}
		}
		rows[k] = join.Row{join.TextValue(strconv.Itoa(id)), fk, join.TextValue(o.note), name}
		if m.regions != nil {
			rows[k] = append(rows[k], region)
		}
	}
	return rows
}

// workload returns n transactions and the SQL join after each (and at 0).
func workload(t *testing.T, seed uint64, n int, spec join.Spec, regions bool) ([]*cdc.Txn, map[wal.LSN]map[join.Key]join.Row) {
	return filteredWorkload(t, seed, n, spec, regions, false)
}

// filteredWorkload is workload, with the filters of withFilters when
// filtered.
func filteredWorkload(t *testing.T, seed uint64, n int, spec join.Spec, regions, filtered bool) ([]*cdc.Txn, map[wal.LSN]map[join.Key]join.Row) {
	m := newShopModel(seed, spec, regions)
	m.filtered = filtered
	want := map[wal.LSN]map[join.Key]join.Row{0: {}}
	txns := make([]*cdc.Txn, n)
	for i := range txns {
		txns[i] = m.txn()
		want[txns[i].EndLSN] = m.join(t)
	}
	return txns, want
}

// smallBatches makes batches of a few transactions, so that three are in
// flight at once.
var smallBatches = BatchLimits{Changes: 12, Delay: time.Millisecond, Idle: time.Millisecond}

// TestPipelineWithFakes: the whole workload through run(), every kind of
// change in overlapping batches; the target equals the SQL join, the acks
// grow and never pass a commit, target transactions never overlap. For a
// two-table join, and for a join of three tables (orders → customers →
// regions, each table's state on its own, TRUNCATE of regions too).
func TestPipelineWithFakes(t *testing.T) {
	t.Parallel()
	for _, tree := range []bool{false, true} {
		for seed := range uint64(6) {
			// Seeds 4 and 5 hold at most one target row in memory per batch:
			// the rest goes through the asyncWriter while the batch joins.
			buffered := maxBufferedRows
			if seed >= 4 {
				buffered = 1
			}
			t.Run(fmt.Sprintf("tree %v/%d", tree, seed), func(t *testing.T) {
				t.Parallel()
				w := newFakeWorld(t, nil)
				if tree {
					w = newTreeWorld(t)
				}
				txns, want := workload(t, seed, 400, w.plan.Spec, tree)
				w.txns = txns
				last := txns[len(txns)-1].EndLSN
				p := w.pipeline(smallBatches)
				p.maxBuffered = buffered
				if err := w.runUntil(p, last); err != nil {
					t.Fatal(err)
				}
				w.check(want)
				if w.targetLSN != last || w.stateLSN() != last || w.acked != last {
					t.Errorf("checkpoints target %s, state %s, acked %s; want %s", w.targetLSN, w.stateLSN(), w.acked, last)
				}
			})
		}
	}
}

// TestPipelineTreeCrashBetweenTables: a tree commits its tables' states
// one after the other; the commit of the middle table fails after the
// last table's went through (a crash between them). Nothing after is
// acknowledged, and a restart from the checkpoints (the last table ahead
// of the others, the target ahead of both) converges to the SQL join:
// each table gets exactly what it lacks. Every table's failure point is
// tried over several seeds.
func TestPipelineTreeCrashBetweenTables(t *testing.T) {
	t.Parallel()
	for table := range 3 {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("table %d/%d", table, seed), func(t *testing.T) {
				t.Parallel()
				w := newTreeWorld(t)
				txns, want := workload(t, 20+seed, 300, w.plan.Spec, true)
				w.txns = txns
				w.failTable = table
				hook := &failAfter{w: w, at: txns[99].EndLSN, fail: &w.failState}
				p := w.pipeline(smallBatches)
				p.stages = &commitStages{target: hook.wrap(p.commitTarget, true), state: hook.wrap(p.commitState, false)}
				err := w.runUntil(p, txns[len(txns)-1].EndLSN)
				if err == nil || !strings.Contains(err.Error(), "injected state commit failure") {
					t.Fatalf("run = %v, want the injected failure", err)
				}
				w.mu.Lock()
				failed, lsns := hook.failed, slices.Clone(w.stateLSNs)
				if lsns[table] >= failed || w.acked >= failed {
					t.Errorf("after the failure of table %d's commit at %s: states %v, acked %s", table, failed, lsns, w.acked)
				}
				if table < 2 && lsns[2] < failed {
					t.Errorf("the last table's state is at %s, want the failed batch %s committed (tables commit last first)", lsns[2], failed)
				}
				w.mu.Unlock()
				w.check(want)
				// The restart collects other batches: without its cuts at
				// the checkpoints ahead, one would straddle them.
				other := BatchLimits{Changes: 29, Delay: time.Millisecond, Idle: time.Millisecond}
				if err := w.runUntil(w.pipeline(other), txns[len(txns)-1].EndLSN); err != nil {
					t.Fatal(err)
				}
				w.check(want)
				if last := txns[len(txns)-1].EndLSN; w.stateLSN() != last || w.targetLSN != last {
					t.Errorf("after the restart: states %v, target %s; want %s", w.stateLSNs, w.targetLSN, last)
				}
			})
		}
	}
}

// TestPipelineFailureDiscardsLater: batch N's target commit (or state
// commit) fails while N+1 is prepared and N+2 is being joined: run returns
// N's error, nothing after N is committed or acknowledged, and a restart
// from the checkpoints (the target may be a batch ahead of the state)
// converges to the SQL join.
func TestPipelineFailureDiscardsLater(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"target", "state"} {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			w := newFakeWorld(t, nil)
			txns, want := workload(t, 11, 300, w.plan.Spec, false)
			w.txns = txns
			// Batches end at transaction ends the test cannot predict: fail
			// the first commit at or after the 100th transaction.
			at := txns[99].EndLSN
			var fail *wal.LSN
			switch stage {
			case "target":
				fail = &w.failTarget
			default:
				fail = &w.failState
			}
			hook := &failAfter{w: w, at: at, fail: fail}
			p := w.pipeline(smallBatches)
			p.stages = &commitStages{target: hook.wrap(p.commitTarget, true), state: hook.wrap(p.commitState, false)}
			err := w.runUntil(p, txns[len(txns)-1].EndLSN)
			if err == nil || !strings.Contains(err.Error(), "injected "+stage+" commit failure") {
				t.Fatalf("run = %v, want the injected %s failure", err, stage)
			}
			w.mu.Lock()
			failed := hook.failed
			if w.targetLSN >= failed && stage == "target" || w.stateLSN() >= failed || w.acked >= failed {
				t.Errorf("after the failure of the batch ending at %s: target %s, state %s, acked %s", failed, w.targetLSN, w.stateLSN(), w.acked)
			}
			w.mu.Unlock()
			w.check(want)
			// Restart from the checkpoints: the target's rows of a batch
			// whose state commit failed are replayed for the state only.
			if err := w.runUntil(w.pipeline(smallBatches), txns[len(txns)-1].EndLSN); err != nil {
				t.Fatal(err)
			}
			w.check(want)
		})
	}
}

// TestPipelineStateReplaced: the Redis state is replaced (another epoch)
// after a batch was joined and before its target commit: the batch's
// target rows are not committed, nothing after is acknowledged, and run
// stops with ErrStateChanged. The check runs while the rows are written.
func TestPipelineStateReplaced(t *testing.T) {
	t.Parallel()
	w := newFakeWorld(t, nil)
	txns, _ := workload(t, 5, 200, w.plan.Spec, false)
	w.txns = txns
	at := txns[99].EndLSN
	var replaced wal.LSN
	p := w.pipeline(smallBatches)
	p.stages = &commitStages{target: func(ctx context.Context, job *commitJob) error {
		w.mu.Lock()
		if job.end >= at && replaced == 0 {
			w.epoch, replaced = "other", job.end
		}
		w.mu.Unlock()
		return p.commitTarget(ctx, job)
	}, state: p.commitState}
	err := w.runUntil(p, txns[len(txns)-1].EndLSN)
	if !errors.Is(err, ErrStateChanged) {
		t.Fatalf("run = %v, want ErrStateChanged", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.targetLSN >= replaced || w.acked >= replaced {
		t.Errorf("the batch ending at %s, joined before its state was replaced, committed: target %s, acked %s", replaced, w.targetLSN, w.acked)
	}
}

// failAfter arms the world's failure for the first batch commit ending at
// or after at, when that batch reaches the stage.
type failAfter struct {
	w      *fakeWorld
	at     wal.LSN
	fail   *wal.LSN
	failed wal.LSN
}

func (h *failAfter) wrap(stage func(context.Context, *commitJob) error, target bool) func(context.Context, *commitJob) error {
	return func(ctx context.Context, job *commitJob) error {
		h.w.mu.Lock()
		if job.end >= h.at && h.failed == 0 && (target == (h.fail == &h.w.failTarget)) {
			*h.fail, h.failed = job.end, job.end
		}
		h.w.mu.Unlock()
		return stage(ctx, job)
	}
}

// TestPipelineShutdownMidBatch: a shutdown while a batch's target commit
// is under way lets that batch finish (its commits and ack land), later
// ones are not started, and run returns nil; a restart converges.
func TestPipelineShutdownMidBatch(t *testing.T) {
	t.Parallel()
	w := newFakeWorld(t, nil)
	txns, want := workload(t, 5, 200, w.plan.Spec, false)
	w.txns = txns
	p := w.pipeline(smallBatches)
	w.blocked, w.release = make(chan struct{}), make(chan struct{})
	armed := false
	p.stages = &commitStages{
		target: func(ctx context.Context, job *commitJob) error {
			w.mu.Lock()
			if !armed && job.end >= txns[80].EndLSN {
				armed, w.blockTarget = true, job.end
			}
			w.mu.Unlock()
			return p.commitTarget(ctx, job)
		},
		state: p.commitState,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-w.blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the target commit was never reached")
	}
	cancel()
	time.Sleep(20 * time.Millisecond) // run sees the shutdown while the commit is blocked
	close(w.release)
	if err := <-done; err != nil {
		t.Fatalf("run after a shutdown mid-batch = %v, want nil", err)
	}
	w.mu.Lock()
	blocked := w.blockTarget
	if w.targetLSN < blocked || w.stateLSN() < blocked || w.acked < blocked {
		t.Errorf("the batch in hand (ending at %s) did not finish: target %s, state %s, acked %s", blocked, w.targetLSN, w.stateLSN(), w.acked)
	}
	if w.acked == txns[len(txns)-1].EndLSN {
		t.Errorf("every transaction was applied after the shutdown")
	}
	w.blockTarget = 0
	w.mu.Unlock()
	w.check(want)
	if err := w.runUntil(w.pipeline(smallBatches), txns[len(txns)-1].EndLSN); err != nil {
		t.Fatal(err)
	}
	w.check(want)
	if !slices.Contains([]wal.LSN{txns[len(txns)-1].EndLSN}, w.targetLSN) {
		t.Errorf("target at %s after the restart", w.targetLSN)
	}
}

func TestAfterGrace(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	gctx, cancel := afterGrace(parent, 50*time.Millisecond)
	defer cancel()
	stop()
	select {
	case <-gctx.Done():
		t.Fatal("canceled with its parent, before the grace passed")
	case <-time.After(20 * time.Millisecond):
	}
	select {
	case <-gctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not canceled after the grace")
	}
	if context.Cause(gctx) == context.Canceled {
		t.Fatalf("cause %v, want the shutdown grace", context.Cause(gctx))
	}
}

func TestAfterGraceRunning(t *testing.T) {
	gctx, cancel := afterGrace(context.Background(), time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	if gctx.Err() != nil {
		t.Fatal("canceled while its parent runs")
	}
	cancel()
	if gctx.Err() == nil {
		t.Fatal("not canceled by its cancel func")
	}
}

// The filters of withFilters, in SQL (what the plan holds) and in Go (what
// the fake generator and the model compute).
const (
	orderFilter    = "note NOT LIKE 'x%'"
	customerFilter = "right(name, 1) NOT IN ('3', '7')"
	regionFilter   = "name NOT LIKE '%5'"
)

func orderPasses(note string) bool { return !strings.HasPrefix(note, "x") }
func customerPasses(name string) bool {
	return !strings.HasSuffix(name, "3") && !strings.HasSuffix(name, "7")
}
func regionPasses(name string) bool { return !strings.HasSuffix(name, "5") }

// withFilters filters every table of p (testPlan or testTreePlan): orders
// on their note (a value the model leaves unchanged-TOASTed in many
// updates and key changes), customers and regions on their name.
func withFilters(p *plan.JoinPlan) {
	filter := func(tp *plan.TablePlan, where, input string) {
		tp.Where = where
		tp.Computed = []plan.GeneratedColumn{{Name: tp.FilterColumn(), Type: "boolean", TypeOID: 16, Expr: where,
			Inputs: []plan.GeneratedInput{{Name: input, Type: "text", Toastable: true}}}}
		if p.Generated == nil {
			p.Generated = map[config.TableName][]plan.GeneratedColumn{}
		}
		p.Generated[tp.Table] = tp.Computed
	}
	filter(&p.Left, orderFilter, "note")
	if p.Edges == nil {
		filter(&p.Right, customerFilter, "name")
		return
	}
	filter(&p.Edges[0].Table, customerFilter, "name")
	filter(&p.Edges[1].Table, regionFilter, "name")
}

// fakeGenerator computes the filters of withFilters in Go.
type fakeGenerator struct{}

func (fakeGenerator) TypeName(context.Context, uint32, int32) (string, error) { return "text", nil }

func (fakeGenerator) Generate(_ context.Context, _ config.TableName, cols []plan.GeneratedColumn, _ []plan.GeneratedInput,
	rows [][]*string) ([][]*string, error) {
	out := make([][]*string, len(rows))
	for i, row := range rows {
		out[i] = make([]*string, len(cols))
		for k, c := range cols {
			if row[0] == nil {
				continue // NULL
			}
			var pass bool
			switch c.Expr {
			case orderFilter:
				pass = orderPasses(*row[0])
			case customerFilter:
				pass = customerPasses(*row[0])
			case regionFilter:
				pass = regionPasses(*row[0])
			default:
				return nil, fmt.Errorf("no fake for %q", c.Expr)
			}
			v := strconv.FormatBool(pass)
			out[i][k] = &v
		}
	}
	return out, nil
}

func (fakeGenerator) Fetch(context.Context, config.TableName, []plan.SourceColumn, [][]*string, []string) ([][]*string, error) {
	return nil, errors.New("a filter's inputs are read from the state or the change, never fetched, in this model")
}

// TestPipelineFiltered is TestPipelineWithFakes with every table filtered:
// rows enter and leave their filters by inserts, updates, key changes and
// deletes, and updates that leave the orders' filter input unchanged
// (TOASTed) keep a row in the join or out of it. The target equals the SQL
// join with the filters at every checkpoint, through crashes between
// commits too.
func TestPipelineFiltered(t *testing.T) {
	t.Parallel()
	for _, tree := range []bool{false, true} {
		for seed := range uint64(4) {
			t.Run(fmt.Sprintf("tree %v/%d", tree, seed), func(t *testing.T) {
				t.Parallel()
				w := newFakeWorld(t, nil)
				if tree {
					w = newTreeWorld(t)
				}
				withFilters(w.plan)
				w.gen = fakeGenerator{}
				txns, want := filteredWorkload(t, 40+seed, 400, w.plan.Spec, tree, true)
				w.txns = txns
				last := txns[len(txns)-1].EndLSN
				hook := &failAfter{w: w, at: txns[150].EndLSN, fail: &w.failTarget}
				if seed%2 == 1 {
					hook.fail = &w.failState
				}
				p := w.pipeline(smallBatches)
				p.stages = &commitStages{target: hook.wrap(p.commitTarget, true), state: hook.wrap(p.commitState, false)}
				if err := w.runUntil(p, last); err == nil || !strings.Contains(err.Error(), "injected") {
					t.Fatalf("run = %v, want the injected failure", err)
				}
				w.check(want)
				if err := w.runUntil(w.pipeline(smallBatches), last); err != nil {
					t.Fatal(err)
				}
				w.check(want)
				if w.targetLSN != last || w.stateLSN() != last || w.acked != last {
					t.Errorf("checkpoints target %s, state %s, acked %s; want %s", w.targetLSN, w.stateLSN(), w.acked, last)
				}
			})
		}
	}
}
