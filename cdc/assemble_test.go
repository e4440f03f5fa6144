package cdc

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fkmat/fkmat/internal/wal"
)

var twoCols = []col{{"id", 23, true}, {"name", 25, false}}

// feed runs messages through the assembler at increasing LSNs and collects
// what it delivers.
func feed(t *testing.T, a *assembler, msgs ...[]byte) (txns []*Txn, empty []wal.LSN) {
	t.Helper()
	for i, m := range msgs {
		res, err := a.handle(wal.LSN(0x1000+i*0x10), m)
		if err != nil {
			t.Fatalf("message %d (%c): %v", i, m[0], err)
		}
		txns = append(txns, res.chunks...)
		if res.txn != nil {
			txns = append(txns, res.txn)
			if res.txn.Final {
				a.delivered()
			}
		}
		if res.emptyEnd != 0 {
			empty = append(empty, res.emptyEnd)
		}
	}
	return txns, empty
}

func inserts(relid uint32, from, n int) [][]byte {
	var msgs [][]byte
	for i := from; i < from+n; i++ {
		msgs = append(msgs, mkInsert(relid, sp(fmt.Sprint(i)), sp("x")))
	}
	return msgs
}

func TestAssemblerChunks(t *testing.T) {
	t.Parallel()
	a := newAssembler(10, 1<<30, discardLogger())
	msgs := [][]byte{mkBegin(0x500, 7), mkRelation(1, "t", twoCols...)}
	msgs = append(msgs, inserts(1, 0, 25)...)
	msgs = append(msgs, mkCommit(0x500, 0x530))
	txns, _ := feed(t, a, msgs...)
	if len(txns) != 3 {
		t.Fatalf("got %d chunks, want 3", len(txns))
	}
	id := 0
	for i, txn := range txns {
		wantLen := []int{10, 10, 5}[i]
		if txn.Chunk != i || txn.Xid != 7 || txn.CommitLSN != 0x500 || len(txn.Changes) != wantLen || txn.Final != (i == 2) {
			t.Errorf("chunk %d: chunk=%d xid=%d commit=%s changes=%d final=%t", i, txn.Chunk, txn.Xid, txn.CommitLSN, len(txn.Changes), txn.Final)
		}
		if txn.Final != (txn.EndLSN != 0) {
			t.Errorf("chunk %d: end lsn %s on final=%t", i, txn.EndLSN, txn.Final)
		}
		for _, c := range txn.Changes {
			if got := c.New[0].String(); got != fmt.Sprint(id) {
				t.Fatalf("change %d: id %s", id, got)
			}
			if c.New[0].Type != 23 || c.New[1].Type != 25 {
				t.Fatalf("value types %d %d", c.New[0].Type, c.New[1].Type)
			}
			id++
		}
	}
	if txns[2].EndLSN != 0x530 {
		t.Errorf("end lsn %s", txns[2].EndLSN)
	}
}

func TestAssemblerChunkBytes(t *testing.T) {
	t.Parallel()
	const limit = 4096
	a := newAssembler(1<<30, limit, discardLogger())
	big := string(make([]byte, 1000))
	msgs := [][]byte{mkBegin(0x500, 7), mkRelation(1, "t", twoCols...)}
	for i := range 20 {
		msgs = append(msgs, mkInsert(1, sp(fmt.Sprint(i)), sp(big)))
	}
	txns, _ := feed(t, a, append(msgs, mkCommit(0x500, 0x530))...)
	total := 0
	for _, txn := range txns {
		total += len(txn.Changes)
		// A chunk is cut after the change that reaches the limit.
		if txn.Bytes-1100 >= limit {
			t.Errorf("chunk %d holds %d bytes, limit %d", txn.Chunk, txn.Bytes, limit)
		}
	}
	if total != 20 || len(txns) < 5 {
		t.Errorf("%d changes in %d chunks", total, len(txns))
	}
}

