package jointest

import (
	"fmt"
	"maps"
	"slices"

	"github.com/fkmat/fkmat/join"
)

// Target is an in-memory target table. Its Apply is strict: an upsert equal
// to the existing row, a delete of an absent row, or a second write of one
// row in one batch segment is an error (no redundant writes).
type Target struct {
	spec    join.Spec
	Rows    map[join.Key]join.Row
	written map[join.Key]bool
	// Rewrites lets a batch write a row more than once: a Tree emits a
	// batch's outputs change by change, each net for its change.
	Rewrites bool
}

// NewTarget returns an empty target for spec.
func NewTarget(spec join.Spec) *Target {
	return &Target{spec: spec, Rows: map[join.Key]join.Row{}, written: map[join.Key]bool{}}
}

// Begin starts a new batch.
func (t *Target) Begin() { t.written = map[join.Key]bool{} }

// Apply applies one output of a batch.
func (t *Target) Apply(o join.Output) error {
	if o.Truncate {
		t.Rows = map[join.Key]join.Row{}
		t.Begin()
	}
	if o.NullRight {
		for k, row := range t.Rows {
			row = slices.Clone(row)
			for i := len(row) - t.spec.RightValues; i < len(row); i++ {
				row[i] = join.NullValue()
			}
			t.Rows[k] = row
		}
		t.Begin()
	}
	for i, c := range o.NullColumns { // a Tree's TRUNCATE of an entry's table
		v := join.NullValue()
		if o.NullValues != nil {
			v = o.NullValues[i]
		}
		for k, row := range t.Rows {
			row = slices.Clone(row)
			row[c] = v
			t.Rows[k] = row
		}
	}
	for _, pk := range o.Deletes {
		k, err := t.write(pk)
		if err != nil {
			return err
		}
		if _, ok := t.Rows[k]; !ok {
			return fmt.Errorf("delete of absent row %v", pk)
		}
		delete(t.Rows, k)
	}
	for _, row := range o.Upserts {
		if err := t.upsert(row); err != nil {
			return err
		}
	}
	// A Tree's column updates: rows that are absent, or whose columns
	// have the values already, are left alone (the target's statement
	// writes only rows that differ).
	for _, cu := range o.ColumnUpdates {
		if len(cu.Columns) != len(cu.Values) {
			return fmt.Errorf("column update of %d columns with %d values", len(cu.Columns), len(cu.Values))
		}
		for _, pk := range cu.Keys {
			k, err := join.EncodeKey(t.spec.PK, pk)
			if err != nil {
				return fmt.Errorf("encode target key: %w", err)
			}
			old, ok := t.Rows[k]
			if !ok {
				continue
			}
			row := slices.Clone(old)
			for i, c := range cu.Columns {
				row[c] = cu.Values[i]
			}
			t.Rows[k] = row
		}
	}
	for _, u := range o.RightUpdates {
		if len(u.Right) != t.spec.RightValues {
			return fmt.Errorf("right update with %d values", len(u.Right))
		}
		for _, pk := range u.Keys {
			k, err := t.write(pk)
			if err != nil {
				return err
			}
			old, ok := t.Rows[k]
			if !ok {
				return fmt.Errorf("right update of absent row %v", pk)
			}
			row := append(slices.Clone(old[:len(old)-t.spec.RightValues]), u.Right...)
			if join.ValuesEqual(old, row) {
				return fmt.Errorf("redundant right update of unchanged row %v", row)
			}
			t.Rows[k] = row
		}
	}
	return nil
}

func (t *Target) upsert(row join.Row) error {
	if len(row) != len(t.spec.PK)+t.spec.LeftValues+t.spec.RightValues {
		return fmt.Errorf("upsert of a row with %d columns", len(row))
	}
	for _, v := range row {
		if v.Toast {
			return fmt.Errorf("upsert of a row with a TOAST marker: %v", row)
		}
	}
	k, err := t.write(row[:len(t.spec.PK)])
	if err != nil {
		return err
	}
	if old, ok := t.Rows[k]; ok && join.ValuesEqual(old, row) {
		return fmt.Errorf("redundant upsert of unchanged row %v", row)
	}
	// A copy, as a database keeps: the engine reuses the memory of a
	// batch's rows once its outputs are written.
	t.Rows[k] = slices.Clone(row)
	return nil
}

// write records a write of the row with key pk and returns its key.
func (t *Target) write(pk []join.Value) (join.Key, error) {
	k, err := join.EncodeKey(t.spec.PK, pk)
	if err != nil {
		return "", fmt.Errorf("encode target key: %w", err)
	}
	if t.written[k] && !t.Rewrites {
		return "", fmt.Errorf("row %v written twice in one batch", pk)
	}
	t.written[k] = true
	return k, nil
}

// Diff returns an error describing how the target differs from want.
func (t *Target) Diff(want map[join.Key]join.Row) error {
	var missing, extra, differ int
	var example string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		got, ok := t.Rows[k]
		switch {
		case !ok:
			missing++
			example = fmt.Sprintf("missing %v", want[k])
		case !join.ValuesEqual(got, want[k]):
			differ++
			example = fmt.Sprintf("got %v, want %v", got, want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(t.Rows)) {
		if _, ok := want[k]; !ok {
			extra++
			example = fmt.Sprintf("extra %v", t.Rows[k])
		}
	}
	if missing+extra+differ == 0 {
		return nil
	}
	return fmt.Errorf("target differs from the join: %d missing, %d extra, %d different; e.g. %s",
		missing, extra, differ, example)
}
