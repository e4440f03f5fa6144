package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/fkmat/fkmat/internal/crash"
	"github.com/fkmat/fkmat/internal/wal"
)

// Stream delivers the committed transactions of the slot in commit order and
// carries the consumer's acknowledgements back to the server.
//
// Run owns the replication connection; the consumer calls Next and Ack from
// any goroutine:
//
//	s := client.NewStream(checkpoint)
//	g.Go(func() error { return s.Run(ctx) })
//	for {
//		txn, err := s.Next(ctx)
//		if err != nil { return err }
//		apply(txn)                 // chunks of one transaction until txn.Final
//		if txn.Final { s.Ack(txn.EndLSN) } // once the effects are durable
//	}
//
// Contract: Ack promises that every transaction with EndLSN <= lsn is
// durably applied; the server is told nothing beyond the highest Ack
// (except, when everything delivered is acknowledged and no transaction is
// open, the server's own WAL position, which holds nothing for this
// publication). Within one Stream each transaction is delivered once, except
// that a reconnect in the middle of a chunked transaction delivers it again
// from Chunk 0 (see Txn). A new Stream started at a checkpoint delivers
// exactly the transactions with EndLSN > checkpoint.
type Stream struct {
	c     *Client
	cfg   Config
	log   *slog.Logger
	queue *queue
	done  chan struct{}
	err   error // Run's result, set before done is closed
	// holding is closed once the stream holds the slot: its first
	// START_REPLICATION succeeded.
	holding chan struct{}
	acked   atomic.Uint64
	// cleared bounds every position reported while held (Hold); it is
	// the highest position the consumer has found safe to confirm.
	held    bool
	cleared atomic.Uint64
	// stopAt is the marker (EmitSwitch) at which the stream stops.
	stopAt atomic.Pointer[string]
	// limit bounds every position reported (Limit); 0 for none.
	limit atomic.Uint64

	started atomic.Bool
	stats   streamStats

	// Owned by the Run goroutine.
	start     wal.LSN // the consumer's checkpoint (or the slot's confirmed position)
	delivered wal.LSN // EndLSN of the last final chunk handed to the consumer
	reported  wal.LSN // last position sent to the server
	asm       *assembler
	lastPID   uint32 // backend PID of the last walsender that streamed for us
	triedPID  uint32 // backend PID of our last replication connection
	streamed  bool   // the stream has held the slot (holding is closed)
	checked   bool   // slot and publication were checked
	warned    map[byte]time.Time
}

type streamStats struct {
	txns, changes, reconnects     atomic.Int64
	received, reported, serverEnd atomic.Uint64
	confirmable                   atomic.Uint64
}

// NewStream returns a stream that starts after start: the consumer's
// checkpoint, i.e. the EndLSN of the last transaction it applied (or the
// slot's consistent point after a backfill). Zero means the slot's
// confirmed_flush_lsn. Call Run to start it.
func (c *Client) NewStream(start wal.LSN) *Stream {
	s := &Stream{
		c:       c,
		cfg:     c.cfg,
		log:     c.log,
		queue:   newQueue(int64(c.cfg.QueueChanges), int64(c.cfg.QueueBytes)),
		done:    make(chan struct{}),
		holding: make(chan struct{}),
		start:   start,
		asm:     newAssembler(c.cfg.ChunkChanges, c.cfg.ChunkBytes, c.log),
		warned:  map[byte]time.Time{},
	}
	owner := c.cfg.Slot
	if c.cfg.MessageSlot != "" {
		owner = c.cfg.MessageSlot
	}
	s.asm.prefix, s.asm.switchPrefix = MessagePrefix(owner), SwitchPrefix(owner)
	s.acked.Store(uint64(start))
	return s
}

