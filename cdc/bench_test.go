package cdc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgproto3"
)

// BenchmarkDrain500k fills a slot with 500k row changes (50 transactions of
// 10k inserts) and measures how fast a Stream drains it, next to
// pg_logical_slot_get_binary_changes decoding the same WAL on the server
// from a second slot created at the same point. decode_efficiency is the
// ratio of the two rates (1.0 = the stream costs no more than the server's
// own decoding into a tuplestore).
//
// The SQL function pays no per-message network cost, while a walsender
// sends (and flushes) every change as its own message, so the ratio is far
// below 1 even for a client that does nothing. A third slot measures that
// floor: raw_changes/s counts the messages of a bare receive loop on a
// replication connection (no decoding, no delivery), and stream_vs_raw is
// the Stream's rate relative to it, i.e. what decoding and delivery cost.
//
// Run with: go test ./cdc -run '^$' -bench Drain500k -benchtime 1x
func BenchmarkDrain500k(b *testing.B) {
	const (
		txns    = 50
		perTxn  = 10_000
		changes = txns * perTxn
	)
	var cdcTotal, sqlTotal, rawTotal time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		tc, c := setup(b, `CREATE TABLE orders (id int PRIMARY KEY, customer_id int, amount numeric(10,2), status text, note text)`,
			[]TableName{{Name: "orders"}}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		if err := c.EnsurePublication(ctx); err != nil {
			b.Fatal(err)
		}
		slot, err := c.CreateSlot(ctx, false)
		if err != nil {
			b.Fatal(err)
		}
		sqlSlot, rawSlot := tc.Slot+"_sql", tc.Slot+"_raw"
		for _, name := range []string{sqlSlot, rawSlot} {
			if _, err := tc.Pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name); err != nil {
				b.Fatal(err)
			}
		}
		for t := range txns {
			_, err := tc.Pool.Exec(ctx, fmt.Sprintf(`INSERT INTO orders SELECT i, i %% 1000, i / 100.0, 'new', md5(i::text)
				FROM generate_series(%d, %d) i`, t*perTxn+1, (t+1)*perTxn))
			if err != nil {
				b.Fatal(err)
			}
		}
		if _, err := tc.Pool.Exec(ctx, `CHECKPOINT`); err != nil {
			b.Fatal(err)
		}

		b.StartTimer()
		start := time.Now()
		var n int
		err = tc.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE get_byte(data, 0) = ascii('I'))
			FROM pg_logical_slot_get_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', $2)`,
			sqlSlot, quoteIdent(tc.Publication)).Scan(&n)
		if err != nil {
			b.Fatal(err)
		}
		sqlTotal += time.Since(start)
		if n != changes {
			b.Fatalf("sql decoded %d inserts, want %d", n, changes)
		}

		start = time.Now()
		if n := rawDrain(b, ctx, c, rawSlot, changes); n != changes {
			b.Fatalf("raw loop saw %d inserts, want %d", n, changes)
		}
		rawTotal += time.Since(start)

		start = time.Now()
		s := c.NewStream(slot.ConsistentPoint)
		sctx, stop := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- s.Run(sctx) }()
		got := 0
		for got < changes {
			txn, err := s.Next(ctx)
			if err != nil {
				b.Fatal(err)
			}
			got += len(txn.Changes)
			if txn.Final {
				s.Ack(txn.EndLSN)
			}
		}
		cdcTotal += time.Since(start)
		b.StopTimer()
		stop()
		<-errc
		for _, name := range []string{sqlSlot, rawSlot} {
			if _, err := tc.Pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name); err != nil {
				b.Fatal(err)
			}
		}
		cancel()
		b.StartTimer()
	}
	cdcRate := float64(changes*b.N) / cdcTotal.Seconds()
	sqlRate := float64(changes*b.N) / sqlTotal.Seconds()
	rawRate := float64(changes*b.N) / rawTotal.Seconds()
	b.ReportMetric(cdcRate, "cdc_changes/s")
	b.ReportMetric(sqlRate, "sql_changes/s")
	b.ReportMetric(cdcRate/sqlRate, "decode_efficiency")
	b.ReportMetric(rawRate, "raw_changes/s")
	b.ReportMetric(cdcRate/rawRate, "stream_vs_raw")
}

// rawDrain receives from slot until it has seen want insert messages and
// returns how many it saw: the cost of the replication protocol alone.
func rawDrain(b *testing.B, ctx context.Context, c *Client, slot string, want int) int {
	conn, err := c.connectReplication(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer closeConn(conn)
	err = pglogrepl.StartReplication(ctx, conn, quoteIdent(slot), 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(quoteIdent(c.cfg.Publication))},
	})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for n < want {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if cd, ok := msg.(*pgproto3.CopyData); ok && len(cd.Data) > 25 && cd.Data[0] == 'w' && cd.Data[25] == 'I' {
			n++
		}
	}
	return n
}
