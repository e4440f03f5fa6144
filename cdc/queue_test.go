package cdc

import (
	"context"
	"errors"
	"testing"
	"time"
)

// txnOf is a chunk with n changes and b bytes.
func txnOf(n, b int) *Txn { return &Txn{Changes: make([]Change, n), Bytes: b} }

// pushSoon pushes t and reports whether it was queued within a short wait
// (the wait gives up with the tick error).
func pushSoon(t *testing.T, q *queue, txn *Txn) bool {
	t.Helper()
	errWait := errors.New("no room")
	ticks := 0
	err := q.push(context.Background(), txn, 5*time.Millisecond, func(time.Time) error {
		if ticks++; ticks > 2 {
			return errWait
		}
		return nil
	})
	if err != nil && !errors.Is(err, errWait) {
		t.Fatal(err)
	}
	return err == nil
}

// TestQueueBoundedByChangesAndBytes: the queue holds chunks up to its
// change and byte limits whatever their number, admits a chunk larger than
// the limits only when empty, hands them over in order, and a chunk that
// did not get in counts nowhere.
func TestQueueBoundedByChangesAndBytes(t *testing.T) {
	q := newQueue(100, 1000)
	// Many small transactions fit: 100 of one change each.
	for i := range 100 {
		if !pushSoon(t, q, txnOf(1, 10)) {
			t.Fatalf("transaction %d of 1 change refused with %d queued", i, i)
		}
	}
	if pushSoon(t, q, txnOf(1, 10)) {
		t.Fatal("a 101st change was queued past the limit of 100")
	}
	if ch, b, _, _ := q.stats(); ch != 100 || b != 1000 {
		t.Fatalf("buffered %d changes, %d bytes after a refused push; want 100, 1000", ch, b)
	}
	for range 100 {
		if _, ok := q.tryTake(); !ok {
			t.Fatal("queue emptied early")
		}
	}
	// Bytes bound too.
	if !pushSoon(t, q, txnOf(1, 600)) || pushSoon(t, q, txnOf(1, 600)) {
		t.Fatal("the byte limit of 1000 did not admit 600 and refuse 600 more")
	}
	q.tryTake()
	// A chunk over both limits gets in when the queue is empty, not after.
	big := txnOf(500, 5000)
	if !pushSoon(t, q, big) {
		t.Fatal("an oversized chunk was refused by an empty queue")
	}
	if pushSoon(t, q, txnOf(1, 1)) {
		t.Fatal("a chunk was queued behind an oversized one")
	}
	second := txnOf(2, 2)
	go func() {
		time.Sleep(20 * time.Millisecond)
		if got, ok := q.tryTake(); !ok || got != big {
			t.Error("the oversized chunk did not come out first")
		}
	}()
	if err := q.push(context.Background(), second, time.Second, func(time.Time) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got, ok := q.tryTake(); !ok || got != second {
		t.Fatal("the chunk pushed once room was made did not come out")
	}
	// The buffered counts include the chunk waiting for room: at most the
	// oversized chunk plus the second one.
	if ch, b, maxCh, _ := q.stats(); ch != 0 || b != 0 || maxCh != 502 {
		t.Fatalf("stats %d changes, %d bytes, max %d; want 0, 0, 502", ch, b, maxCh)
	}
}
