package cdc

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// holderOf reads the slot's holder through c, failing the test on error.
func holderOf(t *testing.T, c *Client) (Holder, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, ok, err := c.Holder(ctx)
	if err != nil {
		t.Fatalf("holder: %v", err)
	}
	return h, ok
}

// TestHolder follows the slot's holder through its life: none before the
// slot exists; the creator while it keeps the exported snapshot (the slot
// itself is inactive then: a backfill); none once the snapshot is
// released; the streaming walsender, which Holding announces; none once
// the stream stopped.
func TestHolder(t *testing.T) {
	_, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if h, ok := holderOf(t, c); ok {
		t.Fatalf("holder before the slot exists: %+v", h)
	}
	if err := c.EnsurePublication(ctx); err != nil {
		t.Fatal(err)
	}
	slot, err := c.CreateSlot(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	h, ok := holderOf(t, c)
	if info, err := c.SlotInfo(ctx); err != nil || info.Active {
		t.Fatalf("slot with its snapshot held: active %t, %v; want inactive", info.Active, err)
	}
	if !ok || h.Streaming || h.PID == 0 || h.ApplicationName != "fkmat-cdc" || !strings.Contains(h.What(), "backfilling") {
		t.Fatalf("holder while the snapshot is held: %+v, %t; want the creator", h, ok)
	}
	if err := slot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if h, ok := holderOf(t, c); ok {
		t.Fatalf("holder after the snapshot's release: %+v", h)
	}

	s := c.NewStream(slot.ConsistentPoint)
	select {
	case <-s.Holding():
		t.Fatal("holding before Run")
	default:
	}
	stop := runStream(t, s)
	select {
	case <-s.Holding():
	case <-time.After(30 * time.Second):
		t.Fatal("the stream did not take the slot within 30 s")
	}
	h, ok = holderOf(t, c)
	info, err := c.SlotInfo(ctx)
	if err != nil || !ok || !h.Streaming || h.PID != info.ActivePID {
		t.Fatalf("holder while streaming: %+v, %t; slot active pid %d (%v)", h, ok, info.ActivePID, err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if h, ok := holderOf(t, c); ok {
		t.Fatalf("holder after the stream stopped: %+v", h)
	}
}

// TestStreamTakenOver: a stream whose connection drops finds, when it
// reconnects, another consumer streaming from the slot (a standby that
// took over): it stops at once with ErrSlotInUse instead of waiting for
// the slot, and the other consumer goes on.
func TestStreamTakenOver(t *testing.T) {
	tc, first := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, func(c *Config) {
		// The first stream comes back late enough for the second to be
		// streaming by then.
		c.BackoffMin, c.BackoffMax = 4*time.Second, 4*time.Second
	})
	cfg := first.Config()
	cfg.BackoffMin, cfg.BackoffMax = 100*time.Millisecond, time.Second
	second, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := startStream(t, first)
	select {
	case <-a.Holding():
	case <-time.After(30 * time.Second):
		t.Fatal("the first stream did not take the slot within 30 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := first.SlotInfo(ctx)
	if err != nil || !info.Active {
		t.Fatalf("first stream not active: %+v, %v", info, err)
	}
	// The first stream's connection drops; the second takes the slot
	// before the first reconnects.
	if _, err := tc.Env.Admin().Exec(ctx, `SELECT pg_terminate_backend($1)`, info.ActivePID); err != nil {
		t.Fatal(err)
	}
	dropped := time.Now()
	b := second.NewStream(0)
	runStream(t, b)
	select {
	case <-b.Holding():
	case <-time.After(30 * time.Second):
		t.Fatal("the second stream did not take the slot within 30 s")
	}
	select {
	case <-a.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the first stream did not stop within 30 s of losing the slot")
	}
	_, err = a.Next(ctx)
	if !errors.Is(err, ErrSlotInUse) || !strings.Contains(err.Error(), "took over") {
		t.Fatalf("first stream: %v; want ErrSlotInUse naming the takeover", err)
	}
	if took := time.Since(dropped); took > 20*time.Second {
		t.Errorf("the first stream stopped %s after its connection dropped; want about one backoff (4 s)", took)
	}
	exec(t, tc, `INSERT INTO t VALUES (1)`)
	if txn := next(t, b, 30*time.Second); txn.Changes[0].New[0].String() != "1" {
		t.Errorf("second stream got %+v", txn)
	}
}
