package cdc

import (
	"fmt"
	"strings"
	"testing"
)

func mkMessage(transactional bool, prefix string, content []byte) []byte {
	flags := byte(0)
	if transactional {
		flags = 1
	}
	b := cstr(be64([]byte{'M', flags}, 0x4242), prefix)
	return append(be32(b, uint32(len(content))), content...)
}

// TestEmbeddedChanges: the row changes of a transactional message with the
// slot's prefix are decoded in their transaction, in order, chunked like
// any others; messages of another prefix, or not transactional, are not
// ours; a message holding anything but types, relations and rows is a
// protocol error.
func TestEmbeddedChanges(t *testing.T) {
	t.Parallel()
	a := newAssembler(10, 1<<30, discardLogger())
	a.prefix = MessagePrefix("s1")
	var e Embedded
	e.Type(16400, "app", "mood")
	e.Relation(&Relation{ID: 9, Namespace: "public", Name: "orders", ReplicaIdentity: IdentityDefault,
		Columns: []Column{{Name: "id", Type: 23, TypeMod: -1, Key: true}, {Name: "mood", Type: 16400, TypeMod: -1}}})
	for i := range 22 {
		e.Update(9, []*string{sp(fmt.Sprint(i)), sp("happy")})
	}
	e.Delete(9, []*string{sp("100"), nil})
	e.Update(9, []*string{sp("101"), nil})
	other := mkMessage(true, MessagePrefix("s2"), e.Bytes())
	nonTxn := mkMessage(false, MessagePrefix("s1"), e.Bytes())
	msgs := [][]byte{mkBegin(0x500, 7), cstr(cstr(be32([]byte{'Y'}, 16400), "app"), "mood"), mkRelation(9, "orders", col{"id", 23, true}, col{"mood", 16400, false}),
		mkInsert(9, sp("1000"), sp("sad")), other, mkMessage(true, MessagePrefix("s1"), e.Bytes()), mkCommit(0x500, 0x530)}
	txns, _ := feed(t, a, msgs...)
	if len(txns) != 3 {
		t.Fatalf("got %d chunks, want 3", len(txns))
	}
	var changes []Change
	for i, txn := range txns {
		if txn.Chunk != i || txn.Final != (i == 2) || txn.CommitLSN != 0x500 {
			t.Fatalf("chunk %d: chunk=%d final=%t commit=%s", i, txn.Chunk, txn.Final, txn.CommitLSN)
		}
		changes = append(changes, txn.Changes...)
	}
	if len(changes) != 25 {
		t.Fatalf("got %d changes, want 25", len(changes))
	}
	if c := changes[0]; c.Kind != ChangeInsert || string(c.New[0].Data) != "1000" {
		t.Errorf("first change: %v %q, want the streamed insert", c.Kind, c.New[0].Data)
	}
	for i, c := range changes[1:23] {
		if c.Kind != ChangeUpdate || c.OldKind != OldNone || string(c.New[0].Data) != fmt.Sprint(i) || string(c.New[1].Data) != "happy" ||
			c.Relation.Columns[1].TypeName != "app.mood" {
			t.Errorf("change %d: %v %v %q %q type %q", i+1, c.Kind, c.OldKind, c.New[0].Data, c.New[1].Data, c.Relation.Columns[1].TypeName)
		}
	}
	if c := changes[23]; c.Kind != ChangeDelete || c.OldKind != OldKey || string(c.Old[0].Data) != "100" || c.Old[1].Kind != ValueNull {
		t.Errorf("delete: %v %v %q", c.Kind, c.OldKind, c.Old[0].Data)
	}
	if c := changes[24]; c.Kind != ChangeUpdate || c.New[1].Kind != ValueNull {
		t.Errorf("update with a NULL: %v %v", c.Kind, c.New[1].Kind)
	}
	// The same shape as the server's: no schema change, the same relation.
	if changes[0].Relation != changes[1].Relation {
		t.Error("the embedded relation replaced the server's identical one")
	}

	// Not ours: outside a transaction, or not transactional.
	if txns, _ := feed(t, a, nonTxn, mkBegin(0x600, 8), nonTxn, mkCommit(0x600, 0x630)); len(txns) != 0 {
		t.Errorf("a non-transactional message delivered %d chunks", len(txns))
	}

	var bad Embedded
	bad.buf = append(bad.buf, 0, 0, 0, 1, 'M')
	if _, err := a.handle(0x700, mkBegin(0x700, 9)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.handle(0x710, mkMessage(true, MessagePrefix("s1"), bad.Bytes())); err == nil || !strings.Contains(err.Error(), "message message") {
		t.Errorf("an embedded logical message: %v, want a protocol error", err)
	}
	if _, err := a.handle(0x720, mkMessage(true, MessagePrefix("s1"), []byte{0, 0, 0, 9, 'U'})); err == nil {
		t.Error("a truncated embedded message was accepted")
	}
}
