package cdc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/internal/wal"
)

var update = flag.Bool("update", false, "capture pgoutput messages from a real server into testdata and rewrite the golden files")

const (
	capturedFile = "testdata/pgoutput.msgs"
	goldenFile   = "testdata/pgoutput.golden"
)

// A recorded message. Kind "L" was captured from the server, "S" is
// synthetic but valid (kinds the decoder must skip), "X" is malformed and
// must decode to an error.
type recorded struct {
	kind string
	lsn  wal.LSN
	data []byte
	note string
}

// TestGolden decodes the recorded pgoutput messages and compares the decoded
// text form with the golden file. With -update it first records the messages
// from a real server (the workload below covers every message kind).
func TestGolden(t *testing.T) {
	if *update {
		msgs := captureMessages(t)
		msgs = append(msgs, syntheticMessages()...)
		if err := writeRecorded(capturedFile, msgs); err != nil {
			t.Fatal(err)
		}
	}
	msgs, err := readRecorded(capturedFile)
	if err != nil {
		t.Fatal(err)
	}
	got := renderGolden(t, msgs)
	if *update {
		if err := os.WriteFile(goldenFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("decoded messages differ from %s (run with -update after checking):\n%s", goldenFile, lineDiff(string(want), got))
	}
}

// goldenWorkload exercises every message kind; each entry is one transaction.
var goldenWorkload = [][]string{
	{`INSERT INTO customers VALUES (1, 'Ada', 'gold'), (2, 'Bob', NULL)`,
		`INSERT INTO orders VALUES (10, 1, 9.99, 'first', 'happy')`},
	// Update without key change: new tuple only.
	{`UPDATE orders SET amount = 10.50 WHERE id = 10`},
	// Update of the key: old key tuple 'K'.
	{`UPDATE orders SET id = 11 WHERE id = 10`},
	// Delete under REPLICA IDENTITY DEFAULT: key only.
	{`DELETE FROM customers WHERE id = 2`},
	// A TOASTed value (incompressible enough to move out of line) ...
	{`INSERT INTO orders SELECT 12, 1, 1.00, string_agg(md5(i::text), ''), 'sad' FROM generate_series(1, 300) i`},
	// ... unchanged in an update: 'u'.
	{`UPDATE orders SET amount = 2.00 WHERE id = 12`},
	// REPLICA IDENTITY FULL: old tuple 'O', with an unchanged TOASTed value.
	{`INSERT INTO audit SELECT 1, 0, string_agg(md5(i::text), '') FROM generate_series(1, 300) i`},
	{`UPDATE audit SET n = 1 WHERE id = 1`},
	{`DELETE FROM audit WHERE id = 1`},
	// A logical decoding message inside a transaction.
	{`SELECT pg_logical_emit_message(true, 'fkmat', 'hello')`, `INSERT INTO customers VALUES (3, 'Cy', 'silver')`},
	// TRUNCATE of two tables in one statement.
	{`TRUNCATE customers, orders RESTART IDENTITY CASCADE`},
	// Schema changes between transactions.
	{`ALTER TABLE customers ADD COLUMN region text`},
	{`INSERT INTO customers VALUES (4, 'Di', 'gold', 'eu')`},
	{`ALTER TABLE customers DROP COLUMN tier`},
	{`INSERT INTO customers VALUES (5, 'Ed', 'us')`},
	{`ALTER TABLE customers ALTER COLUMN name TYPE varchar(20)`},
	{`INSERT INTO customers VALUES (6, 'Flo', 'ap')`},
	// A transaction from a replication origin.
	{`SELECT pg_replication_origin_session_setup('fkmat_golden')`},
	{`SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2024-01-02 03:04:05+00')`, `INSERT INTO customers VALUES (7, 'Gil', 'eu')`},
	{`SELECT pg_replication_origin_session_reset()`},
}

const goldenSchema = `
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE customers (id int PRIMARY KEY, name text, tier text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, amount numeric(10,2), note text, feel mood);
CREATE TABLE audit (id int PRIMARY KEY, n int, payload text);
ALTER TABLE audit REPLICA IDENTITY FULL;
`

func captureMessages(t *testing.T) []recorded {
	tc := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, tc.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	must := func(q string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	must(goldenSchema)
	must(`CREATE PUBLICATION ` + quoteIdent(tc.Publication) + ` FOR TABLE customers, orders, audit`)
	must(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, tc.Slot)
	must(`SELECT pg_replication_origin_create('fkmat_golden')`)
	t.Cleanup(func() {
		_, _ = tc.Env.Admin().Exec(context.Background(), `SELECT pg_replication_origin_drop('fkmat_golden')`)
	})
	for _, txn := range goldenWorkload {
		batch := &pgx.Batch{}
		for _, q := range txn {
			batch.Queue(q)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.SendBatch(ctx, batch).Close(); err != nil {
			t.Fatalf("%v: %v", txn, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := conn.Query(ctx, `SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', $2, 'messages', 'true')`, tc.Slot, quoteIdent(tc.Publication))
	if err != nil {
		t.Fatal(err)
	}
	var msgs []recorded
	for rows.Next() {
		var lsn string
		var data []byte
		if err := rows.Scan(&lsn, &data); err != nil {
			t.Fatal(err)
		}
		l, err := wal.ParseLSN(lsn)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, recorded{kind: "L", lsn: l, data: data})
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// syntheticMessages are messages a v1 server does not normally send, or
// sends only by mistake, and malformed ones.
func syntheticMessages() []recorded {
	be32 := func(b []byte, v uint32) []byte { return binary.BigEndian.AppendUint32(b, v) }
	insert := func(tuple ...byte) []byte {
		b := be32([]byte{'I'}, 1)
		return append(append(b, 'N'), tuple...)
	}
	return []recorded{
		{kind: "S", data: be32(be32([]byte{'A'}, 900), 901), note: "stray stream abort (PG18 bug), ignored"},
		{kind: "S", data: []byte{'Z', 1, 2, 3}, note: "unknown kind, ignored"},
		{kind: "X", data: []byte{}, note: "empty"},
		{kind: "X", data: []byte{'B', 0, 0, 0}, note: "truncated begin"},
		{kind: "X", data: insert(0, 1, 't', 0xff, 0xff, 0xff, 0xff), note: "value length beyond the message"},
		{kind: "X", data: insert(0, 1, 'x'), note: "unknown tuple data kind"},
		{kind: "X", data: insert(0xff, 0xff, 'n'), note: "column count beyond the message"},
		{kind: "X", data: append([]byte{'R', 0, 0, 0, 1, 's', 0, 't', 0, 'd'}, 0x7f, 0xff), note: "relation with too many columns"},
		{kind: "X", data: []byte{'C', 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 9}, note: "trailing byte"},
		{kind: "X", data: be32(append(be32([]byte{'T'}, 0x40000000), 0), 1), note: "truncate claiming 2^30 relations"},
		{kind: "X", data: []byte{'O', 0, 0, 0, 0, 0, 0, 0, 1, 'n', 'o', 'n', 'u', 'l'}, note: "unterminated string"},
	}
}

func writeRecorded(path string, msgs []recorded) error {
	var b strings.Builder
	b.WriteString("# pgoutput messages recorded by TestGolden -update; kind lsn hex [# note]\n")
	for _, m := range msgs {
		fmt.Fprintf(&b, "%s %s %s", m.kind, m.lsn, hex.EncodeToString(m.data))
		if m.note != "" {
			fmt.Fprintf(&b, " # %s", m.note)
		}
		b.WriteByte('\n')
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func readRecorded(path string) ([]recorded, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var msgs []recorded
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var note string
		if i := strings.Index(line, " # "); i >= 0 {
			line, note = line[:i], line[i+3:]
		}
		f := strings.Fields(line)
		if len(f) == 2 {
			f = append(f, "")
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("%s: bad line %q", path, line)
		}
		lsn, err := wal.ParseLSN(f[1])
		if err != nil {
			return nil, err
		}
		data, err := hex.DecodeString(f[2])
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, recorded{kind: f[0], lsn: lsn, data: data, note: note})
	}
	return msgs, sc.Err()
}

// renderGolden prints every message as decoded, then the transactions the
// assembler builds from the valid ones.
func renderGolden(t *testing.T, msgs []recorded) string {
	var b strings.Builder
	b.WriteString("## messages\n")
	for _, m := range msgs {
		dm, err := decodeMessage(m.data, allocValues)
		if m.note != "" {
			fmt.Fprintf(&b, "# %s\n", m.note)
		}
		if err != nil {
			fmt.Fprintf(&b, "%s error: %v\n", m.lsn, err)
			if m.kind != "X" {
				t.Errorf("message at %s: %v", m.lsn, err)
			}
			continue
		}
		if m.kind == "X" {
			t.Errorf("malformed message %q decoded without error", m.note)
		}
		fmt.Fprintf(&b, "%s %s\n", m.lsn, formatMessage(dm))
	}
	b.WriteString("\n## transactions\n")
	asm := newAssembler(DefaultChunkChanges, DefaultChunkBytes, slog.New(slog.NewTextHandler(io.Discard, nil)))
	seen := map[*Relation]bool{}
	for _, m := range msgs {
		if m.kind == "X" {
			continue
		}
		res, err := asm.handle(m.lsn, m.data)
		if err != nil {
			t.Errorf("assemble message at %s: %v", m.lsn, err)
			continue
		}
		if res.ignored != 0 {
			fmt.Fprintf(&b, "ignored %s\n", kindName(res.ignored))
		}
		if res.emptyEnd != 0 {
			fmt.Fprintf(&b, "empty transaction end=%s\n", res.emptyEnd)
		}
		if res.txn != nil {
			if res.txn.Final {
				asm.delivered()
			}
			b.WriteString(formatTxn(res.txn, seen))
		}
	}
	return b.String()
}

func formatMessage(m message) string {
	var b strings.Builder
	b.WriteString(kindName(m.kind))
	switch m.kind {
	case msgBegin:
		fmt.Fprintf(&b, " final_lsn=%s xid=%d time=%s", m.lsn, m.xid, fmtTime(m.time))
	case msgCommit:
		fmt.Fprintf(&b, " flags=%d commit_lsn=%s end_lsn=%s time=%s", m.flags, m.lsn, m.endLSN, fmtTime(m.time))
	case msgOrigin:
		fmt.Fprintf(&b, " lsn=%s name=%q", m.lsn, m.name)
	case msgRelation:
		b.WriteString(" " + formatRelation(m.rel))
	case msgType:
		fmt.Fprintf(&b, " oid=%d name=%s.%s", m.oid, m.namespace, m.name)
	case msgInsert, msgUpdate, msgDelete:
		fmt.Fprintf(&b, " relid=%d", m.relid)
		if m.oldKind != 0 {
			fmt.Fprintf(&b, " old(%c)=%s", m.oldKind, formatValues(m.old))
		}
		if m.new != nil {
			fmt.Fprintf(&b, " new=%s", formatValues(m.new))
		}
	case msgTruncate:
		fmt.Fprintf(&b, " options=%d relids=%v", m.flags, m.relids)
	case msgMessage:
		fmt.Fprintf(&b, " flags=%d lsn=%s prefix=%q content=%q", m.flags, m.lsn, m.name, m.content)
	}
	return b.String()
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func formatRelation(r *Relation) string {
	if r == nil {
		return "<nil>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "id=%d %s.%s identity=%c (", r.ID, r.Namespace, r.Name, r.ReplicaIdentity)
	for i, c := range r.Columns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(formatColumn(c))
	}
	b.WriteString(")")
	return b.String()
}

func formatColumn(c Column) string {
	s := fmt.Sprintf("%s oid=%d", c.Name, c.Type)
	if c.TypeMod != -1 {
		s += fmt.Sprintf(" mod=%d", c.TypeMod)
	}
	if c.TypeName != "" {
		s += " type=" + c.TypeName
	}
	if c.Key {
		s += " key"
	}
	return s
}

func formatValues(vals []Value) string {
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = formatValue(v)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatValue(v Value) string {
	switch v.Kind {
	case ValueNull:
		return "NULL"
	case ValueUnchanged:
		return "UNCHANGED-TOAST"
	case ValueText, ValueBinary:
		s := string(v.Data)
		if len(s) > 32 {
			return strconv.Quote(s[:16]) + "…(" + strconv.Itoa(len(s)) + " bytes)"
		}
		if v.Kind == ValueBinary {
			return "b" + strconv.Quote(s)
		}
		return strconv.Quote(s)
	}
	return "<invalid>"
}

// formatTxn prints a chunk; each relation is printed in full the first time
// a change points at it.
func formatTxn(t *Txn, seen map[*Relation]bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "txn xid=%d commit_lsn=%s end_lsn=%s time=%s chunk=%d final=%t", t.Xid, t.CommitLSN, t.EndLSN, fmtTime(t.CommitTime), t.Chunk, t.Final)
	if t.Origin != "" {
		fmt.Fprintf(&b, " origin=%q", t.Origin)
	}
	b.WriteString("\n")
	for _, c := range t.Changes {
		rels := []*Relation{c.Relation}
		if c.Truncate != nil {
			rels = c.Truncate.Relations
		}
		for _, r := range rels {
			if r != nil && !seen[r] && c.Kind != ChangeSchema {
				seen[r] = true
				b.WriteString("  relation " + formatRelation(r) + "\n")
			}
		}
		b.WriteString("  " + formatChange(c, seen) + "\n")
	}
	return b.String()
}

func formatChange(c Change, seen map[*Relation]bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", c.Kind)
	switch c.Kind {
	case ChangeInsert, ChangeUpdate, ChangeDelete:
		fmt.Fprintf(&b, " %s", c.Relation.Table())
		switch c.OldKind {
		case OldKey:
			fmt.Fprintf(&b, " old-key=%s", formatValues(c.Old))
		case OldFull:
			fmt.Fprintf(&b, " old=%s", formatValues(c.Old))
		}
		if c.New != nil {
			fmt.Fprintf(&b, " new=%s", formatValues(c.New))
		}
	case ChangeTruncate:
		names := make([]string, len(c.Truncate.Relations))
		for i, r := range c.Truncate.Relations {
			names[i] = r.Table().String()
		}
		fmt.Fprintf(&b, " %s cascade=%t restart_identity=%t", strings.Join(names, ", "), c.Truncate.Cascade, c.Truncate.RestartIdentity)
	case ChangeSchema:
		sc := c.Schema
		fmt.Fprintf(&b, " %s", c.Relation.Table())
		for _, col := range sc.Added {
			fmt.Fprintf(&b, " added(%s)", formatColumn(col))
		}
		for _, col := range sc.Dropped {
			fmt.Fprintf(&b, " dropped(%s)", formatColumn(col))
		}
		for _, r := range sc.Retyped {
			fmt.Fprintf(&b, " retyped(%s -> %s)", formatColumn(r.Old), formatColumn(r.New))
		}
		for _, f := range []struct {
			name string
			on   bool
		}{{"renamed", sc.Renamed}, {"key-changed", sc.KeyChanged}, {"identity-changed", sc.IdentityChanged}, {"reordered", sc.Reordered}} {
			if f.on {
				b.WriteString(" " + f.name)
			}
		}
		fmt.Fprintf(&b, "\n    now %s", formatRelation(c.Relation))
		seen[c.Relation] = true
	}
	return b.String()
}

// lineDiff shows the first differing lines.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b bytes.Buffer
	shown := 0
	for i := 0; i < max(len(w), len(g)) && shown < 10; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %s\n  got  %s\n", i+1, wl, gl)
			shown++
		}
	}
	return b.String()
}
