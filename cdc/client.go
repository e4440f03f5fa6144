package cdc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Client manages the publication and the replication slot of one source
// database and opens Streams on it. It holds no connection between calls and
// is safe for concurrent use.
type Client struct {
	cfg  Config
	log  *slog.Logger
	repl *pgconn.Config // replication connection settings
	user string
}

// TextSettings are the settings of the replication connection that shape
// the text form of values: dates in ISO form, intervals in Postgres's,
// floats exact.
var TextSettings = map[string]string{"DateStyle": "ISO, MDY", "IntervalStyle": "postgres", "extra_float_digits": "1"}

// New validates cfg and returns a Client.
func New(cfg Config) (*Client, error) {
	cfg.Tables = slices.Clone(cfg.Tables)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	repl, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("parse connection string: %w", redactErr(err))
	}
	repl.RuntimeParams["replication"] = "database"
	repl.BuildFrontend = coalescingFrontend
	// The connection that exports a snapshot sits idle in its transaction
	// while the backfill runs; slot creation waits for running transactions.
	repl.RuntimeParams["idle_in_transaction_session_timeout"] = "0"
	repl.RuntimeParams["statement_timeout"] = "0"
	if _, ok := repl.RuntimeParams["application_name"]; !ok {
		repl.RuntimeParams["application_name"] = "fkmat-cdc"
	}
	// pgoutput sends values in text form under the walsender's settings:
	// fix those that change how dates, intervals and floats read, as on
	// every other session of fkmat (whose DateStyle is ISO).
	for name, value := range TextSettings {
		repl.RuntimeParams[name] = value
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Client{cfg: cfg, log: log.With("component", "cdc"), repl: repl, user: repl.User}, nil
}

// Config returns the validated configuration, defaults applied.
func (c *Client) Config() Config { return c.cfg }

func (c *Client) mapErr(err error) error { return mapError(err, c.cfg.Slot, c.cfg.Publication, c.user) }

// connect opens a normal (SQL) connection to the source database.
func (c *Client) connect(ctx context.Context) (*pgx.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.cfg.ConnString)
	if err != nil {
		return nil, fmt.Errorf("connect to source database: %w", c.mapErr(err))
	}
	return conn, nil
}

// connectReplication opens a replication connection (replication=database).
func (c *Client) connectReplication(ctx context.Context) (*pgconn.PgConn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
	defer cancel()
	conn, err := pgconn.ConnectConfig(ctx, c.repl.Copy())
	if err != nil {
		return nil, fmt.Errorf("open replication connection: %w", c.mapErr(err))
	}
	return conn, nil
}

// closeConn closes a connection with a bounded wait, also when ctx is done.
func closeConn(conn interface{ Close(context.Context) error }) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if rc, ok := conn.(*pgconn.PgConn); ok {
		_ = terminate(ctx, rc)
		return
	}
	_ = conn.Close(ctx)
}

// terminate ends a replication connection and waits until the server has
// closed its end of it. The walsender has then exited: the slot it held is
// free (no "slot is active" for the next START_REPLICATION) and a snapshot
// it exported can no longer be imported. pgconn's Close does not wait.
func terminate(ctx context.Context, conn *pgconn.PgConn) error {
	hc, err := conn.Hijack()
	if err != nil { // busy or already closed: close without waiting
		return conn.Close(ctx)
	}
	defer func() { _ = hc.Conn.Close() }()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(5 * time.Second)
	}
	// Also replaces a deadline a cancelled context left on the connection.
	if err := hc.Conn.SetDeadline(deadline); err != nil {
		return err
	}
	hc.Frontend.Send(&pgproto3.Terminate{})
	if err := hc.Frontend.Flush(); err != nil {
		return err
	}
	// Read to the end: EOF (or a reset) is the server closing.
	if _, err := io.Copy(io.Discard, hc.Conn); errors.Is(err, os.ErrDeadlineExceeded) {
		return errors.New("the server did not close the replication connection in time")
	}
	return nil
}

