package jointest

import (
	"fmt"

	"github.com/fkmat/fkmat/join"
)

// Source models the two source tables and evaluates the join on them with
// SQL semantics: it is the oracle the engine's output is compared with.
type Source struct {
	spec  join.Spec
	Left  map[join.Key]join.LeftRow
	Right map[join.Key]join.RightRow
}

// NewSource returns empty source tables for spec.
func NewSource(spec join.Spec) *Source {
	return &Source{spec: spec, Left: map[join.Key]join.LeftRow{}, Right: map[join.Key]join.RightRow{}}
}

// Apply applies one change, filling unchanged-TOAST values from the table.
// A change marked IfPresent of a row the table does not hold is nothing.
func (s *Source) Apply(c join.Change) error {
	if c.IfPresent {
		if present, err := s.present(c); err != nil || !present {
			return err
		}
	}
	switch c.Kind {
	case join.LeftUpsert:
		k, err := join.EncodeKey(s.spec.PK, c.Left.PK)
		if err != nil {
			return err
		}
		old := s.Left[k]
		s.Left[k] = join.LeftRow{PK: c.Left.PK, FK: fill(c.Left.FK, old.FK), Values: fill(c.Left.Values, old.Values)}
	case join.LeftDelete:
		k, err := join.EncodeKey(s.spec.PK, c.Left.PK)
		if err != nil {
			return err
		}
		delete(s.Left, k)
	case join.RightUpsert:
		k, err := join.EncodeKey(s.spec.RightKey, c.Right.Key)
		if err != nil {
			return err
		}
		s.Right[k] = join.RightRow{Key: c.Right.Key, Values: fill(c.Right.Values, s.Right[k].Values)}
	case join.RightDelete:
		k, err := join.EncodeKey(s.spec.RightKey, c.Right.Key)
		if err != nil {
			return err
		}
		delete(s.Right, k)
	case join.LeftKeyChange:
		ok, err := join.EncodeKey(s.spec.PK, c.OldKey)
		if err != nil {
			return err
		}
		k, err := join.EncodeKey(s.spec.PK, c.Left.PK)
		if err != nil {
			return err
		}
		old, found := s.Left[ok]
		if !found {
			return fmt.Errorf("key change of missing left row %v", c.OldKey)
		}
		if _, taken := s.Left[k]; taken && k != ok {
			return fmt.Errorf("key change of left row %v to existing key %v", c.OldKey, c.Left.PK)
		}
		delete(s.Left, ok)
		s.Left[k] = join.LeftRow{PK: c.Left.PK, FK: fill(c.Left.FK, old.FK), Values: fill(c.Left.Values, old.Values)}
	case join.RightKeyChange:
		ok, err := join.EncodeKey(s.spec.RightKey, c.OldKey)
		if err != nil {
			return err
		}
		k, err := join.EncodeKey(s.spec.RightKey, c.Right.Key)
		if err != nil {
			return err
		}
		old, found := s.Right[ok]
		if !found {
			return fmt.Errorf("key change of missing right row %v", c.OldKey)
		}
		if _, taken := s.Right[k]; taken && k != ok {
			return fmt.Errorf("key change of right row %v to existing key %v", c.OldKey, c.Right.Key)
		}
		delete(s.Right, ok)
		s.Right[k] = join.RightRow{Key: c.Right.Key, Values: fill(c.Right.Values, old.Values)}
	case join.LeftTruncate:
		s.Left = map[join.Key]join.LeftRow{}
	case join.RightTruncate:
		s.Right = map[join.Key]join.RightRow{}
	default:
		return fmt.Errorf("unknown change kind %d", c.Kind)
	}
	return nil
}

// fill replaces Toast markers in vals by the same position of old.
func fill(vals, old []join.Value) []join.Value {
	out := make([]join.Value, len(vals))
	for i, v := range vals {
		if v.Toast {
			v = old[i]
		}
		out[i] = v
	}
	return out
}

// Join evaluates SELECT l.pk, l.values, r.values FROM left l [LEFT] JOIN
// right r ON l.fk = r.key, keyed by the encoded left key. A foreign key with
// a NULL column matches nothing, as in SQL.
func (s *Source) Join() map[join.Key]join.Row {
	rows := make(map[join.Key]join.Row, len(s.Left))
	for k, l := range s.Left {
		var right []join.Value
		if fk, err := join.EncodeKey(s.spec.FK, l.FK); err == nil {
			if r, ok := s.Right[fk]; ok {
				right = r.Values
			}
		}
		if right == nil {
			if s.spec.Type == join.Inner {
				continue
			}
			right = make([]join.Value, s.spec.RightValues)
			for i := range right {
				right[i] = join.NullValue()
			}
		}
		row := append(append(append(join.Row{}, l.PK...), l.Values...), right...)
		rows[k] = row
	}
	return rows
}

// present reports whether the table holds the row an upsert or a key
// change (at its old key) applies to.
func (s *Source) present(c join.Change) (bool, error) {
	switch c.Kind {
	case join.LeftUpsert, join.LeftKeyChange:
		key := c.Left.PK
		if c.Kind == join.LeftKeyChange {
			key = c.OldKey
		}
		k, err := join.EncodeKey(s.spec.PK, key)
		_, ok := s.Left[k]
		return ok, err
	case join.RightUpsert, join.RightKeyChange:
		key := c.Right.Key
		if c.Kind == join.RightKeyChange {
			key = c.OldKey
		}
		k, err := join.EncodeKey(s.spec.RightKey, key)
		_, ok := s.Right[k]
		return ok, err
	}
	return true, nil
}
