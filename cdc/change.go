package cdc

import (
	"strconv"
	"time"

	"github.com/fkmat/fkmat/internal/wal"
)

// Txn is one source transaction, or one chunk of a large one, in commit
// order.
//
// A transaction with more than Config.ChunkChanges changes (or
// Config.ChunkBytes bytes) arrives as several Txn values with the same Xid
// and CommitLSN, Chunk counting up from 0, and Final set on the last one only.
// A Txn with Chunk == 0 always starts a transaction: if the consumer holds
// chunks of an unfinished transaction at that point, the stream reconnected
// in the middle of it and is sending it again from the start, so the held
// chunks must be discarded.
type Txn struct {
	// Xid is the source transaction id.
	Xid uint32
	// CommitLSN is the position of the commit record (from BEGIN), the same
	// on every chunk.
	CommitLSN wal.LSN
	// EndLSN is the position just after the commit record; set on the
	// Final chunk only. It is the position to pass to Stream.Ack once the
	// transaction is applied, and the position to restart from.
	EndLSN wal.LSN
	// CommitTime is the commit timestamp on the source.
	CommitTime time.Time
	// Origin is the replication origin the transaction came from, if any.
	Origin string
	// Chunk numbers the chunks of one transaction from 0.
	Chunk int
	// Final marks the last chunk; a transaction small enough for one chunk
	// has Chunk == 0 and Final == true.
	Final bool
	// Changes are the row changes, truncations and schema changes in WAL
	// order.
	Changes []Change
	// Bytes approximates the memory the chunk holds.
	Bytes int
	// Marker is the id of the switch marker (EmitSwitch) the transaction
	// carries, if any; such a transaction has no changes of its own.
	Marker string

	// arenas are the arenas the chunk was cut from (see arena); own,
	// when set, holds Changes, too many for an arena.
	arenas []*arena
	own    []Change
}

// Release says the consumer is done with the chunk's changes and their
// values: the memory they were cut from is cut again for later chunks.
// Changes is nil after; the other fields stay. A chunk the stream did not
// assemble is left as it is. Using a chunk's changes or values after
// releasing it, or releasing it twice, is a bug.
func (t *Txn) Release() {
	if t.arenas == nil {
		return
	}
	for _, ar := range t.arenas {
		ar.release()
	}
	t.arenas, t.Changes, t.own = nil, nil, nil
}

// ChangeKind says what a Change is.
type ChangeKind uint8

// The kinds of Change.
const (
	ChangeInsert ChangeKind = iota + 1
	ChangeUpdate
	ChangeDelete
	ChangeTruncate
	// ChangeSchema reports that a table's shape differs from the previous
	// Relation message for the same relation (see SchemaChange). It comes
	// before the first row change laid out the new way. The first shape a
	// Stream sees of a table is compared with nothing: a consumer that keeps
	// table shapes across restarts checks the Relation of the first change
	// of each table itself (a *Relation only changes with a ChangeSchema).
	ChangeSchema
)