// Ack reports that every transaction with EndLSN <= lsn is durably applied.
// Pass the EndLSN of a Final chunk. It never blocks; lower values than an
// earlier Ack are ignored. The position reaches the server within about a
// second (a tenth of StandbyInterval, clamped to [100ms, 1s]).
func (s *Stream) Ack(lsn wal.LSN) {
	for {
		cur := s.acked.Load()
		if uint64(lsn) <= cur || s.acked.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// Hold makes the stream report no position beyond the highest Clear, even
// an acknowledged one or the server's own position on an idle slot. A
// consumer holds the stream when an event outside the stream (DDL, which
// pgoutput does not send) can make an acknowledged position untrue; it
// clears a position once it has checked that nothing before it happened.
// Call Hold, and Clear the start position or later, before Run.
func (s *Stream) Hold() { s.held = true }

// Limit makes the stream report no position beyond lsn, whatever is
// acknowledged or cleared: a consumer that stopped maintaining part of
// what the slot feeds (a join left unmaintained until its rebuild switches
// in) keeps the slot from claiming it caught up. Call it before Run, with
// the start position or later.
func (s *Stream) Limit(lsn wal.LSN) { s.limit.Store(uint64(lsn)) }

// Clear allows a held stream to report positions up to lsn; lower values
// than an earlier Clear are ignored. It never blocks.
func (s *Stream) Clear(lsn wal.LSN) {
	for {
		cur := s.cleared.Load()
		if uint64(lsn) <= cur || s.cleared.CompareAndSwap(cur, uint64(lsn)) {
			return
		}
	}
}

// StopAt makes the stream stop at the transaction that carries marker id
// (EmitSwitch): every transaction before it is delivered, it and nothing
// after it is, and Run returns ErrStopped. Two streams of the same changes
// stopped at one marker have delivered exactly the same transactions. Call
// it before the marker is written.
func (s *Stream) StopAt(id string) { s.stopAt.Store(&id) }

// Next returns the next transaction chunk, blocking until one is ready, ctx
// is done (ctx.Err()) or Run has stopped (Run's error; context.Canceled after
// a clean shutdown). Chunks already queued are returned before Run's error.
func (s *Stream) Next(ctx context.Context) (*Txn, error) {
	t, ok, err := s.queue.take(ctx, s.done)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, s.err
	}
	return t, nil
}

// Done is closed when Run has returned.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Holding is closed once the stream holds the slot (its first
// START_REPLICATION succeeded): from then on no other consumer can stream
// from it until this one's connection ends.
func (s *Stream) Holding() <-chan struct{} { return s.holding }

// StreamStats is a snapshot of a stream's counters.
type StreamStats struct {
	// BufferedChanges and BufferedBytes are held by the stream: chunks
	// queued for Next plus the one waiting for room. MaxBuffered* are the
	// highest values seen. The chunk being assembled (at most one chunk's
	// limits) is not included; it exists only while nothing waits for room.
	BufferedChanges, BufferedBytes       int64
	MaxBufferedChanges, MaxBufferedBytes int64
	// Txns and Changes count delivered final chunks and changes.
	Txns, Changes int64
	// Reconnects counts replication connections after the first.
	Reconnects int64
	// ReceivedLSN is the EndLSN of the last transaction handed to the
	// consumer;
	// AckedLSN the highest Ack; ReportedLSN the last position sent to the
	// server; ServerWALEnd the server's WAL end from its last keepalive.
	ReceivedLSN, AckedLSN, ReportedLSN, ServerWALEnd wal.LSN
	// Held says the stream is held (Hold); ClearedLSN is then the
	// highest Clear, which bounds ReportedLSN. ConfirmableLSN is the
	// position the stream would report if it were not held: every
	// transaction before it is acknowledged (on an idle slot, the
	// server's position).
	Held                       bool
	ClearedLSN, ConfirmableLSN wal.LSN
	// LimitLSN is the Limit, 0 for none: ReportedLSN stays at or below it.
	LimitLSN wal.LSN
}

// Stats returns the stream's counters; safe from any goroutine.
func (s *Stream) Stats() StreamStats {
	st := &s.stats
	changes, bytes, maxChanges, maxBytes := s.queue.stats()
	return StreamStats{
		BufferedChanges:    changes,
		BufferedBytes:      bytes,
		MaxBufferedChanges: maxChanges,
		MaxBufferedBytes:   maxBytes,
		Txns:               st.txns.Load(),
		Changes:            st.changes.Load(),
		Reconnects:         st.reconnects.Load(),
		ReceivedLSN:        wal.LSN(st.received.Load()),
		AckedLSN:           wal.LSN(s.acked.Load()),
		ReportedLSN:        wal.LSN(st.reported.Load()),
		ServerWALEnd:       wal.LSN(st.serverEnd.Load()),
		Held:               s.held,
		ClearedLSN:         wal.LSN(s.cleared.Load()),
		ConfirmableLSN:     wal.LSN(st.confirmable.Load()),
		LimitLSN:           wal.LSN(s.limit.Load()),
	}
}

// Run streams until ctx is done or a terminal error occurs; it reconnects
// with exponential backoff and jitter after anything else (dropped
// connection, Postgres restart). It returns ctx's error after a clean
// shutdown, else an error for which IsTerminal is true. Run may be called
// once.
func (s *Stream) Run(ctx context.Context) (err error) {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("run stream: already started")
	}
	defer func() {
		s.err = err
		close(s.done)
	}()
	bo := backoff{min: s.cfg.BackoffMin, max: s.cfg.BackoffMax}
	var busySince time.Time
	for {
		progressed, err := s.session(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrStopped) {
			s.log.Info("replication stopped at its marker", "slot", s.cfg.Slot, "delivered_lsn", s.delivered.String())
			return err
		}
		if busy, ok := errors.AsType[*slotBusyError](err); ok {
			if busySince.IsZero() {
				busySince = time.Now()
			}
			switch {
			case busy.pid != 0 && (uint32(busy.pid) == s.lastPID || uint32(busy.pid) == s.triedPID):
				// Our previous walsender has not noticed that its
				// connection is gone.
				s.log.Warn("terminating our stale walsender", "pid", busy.pid)
				if terr := s.c.terminateBackend(ctx, busy.pid); terr != nil {
					s.log.Warn("terminate stale walsender failed", "pid", busy.pid, "err", terr)
				}
			case s.streamed:
				// Another consumer took the slot while this stream was
				// reconnecting (a standby taking over): it streams from
				// the checkpoints now, and this stream's consumer must
				// stop at once rather than apply what it still holds.
				err = fmt.Errorf("%w: process %d took over replication slot %q while this stream reconnected (a standby?); stopping: %w",
					ErrSlotInUse, busy.pid, s.cfg.Slot, busy.err)
				s.log.Error("replication stopped", "err", err)
				return fmt.Errorf("stream slot %q: %w", s.cfg.Slot, err)
			case time.Since(busySince) >= s.cfg.SlotBusyTimeout:
				err = busy.terminal(s.cfg.SlotBusyTimeout)
				s.log.Error("replication stopped", "err", err)
				return fmt.Errorf("stream slot %q: %w", s.cfg.Slot, err)
			}
		} else {
			busySince = time.Time{}
			if IsTerminal(err) {
				s.log.Error("replication stopped", "err", err)
				return fmt.Errorf("stream slot %q: %w", s.cfg.Slot, err)
			}
		}
		if progressed {
			bo.reset()
		}
		d := bo.next()
		s.log.Warn("replication interrupted; reconnecting", "err", err, "retry_in", d, "resume_lsn", max(s.start, s.delivered).String())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
		s.stats.reconnects.Add(1)
	}
}