func TestAssemblerSkipsBeforeResume(t *testing.T) {
	t.Parallel()
	a := newAssembler(100, 1<<20, discardLogger())
	a.reset(0x600)
	txns, empty := feed(t, a,
		mkBegin(0x5f0, 1), mkRelation(1, "t", twoCols...), mkInsert(1, sp("1"), nil), mkCommit(0x5f0, 0x600),
		// Commit record exactly at the resume position: not skipped.
		mkBegin(0x600, 2), mkInsert(1, sp("2"), nil), mkCommit(0x600, 0x620),
		// Nothing published in it.
		mkBegin(0x700, 3), mkCommit(0x700, 0x720),
	)
	if len(txns) != 1 || txns[0].Xid != 2 {
		t.Fatalf("delivered %v, want only xid 2", txns)
	}
	if len(empty) != 2 || empty[0] != 0x600 || empty[1] != 0x720 {
		t.Errorf("empty ends %v, want [0/600 0/720]", empty)
	}
	// The relation of the skipped transaction was still learned.
	if txns[0].Changes[0].Relation == nil || txns[0].Changes[0].Relation.Name != "t" {
		t.Errorf("relation not known after skipped transaction")
	}
}

func TestAssemblerSchemaChange(t *testing.T) {
	t.Parallel()
	a := newAssembler(100, 1<<20, discardLogger())
	three := append(append([]col(nil), twoCols...), col{"extra", 20, false})
	txns, _ := feed(t, a,
		mkBegin(0x500, 1), mkRelation(1, "t", twoCols...), mkInsert(1, sp("1"), nil), mkCommit(0x500, 0x510),
		mkBegin(0x600, 2), mkRelation(1, "t", three...), mkInsert(1, sp("2"), nil, sp("3")), mkCommit(0x600, 0x610),
	)
	if len(txns[0].Changes) != 1 {
		t.Fatalf("first sight of a relation must not be a schema change: %v", txns[0].Changes)
	}
	ch := txns[1].Changes
	if len(ch) != 2 || ch[0].Kind != ChangeSchema || ch[1].Kind != ChangeInsert {
		t.Fatalf("changes %v", ch)
	}
	sc := ch[0].Schema
	if len(sc.Added) != 1 || sc.Added[0].Name != "extra" || sc.Old != txns[0].Changes[0].Relation || sc.New != ch[1].Relation {
		t.Errorf("schema change %+v", sc)
	}
}

// A schema change inside a transaction cut off by a reconnect must be
// reported again when the transaction is resent; an unchanged relation
// announced again after a reconnect is no schema change.
func TestAssemblerSchemaChangeAfterReset(t *testing.T) {
	t.Parallel()
	a := newAssembler(1, 1<<20, discardLogger())
	three := append(append([]col(nil), twoCols...), col{"extra", 20, false})
	feed(t, a, mkBegin(0x500, 1), mkRelation(1, "t", twoCols...), mkInsert(1, sp("1"), nil), mkCommit(0x500, 0x510))
	// Chunk size 1: the schema change is delivered in chunk 0, then the
	// connection drops before the commit.
	cut, _ := feed(t, a, mkBegin(0x600, 2), mkRelation(1, "t", three...), mkInsert(1, sp("2"), nil, nil))
	if len(cut) == 0 || cut[0].Changes[0].Kind != ChangeSchema {
		t.Fatalf("cut chunks %v", cut)
	}
	a.reset(0x510)
	txns, _ := feed(t, a, mkBegin(0x600, 2), mkRelation(1, "t", three...), mkInsert(1, sp("2"), nil, nil), mkCommit(0x600, 0x610))
	if txns[0].Chunk != 0 || txns[0].Changes[0].Kind != ChangeSchema {
		t.Fatalf("resent transaction lacks the schema change: %+v", txns[0])
	}
	a.reset(0x610)
	txns, _ = feed(t, a, mkBegin(0x700, 3), mkRelation(1, "t", three...), mkInsert(1, sp("3"), nil, nil), mkCommit(0x700, 0x710))
	for _, txn := range txns {
		for _, c := range txn.Changes {
			if c.Kind != ChangeInsert {
				t.Fatalf("unchanged relation after reconnect gave %s", c.Kind)
			}
		}
	}
}

