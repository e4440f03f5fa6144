package join

import (
	"errors"
	"fmt"
)

// JoinType is the SQL join type of a foreign-key join.
type JoinType uint8

// The join types.
const (
	// Inner keeps only left rows whose foreign key matches a right row.
	Inner JoinType = iota + 1
	// Left keeps every left row; right columns are NULL without a match.
	Left
)

// String returns "inner" or "left".
func (t JoinType) String() string {
	switch t {
	case Inner:
		return "inner"
	case Left:
		return "left"
	}
	return fmt.Sprintf("jointype(%d)", uint8(t))
}

// DefaultPageSize is the number of dependents of a right key resolved (and
// emitted) at a time when a right change fans out.
const DefaultPageSize = 5000

// Spec describes one join as the engine sees it: key families and value
// counts. The column mapping lives in the caller's configuration.
type Spec struct {
	// Name identifies the join in errors.
	Name string
	// Type is Inner or Left.
	Type JoinType
	// PK, FK and RightKey are the families of the left primary key, the
	// foreign key and the right key columns; FK and RightKey pairwise equal.
	PK       []Family
	FK       []Family
	RightKey []Family
	// LeftValues and RightValues count the projected columns of each side
	// (LeftRow.Values, RightRow.Values).
	LeftValues  int
	RightValues int
	// LeftPartitioned and RightPartitioned say the table is partitioned.
	// Partition DDL moves rows of such a table without row changes in the
	// WAL, and the daemon writes them into the WAL itself a moment later:
	// meanwhile an update of a row that came with a partition finds no
	// stored row, and one with unchanged-TOAST values is skipped (the
	// row is written whole after it) instead of failing with
	// ErrNoToastState.
	LeftPartitioned, RightPartitioned bool
	// PageSize bounds the dependents resolved per fan-out page; 0 means
	// DefaultPageSize.
	PageSize int
}

// Validate reports the first problem of s, naming the join.
func (s Spec) Validate() error {
	if err := s.validate(); err != nil {
		return fmt.Errorf("join %q: %w", s.Name, err)
	}
	return nil
}

func (s Spec) validate() error {
	switch {
	case s.Type != Inner && s.Type != Left:
		return fmt.Errorf("type %s is neither inner nor left", s.Type)
	case len(s.PK) == 0:
		return errors.New("left table has no key columns; set left.key in the config")
	case len(s.FK) == 0:
		return errors.New("no foreign key columns; set left.foreign_key in the config")
	case len(s.FK) != len(s.RightKey):
		return fmt.Errorf("%d foreign key columns for %d right key columns; list one foreign key column per right key column",
			len(s.FK), len(s.RightKey))
	case s.LeftValues < 0 || s.RightValues < 0 || s.PageSize < 0:
		return errors.New("negative column count or page size")
	}
	for i := range s.FK {
		if s.FK[i] != s.RightKey[i] {
			return fmt.Errorf("foreign key column %d (%s) cannot match right key column %d (%s); use columns of compatible types",
				i+1, s.FK[i], i+1, s.RightKey[i])
		}
	}
	return nil
}

// ChangeKind is the kind of one source change.
type ChangeKind uint8

// The change kinds.
const (
	LeftUpsert ChangeKind = iota + 1
	LeftDelete
	RightUpsert
	RightDelete
	LeftTruncate
	RightTruncate
	// LeftKeyChange is an UPDATE that changed a left row's key: the row at
	// OldKey moves to Left.PK. Unchanged-TOAST values of Left are the old
	// row's, which is why a key change is not a delete plus an upsert: the
	// new key has no state to fill them from.
	LeftKeyChange
	// RightKeyChange is an UPDATE that changed a right row's key: the row at
	// OldKey moves to Right.Key, its unchanged-TOAST values with it. The
	// left rows that referenced the old key still reference it (SQL does not
	// move them), so they lose their match; the ones referencing the new key
	// gain it.
	RightKeyChange
)

var changeKindNames = [...]string{"", "left_upsert", "left_delete", "right_upsert", "right_delete",
	"left_truncate", "right_truncate", "left_key_change", "right_key_change"}

// String returns the kind's snake_case name.
func (k ChangeKind) String() string {
	if int(k) < len(changeKindNames) && k != 0 {
		return changeKindNames[k]
	}
	return fmt.Sprintf("changekind(%d)", uint8(k))
}

// Change is one row change of a source table. LeftUpsert uses Left;
// LeftDelete uses Left.PK only; RightUpsert uses Right; RightDelete uses
// Right.Key only; truncates use neither. LeftKeyChange uses Left and OldKey
// (the old left key), RightKeyChange Right and OldKey (the old right key).
type Change struct {
	Kind  ChangeKind
	Left  LeftRow
	Right RightRow
	// OldKey is the key the row had before a key change.
	OldKey []Value
	// Table is the table of a join of more than two tables the change is
	// of (pipeline.TreeLayout): 0 the left table (left kinds), i+1 entry
	// i's (right kinds). Engine ignores it.
	Table int
	// Insert marks an upsert of a row that did not exist just before it (a
	// pgoutput INSERT): when it is the first change of its key in a batch,
	// the key's state at the batch start is known to be absent, and the
	// engine does not read it.
	Insert bool
	// IfPresent marks an upsert or key change that applies only to a row
	// the state holds (at the key change's old key): an update of a
	// filtered table that left every input of the filter unchanged, so the
	// row stays in the join, or out of it, as it was.
	IfPresent bool
	// Known marks a change whose row's values at the batch start the
	// change carries (Before; nil: absent), as a roll-up knows its results
	// from its own state: the tree does not read them.
	Known  bool
	Before []Value
}