// session runs one replication connection until it fails. progressed says
// whether the server sent anything, which resets the backoff.
func (s *Stream) session(ctx context.Context) (progressed bool, err error) {
	sctx, cancel := context.WithTimeout(ctx, s.cfg.ConnectTimeout)
	defer cancel()
	if !s.checked {
		// Check once up front: the server reports a missing publication
		// only when it decodes the first change.
		info, err := s.c.checkReady(sctx)
		if err != nil {
			return false, err
		}
		s.checked = true
		if s.start == 0 {
			s.start = info.ConfirmedFlushLSN
			s.Ack(s.start)
			s.log.Info("starting at the slot's confirmed position", "lsn", s.start.String())
		}
	}
	conn, err := s.c.connectReplication(sctx)
	if err != nil {
		return false, err
	}
	defer closeConn(conn)
	// START_REPLICATION may take the slot even when its reply does not
	// reach us.
	s.triedPID = conn.PID()

	// Resume after the last transaction handed over, not the last one
	// acknowledged: the consumer still holds those. Only a transaction cut
	// off mid-chunks is sent again.
	resume := max(s.start, s.delivered)
	s.asm.reset(resume)
	err = pglogrepl.StartReplication(sctx, conn, quoteIdent(s.cfg.Slot), pglogrepl.LSN(resume), pglogrepl.StartReplicationOptions{
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names " + quoteLiteral(quoteIdent(s.cfg.Publication)),
			// The row changes fkmat writes into the WAL itself (Embedded).
			"messages 'true'",
		},
	})
	if err != nil {
		return false, fmt.Errorf("start replication at %s: %w", resume, s.c.mapErr(err))
	}
	// This walsender now holds the slot; if the connection dies unnoticed
	// by the server, the next session finds the slot busy with this PID.
	s.lastPID = conn.PID()
	if !s.streamed {
		s.streamed = true
		close(s.holding)
	}
	s.log.Info("replication started", "slot", s.cfg.Slot, "resume_lsn", resume.String(), "backend_pid", conn.PID())
	ss := &session{s: s, conn: conn, tick: s.cfg.tick(), lastRecv: time.Now()}
	err = ss.run(ctx)
	return ss.progressed, err
}

