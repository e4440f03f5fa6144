package cdc

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/wal"
)

// The property test of the assembler: seeded random pgoutput streams
// (relations announced and changed before and inside transactions, rows,
// truncates, logical messages of ours and of others, transactions of 1 to
// 10^5 changes) go through it under small and large chunk limits, while a
// consumer holds and releases chunks in random order. The changes delivered
// must equal the changes sent, in order, each with the relation it was laid
// out by, and a held chunk's values must stay intact until it is released.
// FKMAT_ASSEMBLER_SEED replays one seed.

// want is one change the stream must deliver.
type want struct {
	kind  ChangeKind
	relid uint32
	// shape is the relation's column names at the time of the change.
	shape string
	// old and new are the tuples sent, nil for none; "\x00n" is NULL and
	// "\x00u" unchanged TOAST.
	old, new []string
	// truncated are the relations a truncate names.
	truncated []uint32
}

// wantTxn is one transaction the stream must deliver.
type wantTxn struct {
	xid         uint32
	commit, end wal.LSN
	changes     []want
	marker      string
}

// propRel is a relation of the generated stream.
type propRel struct {
	id   uint32
	cols []col
	// announced: the assembler has seen the current shape in this session.
	announced bool
	// seen: the assembler has seen any shape of it (a later different one
	// is a schema change).
	seen bool
}

func (r *propRel) shape() string {
	names := make([]string, len(r.cols))
	for i, c := range r.cols {
		names[i] = c.name + ":" + strconv.Itoa(int(c.oid))
	}
	return strings.Join(names, ",")
}

func (r *propRel) message() []byte { return mkRelation(r.id, fmt.Sprintf("t%d", r.id), r.cols...) }

// propGen generates a stream and what it must deliver.
type propGen struct {
	rnd     *rand.Rand
	rels    []*propRel
	msgs    [][]byte
	txns    []wantTxn
	pending []want // schema changes announced outside a transaction
	seq     int
	lsn     wal.LSN
	xid     uint32
	prefix  string
	markers string
}

func (g *propGen) relation(r *propRel, into *[]want) {
	if r.seen && !r.announced {
		// A shape that differs from the last one the assembler saw.
		*into = append(*into, want{kind: ChangeSchema, relid: r.id, shape: r.shape()})
	}
	r.seen, r.announced = true, true
}

// reshape changes r's columns: one added, the last non-key dropped, or one
// retyped.
func (g *propGen) reshape(r *propRel) {
	switch k := g.rnd.IntN(3); {
	case k == 0 || len(r.cols) <= 2:
		r.cols = append(slices.Clone(r.cols), col{fmt.Sprintf("c%d", g.seq), 25, false})
		g.seq++
	case k == 1:
		r.cols = slices.Clone(r.cols[:len(r.cols)-1])
	default:
		r.cols = slices.Clone(r.cols)
		i := 1 + g.rnd.IntN(len(r.cols)-1)
		r.cols[i].oid = map[uint32]uint32{25: 20, 20: 25, 23: 20}[r.cols[i].oid]
	}
	r.announced = false
}

// tuple returns random values for r: mostly short text, some NULL, some
// large (past what an arena takes), unchanged TOAST where allowed.
func (g *propGen) tuple(r *propRel, toast bool) []string {
	vals := make([]string, len(r.cols))
	tag := "r" + strconv.Itoa(int(r.id)) + "s" + strconv.Itoa(g.seq) + "c"
	for i := range vals {
		switch p := g.rnd.IntN(100); {
		case i > 0 && p < 8:
			vals[i] = "\x00n"
		case i > 0 && toast && p < 16:
			vals[i] = "\x00u"
		default:
			vals[i] = tag + strconv.Itoa(i)
		}
	}
	if g.rnd.IntN(300) == 0 {
		vals[len(vals)-1] = strings.Repeat(tag, 20_000/len(tag))
	}
	g.seq++
	return vals
}