// Output is one ordered piece of a batch's effect on the target table. The
// target applies a batch's Outputs in order, in one transaction: first
// Truncate or NullRight, then Deletes and Upserts (they concern distinct keys).
type Output struct {
	// Truncate empties the target first.
	Truncate bool
	// NullRight sets every right column of every target row to NULL first
	// (left join after a TRUNCATE of the right table).
	NullRight bool
	// Upserts are whole joined rows, inserted or replacing the row with the
	// same left key; each differs from the row it replaces.
	Upserts []Row
	// Deletes are the left key values of rows to delete; each row exists.
	Deletes [][]Value
	// RightUpdates set the right columns of existing rows, after the
	// upserts and deletes (they concern other keys).
	RightUpdates []RightUpdate
	// NullColumns (a Tree's) sets these target columns of every row to
	// NULL first, or to NullValues when set (an entry's values without a
	// row: a roll-up's count is 0), touching only the rows that differ.
	NullColumns []int
	NullValues  []Value
	// ColumnUpdates (a Tree's) set some columns of rows, after the
	// upserts and deletes. A key whose row does not exist is skipped; a
	// row may get several, of disjoint columns.
	ColumnUpdates []ColumnUpdate
}

// ColumnUpdate sets the target columns Columns (ascending indexes) of the
// rows with keys Keys to Values, touching only the rows where they differ.
type ColumnUpdate struct {
	Columns []int
	Keys    [][]Value
	Values  []Value
}

// RightUpdate is a fan-out that changes only the right columns of rows that
// exist before and after it: the rows with left keys Keys get the right
// values Right (all NULL for a left join without a match). The engine
// emits it without reading the rows' left state; each row's right part
// differs from Right.
type RightUpdate struct {
	Keys  [][]Value
	Right []Value
}

// Rows returns how many target rows o writes at most (a truncate and a
// null-right count as none).
func (o *Output) Rows() int {
	n := len(o.Upserts) + len(o.Deletes)
	for _, u := range o.RightUpdates {
		n += len(u.Keys)
	}
	for _, u := range o.ColumnUpdates {
		n += len(u.Keys)
	}
	return n
}

// empty reports whether o changes nothing.
func (o *Output) empty() bool {
	return !o.Truncate && !o.NullRight && len(o.Upserts) == 0 && len(o.Deletes) == 0 && len(o.RightUpdates) == 0 &&
		len(o.NullColumns) == 0 && len(o.ColumnUpdates) == 0
}

// Stats are the engine's cumulative counters.
type Stats struct {
	// Instructions counts subscription instructions sent by the sender.
	Instructions uint64
	// Responses counts responses produced by the subscription side,
	// fan-out included.
	Responses uint64
	// StaleResponses counts responses the resolver discarded because the left
	// row changed after they were computed.
	StaleResponses uint64
	// InnerNullFKDrops counts inner-join left rows dropped for a NULL foreign key.
	InnerNullFKDrops uint64
	// AbsentToastSkips counts updates of rows of a partitioned table that
	// were not stored and held unchanged-TOAST values: rows that came with
	// a partition, skipped until the daemon writes them whole.
	AbsentToastSkips uint64
	// FanoutRows counts responses produced by right-side fan-out.
	FanoutRows uint64
	// Rollups are a tree's roll-ups' counters, by roll-up (its child
	// table).
	Rollups map[string]RollupStats
}

// RollupStats counts a roll-up's work.
type RollupStats struct {
	// Changes are the child changes applied; Parents the parents whose
	// state a batch changed; SetReads the sorted sets read because a
	// parent's window could not say its first members.
	Changes, Parents, SetReads uint64
}

// Add adds o's counts to s.
func (s *Stats) Add(o Stats) {
	s.Instructions += o.Instructions
	s.Responses += o.Responses
	s.StaleResponses += o.StaleResponses
	s.InnerNullFKDrops += o.InnerNullFKDrops
	s.AbsentToastSkips += o.AbsentToastSkips
	s.FanoutRows += o.FanoutRows
	if len(o.Rollups) > 0 {
		// A copy: s may share its map with the Stats it was copied from.
		rs := make(map[string]RollupStats, len(s.Rollups)+len(o.Rollups))
		for name, r := range s.Rollups {
			rs[name] = r
		}
		for name, r := range o.Rollups {
			t := rs[name]
			t.Changes += r.Changes
			t.Parents += r.Parents
			t.SetReads += r.SetReads
			rs[name] = t
		}
		s.Rollups = rs
	}
}