// session is the state of one replication connection.
type session struct {
	s          *Stream
	conn       *pgconn.PgConn
	tick       time.Duration
	walEnd     wal.LSN // server position that is safe to report when nothing is pending
	lastStatus time.Time
	lastRecv   time.Time
	progressed bool
}

// recvDeadline bounds each receive by the session's tick with a read
// deadline on the connection, moved once per tick, rather than with a
// context: pgconn watches a context on every receive (a goroutine handoff
// and allocations per replicated row). Canceling the session's context
// moves the deadline into the past, which ends a receive in progress.
type recvDeadline struct {
	conn     net.Conn
	deadline time.Time // only the receive loop reads and writes it
	mu       sync.Mutex
	canceled bool
	stop     func() bool
}

func newRecvDeadline(ctx context.Context, conn net.Conn) *recvDeadline {
	d := &recvDeadline{conn: conn}
	d.stop = context.AfterFunc(ctx, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.canceled = true
		_ = d.conn.SetReadDeadline(time.Unix(1, 0))
	})
	return d
}

// arm sets the next deadline once the last one passed (or timed out a
// receive: expire).
func (d *recvDeadline) arm(now time.Time, tick time.Duration) error {
	if now.Before(d.deadline) {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.canceled {
		return nil
	}
	d.deadline = now.Add(tick)
	return d.conn.SetReadDeadline(d.deadline)
}

// expire makes the next arm set a new deadline.
func (d *recvDeadline) expire() { d.deadline = time.Time{} }

// close stops watching the context and clears the deadline.
func (d *recvDeadline) close() {
	d.stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	_ = d.conn.SetReadDeadline(time.Time{})
}

// minStatusGap limits status updates caused by new acknowledgements.
const minStatusGap = 50 * time.Millisecond

func (ss *session) run(ctx context.Context) error {
	s := ss.s
	rd := newRecvDeadline(ctx, ss.conn.Conn())
	defer rd.close()
	for {
		now := time.Now()
		if err := ss.maybeStatus(now); err != nil {
			return err
		}
		if err := rd.arm(now, ss.tick); err != nil {
			return fmt.Errorf("receive replication message: %w", err)
		}
		msg, err := ss.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) && !ss.conn.IsClosed() {
				rd.expire()
				if silent := time.Since(ss.lastRecv); silent > s.cfg.ServerTimeout {
					return fmt.Errorf("receive replication message: server silent for %s", silent.Round(time.Second))
				}
				continue
			}
			return fmt.Errorf("receive replication message: %w", err)
		}
		ss.lastRecv = time.Now()
		ss.progressed = true
		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if err := ss.handleCopyData(ctx, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("stream changes: %w", s.c.mapErr(pgconn.ErrorResponseToPgError(msg)))
		case *pgproto3.CopyDone:
			return errors.New("stream changes: server ended the replication stream")
		case *pgproto3.NoticeResponse:
			s.log.Info("server notice", "message", msg.Message)
		}
	}
}

