package jointest

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/fkmat/fkmat/join"
)

// Generator produces random, valid change sequences for a join and keeps the
// Source model up to date with them. The same seed gives the same sequence.
type Generator struct {
	r    *rand.Rand
	spec join.Spec
	// Src holds the source tables after the changes generated so far.
	Src *Source
	// TruncateOneIn makes about one change in TruncateOneIn a TRUNCATE of a
	// random side; 0 disables truncates.
	TruncateOneIn int

	leftKeys, rightKeys [][]join.Value
}

// valuePool holds the projected values drawn from: NULL, the empty string and
// few others, so that no-op updates and equal values are frequent.
var valuePool = []join.Value{join.NullValue(), join.TextValue(""), join.TextValue("x"),
	join.TextValue("y"), join.TextValue("\x00")}

// NewGenerator returns a generator with nLeft left keys and nRight right keys
// in its key domains.
func NewGenerator(spec join.Spec, seed uint64, nLeft, nRight int) *Generator {
	g := &Generator{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), spec: spec, Src: NewSource(spec)}
	g.leftKeys = g.domain(spec.PK, nLeft)
	g.rightKeys = g.domain(spec.RightKey, nRight)
	return g
}

// domain returns n distinct key tuples of the families.
func (g *Generator) domain(fams []join.Family, n int) [][]join.Value {
	seen := map[join.Key]bool{}
	var keys [][]join.Value
	for len(keys) < n {
		tuple := make([]join.Value, len(fams))
		for i, f := range fams {
			tuple[i] = g.keyValue(f)
		}
		k, err := join.EncodeKey(fams, tuple)
		if err != nil || seen[k] {
			continue
		}
		seen[k] = true
		keys = append(keys, tuple)
	}
	return keys
}

// textKeys are the text key values: prefixes of each other and NUL bytes.
var textKeys = []string{"", "1", "10", "1\x00", "1\x00\x00", "a", "a b", "\xff", "b"}

// keyValue returns a random non-NULL key value of family f.
func (g *Generator) keyValue(f join.Family) join.Value {
	switch f {
	case join.FamilyInt:
		return join.TextValue(strconv.Itoa(g.r.IntN(300) - 50))
	case join.FamilyUUID:
		return join.TextValue(fmt.Sprintf("00000000-0000-4000-8000-%012x", g.r.IntN(1000)))
	case join.FamilyNumeric:
		return join.TextValue(strconv.Itoa(g.r.IntN(100)) + "." + strconv.Itoa(g.r.IntN(10)+1))
	}
	return join.TextValue(textKeys[g.r.IntN(len(textKeys))] + textKeys[g.r.IntN(len(textKeys))])
}

// Batch returns n random changes, already applied to Src.
func (g *Generator) Batch(n int) []join.Change {
	changes := make([]join.Change, 0, n)
	for range n {
		c := g.change()
		if err := g.Src.Apply(c); err != nil {
			panic(fmt.Sprintf("jointest: generated an invalid change: %v", err))
		}
		changes = append(changes, c)
	}
	return changes
}

// change returns one random change.
func (g *Generator) change() join.Change {
	if g.TruncateOneIn > 0 && g.r.IntN(g.TruncateOneIn) == 0 {
		if g.r.IntN(2) == 0 {
			return join.Change{Kind: join.LeftTruncate}
		}
		return join.Change{Kind: join.RightTruncate}
	}
	switch p := g.r.IntN(100); {
	case p < 44:
		return g.leftUpsert()
	case p < 50:
		if c, ok := g.leftKeyChange(); ok {
			return c
		}
		return g.leftUpsert()
	case p < 62:
		pk, _ := g.pickLeft()
		return join.Change{Kind: join.LeftDelete, Left: join.LeftRow{PK: pk}}
	case p < 85:
		return g.rightUpsert()
	case p < 90:
		if c, ok := g.rightKeyChange(); ok {
			return c
		}
		return g.rightUpsert()
	default:
		key, _ := g.pickRight()
		return join.Change{Kind: join.RightDelete, Right: join.RightRow{Key: key}}
	}
}

// pickLeft returns a left key, preferring existing rows, and its row.
func (g *Generator) pickLeft() ([]join.Value, *join.LeftRow) {
	var pk []join.Value
	for range 3 {
		pk = g.leftKeys[g.r.IntN(len(g.leftKeys))]
		k, _ := join.EncodeKey(g.spec.PK, pk)
		if row, ok := g.Src.Left[k]; ok {
			return pk, &row
		}
	}
	return pk, nil
}