func quoteIdent(s string) string { return pgx.Identifier{s}.Sanitize() }

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// Preflight checks what streaming needs and returns every problem found,
// joined, each naming its fix: wal_level, the REPLICATION privilege, the
// tables, a free slot (when the slot does not exist yet) or a usable slot.
func (c *Client) Preflight(ctx context.Context) error {
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	var errs []error
	var version int
	var versionText string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").Scan(&version, &versionText); err != nil {
		return fmt.Errorf("read the server's version: %w", err)
	}
	if err := checkServerVersion(version, versionText); err != nil {
		errs = append(errs, err)
	}
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return fmt.Errorf("read wal_level: %w", err)
	}
	if walLevel != "logical" {
		errs = append(errs, fmt.Errorf("%w (it is %q): set wal_level=logical in postgresql.conf and restart Postgres", ErrWALLevel, walLevel))
	}
	var canReplicate bool
	err = conn.QueryRow(ctx, "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&canReplicate)
	if err != nil {
		return fmt.Errorf("read role attributes: %w", err)
	}
	if !canReplicate {
		errs = append(errs, fmt.Errorf("%w: grant it with ALTER ROLE %s REPLICATION", ErrReplicationPrivilege, quoteIdent(c.user)))
	}
	for _, t := range c.cfg.Tables {
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", t.Sanitize()).Scan(&exists); err != nil {
			return fmt.Errorf("look up table %s: %w", t, err)
		}
		if !exists {
			errs = append(errs, fmt.Errorf("%w: %s; create it or fix the table list", ErrTableMissing, t))
		}
	}
	info, err := slotInfo(ctx, conn, c.cfg.Slot)
	if err != nil {
		return err
	}
	if info.Exists {
		if err := info.Usable(); err != nil {
			errs = append(errs, err)
		}
	} else {
		var free int
		err := conn.QueryRow(ctx, "SELECT current_setting('max_replication_slots')::int - (SELECT count(*) FROM pg_replication_slots)").Scan(&free)
		if err != nil {
			return fmt.Errorf("count replication slots: %w", err)
		}
		if free <= 0 {
			errs = append(errs, fmt.Errorf("%w: drop an unused slot or raise max_replication_slots and restart Postgres", ErrSlotsExhausted))
		}
	}
	return errors.Join(errs...)
}

// EnsurePublication creates the publication for exactly the configured
// tables, or alters an existing one whose table set or published operations
// differ. It is idempotent.
func (c *Client) EnsurePublication(ctx context.Context) error {
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	pub := quoteIdent(c.cfg.Publication)
	tables := make([]string, len(c.cfg.Tables))
	for i, t := range c.cfg.Tables {
		tables[i] = t.Sanitize()
	}
	list := strings.Join(tables, ", ")

	var allTables, ins, upd, del, trunc, viaRoot bool
	err = conn.QueryRow(ctx, `SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot
		FROM pg_publication WHERE pubname = $1`, c.cfg.Publication).Scan(&allTables, &ins, &upd, &del, &trunc, &viaRoot)
	if errors.Is(err, pgx.ErrNoRows) {
		// Changes of a partitioned table's partitions are published under
		// the table's own name, so that they reach the join that uses it.
		if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+list+" WITH (publish_via_partition_root = true)"); err != nil {
			return fmt.Errorf("create publication %q: %w", c.cfg.Publication, c.mapErr(err))
		}
		c.log.Info("created publication", "publication", c.cfg.Publication, "tables", len(tables))
		return nil
	}
	if err != nil {
		return fmt.Errorf("read publication %q: %w", c.cfg.Publication, err)
	}
	if allTables {
		return fmt.Errorf("%w: publication %q publishes all tables; drop it or configure another publication name", ErrPermission, c.cfg.Publication)
	}
	current, err := publishedTables(ctx, conn, c.cfg.Publication)
	if err != nil {
		return err
	}
	want := slices.Clone(c.cfg.Tables)
	slices.SortFunc(want, compareTables)
	if !slices.Equal(current, want) {
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+pub+" SET TABLE "+list); err != nil {
			return fmt.Errorf("alter publication %q: %w", c.cfg.Publication, c.mapErr(err))
		}
		c.log.Info("changed publication tables", "publication", c.cfg.Publication, "tables", len(tables), "before", len(current))
	}
	if !(ins && upd && del && trunc && viaRoot) {
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+pub+" SET (publish = 'insert, update, delete, truncate', publish_via_partition_root = true)"); err != nil {
			return fmt.Errorf("alter publication %q: %w", c.cfg.Publication, c.mapErr(err))
		}
	}
	return nil
}

