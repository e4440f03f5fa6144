package join

import (
	"context"
	"fmt"
	"strings"
)

// StateReader reads the join state persisted by the store (redisstore in
// production). All methods see the state as of the last committed batch; the
// engine never writes through this interface, it returns Mutations instead.
// Implementations must be safe for the engine's sequential use; they may block
// on I/O and must honour ctx.
type StateReader interface {
	// GetLeft returns the stored state of the given encoded left keys; absent
	// keys are missing from the map, which is new and the caller's. One
	// pipelined round trip.
	GetLeft(ctx context.Context, keys []Key) (map[Key]LeftState, error)
	// GetRight returns the stored state of the given encoded right keys;
	// absent keys are missing from the map, which is new and the caller's.
	// One pipelined round trip.
	GetRight(ctx context.Context, keys []Key) (map[Key]RightState, error)
	// Dependents returns up to limit encoded left keys subscribed to the
	// encoded right key fk, in key order, strictly after `after` ("" = from
	// the start). Its cost is proportional to the page, never a scan.
	Dependents(ctx context.Context, fk Key, after Key, limit int) ([]Key, error)
}

// ManyDependentsReader is implemented by readers that can read the first
// page of dependents of many foreign keys in one round trip. The engine uses
// it, when present, so that a batch changing many right rows does not pay a
// round trip per right row.
type ManyDependentsReader interface {
	// DependentsMany returns, for each fks[i], what Dependents(ctx, fks[i],
	// "", limits[i]) returns.
	DependentsMany(ctx context.Context, fks []Key, limits []int) ([][]Key, error)
}

// Subscription records that the left row PK references the right key FK.
type Subscription struct {
	FK Key
	PK Key
}

// Member returns the subscription's sorted-set member, FK ++ PK. Because keys
// are prefix-free, the members of one FK are exactly those with prefix FK.
func (s Subscription) Member() string { return string(s.FK) + string(s.PK) }

// ParseMember splits a member produced by Member into its FK and PK, given the
// families of the FK columns.
func ParseMember(fkFams []Family, member string) (Subscription, error) {
	_, n, err := DecodeKey(fkFams, member)
	if err != nil {
		return Subscription{}, fmt.Errorf("parse subscription member: %w", err)
	}
	if n == len(member) {
		return Subscription{}, fmt.Errorf("parse subscription member: no primary key after the foreign key")
	}
	return Subscription{FK: Key(member[:n]), PK: Key(member[n:])}, nil
}

// Mutations is the net state change of one batch, to be persisted atomically
// with the batch's checkpoint. Applying it is idempotent: replaying the same
// Mutations over the state they produced changes nothing.
//
// Order of application: ClearLeft and ClearRight first (a TRUNCATE happened in
// the batch), then the deletes and puts, which concern distinct keys.
type Mutations struct {
	// ClearLeft drops every left row and every subscription.
	ClearLeft bool
	// ClearRight drops every right row (subscriptions are kept).
	ClearRight bool

	PutLeft  map[Key]LeftState
	DelLeft  []Key
	PutRight map[Key]RightState
	DelRight []Key

	// AddSubs and DelSubs are disjoint sets of subscriptions.
	AddSubs []Subscription
	DelSubs []Subscription

	// Tables, set instead of the fields above, are the mutations of each
	// table's state of a join of more than two tables (PerTable). A state
	// store refuses them: they are committed table by table.
	Tables []Mutations

	// rows are the chunks of the batch's joined rows, which its outputs
	// hold: the engine takes them back with the mutations (Recycle).
	rows [][]Value
}

// PerTable wraps the mutations of each table's state in one Mutations.
func PerTable(tables []Mutations) Mutations { return Mutations{Tables: tables} }

// Empty reports whether m changes nothing.
func (m *Mutations) Empty() bool {
	for i := range m.Tables {
		if !m.Tables[i].Empty() {
			return false
		}
	}
	return !m.ClearLeft && !m.ClearRight && len(m.PutLeft) == 0 && len(m.DelLeft) == 0 &&
		len(m.PutRight) == 0 && len(m.DelRight) == 0 && len(m.AddSubs) == 0 && len(m.DelSubs) == 0
}

// Clears reports whether m (or one of its tables) clears a side: old keys
// are then garbage to sweep.
func (m *Mutations) Clears() bool {
	for i := range m.Tables {
		if m.Tables[i].Clears() {
			return true
		}
	}
	return m.ClearLeft || m.ClearRight
}

// String summarizes m's sizes, for logs (it never prints row values).
func (m *Mutations) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "clear_left=%t clear_right=%t put_left=%d del_left=%d put_right=%d del_right=%d add_subs=%d del_subs=%d",
		m.ClearLeft, m.ClearRight, len(m.PutLeft), len(m.DelLeft), len(m.PutRight), len(m.DelRight),
		len(m.AddSubs), len(m.DelSubs))
	return b.String()
}