func ptrs(vals []string) []*string {
	out := make([]*string, len(vals))
	for i, v := range vals {
		if v != "\x00n" {
			out[i] = sp(v)
		}
	}
	return out
}

func keyOnly(vals []string) []string {
	out := slices.Clone(vals)
	for i := 1; i < len(out); i++ {
		out[i] = "\x00n"
	}
	return out
}

// rowMessage builds a random row change of r and what it must deliver.
func (g *propGen) rowMessage(r *propRel) ([]byte, want) {
	w := want{relid: r.id, shape: r.shape()}
	var b []byte
	switch g.rnd.IntN(4) {
	case 0, 1:
		w.kind, w.new = ChangeInsert, g.tuple(r, false)
		b = mkInsert(r.id, ptrs(w.new)...)
	case 2:
		w.kind, w.new = ChangeUpdate, g.tuple(r, true)
		b = be32([]byte{'U'}, r.id)
		switch g.rnd.IntN(3) {
		case 0:
			w.old = keyOnly(g.tuple(r, false))
			b = tuple(append(b, 'K'), ptrs(w.old)...)
		case 1:
			w.old = g.tuple(r, false)
			b = tuple(append(b, 'O'), ptrs(w.old)...)
		}
		b = tuple(append(b, 'N'), ptrs(w.new)...)
	default:
		w.kind = ChangeDelete
		b = be32([]byte{'D'}, r.id)
		if g.rnd.IntN(2) == 0 {
			w.old = keyOnly(g.tuple(r, false))
			b = tuple(append(b, 'K'), ptrs(w.old)...)
		} else {
			w.old = g.tuple(r, false)
			b = tuple(append(b, 'O'), ptrs(w.old)...)
		}
	}
	return b, w
}

// embed wraps raw messages as the content of one of our logical messages.
func embed(msgs ...[]byte) []byte {
	var b []byte
	for _, m := range msgs {
		b = append(be32(b, uint32(len(m))), m...)
	}
	return b
}

// txnSize draws a transaction's number of changes: mostly small, some of
// thousands, and with big set, 10^5.
func (g *propGen) txnSize(big bool) int {
	switch p := g.rnd.IntN(100); {
	case big:
		return 100_000
	case p < 6:
		return 300 + g.rnd.IntN(3000)
	case p < 10:
		return 0
	default:
		return 1 + g.rnd.IntN(20)
	}
}

// outside emits what may come between transactions: relation messages
// (a changed shape is carried into the next transaction) and logical
// messages that are not transactional.
func (g *propGen) outside() {
	for g.rnd.IntN(4) == 0 {
		r := g.rels[g.rnd.IntN(len(g.rels))]
		if g.rnd.IntN(2) == 0 {
			g.reshape(r)
		}
		g.msgs = append(g.msgs, r.message())
		g.relation(r, &g.pending)
	}
	if g.rnd.IntN(8) == 0 {
		g.msgs = append(g.msgs, mkMessage(false, g.prefix, embed(mkInsert(1, sp("x")))))
	}
}

// use makes sure r's current shape is announced before a change of it,
// sometimes changing the shape first (a schema change inside the
// transaction), sometimes announcing an unchanged shape again.
func (g *propGen) use(r *propRel, tw *wantTxn, emit func([]byte)) {
	if g.rnd.IntN(200) == 0 {
		g.reshape(r)
	}
	if !r.announced || g.rnd.IntN(100) == 0 {
		emit(r.message())
		g.relation(r, &tw.changes)
	}
}

// pick draws a relation: the wide one seldom.
func (g *propGen) pick() *propRel {
	if g.rnd.IntN(50) == 0 {
		return g.rels[len(g.rels)-1]
	}
	return g.rels[g.rnd.IntN(len(g.rels)-1)]
}

