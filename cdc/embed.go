package cdc

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/jackc/pgx/v5"
)

// Row changes that are not in the WAL (the rows a partition brought into
// or took out of a joined table, say) are written into it by the consumer
// itself: transactional logical decoding messages
// (pg_logical_emit_message) with the prefix MessagePrefix(slot), whose
// content is a sequence of pgoutput messages (Type, Relation, Insert,
// Update, Delete), each preceded by its length as a 4-byte big-endian
// integer. The stream decodes them as if the server had sent them, in the
// transaction that emitted them: their changes are applied, checkpointed
// and acknowledged with it, exactly once.

// MessagePrefix is the prefix of the messages that carry row changes for
// slot; messages with any other prefix are ignored.
func MessagePrefix(slot string) string { return "fkmat:" + slot }

// SwitchPrefix is the prefix of the markers written for slot (EmitSwitch).
func SwitchPrefix(slot string) string { return "fkmat-switch:" + slot }

// EmitSwitch writes a marker with id into the WAL in a transaction of its
// own, for the streams of slot (and of the slots that follow it, Config's
// MessageSlot) that StopAt id: each stops there, having delivered exactly
// the transactions that committed before it. It returns the marker's
// commit position.
func EmitSwitch(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, slot, id string) (wal.LSN, error) {
	var text string
	if err := db.QueryRow(ctx, `SELECT pg_logical_emit_message(true, $1, $2)::text`, SwitchPrefix(slot), id).Scan(&text); err != nil {
		return 0, fmt.Errorf("write the switch marker: %w", err)
	}
	return wal.ParseLSN(text)
}

// Embedded builds the content of one such message.
type Embedded struct{ buf []byte }

// Len returns the content's size in bytes.
func (e *Embedded) Len() int { return len(e.buf) }

// Bytes returns the content.
func (e *Embedded) Bytes() []byte { return e.buf }

// Reset empties the content.
func (e *Embedded) Reset() { e.buf = e.buf[:0] }

// begin starts a message of kind k and returns where its length goes.
func (e *Embedded) begin(k byte) int {
	at := len(e.buf)
	e.buf = append(e.buf, 0, 0, 0, 0, k)
	return at
}

func (e *Embedded) end(at int) {
	binary.BigEndian.PutUint32(e.buf[at:], uint32(len(e.buf)-at-4))
}

func (e *Embedded) str(s string) {
	e.buf = append(append(e.buf, s...), 0)
}

// Type describes a type that is not built in, as pgoutput does before the
// first Relation that uses it.
func (e *Embedded) Type(oid uint32, namespace, name string) {
	at := e.begin(msgType)
	e.buf = binary.BigEndian.AppendUint32(e.buf, oid)
	e.str(namespace)
	e.str(name)
	e.end(at)
}

// Relation describes a table: the changes after it are laid out by it.
func (e *Embedded) Relation(rel *Relation) {
	at := e.begin(msgRelation)
	e.buf = binary.BigEndian.AppendUint32(e.buf, rel.ID)
	e.str(rel.Namespace)
	e.str(rel.Name)
	e.buf = append(e.buf, byte(rel.ReplicaIdentity))
	e.buf = binary.BigEndian.AppendUint16(e.buf, uint16(len(rel.Columns)))
	for _, c := range rel.Columns {
		var flags byte
		if c.Key {
			flags = 1
		}
		e.buf = append(e.buf, flags)
		e.str(c.Name)
		e.buf = binary.BigEndian.AppendUint32(e.buf, c.Type)
		e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(c.TypeMod))
	}
	e.end(at)
}

// Update is an update of a row whose key did not change: vals are its
// columns in the relation's order, in text form, nil for NULL.
func (e *Embedded) Update(relid uint32, vals []*string) { e.row(msgUpdate, relid, 'N', vals) }

// Delete is a delete by replica identity: key holds the key columns' values
// in text form and nil for every other column.
func (e *Embedded) Delete(relid uint32, key []*string) { e.row(msgDelete, relid, 'K', key) }

// row writes a row message of kind k on relid with one tuple, tagged tag.
func (e *Embedded) row(k byte, relid uint32, tag byte, vals []*string) {
	at := e.begin(k)
	e.buf = binary.BigEndian.AppendUint32(e.buf, relid)
	e.buf = append(e.buf, tag)
	e.tuple(vals)
	e.end(at)
}

func (e *Embedded) tuple(vals []*string) {
	e.buf = binary.BigEndian.AppendUint16(e.buf, uint16(len(vals)))
	for _, v := range vals {
		if v == nil {
			e.buf = append(e.buf, 'n')
			continue
		}
		e.buf = append(e.buf, 't')
		e.buf = binary.BigEndian.AppendUint32(e.buf, uint32(len(*v)))
		e.buf = append(e.buf, *v...)
	}
}

// embedded handles a message the consumer emitted: each pgoutput message of
// its content as if the server had sent it at lsn. Full chunks go to
// res.chunks.
func (a *assembler) embedded(lsn wal.LSN, content []byte) (res result, err error) {
	for len(content) > 0 {
		if len(content) < 5 {
			return res, fmt.Errorf("%w: fkmat message at %s: %d trailing bytes", ErrProtocol, lsn, len(content))
		}
		n := binary.BigEndian.Uint32(content)
		if uint64(n) > uint64(len(content)-4) || n == 0 {
			return res, fmt.Errorf("%w: fkmat message at %s: a message of %d bytes in %d", ErrProtocol, lsn, n, len(content)-4)
		}
		msg := content[4 : 4+n]
		content = content[4+n:]
		switch msg[0] {
		case msgType, msgRelation, msgInsert, msgUpdate, msgDelete:
		default:
			return res, fmt.Errorf("%w: fkmat message at %s holds a %s message", ErrProtocol, lsn, kindName(msg[0]))
		}
		r, err := a.handle(lsn, msg)
		if err != nil {
			return res, err
		}
		if r.txn != nil {
			res.chunks = append(res.chunks, r.txn)
		}
	}
	return res, nil
}
