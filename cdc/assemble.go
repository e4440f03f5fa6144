package cdc

import (
	"fmt"
	"log/slog"
	"maps"
	"sync/atomic"
	"unsafe"

	"github.com/fkmat/fkmat/internal/wal"
)

// Approximate sizes for Txn.Bytes.
const (
	valueSize  = int(unsafe.Sizeof(Value{}))
	changeSize = int(unsafe.Sizeof(Change{}))
	// slabValues, slabBytes and slabChanges size an arena.
	slabValues  = 1024
	slabBytes   = 64 << 10
	slabChanges = 512
)

// FirstGenbkiObjectID: pgoutput sends Type messages for types with OIDs from
// here up (PostgreSQL's FirstGenbkiObjectId).
const FirstGenbkiObjectID = 10000

// assembler turns decoded pgoutput messages into Txn chunks. It owns the
// relation cache. It is used by one goroutine.
type assembler struct {
	chunkChanges, chunkBytes int
	log                      *slog.Logger
	// prefix is the prefix of the logical decoding messages that carry
	// row changes (see Embedded).
	prefix string
	// switchPrefix is the prefix of the markers (EmitSwitch).
	switchPrefix string

	// rels are the relations announced in this replication session: tuples
	// are decoded against them.
	rels map[uint32]*Relation
	// last is the newest shape of each relation, across sessions, and
	// committed its shape as of the last transaction delivered (see
	// delivered); a new session starts from committed so that a schema
	// change in a transaction cut off by a reconnect is reported again.
	last, committed map[uint32]*Relation
	lastDirty       bool
	types           map[uint32]string

	// resume: transactions whose commit LSN is below it are skipped.
	resume wal.LSN

	inTxn    bool
	skipping bool
	cur      *Txn
	pending  []Change // schema changes not yet delivered
	// ar is the arena chunks are cut from; free holds the emptied ones.
	ar   *arena
	free chan *arena
}

func newAssembler(chunkChanges, chunkBytes int, log *slog.Logger) *assembler {
	return &assembler{
		prefix:       MessagePrefix(""),
		chunkChanges: chunkChanges,
		chunkBytes:   chunkBytes,
		log:          log,
		rels:         map[uint32]*Relation{},
		last:         map[uint32]*Relation{},
		committed:    map[uint32]*Relation{},
		types:        map[uint32]string{},
	}
}

// reset prepares for a new replication session starting at resume: a
// transaction in progress is dropped (the server sends it again).
func (a *assembler) reset(resume wal.LSN) {
	a.resume = resume
	a.rels = map[uint32]*Relation{}
	a.last = maps.Clone(a.committed)
	a.lastDirty = false
	a.inTxn, a.skipping, a.cur, a.pending = false, false, nil, nil
}

// result is what one message produced.
type result struct {
	// txn is a chunk to deliver, or nil.
	txn *Txn
	// emptyEnd is the end LSN of a transaction that needed no delivery
	// (skipped, or nothing published in it).
	emptyEnd wal.LSN
	// ignored is the kind of a message that was skipped as unknown.
	ignored byte
	// chunks are full chunks to deliver before txn (from a message
	// carrying many row changes).
	chunks []*Txn
}

// handle processes one message that starts at WAL position lsn. data is only
// read during the call.
func (a *assembler) handle(lsn wal.LSN, data []byte) (result, error) {
	if len(data) == 0 {
		return result{}, fmt.Errorf("%w: empty message at %s", ErrProtocol, lsn)
	}
	switch data[0] {
	case msgInsert, msgUpdate, msgDelete, msgTruncate:
		if !a.inTxn {
			return result{}, fmt.Errorf("%w: %s message at %s outside a transaction", ErrProtocol, kindName(data[0]), lsn)
		}
		if a.skipping {
			return result{}, nil
		}
		return a.row(lsn, data)
	case msgMessage:
		return a.message(lsn, data)
	}
	m, err := decodeMessage(data, allocValues)
	if err != nil {
		return result{}, fmt.Errorf("decode message at %s: %w", lsn, err)
	}
	switch m.kind {
	case msgBegin:
		return result{}, a.begin(m)
	case msgCommit:
		return a.commit(m)
	case msgOrigin:
		if a.cur != nil {
			a.cur.Origin = m.name
		}
	case msgRelation:
		a.relation(lsn, m.rel)
	case msgType:
		a.types[m.oid] = m.namespace + "." + m.name
	default:
		// Stream and two-phase messages are never requested with protocol
		// version 1, but PG18 sends a stray stream abort ('A') for some
		// subtransactions; like any unknown kind it carries nothing for us.
		return result{ignored: m.kind}, nil
	}
	return result{}, nil
}