func TestAssemblerTruncate(t *testing.T) {
	t.Parallel()
	a := newAssembler(100, 1<<20, discardLogger())
	txns, _ := feed(t, a, mkBegin(0x500, 1), mkRelation(1, "a", twoCols...), mkRelation(2, "b", twoCols...),
		mkTruncate(truncateCascade, 1, 2), mkCommit(0x500, 0x510))
	tr := txns[0].Changes[0].Truncate
	if tr == nil || len(tr.Relations) != 2 || tr.Relations[0].Name != "a" || tr.Relations[1].Name != "b" || !tr.Cascade || tr.RestartIdentity {
		t.Fatalf("truncate %+v", tr)
	}
}

func TestAssemblerProtocolErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		msgs [][]byte
	}{
		{"insert outside transaction", [][]byte{mkRelation(1, "t", twoCols...), mkInsert(1, sp("1"), nil)}},
		{"unknown relation", [][]byte{mkBegin(0x500, 1), mkInsert(9, sp("1"), nil)}},
		{"tuple width", [][]byte{mkBegin(0x500, 1), mkRelation(1, "t", twoCols...), mkInsert(1, sp("1"))}},
		{"nested begin", [][]byte{mkBegin(0x500, 1), mkBegin(0x600, 2)}},
		{"commit outside transaction", [][]byte{mkCommit(0x500, 0x510)}},
		{"truncate of unknown relation", [][]byte{mkBegin(0x500, 1), mkTruncate(0, 5)}},
		{"garbage row", [][]byte{mkBegin(0x500, 1), {'I', 0, 0}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a := newAssembler(100, 1<<20, discardLogger())
			var err error
			for _, m := range tc.msgs {
				if _, err = a.handle(0x100, m); err != nil {
					break
				}
			}
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("got %v, want ErrProtocol", err)
			}
		})
	}
}

func TestAssemblerIgnores(t *testing.T) {
	t.Parallel()
	a := newAssembler(100, 1<<20, discardLogger())
	streamAbort := be32(be32([]byte{'A'}, 5), 6)
	logical := cstr(be64([]byte{'M', 1}, 0x500), "p")
	logical = append(be32(logical, 2), "hi"...)
	txns, _ := feed(t, a, mkBegin(0x500, 1), streamAbort, logical, mkRelation(1, "t", twoCols...),
		mkInsert(1, sp("1"), sp("\x00u")), []byte{'Z'}, mkCommit(0x500, 0x510), streamAbort)
	if len(txns) != 1 || len(txns[0].Changes) != 1 {
		t.Fatalf("got %v", txns)
	}
	if v := txns[0].Changes[0].New[1]; v.Kind != ValueUnchanged || v.Data != nil {
		t.Errorf("unchanged toast decoded as %+v", v)
	}
}

// A final chunk carrying a schema change that could not be handed over (the
// connection failed while it waited) must report the change again when the
// transaction is resent.
func TestAssemblerSchemaChangeUndelivered(t *testing.T) {
	t.Parallel()
	a := newAssembler(100, 1<<20, discardLogger())
	three := append(append([]col(nil), twoCols...), col{"extra", 20, false})
	feed(t, a, mkBegin(0x500, 1), mkRelation(1, "t", twoCols...), mkInsert(1, sp("1"), nil), mkCommit(0x500, 0x510))
	for _, m := range [][]byte{mkBegin(0x600, 2), mkRelation(1, "t", three...), mkInsert(1, sp("2"), nil, nil)} {
		if _, err := a.handle(0x600, m); err != nil {
			t.Fatal(err)
		}
	}
	res, err := a.handle(0x610, mkCommit(0x600, 0x610))
	if err != nil || res.txn == nil || res.txn.Changes[0].Kind != ChangeSchema {
		t.Fatalf("final chunk %+v, %v", res.txn, err)
	}
	// Not delivered: no a.delivered() call.
	a.reset(0x510)
	txns, _ := feed(t, a, mkBegin(0x600, 2), mkRelation(1, "t", three...), mkInsert(1, sp("2"), nil, nil), mkCommit(0x600, 0x610))
	if txns[0].Changes[0].Kind != ChangeSchema {
		t.Fatalf("resent transaction lacks the schema change: %+v", txns[0].Changes)
	}
}
