package cdc

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Holder is the server process that holds a replication slot: the
// walsender streaming from it, or the one that created it and still keeps
// the snapshot it exported open (a backfill loading from that snapshot;
// the slot itself is inactive meanwhile). Both end with their client's
// connection, so a holder is a live consumer until the server notices that
// its client is gone.
type Holder struct {
	// PID is the walsender's process ID on the server.
	PID int
	// Streaming is true for the walsender streaming from the slot, false
	// for the one that created it and holds its exported snapshot.
	Streaming bool
	// ClientAddr is the address the holder connected from ("" over a Unix
	// socket, or when the role may not see it); ApplicationName is its
	// application_name ("fkmat-cdc" unless the connection string sets it).
	ClientAddr      string
	ApplicationName string
	// Since is when the holder's connection started (zero when hidden).
	Since time.Time
}

// What says what the holder does, for messages: "streams from" or "is
// backfilling from".
func (h Holder) What() string {
	if h.Streaming {
		return "streams from"
	}
	return "is backfilling from"
}

// BackfillSlot is the name of the slot a backfill of slot loads from: the
// slot itself takes its position only once the targets hold the snapshot
// (Client.CopySlot), so that it never claims what they do not reflect.
// The creator of either one holds slot (ReadHolder).
func BackfillSlot(slot string) string { return DerivedSlot(slot, "_backfill") }

// DerivedSlot is the name of a second slot of slot's: slot with suffix, the
// end of slot replaced by its hash when that is longer than Postgres's 63
// bytes.
func DerivedSlot(slot, suffix string) string {
	if len(slot)+len(suffix) <= 63 {
		return slot + suffix
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(slot))
	return fmt.Sprintf("%s_%08x%s", slot[:63-len(suffix)-9], h.Sum32(), suffix)
}

// ReadHolder returns the holder of the named slot on conn; ok is false when
// nobody holds it (or it does not exist). A creator is found by its last
// command, which pg_stat_activity.query shows for a walsender, and only
// when the role may read it (the same role, or one with
// pg_read_all_stats).
func ReadHolder(ctx context.Context, conn *pgx.Conn, slot string) (h Holder, ok bool, err error) {
	var addr, app *string
	var since *time.Time
	err = conn.QueryRow(ctx, `
		SELECT w.pid, w.streaming, host(a.client_addr), a.application_name, a.backend_start
		FROM (SELECT active_pid AS pid, true AS streaming FROM pg_replication_slots
				WHERE slot_name = $1 AND active_pid IS NOT NULL
			UNION ALL
			SELECT pid, false FROM pg_stat_activity
				WHERE backend_type = 'walsender' AND (starts_with(query, $2) OR starts_with(query, $3))) AS w
		LEFT JOIN pg_stat_activity a ON a.pid = w.pid
		ORDER BY w.streaming DESC LIMIT 1`,
		slot, "CREATE_REPLICATION_SLOT "+quoteIdent(slot)+" ", "CREATE_REPLICATION_SLOT "+quoteIdent(BackfillSlot(slot))+" ",
	).Scan(&h.PID, &h.Streaming, &addr, &app, &since)
	if errors.Is(err, pgx.ErrNoRows) {
		return Holder{}, false, nil
	}
	if err != nil {
		return Holder{}, false, fmt.Errorf("read the holder of replication slot %q: %w", slot, err)
	}
	if addr != nil {
		h.ClientAddr = *addr
	}
	if app != nil {
		h.ApplicationName = *app
	}
	if since != nil {
		h.Since = *since
	}
	return h, true, nil
}

// Holder returns the slot's holder; ok is false when nobody holds it.
func (c *Client) Holder(ctx context.Context) (Holder, bool, error) {
	conn, err := c.connect(ctx)
	if err != nil {
		return Holder{}, false, err
	}
	defer closeConn(conn)
	return ReadHolder(ctx, conn, c.cfg.Slot)
}