// pickRight returns a right key, hot key first, preferring existing rows.
func (g *Generator) pickRight() ([]join.Value, *join.RightRow) {
	var key []join.Value
	for range 2 {
		key = g.rightKey()
		k, _ := join.EncodeKey(g.spec.RightKey, key)
		if row, ok := g.Src.Right[k]; ok {
			return key, &row
		}
	}
	return key, nil
}

// rightKey returns a random right key; the first one is hot.
func (g *Generator) rightKey() []join.Value {
	if g.r.IntN(3) == 0 {
		return g.rightKeys[0]
	}
	return g.rightKeys[g.r.IntN(len(g.rightKeys))]
}

// foreignKey returns a random foreign key: a right key, sometimes wholly or
// partly NULL.
func (g *Generator) foreignKey() []join.Value {
	fk := slices.Clone(g.rightKey())
	switch g.r.IntN(10) {
	case 0:
		for i := range fk {
			fk[i] = join.NullValue()
		}
	case 1:
		fk[g.r.IntN(len(fk))] = join.NullValue()
	}
	return fk
}

func (g *Generator) values(n int) []join.Value {
	vs := make([]join.Value, n)
	for i := range vs {
		vs[i] = valuePool[g.r.IntN(len(valuePool))]
	}
	return vs
}

// leftUpsert returns an insert or an update: a no-op, a refresh with the same
// foreign key, a move to another key, or a new row, with TOAST markers for
// some unchanged values.
func (g *Generator) leftUpsert() join.Change {
	pk, old := g.pickLeft()
	row := join.LeftRow{PK: pk, FK: g.foreignKey(), Values: g.values(g.spec.LeftValues)}
	if old != nil {
		switch g.r.IntN(4) {
		case 0:
			row.FK, row.Values = old.FK, old.Values
		case 1:
			row.FK = old.FK
		case 2:
			row.Values = old.Values
		}
		row.FK = g.toast(row.FK, old.FK)
		row.Values = g.toast(row.Values, old.Values)
	}
	c := join.Change{Kind: join.LeftUpsert, Left: row, Insert: g.insert(old == nil)}
	return g.ifPresent(c, old == nil)
}

// ifPresent marks some updates IfPresent (a filtered table's row whose
// filter inputs did not change): of a present row, applied as any; of an
// absent one, with an unchanged-TOAST marker the engine must not try to
// fill: nothing.
func (g *Generator) ifPresent(c join.Change, absent bool) join.Change {
	if c.Insert || g.r.IntN(6) != 0 {
		return c
	}
	c.IfPresent = true
	vals := &c.Left.Values
	if c.Kind == join.RightUpsert || c.Kind == join.RightKeyChange {
		vals = &c.Right.Values
	}
	if absent && len(*vals) > 0 {
		*vals = slices.Clone(*vals)
		(*vals)[0] = join.ToastValue()
	}
	return c
}

// insert returns whether an upsert of a row that exists (or not) is marked
// as an insert: never for an existing row (pgoutput sends an UPDATE), and
// for a new one three times in four, so that the engine meets new rows
// with and without the hint.
func (g *Generator) insert(isNew bool) bool { return isNew && g.r.IntN(4) != 0 }

// freeKey returns a key of the domain that rows does not hold.
func freeKey[R any](g *Generator, fams []join.Family, domain [][]join.Value, rows map[join.Key]R) ([]join.Value, bool) {
	for range 5 {
		key := domain[g.r.IntN(len(domain))]
		k, _ := join.EncodeKey(fams, key)
		if _, taken := rows[k]; !taken {
			return key, true
		}
	}
	return nil, false
}

// leftKeyChange returns an UPDATE moving an existing left row to a free key,
// sometimes with its foreign key or values changed too, and with TOAST
// markers for some unchanged values: they must come from the old key's row.
func (g *Generator) leftKeyChange() (join.Change, bool) {
	old, oldRow := g.pickLeft()
	pk, free := freeKey(g, g.spec.PK, g.leftKeys, g.Src.Left)
	if oldRow == nil || !free {
		return join.Change{}, false
	}
	row := join.LeftRow{PK: pk, FK: oldRow.FK, Values: oldRow.Values}
	if g.r.IntN(3) == 0 {
		row.FK = g.foreignKey()
	}
	if g.r.IntN(3) == 0 {
		row.Values = g.values(g.spec.LeftValues)
	}
	row.FK = g.toast(row.FK, oldRow.FK)
	row.Values = g.toast(row.Values, oldRow.Values)
	c := join.Change{Kind: join.LeftKeyChange, Left: row, OldKey: old}
	return g.ifPresent(c, false), true
}

