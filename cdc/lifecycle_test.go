package cdc

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestEnsurePublication creates the publication for exactly the configured
// tables, alters it when the set or the published operations differ, and is
// idempotent. Odd identifiers are quoted.
func TestEnsurePublication(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE a (id int PRIMARY KEY); CREATE TABLE "Odd ""Name""" (id int PRIMARY KEY);
		CREATE SCHEMA s; CREATE TABLE s.b (id int PRIMARY KEY)`,
		[]TableName{{Name: "a"}, {Name: `Odd "Name"`}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	published := func() []string {
		rows, err := tc.Pool.Query(ctx, `SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, tc.Publication)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	for range 2 {
		if err := c.EnsurePublication(ctx); err != nil {
			t.Fatal(err)
		}
		if got := published(); !slices.Equal(got, []string{`public.Odd "Name"`, "public.a"}) {
			t.Fatalf("published %q", got)
		}
	}
	cfg := c.Config()
	cfg.Tables = []TableName{{Name: "a"}, {Schema: "s", Name: "b"}}
	c2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	exec(t, tc, `ALTER PUBLICATION `+quoteIdent(tc.Publication)+` SET (publish = 'insert')`)
	if err := c2.EnsurePublication(ctx); err != nil {
		t.Fatal(err)
	}
	if got := published(); !slices.Equal(got, []string{"public.a", "s.b"}) {
		t.Fatalf("after alter: published %q", got)
	}
	var del, trunc bool
	if err := tc.Pool.QueryRow(ctx, `SELECT pubdelete, pubtruncate FROM pg_publication WHERE pubname = $1`, tc.Publication).Scan(&del, &trunc); err != nil {
		t.Fatal(err)
	}
	if !del || !trunc {
		t.Errorf("published operations not restored: delete=%t truncate=%t", del, trunc)
	}

	cfg.Tables = []TableName{{Name: "missing"}}
	c3, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c3.EnsurePublication(ctx); !errors.Is(err, ErrTableMissing) {
		t.Errorf("missing table: %v", err)
	}
	if err := c3.Preflight(ctx); !errors.Is(err, ErrTableMissing) {
		t.Errorf("preflight with a missing table: %v", err)
	}
	if err := c.Preflight(ctx); err != nil {
		t.Errorf("preflight: %v", err)
	}
}