func (a *assembler) begin(m message) error {
	if a.inTxn {
		return fmt.Errorf("%w: begin of xid %d inside transaction xid %d", ErrProtocol, m.xid, a.curXid())
	}
	a.inTxn = true
	// The server resends transactions that committed before the requested
	// start after a crash; skip them like the server itself does (commit
	// record before the start position).
	if m.lsn < a.resume {
		a.skipping = true
		return nil
	}
	a.cur = &Txn{Xid: m.xid, CommitLSN: m.lsn, CommitTime: m.time}
	for _, c := range a.pending {
		a.appendChange(a.cur, c)
		a.cur.Bytes += changeSize + relationSize(c.Relation)
	}
	a.pending = nil
	return nil
}

// message handles a logical decoding message: one of ours, transactional,
// carries row changes; any other is not ours.
func (a *assembler) message(lsn wal.LSN, data []byte) (result, error) {
	if !a.inTxn || a.skipping {
		return result{}, nil
	}
	m, err := decodeMessage(data, allocValues)
	if err != nil {
		return result{}, fmt.Errorf("decode message at %s: %w", lsn, err)
	}
	if m.flags&1 == 0 {
		return result{}, nil
	}
	if m.name == a.switchPrefix && a.switchPrefix != "" {
		a.cur.Marker = string(m.content)
		return result{}, nil
	}
	if m.name != a.prefix {
		return result{}, nil
	}
	return a.embedded(lsn, m.content)
}

func (a *assembler) curXid() uint32 {
	if a.cur == nil {
		return 0
	}
	return a.cur.Xid
}

func (a *assembler) commit(m message) (result, error) {
	if !a.inTxn {
		return result{}, fmt.Errorf("%w: commit at %s outside a transaction", ErrProtocol, m.lsn)
	}
	a.inTxn = false
	if a.skipping {
		a.skipping = false
		return result{emptyEnd: m.endLSN}, nil
	}
	t := a.cur
	a.cur = nil
	if t.Chunk == 0 && len(t.Changes) == 0 && t.Marker == "" {
		return result{emptyEnd: m.endLSN}, nil
	}
	t.EndLSN = m.endLSN
	t.Final = true
	return result{txn: t}, nil
}

// delivered records that the final chunk just returned reached the consumer:
// the relation shapes it reported are now known to the consumer, and a new
// session compares against them.
func (a *assembler) delivered() {
	if a.lastDirty {
		a.committed = maps.Clone(a.last)
		a.lastDirty = false
	}
}

func (a *assembler) relation(lsn wal.LSN, rel *Relation) {
	for i := range rel.Columns {
		if c := &rel.Columns[i]; c.Type >= FirstGenbkiObjectID {
			c.TypeName = a.types[c.Type]
		}
	}
	prev := a.last[rel.ID]
	if prev != nil {
		sc := diffRelations(prev, rel)
		if sc == nil {
			// Same shape: keep the old pointer so consumers' per-relation
			// caches stay valid across reconnects.
			a.rels[rel.ID] = prev
			return
		}
		ch := Change{Kind: ChangeSchema, LSN: lsn, Relation: rel, Schema: sc}
		if a.inTxn && !a.skipping {
			a.appendChange(a.cur, ch)
			a.cur.Bytes += changeSize + relationSize(rel)
		} else {
			a.pending = append(a.pending, ch)
		}
		a.log.Info("table shape changed", "table", rel.Table().String(), "relation_id", rel.ID,
			"added", len(sc.Added), "dropped", len(sc.Dropped), "retyped", len(sc.Retyped))
	}
	a.rels[rel.ID] = rel
	a.last[rel.ID] = rel
	a.lastDirty = true
}