func (g *propGen) txn(big bool) {
	g.outside()
	g.xid++
	tw := wantTxn{xid: g.xid, commit: g.lsn + 0x100}
	g.msgs = append(g.msgs, mkBegin(tw.commit, tw.xid))
	tw.changes = append(tw.changes, g.pending...)
	g.pending = nil
	n := g.txnSize(big)
	for done := 0; done < n; {
		switch p := g.rnd.IntN(1000); {
		case p < 5:
			// A truncate of one or more announced relations.
			var ids []uint32
			for _, r := range g.rels {
				if g.rnd.IntN(2) == 0 || len(ids) == 0 && r == g.rels[len(g.rels)-1] {
					g.use(r, &tw, func(m []byte) { g.msgs = append(g.msgs, m) })
					ids = append(ids, r.id)
				}
			}
			g.msgs = append(g.msgs, mkTruncate(byte(g.rnd.IntN(4)), ids...))
			tw.changes = append(tw.changes, want{kind: ChangeTruncate, truncated: ids})
			done++
		case p < 15:
			// A transactional message of another prefix: not ours.
			g.msgs = append(g.msgs, mkMessage(true, "other", []byte("hello")))
		case p < 20 && g.markers == "":
			g.markers = fmt.Sprintf("m%d", g.xid)
			g.msgs = append(g.msgs, mkMessage(true, SwitchPrefix("s"), []byte(g.markers)))
			tw.marker = g.markers
		case p < 60:
			// One of ours, carrying up to 40 changes and the relation
			// messages they need.
			var inner [][]byte
			for k := g.rnd.IntN(40) + 1; k > 0 && done < n; k-- {
				r := g.pick()
				g.use(r, &tw, func(m []byte) { inner = append(inner, m) })
				m, w := g.rowMessage(r)
				inner = append(inner, m)
				tw.changes = append(tw.changes, w)
				done++
			}
			g.msgs = append(g.msgs, mkMessage(true, g.prefix, embed(inner...)))
		default:
			r := g.pick()
			g.use(r, &tw, func(m []byte) { g.msgs = append(g.msgs, m) })
			m, w := g.rowMessage(r)
			g.msgs = append(g.msgs, m)
			tw.changes = append(tw.changes, w)
			done++
		}
	}
	g.lsn += 0x200
	tw.end = tw.commit + 0x10
	g.msgs = append(g.msgs, mkCommit(tw.commit, tw.end))
	g.markers = ""
	g.txns = append(g.txns, tw)
}

// newPropGen returns a generator of relations of 2 to 6 columns, one of
// them wider than an arena's values take at once.
func newPropGen(seed uint64) *propGen {
	g := &propGen{rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), prefix: MessagePrefix("s"), lsn: 0x10000}
	for id := uint32(1); id <= 4; id++ {
		cols := []col{{"id", 23, true}}
		n := 1 + g.rnd.IntN(5)
		if id == 4 {
			n = 300
		}
		for i := range n {
			cols = append(cols, col{fmt.Sprintf("a%d", i), 25, false})
		}
		g.rels = append(g.rels, &propRel{id: id, cols: cols})
	}
	return g
}

// checkChange compares a delivered change with the one sent.
func checkChange(c *Change, w *want) error {
	if c.Kind != w.kind {
		return fmt.Errorf("kind %s, want %s", c.Kind, w.kind)
	}
	if w.kind == ChangeTruncate {
		var ids []uint32
		for _, r := range c.Truncate.Relations {
			ids = append(ids, r.ID)
		}
		if !slices.Equal(ids, w.truncated) {
			return fmt.Errorf("truncate of %v, want %v", ids, w.truncated)
		}
		return nil
	}
	if c.Relation == nil || c.Relation.ID != w.relid {
		return fmt.Errorf("relation %v, want %d", c.Relation, w.relid)
	}
	got := make([]string, len(c.Relation.Columns))
	for i, col := range c.Relation.Columns {
		got[i] = col.Name + ":" + strconv.Itoa(int(col.Type))
	}
	if s := strings.Join(got, ","); s != w.shape {
		return fmt.Errorf("relation %d laid out as %s, want %s", w.relid, s, w.shape)
	}
	if w.kind == ChangeSchema {
		if c.Schema == nil || c.Schema.New != c.Relation {
			return fmt.Errorf("schema change without its new relation: %+v", c.Schema)
		}
		return nil
	}
	if err := checkTuple("new", c.New, w.new, c.Relation); err != nil {
		return err
	}
	return checkTuple("old", c.Old, w.old, c.Relation)
}

