package cdc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/fkmat/fkmat/internal/wal"
)

// pgoutput message kinds (protocol version 1), and the streaming/two-phase
// kinds this package recognises only to ignore them.
const (
	msgBegin    = 'B'
	msgCommit   = 'C'
	msgOrigin   = 'O'
	msgRelation = 'R'
	msgType     = 'Y'
	msgInsert   = 'I'
	msgUpdate   = 'U'
	msgDelete   = 'D'
	msgTruncate = 'T'
	msgMessage  = 'M'
)

// Truncate option bits.
const (
	truncateCascade         = 1
	truncateRestartIdentity = 2
)

// message is one decoded pgoutput message. Only the fields of its kind are
// set. Tuple values alias the decoded buffer.
type message struct {
	kind byte
	// lsn is: Begin the final (commit) LSN; Commit the commit LSN; Origin
	// the origin's commit LSN; Message the message LSN.
	lsn wal.LSN
	// endLSN is the Commit's end LSN.
	endLSN wal.LSN
	time   time.Time
	xid    uint32
	flags  uint8
	// relid is the relation of Insert/Update/Delete.
	relid uint32
	// rel is a decoded Relation message.
	rel *Relation
	// oid, namespace and name are a Type message; name is also the Origin
	// name and the Message prefix.
	oid             uint32
	namespace, name string
	// oldKind is 'K', 'O' or 0.
	oldKind  byte
	old, new []Value
	relids   []uint32
	content  []byte
}

// errShort is the error of a message that ends too early.
var errShort = errors.New("message too short")

// reader reads big-endian fields from a message; the first error sticks and
// later reads return zero values, so a parse checks r.err once at the end.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.b)-r.off < n {
		r.err = errShort
		return false
	}
	return true
}

func (r *reader) u8() uint8 {
	if !r.need(1) {
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.b[r.off:])
	r.off += 2
	return v
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.b[r.off:])
	r.off += 8
	return v
}

func (r *reader) lsn() wal.LSN { return wal.LSN(r.u64()) }

// pgEpoch is 2000-01-01 UTC, the zero of Postgres timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func (r *reader) time() time.Time {
	us := int64(r.u64())
	if r.err != nil {
		return time.Time{}
	}
	return pgEpoch.Add(time.Duration(us) * time.Microsecond)
}

// str reads a NUL-terminated string.
func (r *reader) str() string {
	if r.err != nil {
		return ""
	}
	for i := r.off; i < len(r.b); i++ {
		if r.b[i] == 0 {
			s := string(r.b[r.off:i])
			r.off = i + 1
			return s
		}
	}
	r.err = errors.New("string not terminated")
	return ""
}

