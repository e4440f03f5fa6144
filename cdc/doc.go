// Package cdc turns a Postgres logical replication stream into typed, ordered
// row changes and carries the consumer's committed position back to the
// server. It knows nothing about joins.
//
// # Pieces
//
//   - Client (New): the publication (EnsurePublication), the slot
//     (CreateSlot with an optional exported snapshot, SlotInfo, Teardown),
//     Preflight checks, and Streams. Catalog work uses short-lived normal
//     connections; replication uses dedicated replication=database
//     connections.
//   - Stream (Client.NewStream): one goroutine, Run, owns the replication
//     connection. It reads with a deadline of one tick, answers keepalives,
//     sends standby status updates, decodes pgoutput and hands whole
//     transactions (or bounded chunks of huge ones) to the consumer through a
//     bounded queue (Next). The consumer reports durable progress with Ack.
//     Run reconnects with exponential backoff and jitter and stops only on
//     a terminal error (IsTerminal) or when its context ends.
//
// # Positions and acknowledgements
//
// A transaction is identified by its EndLSN, the position just after its
// commit record; that is the position a consumer acknowledges, stores as its
// checkpoint and restarts from.
//
//   - Ack(lsn) promises that every transaction with EndLSN <= lsn is durably
//     applied. The stream reports exactly that to the server as written,
//     flushed and applied position (so confirmed_flush_lsn never passes it),
//     never what was merely received.
//   - When nothing is pending (no transaction open, every delivered one
//     acknowledged), the stream reports the server's WAL position from its
//     keepalives instead: all WAL before it was decoded and held nothing
//     for the publication, so an idle slot holds no WAL back.
//   - A held stream (Hold) reports nothing beyond the highest Clear, acked
//     or idle: for a consumer that must check something the stream does
//     not carry (DDL) before a position may be confirmed.
//   - NewStream(checkpoint) delivers exactly the transactions with
//     EndLSN > checkpoint; transactions the server resends from before it
//     (after a crash, the slot's position can move back) are skipped.
//   - Within one Stream every transaction is delivered once. After a
//     reconnect the stream resumes after the last transaction it handed
//     over (not the last acknowledged one: the consumer still holds those),
//     so the only repetition is a chunked transaction cut off mid-way, which
//     is sent again from Chunk 0; a consumer drops held chunks whenever a
//     Txn with Chunk == 0 arrives.
//
// # Protocol version
//
// The stream uses pgoutput protocol version 1: the server sends each
// transaction whole, at commit, in commit order, and spills large ones to
// its own disk meanwhile. Version 2 would stream large transactions while
// they run, interleaved, with aborts of subtransactions announced only at
// the end: a correct consumer must then buffer every open transaction
// (unbounded memory, or a spill file of our own) or apply and undo. Version
// 1 with chunked delivery keeps memory bounded without either, at the price
// of latency for huge transactions. Stray stream messages (PG18 sends a
// stream abort to v1 consumers in some cases) and unknown kinds are ignored.
//
// # Values
//
// Column values keep their text form (Value.Data) and type OID; an unchanged
// TOASTed value in an UPDATE is ValueUnchanged, never NULL. The decoder
// checks every length and never panics on malformed input (FuzzDecode).
package cdc