func checkTuple(which string, got []Value, want []string, rel *Relation) error {
	if (got == nil) != (want == nil) || len(got) != len(want) {
		return fmt.Errorf("%s tuple of %d values, want %d", which, len(got), len(want))
	}
	for i, v := range got {
		var s string
		switch v.Kind {
		case ValueNull:
			s = "\x00n"
		case ValueUnchanged:
			s = "\x00u"
		default:
			if string(v.Data) == want[i] {
				s = want[i]
			} else {
				s = string(v.Data)
			}
		}
		if s != want[i] {
			return fmt.Errorf("%s column %d: %.40q, want %.40q", which, i, s, want[i])
		}
		if v.Type != rel.Columns[i].Type {
			return fmt.Errorf("%s column %d: type %d, want %d", which, i, v.Type, rel.Columns[i].Type)
		}
	}
	return nil
}

// propConsumer receives chunks, checks each transaction's chunking and
// changes, and holds chunks for a while before releasing them (checking
// them again first), some never.
type propConsumer struct {
	t       *testing.T
	rnd     *rand.Rand
	a       *assembler
	txns    []wantTxn
	next    int // the transaction expected next
	chunk   int // the chunk expected next
	at      int // changes of it matched so far
	marker  bool
	held    []heldChunk
	limit   int
	failed  bool
	changes int
}

type heldChunk struct {
	txn  *Txn
	want []want
}

func (p *propConsumer) fail(format string, args ...any) {
	p.t.Helper()
	if !p.failed {
		p.t.Errorf(format, args...)
	}
	p.failed = true
}

func (p *propConsumer) take(txn *Txn) {
	p.t.Helper()
	if p.next >= len(p.txns) {
		p.fail("chunk of xid %d after the last transaction", txn.Xid)
		return
	}
	tw := &p.txns[p.next]
	if txn.Xid != tw.xid || txn.CommitLSN != tw.commit || txn.Chunk != p.chunk {
		p.fail("got xid %d commit %s chunk %d, want xid %d commit %s chunk %d", txn.Xid, txn.CommitLSN, txn.Chunk, tw.xid, tw.commit, p.chunk)
		return
	}
	schema := 0
	for i := range txn.Changes {
		if p.at+i >= len(tw.changes) {
			p.fail("xid %d: more than the %d changes sent", tw.xid, len(tw.changes))
			return
		}
		if txn.Changes[i].Kind == ChangeSchema {
			schema++
		}
		if err := checkChange(&txn.Changes[i], &tw.changes[p.at+i]); err != nil {
			p.fail("xid %d change %d of %d: %v", tw.xid, p.at+i, len(tw.changes), err)
			return
		}
	}
	if len(txn.Changes)-schema > p.limit {
		p.fail("xid %d chunk %d: %d changes, limit %d", tw.xid, txn.Chunk, len(txn.Changes), p.limit)
	}
	if txn.Marker != "" {
		if txn.Marker != tw.marker || p.marker {
			p.fail("xid %d: marker %q, want %q once", tw.xid, txn.Marker, tw.marker)
		}
		p.marker = true
	}
	p.held = append(p.held, heldChunk{txn, tw.changes[p.at : p.at+len(txn.Changes)]})
	p.at += len(txn.Changes)
	p.chunk++
	p.changes += len(txn.Changes)
	if txn.Final {
		p.a.delivered()
		if txn.EndLSN != tw.end || p.at != len(tw.changes) || p.marker != (tw.marker != "") {
			p.fail("xid %d ends at %s with %d of %d changes (marker %t), want end %s", tw.xid, txn.EndLSN, p.at, len(tw.changes), p.marker, tw.end)
		}
		p.next, p.chunk, p.at, p.marker = p.next+1, 0, 0, false
	} else if txn.EndLSN != 0 {
		p.fail("xid %d: end LSN on chunk %d that is not final", tw.xid, txn.Chunk)
	}
	p.release(false)
}