func compareTables(a, b TableName) int {
	if c := strings.Compare(a.Schema, b.Schema); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}

func publishedTables(ctx context.Context, conn *pgx.Conn, pub string) ([]TableName, error) {
	rows, err := conn.Query(ctx, "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = $1", pub)
	if err != nil {
		return nil, fmt.Errorf("list tables of publication %q: %w", pub, err)
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (TableName, error) {
		var t TableName
		err := r.Scan(&t.Schema, &t.Name)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("list tables of publication %q: %w", pub, err)
	}
	slices.SortFunc(tables, compareTables)
	return tables, nil
}

// SlotInfo describes the replication slot as pg_replication_slots shows it.
type SlotInfo struct {
	// Exists is false when there is no slot of that name; the other fields
	// are then zero.
	Exists    bool
	Plugin    string
	SlotType  string
	Database  string
	Temporary bool
	// Active and ActivePID tell whether a walsender streams from the slot.
	Active    bool
	ActivePID int
	// RestartLSN is the oldest WAL the slot holds; ConfirmedFlushLSN is the
	// position the consumer acknowledged.
	RestartLSN        wal.LSN
	ConfirmedFlushLSN wal.LSN
	// WALStatus is reserved, extended, unreserved or lost.
	WALStatus string
	// SafeWALSize is the WAL that can still be written before the slot is
	// lost; -1 when unlimited (max_slot_wal_keep_size = -1).
	SafeWALSize int64
	// CurrentDatabase is the database this client is connected to.
	CurrentDatabase string
	// CurrentLSN is pg_current_wal_lsn() at the time of the query, and
	// LagBytes how far ConfirmedFlushLSN is behind it.
	CurrentLSN wal.LSN
	LagBytes   int64
	// RetainedBytes is the WAL the slot keeps on the server's disk
	// (CurrentLSN - RestartLSN).
	RetainedBytes int64
	name          string
}

// Usable returns nil when streaming can start from the slot, else an error
// naming the fix.
func (i SlotInfo) Usable() error {
	switch {
	case !i.Exists:
		return fmt.Errorf("%w: slot %q; create it (and backfill)", ErrSlotMissing, i.name)
	case i.SlotType != "logical" || i.Plugin != "pgoutput":
		return fmt.Errorf("%w: slot %q is a %s slot with plugin %q, not a pgoutput logical slot; configure another slot name or drop it",
			ErrSlotExists, i.name, i.SlotType, i.Plugin)
	case i.Database != i.CurrentDatabase:
		return fmt.Errorf("%w: slot %q belongs to database %q, not %q; configure another slot name",
			ErrSlotExists, i.name, i.Database, i.CurrentDatabase)
	case i.WALStatus == "lost":
		return fmt.Errorf("%w: slot %q lost WAL it needed (wal_status lost: it retained more than max_slot_wal_keep_size); "+
			"run fkmat backfill --force (it recreates the slot and rebuilds the joins), and raise max_slot_wal_keep_size "+
			"or keep the daemon from falling that far behind",
			ErrSlotInvalidated, i.name)
	}
	return nil
}

// SlotInfo reads the slot's state.
func (c *Client) SlotInfo(ctx context.Context) (SlotInfo, error) {
	conn, err := c.connect(ctx)
	if err != nil {
		return SlotInfo{}, err
	}
	defer closeConn(conn)
	return slotInfo(ctx, conn, c.cfg.Slot)
}

// ReadSlotInfo reads the state of the named slot on conn.
func ReadSlotInfo(ctx context.Context, conn *pgx.Conn, slot string) (SlotInfo, error) {
	return slotInfo(ctx, conn, slot)
}

func slotInfo(ctx context.Context, conn *pgx.Conn, slot string) (SlotInfo, error) {
	i := SlotInfo{name: slot}
	var restart, confirmed, current *string
	var plugin, slotType, database, walStatus *string
	var activePID *int32
	var safe *int64
	err := conn.QueryRow(ctx, `SELECT current_database(), pg_current_wal_lsn()::text, s.slot_name IS NOT NULL,
			s.plugin, s.slot_type, s.database, coalesce(s.temporary, false), coalesce(s.active, false), s.active_pid,
			s.restart_lsn::text, s.confirmed_flush_lsn::text, s.wal_status, s.safe_wal_size
		FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1`, slot).Scan(
		&i.CurrentDatabase, &current, &i.Exists, &plugin, &slotType, &database, &i.Temporary, &i.Active, &activePID,
		&restart, &confirmed, &walStatus, &safe)
	if err != nil {
		return SlotInfo{}, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	i.Plugin, i.SlotType, i.Database, i.WALStatus = deref(plugin), deref(slotType), deref(database), deref(walStatus)
	if activePID != nil {
		i.ActivePID = int(*activePID)
	}
	i.SafeWALSize = -1
	if safe != nil {
		i.SafeWALSize = *safe
	}
	for _, f := range []struct {
		s   *string
		dst *wal.LSN
	}{{restart, &i.RestartLSN}, {confirmed, &i.ConfirmedFlushLSN}, {current, &i.CurrentLSN}} {
		if f.s == nil {
			continue
		}
		if *f.dst, err = wal.ParseLSN(*f.s); err != nil {
			return SlotInfo{}, fmt.Errorf("read replication slot %q: %w", slot, err)
		}
	}
	if i.Exists && i.ConfirmedFlushLSN != 0 {
		i.LagBytes = int64(i.CurrentLSN) - int64(i.ConfirmedFlushLSN)
	}
	if i.Exists && i.RestartLSN != 0 {
		i.RetainedBytes = int64(i.CurrentLSN) - int64(i.RestartLSN)
	}
	return i, nil
}

// checkReady checks that the slot is usable and the publication exists.
func (c *Client) checkReady(ctx context.Context) (SlotInfo, error) {
	conn, err := c.connect(ctx)
	if err != nil {
		return SlotInfo{}, err
	}
	defer closeConn(conn)
	info, err := slotInfo(ctx, conn, c.cfg.Slot)
	if err != nil {
		return SlotInfo{}, err
	}
	if err := info.Usable(); err != nil {
		return SlotInfo{}, err
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_publication WHERE pubname = $1)", c.cfg.Publication).Scan(&exists); err != nil {
		return SlotInfo{}, fmt.Errorf("read publication %q: %w", c.cfg.Publication, err)
	}
	if !exists {
		return SlotInfo{}, fmt.Errorf("%w: publication %q; create it (EnsurePublication) before streaming", ErrPublicationMissing, c.cfg.Publication)
	}
	return info, nil
}

// Slot is a newly created replication slot.
type Slot struct {
	// Name is the slot name.
	Name string
	// ConsistentPoint is the LSN from which the slot streams every
	// committed transaction: start the Stream there after a backfill.
	ConsistentPoint wal.LSN
	// SnapshotName is the exported snapshot ("" unless asked for). Another
	// connection imports it with
	//
	//	BEGIN ISOLATION LEVEL REPEATABLE READ;
	//	SET TRANSACTION SNAPSHOT '<name>';
	//
	// and then sees the database exactly as of ConsistentPoint. It stays
	// valid until Release.
	SnapshotName string

	conn *pgconn.PgConn
}

// CreateSlot creates the pgoutput logical replication slot. With
// exportSnapshot, the replication connection that created it stays open and
// idle, keeping the snapshot importable, until Release; otherwise Release is
// a no-op. Creation waits for transactions running on the server to finish,
// so bound ctx accordingly. A slot of that name is ErrSlotExists.
func (c *Client) CreateSlot(ctx context.Context, exportSnapshot bool) (*Slot, error) {
	conn, err := c.connectReplication(ctx)
	if err != nil {
		return nil, fmt.Errorf("create replication slot %q: %w", c.cfg.Slot, err)
	}
	action := "NOEXPORT_SNAPSHOT"
	if exportSnapshot {
		action = "EXPORT_SNAPSHOT"
	}
	// pglogrepl.CreateReplicationSlot does not quote the name; the legacy
	// option syntax works on every server with logical replication.
	cmd := "CREATE_REPLICATION_SLOT " + quoteIdent(c.cfg.Slot) + " LOGICAL pgoutput " + action
	res, err := pglogrepl.ParseCreateReplicationSlot(conn.Exec(ctx, cmd))
	if err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("create replication slot %q: %w", c.cfg.Slot, c.mapErr(err))
	}
	lsn, err := wal.ParseLSN(res.ConsistentPoint)
	if err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("create replication slot %q: %w", c.cfg.Slot, err)
	}
	s := &Slot{Name: c.cfg.Slot, ConsistentPoint: lsn, SnapshotName: res.SnapshotName}
	if exportSnapshot {
		s.conn = conn
	} else {
		closeConn(conn)
	}
	c.log.Info("created replication slot", "slot", c.cfg.Slot, "consistent_point", lsn.String(), "snapshot", s.SnapshotName != "")
	return s, nil
}

