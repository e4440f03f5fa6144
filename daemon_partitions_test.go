package fkmat

import (
	"context"
	"sync"
	"testing"

	"github.com/fkmat/fkmat/internal/wal"
)

// TestFollowMovesWaitsForTheLastChange: a partitioned table's changes are
// followed together, so the move waits until the pipeline has applied
// everything committed before the last of them, not the first. A fault run
// found the first: a partition dropped (seen), then a transaction filling
// another partition, then that partition detached, emptied in part and
// attached back; the move ran with the transaction not applied yet, which
// then brought back the rows the detached partition had lost.
func TestFollowMovesWaitsForTheLastChange(t *testing.T) {
	const orders = "public.orders"
	node, before, after := uint32(7), "100", "205"
	leaves := func(attached *string) map[uint32]leaf {
		return map[uint32]leaf{
			1: {oid: 1, parent: orders, relfilenode: &node, attached: &before},
			2: {oid: 2, parent: orders, relfilenode: &node, attached: attached},
		}
	}
	var applied wal.LSN
	w := &partitionWatcher{switching: &sync.Mutex{}, applied: func() wal.LSN { return applied }}
	moves := map[string]*pendingMove{orders: {unbounded: true}}
	follow := func(seenAt wal.LSN, l map[uint32]leaf) bool {
		t.Helper()
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("followed the change seen at %s with the pipeline at %s: %v", seenAt, applied, r)
			}
		}()
		done, err := w.followMoves(context.Background(), moves, catalogRead{after: seenAt, leaves: l})
		if err != nil {
			t.Fatal(err)
		}
		return done
	}

	// The first change, seen at 100: not followed before it is applied.
	if follow(100, leaves(&before)) {
		t.Fatal("followed a change the pipeline has not applied")
	}
	// Partition 2 attached again (a new pg_inherits row), seen at 200,
	// with the pipeline between the two.
	applied = 150
	if follow(200, leaves(&after)) {
		t.Fatal("followed a change the pipeline has not applied")
	}
	if got := w.moves[orders].at; got != 200 {
		t.Fatalf("the move waits for %s, want 200 (the last change)", got)
	}
	// Seen again unchanged: the wait does not move on with every read.
	w.switching.Lock() // no move is written: this test has no database
	defer w.switching.Unlock()
	applied = 250
	follow(300, leaves(&after))
	if got := w.moves[orders].at; got != 200 {
		t.Fatalf("the move waits for %s after an unchanged read, want 200", got)
	}
	// A read that does not call for the table's move (a partition
	// truncated on its own is judged anew every other read) keeps its
	// position: with writes going on, a wait that started over at every
	// such read would never end (TestPartitionDDLFollowed/truncate).
	delete(moves, orders)
	moves["public.customers"] = &pendingMove{unbounded: true}
	follow(400, leaves(&after))
	moves = map[string]*pendingMove{orders: {unbounded: true}}
	follow(500, leaves(&after))
	if got := w.moves[orders].at; got != 200 {
		t.Fatalf("the move waits for %s after a read without it, want 200", got)
	}
}