// rightKeyChange returns an UPDATE moving an existing right row to a free
// key, its unchanged values sometimes TOAST markers.
func (g *Generator) rightKeyChange() (join.Change, bool) {
	old, oldRow := g.pickRight()
	key, free := freeKey(g, g.spec.RightKey, g.rightKeys, g.Src.Right)
	if oldRow == nil || !free {
		return join.Change{}, false
	}
	row := join.RightRow{Key: key, Values: oldRow.Values}
	if g.r.IntN(3) == 0 {
		row.Values = g.values(g.spec.RightValues)
	}
	row.Values = g.toast(row.Values, oldRow.Values)
	c := join.Change{Kind: join.RightKeyChange, Right: row, OldKey: old}
	return g.ifPresent(c, false), true
}

// rightUpsert returns an insert or an update of a right row.
func (g *Generator) rightUpsert() join.Change {
	key, old := g.pickRight()
	row := join.RightRow{Key: key, Values: g.values(g.spec.RightValues)}
	if old != nil {
		if g.r.IntN(4) == 0 {
			row.Values = old.Values
		}
		row.Values = g.toast(row.Values, old.Values)
	}
	c := join.Change{Kind: join.RightUpsert, Right: row, Insert: g.insert(old == nil)}
	return g.ifPresent(c, old == nil)
}

// toast replaces some values equal to the old ones by Toast markers.
func (g *Generator) toast(vals, old []join.Value) []join.Value {
	out := slices.Clone(vals)
	for i := range out {
		if out[i].Equal(old[i]) && g.r.IntN(4) == 0 {
			out[i] = join.ToastValue()
		}
	}
	return out
}

// CheckState verifies through r that the stored state matches Src: every
// left and right row of the key domains, and the dependents of every right key.
func (g *Generator) CheckState(ctx context.Context, r join.StateReader, pageSize int) error {
	lk := g.encodeAll(g.spec.PK, g.leftKeys)
	left, err := r.GetLeft(ctx, lk)
	if err != nil {
		return err
	}
	deps := map[join.Key][]join.Key{}
	for _, k := range lk {
		src, inSrc := g.Src.Left[k]
		st, inStore := left[k]
		if inSrc != inStore || (inSrc && !st.Equal(join.NewLeftState(src.PK, src.FK, src.Values))) {
			return fmt.Errorf("left row %v: stored %v (%v), source %v (%v)", src.PK, inStore, st, inSrc, src)
		}
		if fk, err := join.EncodeKey(g.spec.FK, src.FK); inSrc && err == nil {
			deps[fk] = append(deps[fk], k)
		}
	}
	if err := g.checkRight(ctx, r); err != nil {
		return err
	}
	for _, fk := range slices.Sorted(maps.Keys(deps)) {
		got, err := allDependents(ctx, r, fk, pageSize)
		if err != nil {
			return err
		}
		if want := slices.Sorted(slices.Values(deps[fk])); !slices.Equal(got, want) {
			return fmt.Errorf("dependents of %x: got %x, want %x", fk, got, want)
		}
	}
	return nil
}

func (g *Generator) checkRight(ctx context.Context, r join.StateReader) error {
	rk := g.encodeAll(g.spec.RightKey, g.rightKeys)
	right, err := r.GetRight(ctx, rk)
	if err != nil {
		return err
	}
	for _, k := range rk {
		src, inSrc := g.Src.Right[k]
		st, inStore := right[k]
		if inSrc != inStore || (inSrc && !join.ValuesEqual(st.Values, src.Values)) {
			return fmt.Errorf("right row %v: stored %v (%v), source %v (%v)", src.Key, inStore, st, inSrc, src)
		}
	}
	return nil
}

func (g *Generator) encodeAll(fams []join.Family, tuples [][]join.Value) []join.Key {
	keys := make([]join.Key, len(tuples))
	for i, t := range tuples {
		keys[i], _ = join.EncodeKey(fams, t)
	}
	return keys
}

// allDependents pages through every dependent of fk.
func allDependents(ctx context.Context, r join.StateReader, fk join.Key, pageSize int) ([]join.Key, error) {
	var all []join.Key
	var after join.Key
	for {
		page, err := r.Dependents(ctx, fk, after, pageSize)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < pageSize {
			return all, nil
		}
		after = page[len(page)-1]
	}
}
