package cdc

import (
	"fmt"
	"log/slog"
	"maps"
	"unsafe"
)

// Approximate sizes for Txn.Bytes.
const (
	valueSize  = int(unsafe.Sizeof(Value{}))
	changeSize = int(unsafe.Sizeof(Change{}))
	// slabValues and slabBytes size the per-chunk allocation slabs.
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
	resume LSN

	inTxn    bool
	skipping bool
	cur      *Txn
	pending  []Change // schema changes not yet delivered
	// values and data are allocation slabs for tuple values and message
	// bytes, shared by consecutive chunks so that small transactions do not
	// each hold a whole slab.
	values  []Value
	data    []byte
	changes []Change
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
func (a *assembler) reset(resume LSN) {
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
	emptyEnd LSN
	// ignored is the kind of a message that was skipped as unknown.
	ignored byte
	// chunks are full chunks to deliver before txn (from a message
	// carrying many row changes).
	chunks []*Txn
}

// handle processes one message that starts at WAL position lsn. data is only
// read during the call.
func (a *assembler) handle(lsn LSN, data []byte) (result, error) {
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
	if len(a.pending) > 0 {
		a.cur.Changes = append(a.cur.Changes, a.pending...)
		for _, c := range a.pending {
			a.cur.Bytes += changeSize + relationSize(c.Relation)
		}
		a.pending = nil
	}
	return nil
}

// message handles a logical decoding message: one of ours, transactional,
// carries row changes; any other is not ours.
func (a *assembler) message(lsn LSN, data []byte) (result, error) {
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

func (a *assembler) relation(lsn LSN, rel *Relation) {
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
			a.cur.Changes = append(a.cur.Changes, ch)
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
func (a *assembler) row(lsn LSN, data []byte) (result, error) {
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
// the change slab while they are its last slice (the current transaction
// always is, but for the schema changes begin carries over), instead of
// doubling a slice of their own. t.Changes is capped at its length: an
// append by its consumer copies it.
func (a *assembler) appendChange(t *Txn, ch Change) {
	n := len(t.Changes)
	last := n == 0 || (len(a.changes) >= n && &a.changes[len(a.changes)-n] == &t.Changes[0])
	if last && len(a.changes) < cap(a.changes) {
		a.changes = append(a.changes, ch) // in place: there is room
		t.Changes = a.changes[len(a.changes)-n-1 : len(a.changes) : len(a.changes)]
		return
	}
	a.changes = make([]Change, 0, max(slabChanges, 2*(n+1)))
	a.changes = append(append(a.changes, t.Changes...), ch)
	t.Changes = a.changes[: n+1 : n+1]
}

// copyData copies a message into the chunk's byte slab: the connection
// reuses its buffer, and the values of the chunk alias the copy.
func (a *assembler) copyData(data []byte) []byte {
	if len(data) > slabBytes/4 {
		return append([]byte(nil), data...)
	}
	if cap(a.data)-len(a.data) < len(data) {
		a.data = make([]byte, 0, slabBytes)
	}
	start := len(a.data)
	a.data = append(a.data, data...)
	return a.data[start:len(a.data):len(a.data)]
}

// allocValues takes n values from the chunk's value slab.
func (a *assembler) allocValues(n int) []Value {
	if n > slabValues/4 {
		return make([]Value, n)
	}
	if cap(a.values)-len(a.values) < n {
		a.values = make([]Value, 0, slabValues)
	}
	start := len(a.values)
	a.values = a.values[:start+n]
	return a.values[start : start+n : start+n]
}
