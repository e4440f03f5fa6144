package join

import (
	"context"
	"errors"
	"fmt"
)

// InstructionKind is what the sender asks of the subscription side. The
// propagate kinds carry the join type explicitly, like Kafka Streams'
// SubscriptionWrapper.Instruction: whether a missing right row still yields
// a joined row.
type InstructionKind uint8

// The instruction kinds.
const (
	// DeleteKeyAndPropagate: the left row was deleted; remove its
	// subscription (if it had one) and propagate the delete of its joined row.
	DeleteKeyAndPropagate InstructionKind = iota + 1
	// DeleteKeyNoPropagate: the left row moved to another foreign key; remove
	// the old subscription without output (the new subscription answers).
	DeleteKeyNoPropagate
	// PropagateNullIfNoRight (left join): subscribe or refresh, and answer;
	// a missing right row yields the left row with NULL right columns.
	PropagateNullIfNoRight
	// PropagateOnlyIfRight (inner join): subscribe or refresh, and answer;
	// a missing right row yields no joined row.
	PropagateOnlyIfRight
)

var instructionNames = [...]string{"", "delete_key_and_propagate", "delete_key_no_propagate",
	"propagate_null_if_no_right", "propagate_only_if_right"}

// String returns the kind's snake_case name.
func (k InstructionKind) String() string {
	if k != 0 && int(k) < len(instructionNames) {
		return instructionNames[k]
	}
	return fmt.Sprintf("instruction(%d)", uint8(k))
}

// propagateKind returns the propagate instruction of a join type.
func propagateKind(t JoinType) InstructionKind {
	if t == Left {
		return PropagateNullIfNoRight
	}
	return PropagateOnlyIfRight
}

// Instruction is one message from the sender to the subscription side.
type Instruction struct {
	Kind InstructionKind
	// PK is the encoded left key.
	PK Key
	// FK is the encoded foreign key the instruction is about; "" for a NULL
	// foreign key, which has no subscription and never matches.
	FK Key
	// Hash is the value hash of the new left row (0 for deletes): the
	// resolver discards the answer if the row has changed since.
	Hash uint64
}

// ErrNoToastState reports an unchanged-TOAST value for a row fkmat has no
// state of: the state is incomplete and must be rebuilt.
var ErrNoToastState = errors.New("unchanged TOAST value for a row without stored state; rebuild the state with fkmat backfill --force")

// send returns the instructions for a left row going from old to cur (nil =
// absent), appended to dst. It is the sender's decision table.
func send(prop InstructionKind, pk Key, old, cur *leftEntry, dst []Instruction) []Instruction {
	if cur == nil {
		if old == nil {
			return dst
		}
		return append(dst, Instruction{Kind: DeleteKeyAndPropagate, PK: pk, FK: old.fk})
	}
	if old != nil && old.fk != "" && old.fk != cur.fk {
		dst = append(dst, Instruction{Kind: DeleteKeyNoPropagate, PK: pk, FK: old.fk})
	}
	// Same FK: a refresh; new FK: a subscription; NULL FK: an answer with no
	// right row. All three are one propagate instruction.
	return append(dst, Instruction{Kind: prop, PK: pk, FK: cur.fk, Hash: cur.Hash})
}

// newLeft returns the state of row after filling its unchanged-TOAST values
// from old, and whether it differs from old at all.
func newLeft(spec *Spec, entries *slab[leftEntry], old *leftEntry, row LeftRow) (*leftEntry, bool, error) {
	fk, err := fillToast(row.FK, old, func(e *leftEntry) []Value { return e.FK })
	if err != nil {
		return nil, false, fmt.Errorf("fill foreign key: %w", err)
	}
	values, err := fillToast(row.Values, old, func(e *leftEntry) []Value { return e.Values })
	if err != nil {
		return nil, false, fmt.Errorf("fill left values: %w", err)
	}
	if old != nil && ValuesEqual(old.FK, fk) && ValuesEqual(old.Values, values) && ValuesEqual(old.PK, row.PK) {
		return old, false, nil
	}
	e := entries.new()
	e.LeftState = NewLeftState(row.PK, fk, values)
	if !hasNull(fk) {
		if e.fk, err = EncodeKey(spec.FK, fk); err != nil {
			return nil, false, fmt.Errorf("encode foreign key: %w", err)
		}
	}
	return e, true, nil
}