func relationSize(r *Relation) int {
	n := 64
	for _, c := range r.Columns {
		n += 48 + len(c.Name)
	}
	return n
}

// row decodes an insert, update, delete or truncate into the current chunk,
// and returns the chunk when it is full.
func (a *assembler) row(lsn wal.LSN, data []byte) (result, error) {
	buf := a.copyData(data)
	m, err := decodeMessage(buf, a.allocValues)
	if err != nil {
		return result{}, fmt.Errorf("decode message at %s: %w", lsn, err)
	}
	ch := Change{LSN: lsn}
	size := changeSize + len(buf)
	switch m.kind {
	case msgTruncate:
		tr := &Truncate{
			Cascade:         m.flags&truncateCascade != 0,
			RestartIdentity: m.flags&truncateRestartIdentity != 0,
			Relations:       make([]*Relation, 0, len(m.relids)),
		}
		for _, id := range m.relids {
			rel := a.rels[id]
			if rel == nil {
				return result{}, fmt.Errorf("%w: truncate at %s of relation %d that was not announced", ErrProtocol, lsn, id)
			}
			tr.Relations = append(tr.Relations, rel)
		}
		ch.Kind, ch.Truncate = ChangeTruncate, tr
	default:
		rel := a.rels[m.relid]
		if rel == nil {
			return result{}, fmt.Errorf("%w: %s at %s of relation %d that was not announced", ErrProtocol, kindName(m.kind), lsn, m.relid)
		}
		ch.Relation = rel
		switch m.kind {
		case msgInsert:
			ch.Kind = ChangeInsert
		case msgUpdate:
			ch.Kind = ChangeUpdate
		default:
			ch.Kind = ChangeDelete
		}
		switch m.oldKind {
		case 'K':
			ch.OldKind = OldKey
		case 'O':
			ch.OldKind = OldFull
		}
		if ch.Old, err = typed(rel, m.old); err == nil {
			ch.New, err = typed(rel, m.new)
		}
		if err != nil {
			return result{}, fmt.Errorf("%w: %s at %s: %w", ErrProtocol, kindName(m.kind), lsn, err)
		}
		size += valueSize * (len(m.old) + len(m.new))
	}
	t := a.cur
	a.appendChange(t, ch)
	t.Bytes += size
	if len(t.Changes) < a.chunkChanges && t.Bytes < a.chunkBytes {
		return result{}, nil
	}
	next := &Txn{Xid: t.Xid, CommitLSN: t.CommitLSN, CommitTime: t.CommitTime, Origin: t.Origin, Chunk: t.Chunk + 1}
	a.cur = next
	return result{txn: t}, nil
}

// typed checks a tuple against its relation and sets each value's type OID.
func typed(rel *Relation, vals []Value) ([]Value, error) {
	if vals == nil {
		return nil, nil
	}
	if len(vals) != len(rel.Columns) {
		return nil, fmt.Errorf("table %s: tuple has %d columns, relation has %d", rel.Table(), len(vals), len(rel.Columns))
	}
	for i := range vals {
		vals[i].Type = rel.Columns[i].Type
	}
	return vals, nil
}