// Release closes the connection that holds the exported snapshot; the
// snapshot cannot be imported afterwards (running imports keep it). The
// slot itself stays. Release is idempotent.
func (s *Slot) Release(ctx context.Context) error {
	if s.conn == nil {
		return nil
	}
	conn := s.conn
	s.conn = nil
	if err := terminate(ctx, conn); err != nil {
		return fmt.Errorf("release snapshot of slot %q: %w", s.Name, err)
	}
	return nil
}

// Teardown drops the slot and the publication; missing ones are fine. A slot
// that a process is streaming from is ErrSlotInUse: stop that process first.
func (c *Client) Teardown(ctx context.Context) error {
	if err := c.DropSlot(ctx); err != nil {
		return err
	}
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+quoteIdent(c.cfg.Publication)); err != nil {
		return fmt.Errorf("drop publication %q: %w", c.cfg.Publication, c.mapErr(err))
	}
	c.log.Info("dropped replication slot and publication", "slot", c.cfg.Slot, "publication", c.cfg.Publication)
	return nil
}

// DropSlot drops the slot; a missing one is fine. A slot that a process is
// streaming from is ErrSlotInUse: stop that process first.
func (c *Client) DropSlot(ctx context.Context) error {
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	return c.dropSlot(ctx, conn)
}