// String names the kind.
func (k ChangeKind) String() string {
	switch k {
	case ChangeInsert:
		return "insert"
	case ChangeUpdate:
		return "update"
	case ChangeDelete:
		return "delete"
	case ChangeTruncate:
		return "truncate"
	case ChangeSchema:
		return "schema"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// OldKind says what the old tuple of an update or delete holds.
type OldKind uint8

// The kinds of old tuple.
const (
	// OldNone: no old tuple (inserts, and updates that did not change the
	// replica identity key under REPLICA IDENTITY DEFAULT or USING INDEX).
	OldNone OldKind = iota
	// OldKey: the replica identity columns (Column.Key) carry the old key;
	// every other column is ValueNull and means nothing.
	OldKey
	// OldFull: the whole old row (REPLICA IDENTITY FULL).
	OldFull
)

// Change is one change of a transaction.
type Change struct {
	Kind ChangeKind
	// LSN is the WAL position of the change.
	LSN wal.LSN
	// Relation is the table the tuples are laid out against, as of this
	// change (ChangeInsert, ChangeUpdate, ChangeDelete; for ChangeSchema
	// the new shape). A schema change yields a new *Relation; changes
	// before it keep pointing at the old one.
	Relation *Relation
	// Old is the old tuple of an update or delete, as OldKind says; nil when
	// OldKind is OldNone.
	Old     []Value
	OldKind OldKind
	// New is the new tuple of an insert or update. In an update, columns
	// whose value is an unchanged TOASTed value are ValueUnchanged.
	New []Value
	// Truncate is set for ChangeTruncate.
	Truncate *Truncate
	// Schema is set for ChangeSchema.
	Schema *SchemaChange
}

// ValueKind says what a Value holds.
type ValueKind uint8

// The kinds of Value.
const (
	// ValueNull is SQL NULL.
	ValueNull ValueKind = iota + 1
	// ValueText is a value in Postgres' text output format.
	ValueText
	// ValueBinary is a value in binary format (only if the binary option
	// was requested, which this package does not do).
	ValueBinary
	// ValueUnchanged is an unchanged TOASTed value: the column still holds
	// its old value, which the server did not send. It is never NULL.
	ValueUnchanged
)

// String names the kind.
func (k ValueKind) String() string {
	switch k {
	case ValueNull:
		return "null"
	case ValueText:
		return "text"
	case ValueBinary:
		return "binary"
	case ValueUnchanged:
		return "unchanged-toast"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Value is one column of a tuple.
type Value struct {
	Kind ValueKind
	// Type is the column's type OID (from the Relation).
	Type uint32
	// Data is the text (or binary) form for ValueText and ValueBinary. It
	// shares memory with other values of the chunk: do not modify it, copy
	// it to keep it beyond the chunk.
	Data []byte
}

// String returns the text form, "NULL" or "<unchanged-toast>".
func (v Value) String() string {
	switch v.Kind {
	case ValueText, ValueBinary:
		return string(v.Data)
	case ValueNull:
		return "NULL"
	case ValueUnchanged:
		return "<unchanged-toast>"
	}
	return "<invalid>"
}

// ReplicaIdentity is a table's REPLICA IDENTITY setting, as pg_class
// relreplident spells it.
type ReplicaIdentity byte

// The replica identity settings.
const (
	IdentityDefault ReplicaIdentity = 'd'
	IdentityNothing ReplicaIdentity = 'n'
	IdentityFull    ReplicaIdentity = 'f'
	IdentityIndex   ReplicaIdentity = 'i'
)

// Relation is a table's shape as a pgoutput Relation message describes it.
// It is immutable: a changed table gets a new Relation.
type Relation struct {
	// ID is the table's OID.
	ID              uint32
	Namespace, Name string
	ReplicaIdentity ReplicaIdentity
	Columns         []Column
}

// Column is one published column.
type Column struct {
	Name string
	// Type is the type OID and TypeMod its modifier (-1 for none).
	Type    uint32
	TypeMod int32
	// Key marks the replica identity columns (the primary key by default).
	Key bool
	// TypeName is "schema.name" of a non built-in type, from the Type
	// message the server sent for it; empty for built-in types.
	TypeName string
}

// Table returns the relation's schema-qualified name.
func (r *Relation) Table() TableName { return TableName{Schema: r.Namespace, Name: r.Name} }

// ColumnIndex returns the position of the named column, or -1.
func (r *Relation) ColumnIndex(name string) int {
	for i, c := range r.Columns {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// Truncate is a TRUNCATE of one or more tables in one statement.
type Truncate struct {
	Relations       []*Relation
	Cascade         bool
	RestartIdentity bool
}

// SchemaChange compares a relation's new shape with its previous one.
// Columns are matched by name: a renamed column is one dropped and one added.
type SchemaChange struct {
	Old, New *Relation
	Added    []Column
	Dropped  []Column
	// Retyped holds pairs of the same column with a different type or type
	// modifier.
	Retyped []Retype
	// Renamed: the table's schema or name changed.
	Renamed bool
	// KeyChanged: the set of replica identity columns changed.
	KeyChanged bool
	// IdentityChanged: the REPLICA IDENTITY setting changed.
	IdentityChanged bool
	// Reordered: the surviving columns are in a different order.
	Reordered bool
}

// Retype is a column whose type changed.
type Retype struct {
	Old, New Column
}

// diffRelations returns the schema change from old to new, or nil when they
// describe the same shape.
func diffRelations(old, new *Relation) *SchemaChange {
	sc := &SchemaChange{Old: old, New: new}
	sc.Renamed = old.Namespace != new.Namespace || old.Name != new.Name
	sc.IdentityChanged = old.ReplicaIdentity != new.ReplicaIdentity
	oldIdx := make(map[string]int, len(old.Columns))
	for i, c := range old.Columns {
		oldIdx[c.Name] = i
	}
	var kept []string
	for _, nc := range new.Columns {
		i, ok := oldIdx[nc.Name]
		if !ok {
			sc.Added = append(sc.Added, nc)
			continue
		}
		oc := old.Columns[i]
		delete(oldIdx, nc.Name)
		kept = append(kept, nc.Name)
		if oc.Type != nc.Type || oc.TypeMod != nc.TypeMod {
			sc.Retyped = append(sc.Retyped, Retype{Old: oc, New: nc})
		}
		if oc.Key != nc.Key {
			sc.KeyChanged = true
		}
	}
	var oldKept []string
	for _, oc := range old.Columns {
		if _, dropped := oldIdx[oc.Name]; dropped {
			sc.Dropped = append(sc.Dropped, oc)
			if oc.Key {
				sc.KeyChanged = true
			}
			continue
		}
		oldKept = append(oldKept, oc.Name)
	}
	for _, nc := range sc.Added {
		if nc.Key {
			sc.KeyChanged = true
		}
	}
	for i := range kept {
		if kept[i] != oldKept[i] {
			sc.Reordered = true
			break
		}
	}
	if !sc.Renamed && !sc.IdentityChanged && !sc.KeyChanged && !sc.Reordered &&
		len(sc.Added) == 0 && len(sc.Dropped) == 0 && len(sc.Retyped) == 0 {
		return nil
	}
	return sc
}