// appendChange appends ch to t's changes, which grow in place at the end of
// the arena's changes while they are their last ones, instead of being
// copied at every doubling. A chunk of more changes than half an arena
// holds gets a slice of its own. Every change of a chunk goes through here,
// schema changes too: a change appended to t.Changes directly would be lost
// from t.own, or read past its end.
func (a *assembler) appendChange(t *Txn, ch Change) {
	n := len(t.Changes)
	if t.own != nil || n+1 > slabChanges/2 {
		if t.own == nil {
			t.own = append(make([]Change, 0, 2*(n+1)), t.Changes...)
		}
		t.own = append(t.own, ch)
		t.Changes = t.own[: n+1 : n+1]
		return
	}
	ar := a.ar
	inPlace := ar != nil && len(ar.changes) < cap(ar.changes) &&
		(n == 0 || (len(ar.changes) >= n && &ar.changes[len(ar.changes)-n] == &t.Changes[0]))
	if !inPlace {
		if ar == nil || cap(ar.changes)-len(ar.changes) < n+1 {
			a.rotate()
			ar = a.ar
		}
		ar.changes = append(ar.changes, t.Changes...)
	}
	a.hold(t)
	ar.changes = append(ar.changes, ch)
	t.Changes = ar.changes[len(ar.changes)-n-1 : len(ar.changes) : len(ar.changes)]
}

// copyData copies a message into the arena: the connection reuses its
// buffer, and the values of the chunk alias the copy.
func (a *assembler) copyData(data []byte) []byte {
	if len(data) > slabBytes/4 {
		return append([]byte(nil), data...)
	}
	if a.ar == nil || cap(a.ar.data)-len(a.ar.data) < len(data) {
		a.rotate()
	}
	a.hold(a.cur)
	ar := a.ar
	start := len(ar.data)
	ar.data = append(ar.data, data...)
	return ar.data[start:len(ar.data):len(ar.data)]
}

// allocValues takes n values from the arena.
func (a *assembler) allocValues(n int) []Value {
	if n > slabValues/4 {
		return make([]Value, n)
	}
	if a.ar == nil || cap(a.ar.values)-len(a.ar.values) < n {
		a.rotate()
	}
	a.hold(a.cur)
	ar := a.ar
	start := len(ar.values)
	ar.values = ar.values[:start+n]
	return ar.values[start : start+n : start+n]
}

// arena is the memory chunks are cut from: their changes, tuple values and
// message bytes, shared by consecutive chunks so that small transactions do
// not each hold a slab. A chunk holds a reference on each arena it was cut
// from, and the assembler one on the arena it cuts from. Once the consumer
// released every chunk cut from an arena (Txn.Release) and the assembler
// moved on, the arena is emptied and cut from again; an arena of chunks
// never released is left to the garbage collector.
type arena struct {
	values  []Value
	data    []byte
	changes []Change
	refs    atomic.Int32
	free    chan *arena
}

// keptArenas bounds the arenas kept for reuse (about 150 KB each): the
// chunks the stream decodes ahead and a batch being joined hold most.
const keptArenas = 256

// rotate moves the assembler to an arena with room: an emptied one if any,
// else a new one.
func (a *assembler) rotate() {
	if a.ar != nil {
		a.ar.release()
	}
	if a.free == nil {
		a.free = make(chan *arena, keptArenas)
	}
	select {
	case a.ar = <-a.free:
	default:
		a.ar = &arena{values: make([]Value, 0, slabValues), data: make([]byte, 0, slabBytes),
			changes: make([]Change, 0, slabChanges), free: a.free}
	}
	a.ar.refs.Store(1)
}

// hold makes t hold a reference on the assembler's arena.
func (a *assembler) hold(t *Txn) {
	if t == nil {
		return
	}
	if n := len(t.arenas); n > 0 && t.arenas[n-1] == a.ar {
		return
	}
	a.ar.refs.Add(1)
	t.arenas = append(t.arenas, a.ar)
}

// release drops a reference; the last one empties the arena and hands it
// back to its assembler.
func (ar *arena) release() {
	if ar.refs.Add(-1) != 0 {
		return
	}
	clear(ar.values)
	clear(ar.changes)
	ar.values, ar.data, ar.changes = ar.values[:0], ar.data[:0], ar.changes[:0]
	select {
	case ar.free <- ar:
	default:
	}
}