func (ss *session) handleCopyData(ctx context.Context, data []byte) error {
	s := ss.s
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("%w: parse keepalive: %w", ErrProtocol, err)
		}
		// Everything before ServerWALEnd was sent before this keepalive.
		ss.walEnd = max(ss.walEnd, wal.LSN(ka.ServerWALEnd))
		s.stats.serverEnd.Store(uint64(ka.ServerWALEnd))
		if ka.ReplyRequested {
			return ss.sendStatus(time.Now(), false)
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("%w: parse xlogdata: %w", ErrProtocol, err)
		}
		res, err := ss.decode(wal.LSN(xld.WALStart), xld.WALData)
		if err != nil {
			return err
		}
		if res.emptyEnd != 0 {
			ss.walEnd = max(ss.walEnd, res.emptyEnd)
		}
		if res.ignored != 0 {
			s.warnIgnored(res.ignored)
		}
		for _, t := range res.chunks {
			if err := ss.deliver(ctx, t); err != nil {
				return err
			}
		}
		if res.txn != nil {
			if m := res.txn.Marker; m != "" {
				if stop := s.stopAt.Load(); stop != nil && *stop == m {
					return fmt.Errorf("%w (marker %s at %s)", ErrStopped, m, res.txn.CommitLSN)
				}
			}
			return ss.deliver(ctx, res.txn)
		}
	}
	return nil
}

// decode hands one message to the assembler. A panic in it (a bug) ends
// the stream with a *crash.Error naming the message's position and its
// transaction: reconnecting would decode the same message again, so the
// consumer restarts from its checkpoints and counts it as a stall.
func (ss *session) decode(lsn wal.LSN, data []byte) (res result, err error) {
	defer crash.Recover(&err, func() (string, uint64) {
		where := fmt.Sprintf("decoding the %s message at %s", kindName(data[0]), lsn)
		t := res.txn
		if t == nil {
			t = ss.s.asm.cur
		}
		if t != nil {
			where += fmt.Sprintf(" of the transaction xid %d committed at %s (chunk %d, %d changes in hand)", t.Xid, t.CommitLSN, t.Chunk, len(t.Changes))
			return where, uint64(t.CommitLSN)
		}
		return where, 0
	})
	res, err = ss.s.asm.handle(lsn, data)
	if res.txn != nil {
		crash.At("decode", []*Txn{res.txn})
	}
	return res, err
}

// warnIgnored logs an ignored message kind at most once a minute per kind.
func (s *Stream) warnIgnored(kind byte) {
	if t, ok := s.warned[kind]; ok && time.Since(t) < time.Minute {
		return
	}
	s.warned[kind] = time.Now()
	s.log.Warn("ignoring unexpected pgoutput message", "kind", kindName(kind))
}

// deliver hands a chunk to the consumer, waiting for room; while it waits it
// keeps the connection alive with status updates (it does not read, so the
// server's output backs up in TCP buffers and memory stays bounded). Only a
// chunk actually handed over counts as delivered: if the connection fails
// meanwhile, the stream resumes before it.
func (ss *session) deliver(ctx context.Context, t *Txn) error {
	s := ss.s
	start := time.Now()
	// Once handed over, the chunk is the consumer's, which may release its
	// changes at once: what is counted is read before.
	final, end, changes := t.Final, t.EndLSN, len(t.Changes)
	if err := s.queue.push(ctx, t, ss.tick, ss.maybeStatus); err != nil {
		return err
	}
	if now := time.Now(); now.Sub(start) > time.Millisecond {
		ss.lastRecv = now // we were not reading: the silence was ours
	}
	// While the chunk waited, the position reported could only come from
	// keepalives received before its commit, which lie before it.
	if final {
		s.asm.delivered()
		s.delivered = end
		s.stats.txns.Add(1)
		s.stats.received.Store(uint64(end))
	}
	s.stats.changes.Add(int64(changes))
	return nil
}