// TestSlotLifecycle creates a slot with an exported snapshot: another
// connection importing the snapshot sees the data as of the consistent
// point, and the stream from that point delivers exactly the later changes.
// Then the slot is described, cannot be created twice, and teardown removes
// slot and publication (twice without error).
func TestSlotLifecycle(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)`, []TableName{{Name: "t"}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.EnsurePublication(ctx); err != nil {
		t.Fatal(err)
	}
	slot, err := c.CreateSlot(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if slot.SnapshotName == "" || slot.ConsistentPoint == 0 {
		t.Fatalf("slot %+v", slot)
	}
	exec(t, tc, `INSERT INTO t VALUES (2)`)
	// The snapshot stays importable while the slot's connection is open,
	// also after other activity.
	time.Sleep(200 * time.Millisecond)
	conn, err := pgx.Connect(ctx, tc.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(slot.SnapshotName)); err != nil {
		t.Fatalf("import snapshot: %v", err)
	}
	var ids []int32
	rows, _ := tx.Query(ctx, `SELECT id FROM t ORDER BY id`)
	if ids, err = pgx.CollectRows(rows, pgx.RowTo[int32]); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if fmt.Sprint(ids) != "[1]" {
		t.Errorf("snapshot sees %v, want [1]", ids)
	}
	if err := slot.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Release returns once the walsender has exited: the slot is free at
	// once, not a moment later.
	var active bool
	if err := conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots WHERE slot_name = $1`, slot.Name).Scan(&active); err != nil || active {
		t.Errorf("slot active right after Release: %v (%v)", active, err)
	}
	if err := slot.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	tx, err = conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(slot.SnapshotName)); err == nil {
		t.Errorf("snapshot still importable after Release")
	}
	_ = tx.Rollback(ctx)

	s := c.NewStream(slot.ConsistentPoint)
	stop := runStream(t, s)
	txn := next(t, s, 30*time.Second)
	if len(txn.Changes) != 1 || txn.Changes[0].New[0].String() != "2" {
		t.Errorf("stream from the consistent point: %+v", txn.Changes)
	}
	s.Ack(txn.EndLSN)

	info, err := c.SlotInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Exists || info.Plugin != "pgoutput" || !info.Active || info.ActivePID == 0 || info.Usable() != nil || info.CurrentLSN < info.ConfirmedFlushLSN {
		t.Errorf("slot info %+v (usable: %v)", info, info.Usable())
	}
	if _, err := c.CreateSlot(ctx, false); !errors.Is(err, ErrSlotExists) {
		t.Errorf("second create: %v", err)
	}
	if err := c.Teardown(ctx); !errors.Is(err, ErrSlotInUse) {
		t.Errorf("teardown of an active slot: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := c.Teardown(ctx); err != nil {
			t.Fatalf("teardown: %v", err)
		}
	}
	info, err = c.SlotInfo(ctx)
	if err != nil || info.Exists || !errors.Is(info.Usable(), ErrSlotMissing) {
		t.Errorf("after teardown: %+v, %v", info, err)
	}
	var n int
	if err := tc.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_publication WHERE pubname = $1`, tc.Publication).Scan(&n); err != nil || n != 0 {
		t.Errorf("publication left: %d, %v", n, err)
	}
}

// TestErrorNoReplicationPrivilege connects as a role without REPLICATION:
// slot creation, streaming and preflight fail with ErrReplicationPrivilege
// and name the ALTER ROLE fix; the stream does not retry.
func TestErrorNoReplicationPrivilege(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.EnsurePublication(ctx); err != nil {
		t.Fatal(err)
	}
	role := tc.Slot + "_norepl"
	admin := tc.Env.Admin()
	if _, err := admin.Exec(ctx, `CREATE ROLE `+quoteIdent(role)+` LOGIN PASSWORD 'pw' NOREPLICATION`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP ROLE IF EXISTS `+quoteIdent(role)) })
	u, err := url.Parse(tc.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "pw")
	cfg := c.Config()
	cfg.ConnString = u.String()
	weak, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = weak.CreateSlot(ctx, false)
	if !errors.Is(err, ErrReplicationPrivilege) || !strings.Contains(err.Error(), "ALTER ROLE "+quoteIdent(role)+" REPLICATION") {
		t.Errorf("create slot: %v", err)
	}
	if strings.Contains(fmt.Sprint(err), "pw@") {
		t.Errorf("error leaks the password: %v", err)
	}
	if err := weak.Preflight(ctx); !errors.Is(err, ErrReplicationPrivilege) {
		t.Errorf("preflight: %v", err)
	}
	slot, err := c.CreateSlot(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = weak.NewStream(slot.ConsistentPoint).Run(ctx)
	if !errors.Is(err, ErrReplicationPrivilege) || !IsTerminal(err) {
		t.Errorf("run: %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("a terminal error was retried for %s", time.Since(start))
	}
}

// TestErrorSlotInUse starts a second consumer on a slot that a first one
// streams from: it gives up after SlotBusyTimeout with ErrSlotInUse naming
// the first consumer's walsender PID, and the first one keeps streaming.
func TestErrorSlotInUse(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, func(c *Config) {
		c.SlotBusyTimeout = time.Second
	})
	first := startStream(t, c)
	var pid int
	waitFor(t, 10*time.Second, "first consumer active", func() bool {
		info, err := c.SlotInfo(context.Background())
		pid = info.ActivePID
		return err == nil && info.Active
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := c.NewStream(0).Run(ctx)
	if !errors.Is(err, ErrSlotInUse) || !strings.Contains(err.Error(), fmt.Sprintf("PID %d", pid)) {
		t.Fatalf("second consumer: %v (active pid %d)", err, pid)
	}
	exec(t, tc, `INSERT INTO t VALUES (1)`)
	if txn := next(t, first, 30*time.Second); txn.Changes[0].New[0].String() != "1" {
		t.Errorf("first consumer got %+v", txn)
	}
}

// TestErrorSlotDropped drops the slot under a running stream: the stream
// stops with ErrSlotMissing instead of retrying forever.
func TestErrorSlotDropped(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, func(c *Config) {
		c.BackoffMin = time.Second
	})
	s := startStream(t, c)
	waitFor(t, 10*time.Second, "stream active", func() bool {
		info, err := c.SlotInfo(context.Background())
		return err == nil && info.Active
	})
	admin := tc.Env.Admin()
	waitFor(t, 10*time.Second, "slot dropped", func() bool {
		_, _ = admin.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active`, tc.Slot)
		_, err := admin.Exec(context.Background(), `SELECT pg_drop_replication_slot($1)`, tc.Slot)
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.Next(ctx)
	if !errors.Is(err, ErrSlotMissing) || !IsTerminal(err) {
		t.Fatalf("got %v, want ErrSlotMissing", err)
	}
}

// TestErrorPublicationDropped drops the publication under a running stream:
// the next change fails decoding on the server, and the stream stops with
// ErrPublicationMissing.
func TestErrorPublicationDropped(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE t (id int PRIMARY KEY)`, []TableName{{Name: "t"}}, nil)
	s := startStream(t, c)
	exec(t, tc, `INSERT INTO t VALUES (1)`)
	s.Ack(next(t, s, 30*time.Second).EndLSN)
	exec(t, tc, `DROP PUBLICATION `+quoteIdent(tc.Publication), `INSERT INTO t VALUES (2)`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := s.Next(ctx)
	if !errors.Is(err, ErrPublicationMissing) || !IsTerminal(err) {
		t.Fatalf("got %v, want ErrPublicationMissing", err)
	}
}
