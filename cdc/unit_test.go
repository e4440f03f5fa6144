package cdc

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestLSN(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "0/1"} {
		l, err := wal.ParseLSN(s)
		if err != nil || l.String() != s {
			t.Errorf("ParseLSN(%q) = %s, %v", s, l, err)
		}
	}
	if l, _ := wal.ParseLSN("1/2"); l != 1<<32|2 {
		t.Errorf("ParseLSN(1/2) = %d", l)
	}
	for _, s := range []string{"", "12", "x/1", "1/", "100000000/0"} {
		if _, err := wal.ParseLSN(s); err == nil {
			t.Errorf("ParseLSN(%q) succeeded", s)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	good := func() Config {
		return Config{ConnString: "postgres://u:secret@127.0.0.1/db", Slot: "fkmat_1", Publication: "Pub", Tables: []TableName{{Name: "orders"}}}
	}
	c := good()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.StandbyInterval != DefaultStandbyInterval || c.ChunkChanges != DefaultChunkChanges || c.Tables[0].Schema != "public" {
		t.Errorf("defaults not applied: %+v", c)
	}
	cases := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no conn string", func(c *Config) { c.ConnString = "" }, "connection string is empty"},
		{"bad conn string", func(c *Config) { c.ConnString = "postgres://u:secret@[::1/x" }, "cannot be parsed"},
		{"upper-case slot", func(c *Config) { c.Slot = "Fkmat" }, "slot name"},
		{"slot with quote", func(c *Config) { c.Slot = `a"b` }, "slot name"},
		{"long slot", func(c *Config) { c.Slot = strings.Repeat("a", 64) }, "slot name"},
		{"no publication", func(c *Config) { c.Publication = "" }, "publication name"},
		{"no tables", func(c *Config) { c.Tables = nil }, "no tables"},
		{"duplicate table", func(c *Config) { c.Tables = append(c.Tables, TableName{"public", "orders"}) }, "listed twice"},
		{"negative interval", func(c *Config) { c.StandbyInterval = -time.Second }, "standby interval"},
		{"backoff order", func(c *Config) { c.BackoffMin, c.BackoffMax = time.Minute, time.Second }, "backoff max"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := good()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("error leaks the password: %v", err)
			}
		})
	}
}

func TestMapError(t *testing.T) {
	t.Parallel()
	cases := []struct {
		code, msg string
		want      error
		terminal  bool
		fix       string
	}{
		{"55000", "logical decoding requires wal_level >= logical", ErrWALLevel, true, "wal_level=logical"},
		{"42501", "must be superuser or replication role to start walsender", ErrReplicationPrivilege, true, `ALTER ROLE "app" REPLICATION`},
		{"42501", "permission denied to create replication slot", ErrReplicationPrivilege, true, "REPLICATION"},
		{"42501", "must be owner of table orders", ErrPermission, true, "owner"},
		{"53400", "all replication slots are in use", ErrSlotsExhausted, true, "max_replication_slots"},
		{"53300", "number of requested standby connections exceeds max_wal_senders (currently 10)", ErrWALSendersExhausted, false, "max_wal_senders"},
		{"42710", `replication slot "s" already exists`, ErrSlotExists, true, "drop it"},
		{"42704", `replication slot "s" does not exist`, ErrSlotMissing, true, "backfill"},
		{"42704", `publication "p" does not exist`, ErrPublicationMissing, true, "recreate the publication"},
		{"55000", `can no longer get changes from replication slot "s"`, ErrSlotInvalidated, true, "recreate"},
		{"42P01", `relation "public.nope" does not exist`, ErrTableMissing, true, "create the table"},
		{"57P01", "terminating connection due to administrator command", nil, false, ""},
		{"57P03", "the database system is starting up", nil, false, ""},
		{"28P01", "password authentication failed for user", nil, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.code+" "+tc.msg, func(t *testing.T) {
			t.Parallel()
			pgErr := &pgconn.PgError{Code: tc.code, Message: tc.msg}
			err := mapError(pgErr, "s", "p", "app")
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !errors.Is(err, pgErr) {
				t.Errorf("cause lost: %v", err)
			}
			if got := IsTerminal(err); got != tc.terminal {
				t.Errorf("IsTerminal = %t, want %t", got, tc.terminal)
			}
			if !strings.Contains(err.Error(), tc.fix) {
				t.Errorf("message %q does not name the fix %q", err, tc.fix)
			}
		})
	}
	t.Run("slot busy", func(t *testing.T) {
		t.Parallel()
		err := mapError(&pgconn.PgError{Code: "55006", Message: `replication slot "s" is active for PID 4242`}, "s", "p", "app")
		busy, ok := errors.AsType[*slotBusyError](err)
		if !ok || busy.pid != 4242 {
			t.Fatalf("got %v", err)
		}
		if IsTerminal(err) {
			t.Errorf("a busy slot is retried first")
		}
		term := busy.terminal(30 * time.Second)
		if !errors.Is(term, ErrSlotInUse) || !IsTerminal(term) || !strings.Contains(term.Error(), "4242") ||
			!strings.Contains(term.Error(), "still after 30s") {
			t.Errorf("terminal form %v", term)
		}
	})
	t.Run("database not accepting connections", func(t *testing.T) {
		t.Parallel()
		pgErr := &pgconn.PgError{Severity: "FATAL", Code: "55000", Message: `database "shop" is not currently accepting connections`}
		// pgconn.ConnectError cannot be built here; while connecting it is
		// retried (integration TestFaultTargetUnavailable).
		if !IsTerminal(pgErr) {
			t.Errorf("a 55000 outside connect stays terminal")
		}
	})
	t.Run("network", func(t *testing.T) {
		t.Parallel()
		if IsTerminal(errors.New("read tcp: connection reset by peer")) {
			t.Errorf("network errors are retried")
		}
	})
}

