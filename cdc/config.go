package cdc

import (
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TableName is a schema-qualified table name. It is always quoted when it is
// put into SQL.
type TableName struct {
	Schema string
	Name   string
}

// String returns schema.name unquoted, for messages and logs.
func (t TableName) String() string { return t.Schema + "." + t.Name }

// Sanitize returns the quoted SQL form "schema"."name".
func (t TableName) Sanitize() string { return pgx.Identifier{t.Schema, t.Name}.Sanitize() }

// Defaults of Config.
const (
	DefaultStandbyInterval = 10 * time.Second
	DefaultChunkChanges    = 10_000
	DefaultChunkBytes      = 16 << 20
	// The queue holds about one batch of the pipeline's (10k changes).
	// Decoded changes are dense in pointers, and everything queued is
	// marked by each garbage collection: with 30k changes and 64 MB,
	// fkmat's live heap during W7's TPC-H refresh stream was 135-155 MB
	// against its 192 MB memory limit, and collecting took half its CPU.
	// At 10k and 16 MB it used 23% less CPU there, and W1's catch-up did
	// not slow down.
	DefaultQueueChanges    = 10_000
	DefaultQueueBytes      = 16 << 20
	DefaultConnectTimeout  = 30 * time.Second
	DefaultBackoffMin      = 500 * time.Millisecond
	DefaultBackoffMax      = 30 * time.Second
	DefaultSlotBusyTimeout = 30 * time.Second
	DefaultServerTimeout   = 2 * time.Minute
)

// Config configures a Client. Zero fields take the defaults above; call
// Validate (New does) before use.
type Config struct {
	// ConnString is the source database, as a URL or key=value string. The
	// replication connection is the same with replication=database added.
	ConnString string
	// Slot is the logical replication slot: lowercase letters, digits and
	// underscores, at most 63 bytes (Postgres' own rule).
	Slot string
	// Publication is the publication the slot streams; it is created by
	// EnsurePublication for exactly Tables.
	Publication string
	// Tables are the published tables. An empty Schema means "public".
	Tables []TableName
	// MessageSlot names the slot whose messages (MessagePrefix,
	// SwitchPrefix) the stream decodes; empty means Slot. A second slot
	// that follows the same changes (a rebuild's) names the first.
	MessageSlot string

	// StandbyInterval is the longest time between two standby status
	// updates to the server. Default 10s. Keep it well below the server's
	// wal_sender_timeout (default 60s).
	StandbyInterval time.Duration
	// ChunkChanges and ChunkBytes bound one delivered Txn: a transaction
	// with more changes, or more bytes, is delivered in several chunks. A
	// chunk is cut after the change that reaches either limit.
	ChunkChanges int
	ChunkBytes   int
	// QueueChanges and QueueBytes bound the chunks that wait for the
	// consumer, by their changes and their bytes, so that the stream keeps
	// reading while the consumer works on a batch: size them to hold at
	// least two of the consumer's batches. A chunk is queued when it fits,
	// or when the queue is empty. With the chunk limits they bound the
	// memory the stream holds: QueueChanges + ChunkChanges changes and
	// QueueBytes + ChunkBytes bytes.
	QueueChanges int
	QueueBytes   int
	// ConnectTimeout bounds connecting and starting replication.
	ConnectTimeout time.Duration
	// BackoffMin and BackoffMax bound the exponential, jittered delay
	// between reconnect attempts.
	BackoffMin time.Duration
	BackoffMax time.Duration
	// SlotBusyTimeout is how long the stream retries while the slot is
	// active in another process before it gives up with ErrSlotInUse. A
	// restarted consumer can find its own previous walsender still holding
	// the slot for a moment.
	SlotBusyTimeout time.Duration
	// ServerTimeout is how long the server may stay silent, although the
	// stream asks it for replies, before the connection is taken for dead
	// and replaced. A busy walsender can be silent for up to half its
	// wal_sender_timeout; keep this above that. Default 2m.
	ServerTimeout time.Duration

	// Logger receives the package's logs; nil discards them.
	Logger *slog.Logger
}

var slotNameRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// maxIdentLen is NAMEDATALEN-1: Postgres truncates longer identifiers.
const maxIdentLen = 63

func (c *Config) setDefaults() {
	setDur := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	setInt := func(n *int, def int) {
		if *n == 0 {
			*n = def
		}
	}
	setDur(&c.StandbyInterval, DefaultStandbyInterval)
	setDur(&c.ConnectTimeout, DefaultConnectTimeout)
	setDur(&c.BackoffMin, DefaultBackoffMin)
	setDur(&c.BackoffMax, DefaultBackoffMax)
	setDur(&c.SlotBusyTimeout, DefaultSlotBusyTimeout)
	setDur(&c.ServerTimeout, DefaultServerTimeout)
	setInt(&c.ChunkChanges, DefaultChunkChanges)
	setInt(&c.ChunkBytes, DefaultChunkBytes)
	setInt(&c.QueueChanges, DefaultQueueChanges)
	setInt(&c.QueueBytes, DefaultQueueBytes)
	for i := range c.Tables {
		if c.Tables[i].Schema == "" {
			c.Tables[i].Schema = "public"
		}
	}
}

// Validate applies the defaults and reports every invalid field, each with
// what to change.
func (c *Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.ConnString == "" {
		errs = append(errs, errors.New("connection string is empty; set the source database URL"))
	} else if _, err := pgconn.ParseConfig(c.ConnString); err != nil {
		errs = append(errs, fmt.Errorf("parse connection string: %w", redactErr(err)))
	}
	if !slotNameRE.MatchString(c.Slot) {
		errs = append(errs, fmt.Errorf("slot name %q is invalid; use 1-63 lowercase letters, digits or underscores", c.Slot))
	}
	if c.Publication == "" || len(c.Publication) > maxIdentLen {
		errs = append(errs, fmt.Errorf("publication name %q is invalid; use 1-63 bytes", c.Publication))
	}
	if len(c.Tables) == 0 {
		errs = append(errs, errors.New("no tables configured; list the tables to publish"))
	}
	seen := make(map[TableName]bool, len(c.Tables))
	for _, t := range c.Tables {
		switch {
		case t.Name == "" || len(t.Name) > maxIdentLen || len(t.Schema) > maxIdentLen:
			errs = append(errs, fmt.Errorf("table name %q is invalid; use 1-63 bytes per part", t))
		case seen[t]:
			errs = append(errs, fmt.Errorf("table %s is listed twice; list it once", t))
		}
		seen[t] = true
	}
	positive := []struct {
		name string
		ok   bool
	}{
		{"standby interval", c.StandbyInterval > 0},
		{"chunk changes", c.ChunkChanges > 0},
		{"chunk bytes", c.ChunkBytes > 0},
		{"queue changes", c.QueueChanges > 0},
		{"queue bytes", c.QueueBytes > 0},
		{"connect timeout", c.ConnectTimeout > 0},
		{"backoff min", c.BackoffMin > 0},
		{"backoff max", c.BackoffMax >= c.BackoffMin},
		{"slot busy timeout", c.SlotBusyTimeout > 0},
		{"server timeout", c.ServerTimeout > 0},
	}
	for _, p := range positive {
		if !p.ok {
			errs = append(errs, fmt.Errorf("%s must be positive (backoff max >= backoff min)", p.name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("validate cdc config: %w", err)
	}
	return nil
}

// tick is the receive deadline of the streaming loop: acknowledgements made
// while the server is quiet reach it within about one tick, so that
// confirmed_flush_lsn follows the target closely (a wake-up every 100 ms
// costs nothing measurable).
func (c *Config) tick() time.Duration {
	return min(max(c.StandbyInterval/10, 20*time.Millisecond), 100*time.Millisecond)
}