// position is the LSN to report as written, flushed and applied: the
// consumer's acknowledgement, or the server's position when nothing is
// pending. It never goes backwards.
func (ss *session) position() wal.LSN {
	s := ss.s
	acked := wal.LSN(s.acked.Load())
	free := reportable(acked, s.start, s.delivered, s.reported, ss.walEnd, s.asm.inTxn, math.MaxUint64)
	s.stats.confirmable.Store(uint64(free))
	bound := wal.LSN(math.MaxUint64)
	if s.held {
		bound = wal.LSN(s.cleared.Load())
	}
	if lim := wal.LSN(s.limit.Load()); lim != 0 {
		bound = min(bound, lim)
	}
	if bound == math.MaxUint64 {
		return free
	}
	return reportable(acked, s.start, s.delivered, s.reported, ss.walEnd, s.asm.inTxn, bound)
}

// reportable computes the position to report. acked is the consumer's
// acknowledgement, start the stream's start, delivered the EndLSN of the last
// final chunk handed over, reported the last position sent, walEnd a server
// position before which everything was sent, inTxn whether a transaction is
// open, limit the highest position a held stream may report.
func reportable(acked, start, delivered, reported, walEnd wal.LSN, inTxn bool, limit wal.LSN) wal.LSN {
	// An acknowledgement beyond what was handed over is a consumer bug;
	// never let it confirm WAL that was not seen.
	pos := min(max(acked, start), max(delivered, start))
	if !inTxn && pos >= delivered {
		// Nothing is pending: WAL up to the server's position holds
		// nothing the consumer has not applied.
		pos = max(pos, walEnd)
	}
	return max(min(pos, limit), reported)
}

// maybeStatus sends a standby status update when one is due: every
// StandbyInterval, or soon after the position advanced.
func (ss *session) maybeStatus(now time.Time) error {
	since := now.Sub(ss.lastStatus)
	if since >= ss.s.cfg.StandbyInterval {
		// Ask for a reply when the server has been quiet, so that a dead
		// connection shows up as silence.
		return ss.sendStatus(now, now.Sub(ss.lastRecv) >= ss.s.cfg.StandbyInterval)
	}
	if since >= minStatusGap && ss.position() > ss.s.reported {
		return ss.sendStatus(now, false)
	}
	return nil
}

func (ss *session) sendStatus(now time.Time, replyRequested bool) error {
	s := ss.s
	pos := ss.position()
	// A write into a dead connection must not block the loop for good.
	_ = ss.conn.Conn().SetWriteDeadline(now.Add(s.cfg.ServerTimeout))
	// Set all three positions: pglogrepl fills flush and apply from write
	// only when they are zero, and the server takes confirmed_flush_lsn from
	// flush.
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), ss.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(pos),
		WALFlushPosition: pglogrepl.LSN(pos),
		WALApplyPosition: pglogrepl.LSN(pos),
		ClientTime:       now,
		ReplyRequested:   replyRequested,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	if pos != s.reported {
		s.log.Debug("reported position", "lsn", pos.String())
	}
	s.reported = pos
	s.stats.reported.Store(uint64(pos))
	ss.lastStatus = now
	return nil
}

// backoff is exponential backoff with jitter: the n-th delay is uniform in
// [d/2, d] for d = min·2ⁿ capped at max.
type backoff struct {
	min, max time.Duration
	n        int
}

func (b *backoff) reset() { b.n = 0 }

func (b *backoff) next() time.Duration {
	d := b.min << min(b.n, 30)
	if d > b.max || d <= 0 {
		d = b.max
	}
	b.n++
	return d/2 + rand.N(d/2+1)
}
