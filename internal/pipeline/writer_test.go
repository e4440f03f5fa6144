package pipeline

import (
	"context"
	"errors"
	"testing"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/sink"
)

// orderTx is a TargetTx that records the outputs it applies, in order,
// and fails the failAt-th (1-based; 0: never).
type orderTx struct {
	applied []int
	failAt  int
}

func (tx *orderTx) Apply(_ context.Context, _ *sink.Table, out join.Output) error {
	if len(tx.applied)+1 == tx.failAt {
		return errors.New("injected apply failure")
	}
	tx.applied = append(tx.applied, len(out.Deletes))
	return nil
}
func (tx *orderTx) Exec(context.Context, string, ...any) error    { return nil }
func (tx *orderTx) Commit(context.Context, string, wal.LSN) error { return nil }
func (tx *orderTx) Rollback(context.Context) error                { return nil }
func (tx *orderTx) Counts(*sink.Table) sink.Stats                 { return sink.Stats{} }

// outputOf is an output told apart by its number of deletes.
func outputOf(n int) join.Output { return join.Output{Deletes: make([][]join.Value, n)} }

// TestAsyncWriter: outputs are applied in the order sent; after a failure
// send refuses more (errWriterFailed) and close returns the failure, with
// nothing applied after it.
func TestAsyncWriter(t *testing.T) {
	ctx := context.Background()
	tx := &orderTx{}
	w := startWriter(ctx, tx)
	for i := 1; i <= 20; i++ {
		if err := w.send(ctx, nil, outputOf(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	for i, n := range tx.applied {
		if n != i+1 {
			t.Fatalf("applied %v, want 1..20 in order", tx.applied)
		}
	}
	if len(tx.applied) != 20 {
		t.Fatalf("applied %d outputs, want 20", len(tx.applied))
	}

	tx = &orderTx{failAt: 3}
	w = startWriter(ctx, tx)
	var sendErr error
	for i := 1; i <= 50 && sendErr == nil; i++ {
		sendErr = w.send(ctx, nil, outputOf(i))
	}
	err := w.close()
	if err == nil || err.Error() != "injected apply failure" {
		t.Fatalf("close = %v, want the injected failure", err)
	}
	if !errors.Is(sendErr, errWriterFailed) {
		t.Fatalf("send after the failure = %v, want errWriterFailed", sendErr)
	}
	if len(tx.applied) != 2 {
		t.Fatalf("applied %v after a failure at the third, want the first two only", tx.applied)
	}
}