// CopySlot replaces the slot, which nobody may hold, by a copy of slot
// from (pg_copy_logical_replication_slot): the same restart and confirmed
// positions. from stays.
func (c *Client) CopySlot(ctx context.Context, from string) error {
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	if err := c.dropSlot(ctx, conn); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", from, c.cfg.Slot); err != nil {
		return fmt.Errorf("copy replication slot %q to %q: %w", from, c.cfg.Slot, c.mapErr(err))
	}
	c.log.Info("replication slot copied", "from", from, "slot", c.cfg.Slot)
	return nil
}

func (c *Client) dropSlot(ctx context.Context, conn *pgx.Conn) error {
	_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", c.cfg.Slot)
	if err != nil {
		err = c.mapErr(err)
		if busy, ok := errors.AsType[*slotBusyError](err); ok {
			err = busy.terminal(0)
		}
		return fmt.Errorf("drop replication slot %q: %w", c.cfg.Slot, err)
	}
	return nil
}

// terminateBackend ends a backend (our own stale walsender).
func (c *Client) terminateBackend(ctx context.Context, pid int) error {
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer closeConn(conn)
	if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		return fmt.Errorf("terminate backend %d: %w", pid, err)
	}
	return nil
}

// MinServerVersion is the oldest PostgreSQL the stream works with
// (server_version_num): pgoutput's messages option, which carries the row
// changes the consumer writes into the WAL itself (Embedded), is 14's.
const MinServerVersion = 140000

// checkServerVersion checks server_version_num against MinServerVersion.
func checkServerVersion(num int, text string) error {
	if num >= MinServerVersion {
		return nil
	}
	return fmt.Errorf("%w (it is %s): fkmat needs PostgreSQL 14 or newer, whose pgoutput sends logical decoding messages "+
		"(they carry the rows that partition changes move)", ErrServerVersion, text)
}