func TestDiffRelations(t *testing.T) {
	t.Parallel()
	base := &Relation{ID: 1, Namespace: "public", Name: "t", ReplicaIdentity: IdentityDefault, Columns: []Column{
		{Name: "id", Type: 23, TypeMod: -1, Key: true}, {Name: "a", Type: 25, TypeMod: -1}, {Name: "b", Type: 25, TypeMod: -1},
	}}
	with := func(f func(r *Relation)) *Relation {
		r := *base
		r.Columns = append([]Column(nil), base.Columns...)
		f(&r)
		return &r
	}
	cases := []struct {
		name  string
		new   *Relation
		check func(*SchemaChange) bool
	}{
		{"same", with(func(*Relation) {}), func(sc *SchemaChange) bool { return sc == nil }},
		{"added", with(func(r *Relation) { r.Columns = append(r.Columns, Column{Name: "c", Type: 20}) }),
			func(sc *SchemaChange) bool { return len(sc.Added) == 1 && sc.Added[0].Name == "c" && !sc.Reordered }},
		{"dropped", with(func(r *Relation) { r.Columns = r.Columns[:2] }),
			func(sc *SchemaChange) bool { return len(sc.Dropped) == 1 && sc.Dropped[0].Name == "b" }},
		{"retyped", with(func(r *Relation) { r.Columns[1].Type = 1043; r.Columns[1].TypeMod = 24 }),
			func(sc *SchemaChange) bool { return len(sc.Retyped) == 1 && sc.Retyped[0].New.Type == 1043 }},
		{"renamed column", with(func(r *Relation) { r.Columns[2].Name = "bb" }),
			func(sc *SchemaChange) bool { return len(sc.Added) == 1 && len(sc.Dropped) == 1 }},
		{"key", with(func(r *Relation) { r.Columns[1].Key = true }), func(sc *SchemaChange) bool { return sc.KeyChanged }},
		{"identity", with(func(r *Relation) { r.ReplicaIdentity = IdentityFull }), func(sc *SchemaChange) bool { return sc.IdentityChanged }},
		{"table renamed", with(func(r *Relation) { r.Name = "u" }), func(sc *SchemaChange) bool { return sc.Renamed }},
		{"reordered", with(func(r *Relation) { r.Columns[1], r.Columns[2] = r.Columns[2], r.Columns[1] }),
			func(sc *SchemaChange) bool { return sc.Reordered && len(sc.Added) == 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if sc := diffRelations(base, tc.new); !tc.check(sc) {
				t.Errorf("diff %+v", sc)
			}
		})
	}
}

func TestReportable(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                                   string
		acked, start, delivered, reported, wal wal.LSN
		inTxn                                  bool
		want                                   wal.LSN
		limit                                  wal.LSN // 0: not held
	}{
		{"nothing yet: start", 0, 100, 0, 0, 0, false, 100, 0},
		{"acked below delivered: acked", 150, 100, 200, 0, 500, false, 150, 0},
		{"all acked, idle: server position", 200, 100, 200, 0, 500, false, 500, 0},
		{"all acked, transaction open: acked", 200, 100, 200, 0, 500, true, 200, 0},
		{"ack beyond delivered is clamped", 900, 100, 200, 0, 0, false, 200, 0},
		{"never backwards", 150, 100, 200, 180, 0, false, 180, 0},
		{"idle with nothing delivered", 0, 100, 0, 0, 300, false, 300, 0},
		{"pending, server far ahead", 100, 100, 200, 0, 1000, false, 100, 0},
		{"held below the ack", 200, 100, 200, 0, 0, true, 170, 170},
		{"held below the server's position when idle", 200, 100, 200, 0, 500, false, 300, 300},
		{"held above: unchanged", 150, 100, 200, 0, 500, false, 150, 400},
		{"held, never backwards", 150, 100, 200, 180, 0, false, 180, 120},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			limit := tc.limit
			if limit == 0 {
				limit = math.MaxUint64
			}
			if got := reportable(tc.acked, tc.start, tc.delivered, tc.reported, tc.wal, tc.inTxn, limit); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	b := backoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	var last time.Duration
	for i := range 40 {
		d := b.next()
		ceil := min(b.min<<i, b.max)
		if i > 30 {
			ceil = b.max
		}
		if d < ceil/2 || d > ceil {
			t.Fatalf("attempt %d: %s not in [%s, %s]", i, d, ceil/2, ceil)
		}
		last = d
	}
	if last < time.Second {
		t.Errorf("backoff did not reach its cap: %s", last)
	}
	b.reset()
	if d := b.next(); d > b.min {
		t.Errorf("after reset: %s", d)
	}
}