// release lets go of some held chunks (all with all set), each checked
// again first; a few are dropped without Release.
func (p *propConsumer) release(all bool) {
	p.t.Helper()
	for len(p.held) > 0 && (all || len(p.held) > 64 || p.rnd.IntN(3) == 0) {
		i := 0
		if !all {
			i = p.rnd.IntN(len(p.held))
		}
		h := p.held[i]
		p.held = slices.Delete(p.held, i, i+1)
		for j := range h.txn.Changes {
			if err := checkChange(&h.txn.Changes[j], &h.want[j]); err != nil {
				p.fail("xid %d chunk %d change %d changed while held: %v", h.txn.Xid, h.txn.Chunk, j, err)
				return
			}
		}
		if p.rnd.IntN(20) != 0 {
			h.txn.Release()
		}
	}
}

// runProp runs one seed under one pair of chunk limits.
func runProp(t *testing.T, seed uint64, chunkChanges, chunkBytes, txns int, big bool) {
	t.Helper()
	g := newPropGen(seed)
	for i := range txns {
		g.txn(big && i == txns/2)
	}
	// Delivered transactions: those with any change or a marker.
	var expect []wantTxn
	for _, tw := range g.txns {
		if len(tw.changes) > 0 || tw.marker != "" {
			expect = append(expect, tw)
		}
	}
	a := newAssembler(chunkChanges, chunkBytes, discardLogger())
	a.prefix, a.switchPrefix = g.prefix, SwitchPrefix("s")
	limit := chunkChanges
	p := &propConsumer{t: t, rnd: rand.New(rand.NewPCG(seed, 1)), a: a, txns: expect, limit: limit}
	for i, m := range g.msgs {
		res, err := a.handle(wal.LSN(0x1000+i), m)
		if err != nil {
			t.Fatalf("seed %d message %d (%c): %v", seed, i, m[0], err)
		}
		for _, c := range res.chunks {
			p.take(c)
		}
		if res.txn != nil {
			p.take(res.txn)
		}
		if p.failed {
			t.Fatalf("seed %d (chunks of %d changes, %d bytes): replay with FKMAT_ASSEMBLER_SEED=%d", seed, chunkChanges, chunkBytes, seed)
		}
	}
	p.release(true)
	if p.failed || p.next != len(expect) {
		t.Fatalf("seed %d: %d of %d transactions delivered; replay with FKMAT_ASSEMBLER_SEED=%d", seed, p.next, len(expect), seed)
	}
}

func TestAssemblerProperty(t *testing.T) {
	t.Parallel()
	limits := []struct{ changes, bytes int }{
		{1, 1 << 30}, {7, 1 << 30}, {300, 1 << 30}, {1000, 1 << 30},
		{DefaultChunkChanges, DefaultChunkBytes}, {1 << 30, 4096}, {64, 8192},
	}
	seeds := make([]uint64, 16)
	for i := range seeds {
		seeds[i] = uint64(i + 1)
	}
	if s := os.Getenv("FKMAT_ASSEMBLER_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FKMAT_ASSEMBLER_SEED: %v", err)
		}
		seeds = []uint64{n}
	}
	for _, seed := range seeds {
		for _, l := range limits {
			// A transaction of 10^5 changes under one of the limits per
			// seed, to keep the test to seconds.
			big := seed%uint64(len(limits)) == uint64(slices.Index(limits, l)) && seed <= 10
			runProp(t, seed, l.changes, l.bytes, 60, big)
		}
	}
}