func (r *reader) bytes(n int) []byte {
	if !r.need(n) {
		return nil
	}
	v := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

// valueAlloc returns a slice of n values; the decoder uses it to take tuple
// storage from a slab instead of one allocation per tuple.
type valueAlloc func(n int) []Value

func allocValues(n int) []Value { return make([]Value, n) }

// decodeMessage decodes one pgoutput message, guarding against panics: a
// malformed message yields an error wrapping ErrProtocol, never a crash.
func decodeMessage(buf []byte, alloc valueAlloc) (m message, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: decode message: panic: %v", ErrProtocol, p)
		}
	}()
	m, err = parseMessage(buf, alloc)
	if err != nil {
		return message{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return m, nil
}

// parseMessage decodes one message. Unknown kinds decode to a message with
// just the kind set, so that callers can skip them.
func parseMessage(buf []byte, alloc valueAlloc) (message, error) {
	if len(buf) == 0 {
		return message{}, errors.New("decode message: empty")
	}
	r := &reader{b: buf, off: 1}
	m := message{kind: buf[0]}
	switch m.kind {
	case msgBegin:
		m.lsn = r.lsn()
		m.time = r.time()
		m.xid = r.u32()
	case msgCommit:
		m.flags = r.u8()
		m.lsn = r.lsn()
		m.endLSN = r.lsn()
		m.time = r.time()
	case msgOrigin:
		m.lsn = r.lsn()
		m.name = r.str()
	case msgRelation:
		m.rel = parseRelation(r)
	case msgType:
		m.oid = r.u32()
		m.namespace = r.str()
		m.name = r.str()
	case msgInsert:
		m.relid = r.u32()
		if tag := r.u8(); r.err == nil && tag != 'N' {
			return message{}, fmt.Errorf("decode insert: tuple tag %q, want 'N'", tag)
		}
		m.new = parseTuple(r, alloc)
	case msgUpdate:
		m.relid = r.u32()
		tag := r.u8()
		if tag == 'K' || tag == 'O' {
			m.oldKind = tag
			m.old = parseTuple(r, alloc)
			tag = r.u8()
		}
		if r.err == nil && tag != 'N' {
			return message{}, fmt.Errorf("decode update: tuple tag %q, want 'N'", tag)
		}
		m.new = parseTuple(r, alloc)
	case msgDelete:
		m.relid = r.u32()
		m.oldKind = r.u8()
		if r.err == nil && m.oldKind != 'K' && m.oldKind != 'O' {
			return message{}, fmt.Errorf("decode delete: tuple tag %q, want 'K' or 'O'", m.oldKind)
		}
		m.old = parseTuple(r, alloc)
	case msgTruncate:
		n := r.u32()
		m.flags = r.u8()
		// Bound the allocation and the loop by what the message holds.
		if r.err != nil || int64(n)*4 > int64(len(buf)-r.off) {
			return message{}, fmt.Errorf("decode truncate message: %d relations: %w", n, errShort)
		}
		m.relids = make([]uint32, 0, n)
		for range n {
			m.relids = append(m.relids, r.u32())
		}
	case msgMessage:
		m.flags = r.u8()
		m.lsn = r.lsn()
		m.name = r.str()
		n := r.u32()
		m.content = r.bytes(int(n))
	default:
		return m, nil
	}
	if r.err != nil {
		return message{}, fmt.Errorf("decode %s message: %w", kindName(m.kind), r.err)
	}
	if r.off != len(buf) {
		return message{}, fmt.Errorf("decode %s message: %d trailing bytes", kindName(m.kind), len(buf)-r.off)
	}
	return m, nil
}

func parseRelation(r *reader) *Relation {
	rel := &Relation{ID: r.u32()}
	rel.Namespace = r.str()
	rel.Name = r.str()
	rel.ReplicaIdentity = ReplicaIdentity(r.u8())
	n := int(r.u16())
	// Each column takes at least 10 bytes; do not trust n further.
	if !r.need(n * 10) {
		return nil
	}
	rel.Columns = make([]Column, n)
	for i := range rel.Columns {
		c := &rel.Columns[i]
		c.Key = r.u8()&1 != 0
		c.Name = r.str()
		c.Type = r.u32()
		c.TypeMod = int32(r.u32())
	}
	return rel
}

func parseTuple(r *reader, alloc valueAlloc) []Value {
	n := int(r.u16())
	// Each column takes at least one byte.
	if !r.need(n) {
		return nil
	}
	vals := alloc(n)
	for i := range vals {
		switch k := r.u8(); k {
		case 'n':
			vals[i].Kind = ValueNull
		case 'u':
			vals[i].Kind = ValueUnchanged
		case 't', 'b':
			vals[i].Kind = ValueText
			if k == 'b' {
				vals[i].Kind = ValueBinary
			}
			l := r.u32()
			if l > uint32(len(r.b)) {
				r.err = errShort
				return nil
			}
			vals[i].Data = r.bytes(int(l))
		default:
			if r.err == nil {
				r.err = fmt.Errorf("column %d: unknown tuple data kind %q", i, k)
			}
			return nil
		}
	}
	return vals
}

// kindName names a message kind for errors and logs.
func kindName(k byte) string {
	switch k {
	case msgBegin:
		return "begin"
	case msgCommit:
		return "commit"
	case msgOrigin:
		return "origin"
	case msgRelation:
		return "relation"
	case msgType:
		return "type"
	case msgInsert:
		return "insert"
	case msgUpdate:
		return "update"
	case msgDelete:
		return "delete"
	case msgTruncate:
		return "truncate"
	case msgMessage:
		return "message"
	case 'S':
		return "stream start"
	case 'E':
		return "stream stop"
	case 'c':
		return "stream commit"
	case 'A':
		return "stream abort"
	}
	return fmt.Sprintf("unknown(%q)", k)
}
