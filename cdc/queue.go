package cdc

import (
	"context"
	"sync"
	"time"
)

// queue is the bounded hand-over between the stream and its consumer,
// bounded by the changes and bytes of the chunks it holds (not their
// number: a transaction of one change and a chunk of ten thousand are not
// the same load). Unlike a channel it keeps exact accounts: a chunk counts
// from the moment the stream offers it until the consumer takes it.
type queue struct {
	mu    sync.Mutex
	items []*Txn
	// limCh and limB bound the queued chunks' changes and bytes; a chunk
	// that does not fit is still queued when the queue is empty.
	limCh, limB int64
	// queuedCh and queuedB are the queued chunks' changes and bytes.
	queuedCh, queuedB int64
	offered           *Txn // a chunk waiting for room
	changes           int64
	bytes             int64
	maxCh             int64
	maxB              int64
	ready             chan struct{} // signalled when an item was added
	room              chan struct{} // signalled when an item was taken
}

func newQueue(changes, bytes int64) *queue {
	return &queue{limCh: changes, limB: bytes, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// push adds t, waiting for room; while it waits it calls tick every interval
// and gives up on tick's error or when ctx is done, leaving t out. One
// goroutine pushes.
func (q *queue) push(ctx context.Context, t *Txn, interval time.Duration, tick func(time.Time) error) error {
	q.mu.Lock()
	q.changes += int64(len(t.Changes))
	q.bytes += int64(t.Bytes)
	q.maxCh, q.maxB = max(q.maxCh, q.changes), max(q.maxB, q.bytes)
	q.offered = t
	q.mu.Unlock()
	var ticker *time.Ticker
	for {
		if q.tryAdd() {
			return nil
		}
		if ticker == nil {
			ticker = time.NewTicker(interval)
			defer ticker.Stop()
		}
		var err error
		select {
		case <-q.room:
		case now := <-ticker.C:
			err = tick(now)
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			q.withdraw()
			return err
		}
	}
}

func (q *queue) tryAdd() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.offered
	ch, b := int64(len(t.Changes)), int64(t.Bytes)
	if len(q.items) > 0 && (q.queuedCh+ch > q.limCh || q.queuedB+b > q.limB) {
		return false
	}
	q.items = append(q.items, t)
	q.queuedCh, q.queuedB = q.queuedCh+ch, q.queuedB+b
	q.offered = nil
	signal(q.ready)
	return true
}

func (q *queue) withdraw() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t := q.offered; t != nil {
		q.changes -= int64(len(t.Changes))
		q.bytes -= int64(t.Bytes)
		q.offered = nil
	}
}

// tryTake removes the oldest item.
func (q *queue) tryTake() (*Txn, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil, false
	}
	t := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	q.changes -= int64(len(t.Changes))
	q.bytes -= int64(t.Bytes)
	q.queuedCh -= int64(len(t.Changes))
	q.queuedB -= int64(t.Bytes)
	signal(q.room)
	if len(q.items) > 0 {
		signal(q.ready) // for another waiting consumer
	}
	return t, true
}

// take waits for the oldest item; done (closed) ends the wait with ok false
// once the queue is empty.
func (q *queue) take(ctx context.Context, done <-chan struct{}) (*Txn, bool, error) {
	for {
		if t, ok := q.tryTake(); ok {
			return t, true, nil
		}
		select {
		case <-q.ready:
		case <-done:
			t, ok := q.tryTake()
			return t, ok, nil
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
}

// stats returns the buffered and maximum changes and bytes.
func (q *queue) stats() (changes, bytes, maxChanges, maxBytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.changes, q.bytes, q.maxCh, q.maxB
}