func TestCheckServerVersion(t *testing.T) {
	t.Parallel()
	if err := checkServerVersion(150004, "15.4"); err != nil {
		t.Errorf("15.4: %v", err)
	}
	if err := checkServerVersion(140000, "14.0"); err != nil {
		t.Errorf("14.0: %v", err)
	}
	err := checkServerVersion(130012, "13.12")
	if !errors.Is(err, ErrServerVersion) || !strings.Contains(err.Error(), "13.12") || !strings.Contains(err.Error(), "PostgreSQL 14") {
		t.Errorf("13.12: %v, want ErrServerVersion naming the version and the fix", err)
	}
}

// TestAppendChange: transactions assembled one after the other share the
// change slab without touching each other's changes, across full chunks
// and when a transaction starts with changes of its own (carried schema
// changes); a consumer's append copies.
func TestAppendChange(t *testing.T) {
	a := newAssembler(1<<30, 1<<30, nil)
	var txns []*Txn
	want := map[*Txn][]wal.LSN{}
	for i, n := range []int{3, 0, 1, slabChanges - 3, slabChanges + 7, 5, 2*slabChanges + 1, 1} {
		tx := &Txn{}
		if i == 5 {
			tx.Changes = []Change{{Kind: ChangeSchema, LSN: 1}} // not from the slab
			want[tx] = append(want[tx], 1)
		}
		for j := range n {
			lsn := wal.LSN(i*1_000_000 + j + 2)
			a.appendChange(tx, Change{Kind: ChangeInsert, LSN: lsn})
			want[tx] = append(want[tx], lsn)
		}
		txns = append(txns, tx)
	}
	if more := append(txns[0].Changes, Change{LSN: 999}); &more[0] == &txns[0].Changes[0] {
		t.Fatal("an append to a transaction's changes wrote into the slab")
	}
	for i, tx := range txns {
		if len(tx.Changes) != len(want[tx]) || cap(tx.Changes) != len(tx.Changes) {
			t.Fatalf("txn %d: %d changes (cap %d), want %d", i, len(tx.Changes), cap(tx.Changes), len(want[tx]))
		}
		for j, c := range tx.Changes {
			if c.LSN != want[tx][j] {
				t.Fatalf("txn %d change %d: LSN %d, want %d", i, j, c.LSN, want[tx][j])
			}
		}
	}
}

// TestArenaRelease: a chunk's memory is cut again once every chunk cut
// from its arena is released and the assembler moved on, never while a
// chunk still holds it; releasing twice changes nothing.
func TestArenaRelease(t *testing.T) {
	a := newAssembler(1<<30, 1<<30, nil)
	fill := func(tx *Txn, rows int, tag byte) {
		a.cur = tx
		for range rows {
			data := a.copyData(bytes.Repeat([]byte{tag}, 1000))
			vals := a.allocValues(8)
			for i := range vals {
				vals[i] = Value{Kind: ValueText, Data: data[i*100 : i*100+100]}
			}
			a.appendChange(tx, Change{Kind: ChangeInsert, New: vals})
		}
	}
	intact := func(tx *Txn, tag byte) {
		t.Helper()
		for i, c := range tx.Changes {
			for _, v := range c.New {
				if v.Kind != ValueText || !bytes.Equal(v.Data, bytes.Repeat([]byte{tag}, 100)) {
					t.Fatalf("chunk %c change %d: value %q, want %c's", tag, i, v.Data, tag)
				}
			}
		}
	}
	first, second := &Txn{}, &Txn{}
	fill(first, 200, 'a') // several arenas: 64 KB of data each
	fill(second, 10, 'b') // shares first's last arena
	if len(first.arenas) < 3 || second.arenas[0] != first.arenas[len(first.arenas)-1] {
		t.Fatalf("first holds %d arenas, second %d (sharing: %v)", len(first.arenas), len(second.arenas), second.arenas[0] == first.arenas[len(first.arenas)-1])
	}
	freed := map[*arena]bool{}
	for _, ar := range first.arenas[:len(first.arenas)-1] {
		freed[ar] = true
	}
	first.Release()
	first.Release()
	if first.Changes != nil {
		t.Fatal("a released chunk keeps its changes")
	}
	third := &Txn{}
	fill(third, 200, 'c')
	reused := 0
	for _, ar := range third.arenas {
		if freed[ar] {
			reused++
		}
		if ar == second.arenas[0] && ar != third.arenas[0] {
			t.Fatal("an arena second holds was handed out again")
		}
	}
	if reused == 0 {
		t.Fatalf("none of the %d arenas released was cut again", len(freed))
	}
	intact(second, 'b')
	intact(third, 'c')
	held := append(slices.Clone(third.arenas), second.arenas...)
	second.Release()
	third.Release()
	for _, ar := range held {
		if n := ar.refs.Load(); n < 0 {
			t.Fatalf("an arena has %d references", n)
		}
	}
}