// fillToast returns vals with Toast markers replaced by the values of the
// same position in old (picked by get); vals itself when it has none.
func fillToast[S any](vals []Value, old *S, get func(*S) []Value) ([]Value, error) {
	if !hasToast(vals) {
		return vals, nil
	}
	if old == nil {
		return nil, ErrNoToastState
	}
	prev := get(old)
	out := make([]Value, len(vals))
	for i, v := range vals {
		if v.Toast {
			v = prev[i]
		}
		out[i] = v
	}
	return out, nil
}

// leftUpsert runs the sender for a new version of left row pk and hands its
// instructions to the subscription side.
func (b *batch) leftUpsert(ctx context.Context, pk Key, row LeftRow) error {
	old, err := b.ov.leftOf(ctx, pk)
	if err != nil {
		return err
	}
	cur, changed, err := newLeft(&b.e.spec, &b.e.entries, old, row)
	if old == nil && b.e.spec.LeftPartitioned && errors.Is(err, ErrNoToastState) {
		b.e.stats.AbsentToastSkips++
		return nil // its partition's move writes it whole
	}
	if err != nil || !changed {
		return err
	}
	if cur.fk == "" && b.e.spec.Type == Inner {
		b.e.stats.InnerNullFKDrops++
	}
	return b.sendChange(ctx, pk, old, cur)
}

// leftKeyChange runs the sender for left row old moving to key pk: the old
// key is deleted and the new one upserted with the old row's values in place
// of the new row's unchanged-TOAST markers. The two keys are equal only when
// the key's text form changed without its value (a key of another family
// member): then it is an upsert.
func (b *batch) leftKeyChange(ctx context.Context, old, pk Key, row LeftRow) error {
	if old == pk {
		return b.leftUpsert(ctx, pk, row)
	}
	prev, err := b.ov.leftOf(ctx, old)
	if err != nil {
		return err
	}
	if prev == nil && b.e.spec.LeftPartitioned && (hasToast(row.FK) || hasToast(row.Values)) {
		b.e.stats.AbsentToastSkips++
		return nil // its partition's move writes it whole
	}
	if row.FK, err = fillToast(row.FK, prev, func(e *leftEntry) []Value { return e.FK }); err != nil {
		return fmt.Errorf("fill foreign key from the old key's row: %w", err)
	}
	if row.Values, err = fillToast(row.Values, prev, func(e *leftEntry) []Value { return e.Values }); err != nil {
		return fmt.Errorf("fill left values from the old key's row: %w", err)
	}
	if err := b.leftDelete(ctx, old); err != nil {
		return err
	}
	return b.leftUpsert(ctx, pk, row)
}

// leftDelete runs the sender for the deletion of left row pk.
func (b *batch) leftDelete(ctx context.Context, pk Key) error {
	old, err := b.ov.leftOf(ctx, pk)
	if err != nil || old == nil {
		return err
	}
	return b.sendChange(ctx, pk, old, nil)
}

// sendChange records the change of left row pk from old to cur and passes
// its instructions to the subscription side.
func (b *batch) sendChange(ctx context.Context, pk Key, old, cur *leftEntry) error {
	if err := b.touchLeft(ctx, pk, old, cur); err != nil {
		return err
	}
	b.ov.left[pk] = cur
	b.instrs = send(b.prop, pk, old, cur, b.instrs[:0])
	for _, ins := range b.instrs {
		b.e.stats.Instructions++
		if err := b.receive(ctx, ins); err != nil {
			return err
		}
	}
	return nil
}
