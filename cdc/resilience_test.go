package cdc

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/internal/wal"
)

// TestStreamLargeTransactionBounded commits one 200k-row transaction (about
// 100 MB of row data) and consumes it slowly, with one stall longer than the
// server's wal_sender_timeout: it arrives in bounded chunks of one
// transaction, neither the stream's buffer nor the heap grows with the
// transaction, and the connection survives the stall.
func TestStreamLargeTransactionBounded(t *testing.T) {
	const (
		rows         = 200_000
		chunkChanges = 1000
		chunkBytes   = 1 << 20
		queue        = 2
	)
	tc, c := setup(t, `CREATE TABLE big (id int PRIMARY KEY, pad text)`, []TableName{{Name: "big"}}, func(c *Config) {
		c.ChunkChanges, c.ChunkBytes, c.QueueChanges, c.QueueBytes = chunkChanges, chunkBytes, queue*chunkChanges, queue*(chunkBytes+2048)
		// A server that drops silent clients after 6 s: the stream must
		// keep the connection alive while the consumer stalls. (At 2 s a
		// loaded CI machine once delayed the 500 ms status updates past
		// it, and the test read a reconnect's replay as a bug.)
		c.ConnString = withParam(t, c.ConnString, "wal_sender_timeout", "6s")
		c.StandbyInterval = 500 * time.Millisecond
	})
	s := startStream(t, c)
	exec(t, tc, fmt.Sprintf(`INSERT INTO big SELECT i, repeat(md5(i::text), 16) FROM generate_series(1, %d) i`, rows))

	// The live heap (what the last GC found reachable) measures what the
	// stream retains; HeapAlloc would also count garbage not yet collected,
	// which grows when a loaded machine starves the collector.
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
	readLive := func() (heap, cycles uint64) {
		metrics.Read(live)
		return live[0].Value.Uint64(), live[1].Value.Uint64()
	}
	var maxHeap atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	runtime.GC()
	baseline, cycles0 := readLive()
	wg.Go(func() {
		for {
			if h, _ := readLive(); h > maxHeap.Load() {
				maxHeap.Store(h)
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})

	want, chunks := 1, 0
	var xid uint32
	stalled := false
	for {
		txn := next(t, s, time.Minute)
		if txn.Chunk == 0 && chunks > 0 && txn.Xid == xid {
			// The connection dropped and the stream sends the transaction
			// again from its start, as Txn says. Within the few chunks
			// after the stall (the queue holds two), it dropped during
			// the stall: the stream did not keep it alive.
			if stalled && chunks <= 15 {
				t.Fatalf("the connection dropped during the consumer's stall (xid %d sent again after %d chunks)", xid, chunks)
			}
			// Later, a loaded machine's: replayed correctly, which the
			// rest of the test checks.
			t.Logf("xid %d sent again from chunk 0 after %d chunks", xid, chunks)
			want, chunks = 1, 0
		}
		if txn.Chunk != chunks || (chunks > 0 && txn.Xid != xid) {
			t.Fatalf("chunk %d of xid %d after %d chunks of xid %d", txn.Chunk, txn.Xid, chunks, xid)
		}
		xid = txn.Xid
		chunks++
		if len(txn.Changes) > chunkChanges || txn.Bytes > chunkBytes+2048 {
			t.Fatalf("chunk of %d changes, %d bytes", len(txn.Changes), txn.Bytes)
		}
		for _, ch := range txn.Changes {
			if got := ch.New[0].String(); got != fmt.Sprint(want) {
				t.Fatalf("row %s, want %d", got, want)
			}
			want++
		}
		time.Sleep(10 * time.Millisecond) // a slow consumer
		if chunks == 10 && !stalled {
			stalled = true
			time.Sleep(10 * time.Second) // a stall longer than wal_sender_timeout
		}
		if txn.Final {
			if txn.EndLSN <= txn.CommitLSN {
				t.Errorf("final chunk end %s, commit %s", txn.EndLSN, txn.CommitLSN)
			}
			s.Ack(txn.EndLSN)
			break
		}
	}
	close(done)
	wg.Wait()
	if want-1 != rows {
		t.Fatalf("got %d rows, want %d", want-1, rows)
	}
	_, cycles1 := readLive()
	st := s.Stats()
	t.Logf("%d chunks; max buffered %d changes, %d bytes; live heap %d MB at start, max %d MB over %d GC cycles",
		chunks, st.MaxBufferedChanges, st.MaxBufferedBytes, baseline>>20, maxHeap.Load()>>20, cycles1-cycles0)
	if cycles1-cycles0 < 3 {
		t.Errorf("only %d GC cycles while streaming: the live heap was not measured", cycles1-cycles0)
	}
	if st.MaxBufferedChanges > (queue+1)*chunkChanges || st.MaxBufferedBytes > (queue+1)*(chunkBytes+2048) {
		t.Errorf("stream buffered up to %d changes, %d bytes; bound is %d chunks", st.MaxBufferedChanges, st.MaxBufferedBytes, queue+1)
	}
	if st.MaxBufferedChanges < queue*chunkChanges {
		t.Errorf("the consumer was never slower than the stream (max buffered %d): the test proves nothing", st.MaxBufferedChanges)
	}
	// The transaction holds ~130 MB decoded; bounded delivery holds a few.
	if grown := int64(maxHeap.Load()) - int64(baseline); grown > 48<<20 {
		t.Errorf("heap grew by %d MB while streaming", grown>>20)
	}
	if st.Reconnects != 0 {
		// Not during the stall (checked above): a loaded machine's, after.
		t.Logf("%d reconnects after the stall, replayed from the transaction's start", st.Reconnects)
	}
}

func withParam(t *testing.T, connString, key, value string) string {
	t.Helper()
	u, err := url.Parse(connString)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestStreamReconnectMidTransaction kills the walsender while a chunked
// transaction is half delivered: the stream reconnects and sends the
// transaction again from chunk 0, which the consumer recognises by Chunk == 0
// and uses to drop the partial one. The result is the transaction exactly
// once.
func TestStreamReconnectMidTransaction(t *testing.T) {
	const rows = 150_000 // ~60 MB: more than TCP and proxy buffers hold
	tc, c := setup(t, `CREATE TABLE big (id int PRIMARY KEY, pad text)`, []TableName{{Name: "big"}}, func(c *Config) {
		c.ChunkChanges, c.QueueChanges = 1000, 2000
	})
	s := startStream(t, c)
	exec(t, tc, fmt.Sprintf(`INSERT INTO big SELECT i, repeat(md5(i::text), 12) FROM generate_series(1, %d) i`, rows))

	first := next(t, s, time.Minute)
	if first.Chunk != 0 || first.Final {
		t.Fatalf("first chunk %d final=%t", first.Chunk, first.Final)
	}
	// The stream is now blocked on the full queue with most of the
	// transaction still on the server.
	time.Sleep(500 * time.Millisecond)
	terminateWalsender(t, tc)

	var partial []Change
	restarts := 0
	partial = append(partial, first.Changes...)
	for {
		txn := next(t, s, time.Minute)
		if txn.Chunk == 0 {
			restarts++
			partial = partial[:0]
		}
		partial = append(partial, txn.Changes...)
		if txn.Final {
			s.Ack(txn.EndLSN)
			break
		}
	}
	if restarts == 0 {
		t.Fatalf("transaction was not resent after the reconnect (reconnects %d)", s.Stats().Reconnects)
	}
	if len(partial) != rows {
		t.Fatalf("got %d rows, want %d", len(partial), rows)
	}
	for i, ch := range partial {
		if ch.New[0].String() != fmt.Sprint(i+1) {
			t.Fatalf("row %d is %s", i, ch.New[0])
		}
	}
	if st := s.Stats(); st.Reconnects < 1 {
		t.Errorf("reconnects %d", st.Reconnects)
	}
}

func terminateWalsender(t *testing.T, tc *testenv.Case) {
	t.Helper()
	var n int
	err := tc.Env.Admin().QueryRow(context.Background(), `SELECT count(pg_terminate_backend(active_pid))
		FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, tc.Slot).Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("terminate walsender: %d, %v", n, err)
	}
}

// TestStreamPostgresRestart restarts Postgres while a writer commits small
// transactions and the consumer acknowledges them: the stream reconnects on
// its own and every committed row arrives exactly once.
func TestStreamPostgresRestart(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, func(c *Config) {
		c.BackoffMax = 2 * time.Second
	})
	s := startStream(t, c)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var written atomic.Int64 // transactions attempted
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; ctx.Err() == nil; i++ {
			q := fmt.Sprintf(`INSERT INTO t SELECT generate_series(%d, %d)`, i*10+1, i*10+10)
			if _, err := tc.Pool.Exec(ctx, q); err != nil {
				time.Sleep(50 * time.Millisecond)
				continue // during the restart; the rows may or may not be committed
			}
			written.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()

	seen := map[int]int{}
	var mu sync.Mutex
	consumerDone := make(chan error, 1)
	cctx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	go func() {
		var partial []Change
		for {
			txn, err := s.Next(cctx)
			if err != nil {
				consumerDone <- err
				return
			}
			if txn.Chunk == 0 {
				partial = partial[:0]
			}
			partial = append(partial, txn.Changes...)
			if !txn.Final {
				continue
			}
			mu.Lock()
			for _, ch := range partial {
				var id int
				fmt.Sscan(ch.New[0].String(), &id)
				seen[id]++
			}
			mu.Unlock()
			partial = nil
			s.Ack(txn.EndLSN)
		}
	}()

	waitFor(t, 30*time.Second, "writes before restart", func() bool { return written.Load() >= 50 })
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	if err := tc.Env.RestartPostgres(rctx); err != nil {
		t.Fatal(err)
	}
	before := written.Load()
	waitFor(t, time.Minute, "writes after restart", func() bool { return written.Load() >= before+50 })
	cancel()
	<-writerDone

	var ids []int
	if err := tc.Env.Admin().QueryRow(context.Background(), "SELECT 1").Scan(new(int)); err != nil {
		t.Fatal(err)
	}
	rows, err := tc.Pool.Query(context.Background(), `SELECT id FROM t ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "all committed rows streamed", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= len(ids)
	})
	ccancel()
	<-consumerDone
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if seen[id] != 1 {
			t.Errorf("row %d streamed %d times", id, seen[id])
		}
	}
	if len(seen) != len(ids) {
		t.Errorf("streamed %d distinct rows, table has %d", len(seen), len(ids))
	}
	if st := s.Stats(); st.Reconnects < 1 {
		t.Errorf("no reconnect recorded: %+v", st)
	}
	t.Logf("%d rows, %d reconnects", len(ids), s.Stats().Reconnects)
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// confirmedFlush reads the slot's confirmed_flush_lsn.
func confirmedFlush(t *testing.T, tc *testenv.Case) wal.LSN {
	t.Helper()
	var s string
	err := tc.Env.Admin().QueryRow(context.Background(),
		`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot).Scan(&s)
	if err != nil {
		t.Fatalf("read confirmed_flush_lsn: %v", err)
	}
	l, err := wal.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestConfirmedFlushFollowsAcks checks the acknowledgement contract from the
// server's side: while the consumer holds transactions back,
// confirmed_flush_lsn is always the start or an EndLSN the consumer acked,
// never more; once everything is acked and nothing happens on the published
// tables, it catches up with pg_current_wal_lsn() within a few seconds.
func TestConfirmedFlushFollowsAcks(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY); CREATE TABLE other (id int)`, []TableName{{Name: "t"}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.EnsurePublication(ctx); err != nil {
		t.Fatal(err)
	}
	slot, err := c.CreateSlot(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewStream(slot.ConsistentPoint)
	runStream(t, s)

	var mu sync.Mutex
	acked := map[wal.LSN]bool{slot.ConsistentPoint: true}
	var violations []string
	pollDone := make(chan struct{})
	stopPoll := make(chan struct{})
	go func() {
		defer close(pollDone)
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(10 * time.Millisecond):
			}
			cf := confirmedFlush(t, tc)
			mu.Lock()
			if !acked[cf] {
				violations = append(violations, cf.String())
			}
			mu.Unlock()
		}
	}()

	const txns = 60
	go func() {
		for i := 1; i <= txns; i++ {
			if _, err := tc.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO t VALUES (%d)`, i)); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	// Ack each transaction only when the fifth after it arrives: there is
	// always delivered, unacknowledged work, so the server position must
	// never be reported.
	var ends []wal.LSN
	for len(ends) < txns {
		txn := next(t, s, 30*time.Second)
		ends = append(ends, txn.EndLSN)
		if len(ends) > 5 {
			lsn := ends[len(ends)-6]
			mu.Lock()
			acked[lsn] = true
			mu.Unlock()
			s.Ack(lsn)
		}
	}
	time.Sleep(3 * time.Second) // several status intervals with acks pending
	close(stopPoll)
	<-pollDone
	if len(violations) > 0 {
		t.Fatalf("confirmed_flush_lsn passed the acknowledged positions: %v", violations)
	}
	if cf := confirmedFlush(t, tc); cf != ends[txns-6] {
		t.Errorf("confirmed_flush_lsn %s, want the last acked %s", cf, ends[txns-6])
	}

	// Now everything is acknowledged, then only unpublished tables change.
	s.Ack(ends[txns-1])
	exec(t, tc, `INSERT INTO other SELECT generate_series(1, 1000)`)
	var current string
	if err := tc.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&current); err != nil {
		t.Fatal(err)
	}
	target, _ := wal.ParseLSN(current)
	start := time.Now()
	waitFor(t, 10*time.Second, "idle slot to catch up with pg_current_wal_lsn", func() bool { return confirmedFlush(t, tc) >= target })
	t.Logf("idle catch-up to %s took %s", target, time.Since(start).Round(10*time.Millisecond))
	if !slices.IsSorted(ends) {
		t.Errorf("end LSNs not in commit order")
	}
}

// TestStreamRestartFromCheckpoint stops a stream whose consumer acknowledged
// only part of what it received, and starts a new one from that checkpoint:
// it delivers exactly the transactions after it.
func TestStreamRestartFromCheckpoint(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.EnsurePublication(ctx); err != nil {
		t.Fatal(err)
	}
	slot, err := c.CreateSlot(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 10; i++ {
		exec(t, tc, fmt.Sprintf(`INSERT INTO t VALUES (%d)`, i))
	}
	s1 := c.NewStream(slot.ConsistentPoint)
	stop := runStream(t, s1)
	var ends []wal.LSN
	for range 10 {
		ends = append(ends, next(t, s1, 30*time.Second).EndLSN)
	}
	checkpoint := ends[3]
	s1.Ack(checkpoint)
	waitFor(t, 10*time.Second, "ack to reach the server", func() bool { return confirmedFlush(t, tc) == checkpoint })
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// ids reads n rows without acknowledging them.
	ids := func(s *Stream, n int) []string {
		var got []string
		for len(got) < n {
			for _, ch := range next(t, s, 30*time.Second).Changes {
				got = append(got, ch.New[0].String())
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if extra, err := s.Next(ctx); err == nil {
			t.Errorf("unexpected extra transaction %+v", extra)
		}
		return got
	}
	s2 := c.NewStream(checkpoint)
	stop2 := runStream(t, s2)
	if got := fmt.Sprint(ids(s2, 6)); got != "[5 6 7 8 9 10]" {
		t.Errorf("from checkpoint after txn 4: %s", got)
	}
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if cf := confirmedFlush(t, tc); cf != checkpoint {
		t.Errorf("confirmed_flush_lsn moved to %s without acknowledgements", cf)
	}
	// Zero starts at the slot's confirmed position.
	s3 := c.NewStream(0)
	runStream(t, s3)
	if got := fmt.Sprint(ids(s3, 6)); got != "[5 6 7 8 9 10]" {
		t.Errorf("from the slot's position: %s", got)
	}
}

// TestStreamConnectionLostWhileBlocked loses the connection while a chunk
// waits for room in the queue (the consumer is stalled): the chunk that
// could not be handed over is not counted as delivered, so the stream
// resumes before it and nothing is lost or repeated.
func TestStreamConnectionLostWhileBlocked(t *testing.T) {
	const txns = 20
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, func(c *Config) {
		c.QueueChanges = 1 // one single-row transaction
		c.StandbyInterval = 300 * time.Millisecond
	})
	s := startStream(t, c)
	for i := 1; i <= txns; i++ {
		exec(t, tc, fmt.Sprintf(`INSERT INTO t VALUES (%d)`, i))
	}
	// One chunk queued, one waiting for room.
	waitFor(t, 10*time.Second, "stream to block", func() bool { return s.Stats().BufferedChanges == 2 })
	terminateWalsender(t, tc)
	time.Sleep(2 * time.Second) // status updates on the dead connection fail meanwhile
	var got []string
	for len(got) < txns {
		txn := next(t, s, 30*time.Second)
		for _, ch := range txn.Changes {
			got = append(got, ch.New[0].String())
		}
		s.Ack(txn.EndLSN)
	}
	for i, id := range got {
		if id != fmt.Sprint(i+1) {
			t.Fatalf("rows %v, want 1..%d once each", got, txns)
		}
	}
	if s.Stats().Reconnects < 1 {
		t.Errorf("no reconnect")
	}
}

// TestStreamSilentServer black-holes the connection without closing it (a
// dead peer, a broken network path): the stream notices the silence after
// ServerTimeout, reconnects, terminates its own stale walsender that still
// holds the slot, and goes on without loss.
func TestStreamSilentServer(t *testing.T) {
	tc, _ := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, nil)
	p := newBlackholeProxy(t, tc.Env.PostgresHostPort())
	u, err := url.Parse(tc.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.addr
	c, err := New(Config{
		ConnString: u.String(), Slot: tc.Slot, Publication: tc.Publication, Tables: []TableName{{Name: "t"}},
		StandbyInterval: 500 * time.Millisecond, ServerTimeout: 2 * time.Second,
		BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	s := startStream(t, c)
	exec(t, tc, `INSERT INTO t VALUES (1)`)
	s.Ack(next(t, s, 30*time.Second).EndLSN)
	p.blackhole()
	exec(t, tc, `INSERT INTO t VALUES (2)`)
	start := time.Now()
	txn := next(t, s, 30*time.Second)
	if txn.Changes[0].New[0].String() != "2" {
		t.Fatalf("got %+v", txn.Changes)
	}
	t.Logf("recovered after %s", time.Since(start).Round(100*time.Millisecond))
	if s.Stats().Reconnects < 1 {
		t.Errorf("no reconnect")
	}
}

// blackholeProxy forwards TCP connections to a target; blackhole makes the
// connections open so far swallow all traffic in both directions and stay
// open on the target's side even when the client closes. New connections
// work normally.
type blackholeProxy struct {
	addr string
	mu   sync.Mutex
	dead []*atomic.Bool
}

func newBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackholeProxy{addr: ln.Addr().String()}
	var conns []net.Conn
	var connsMu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			connsMu.Lock()
			conns = append(conns, in, out)
			connsMu.Unlock()
			dead := &atomic.Bool{}
			p.mu.Lock()
			p.dead = append(p.dead, dead)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if err != nil {
						if !dead.Load() { // a dead path leaves the other side hanging
							dst.Close()
						}
						return
					}
					if !dead.Load() {
						if _, err := dst.Write(buf[:n]); err != nil {
							return
						}
					}
				}
			}
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	return p
}

func (p *blackholeProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.dead {
		d.Store(true)
	}
}
