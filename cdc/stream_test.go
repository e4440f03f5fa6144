package cdc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

var ordersCustomers = []TableName{{Name: "customers"}, {Name: "orders"}, {Name: "audit"}}

const streamSchema = `
CREATE TYPE mood AS ENUM ('sad', 'happy');
CREATE TABLE customers (id int PRIMARY KEY, name text, tier text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id int, note text, feel mood);
CREATE TABLE audit (id int PRIMARY KEY, n int, payload text);
ALTER TABLE audit REPLICA IDENTITY FULL;
CREATE TABLE unpublished (id int);
`

// startStream creates publication and slot and starts a stream at the slot's
// consistent point.
func startStream(t *testing.T, c *Client) *Stream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.EnsurePublication(ctx); err != nil {
		t.Fatal(err)
	}
	slot, err := c.CreateSlot(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	s := c.NewStream(slot.ConsistentPoint)
	runStream(t, s)
	return s
}

// collect reads final transactions (gluing chunks) until n changes arrived,
// acking each.
func collect(t *testing.T, s *Stream, n int) []Change {
	t.Helper()
	var out, partial []Change
	for len(out) < n {
		txn := next(t, s, 30*time.Second)
		if txn.Chunk == 0 {
			partial = partial[:0]
		}
		partial = append(partial, txn.Changes...)
		if txn.Final {
			out = append(out, partial...)
			partial = nil
			s.Ack(txn.EndLSN)
		}
	}
	return out
}

func values(vals []Value) string {
	parts := make([]string, len(vals))
	for i, v := range vals {
		parts[i] = formatValue(v)
	}
	return strings.Join(parts, ",")
}

// TestStreamMessageKinds drives every change kind through a real slot and
// checks the decoded result: inserts, updates with and without key change,
// deletes (key only), REPLICA IDENTITY FULL old rows, an unchanged TOASTed
// value (never NULL), a custom type, a replication origin, and a TRUNCATE
// of two tables in one statement.
func TestStreamMessageKinds(t *testing.T) {
	tc, c := setup(t, streamSchema, ordersCustomers, nil)
	s := startStream(t, c)
	big := `(SELECT string_agg(md5(i::text), '') FROM generate_series(1, 300) i)` // 9600 bytes, stored out of line
	exec(t, tc,
		`INSERT INTO customers VALUES (1, 'Ada', 'gold'), (2, 'Bob', NULL)`,
		`INSERT INTO orders VALUES (10, 1, `+big+`, 'happy')`,
		`UPDATE orders SET customer_id = 2 WHERE id = 10`, // note unchanged: TOAST 'u'
		`UPDATE orders SET id = 11 WHERE id = 10`,         // key change: old key
		`DELETE FROM customers WHERE id = 2`,
		`INSERT INTO audit VALUES (1, 0, `+big+`)`,
		`UPDATE audit SET n = 1`,
		`DELETE FROM audit`,
		`INSERT INTO unpublished VALUES (1)`,
		`TRUNCATE customers, orders`,
	)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, tc.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`SELECT pg_replication_origin_create('` + tc.Slot + `')`,
		`SELECT pg_replication_origin_session_setup('` + tc.Slot + `')`,
		`INSERT INTO customers VALUES (3, 'Cy', 'eu')`,
		`SELECT pg_replication_origin_session_reset()`,
		`SELECT pg_replication_origin_drop('` + tc.Slot + `')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	var got []string
	var origin string
	var noteType Column
	for len(got) < 11 {
		txn := next(t, s, 30*time.Second)
		if !txn.Final || txn.Chunk != 0 {
			t.Fatalf("small transaction delivered in chunks: %+v", txn)
		}
		if txn.Origin != "" {
			origin = txn.Origin
		}
		for _, ch := range txn.Changes {
			var line string
			switch ch.Kind {
			case ChangeTruncate:
				line = "truncate"
				for _, r := range ch.Truncate.Relations {
					line += " " + r.Name
				}
			default:
				line = fmt.Sprintf("%s %s", ch.Kind, ch.Relation.Table().Name)
				if ch.OldKind != OldNone {
					line += fmt.Sprintf(" old%d=%s", ch.OldKind, values(ch.Old))
				}
				if ch.New != nil {
					line += " new=" + values(ch.New)
				}
			}
			if ch.Relation != nil && ch.Relation.Name == "orders" {
				noteType = ch.Relation.Columns[3]
			}
			got = append(got, line)
		}
		s.Ack(txn.EndLSN)
	}
	bigPrefix := `"c4ca4238a0b92382"…(9600 bytes)`
	want := []string{
		`insert customers new="1","Ada","gold"`,
		`insert customers new="2","Bob",NULL`,
		`insert orders new="10","1",` + bigPrefix + `,"happy"`,
		`update orders new="10","2",UNCHANGED-TOAST,"happy"`,
		`update orders old1="10",NULL,NULL,NULL new="11","2",UNCHANGED-TOAST,"happy"`,
		`delete customers old1="2",NULL,NULL`,
		`insert audit new="1","0",` + bigPrefix,
		`update audit old2="1","0",` + bigPrefix + ` new="1","1",UNCHANGED-TOAST`,
		`delete audit old2="1","1",` + bigPrefix,
		`truncate customers orders`,
		`insert customers new="3","Cy","eu"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if origin != tc.Slot {
		t.Errorf("origin %q, want %q", origin, tc.Slot)
	}
	if noteType.Name != "feel" || noteType.TypeName != "public.mood" {
		t.Errorf("custom type column %+v", noteType)
	}
}

// TestStreamSchemaChange alters a table between transactions while the
// stream runs: each ALTER shows up as a schema change before the first row
// laid out the new way, and the rows decode against their own shape.
func TestStreamSchemaChange(t *testing.T) {
	tc, c := setup(t, streamSchema, ordersCustomers, nil)
	s := startStream(t, c)
	exec(t, tc,
		`INSERT INTO customers VALUES (1, 'Ada', 'gold')`,
		`ALTER TABLE customers ADD COLUMN region text`,
		`INSERT INTO customers VALUES (2, 'Bob', 'gold', 'eu')`,
		`ALTER TABLE customers DROP COLUMN tier`,
		`INSERT INTO customers VALUES (3, 'Cy', 'us')`,
		`ALTER TABLE customers ALTER COLUMN id TYPE bigint`,
		`INSERT INTO customers VALUES (4, 'Di', 'ap')`,
	)
	changes := collect(t, s, 7)
	var got []string
	for _, ch := range changes {
		switch ch.Kind {
		case ChangeSchema:
			sc := ch.Schema
			line := "schema"
			for _, c := range sc.Added {
				line += " +" + c.Name
			}
			for _, c := range sc.Dropped {
				line += " -" + c.Name
			}
			for _, r := range sc.Retyped {
				line += fmt.Sprintf(" %s:%d->%d", r.New.Name, r.Old.Type, r.New.Type)
			}
			got = append(got, line)
		case ChangeInsert:
			got = append(got, fmt.Sprintf("insert %d cols %s", len(ch.Relation.Columns), values(ch.New)))
		}
	}
	want := []string{
		`insert 3 cols "1","Ada","gold"`,
		`schema +region`,
		`insert 4 cols "2","Bob","gold","eu"`,
		`schema -tier`,
		`insert 3 cols "3","Cy","us"`,
		`schema id:23->20`,
		`insert 3 cols "4","Di","ap"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestStreamQuotedNames streams a table and a publication whose names need
// quoting everywhere (SQL and the replication protocol's options).
func TestStreamQuotedNames(t *testing.T) {
	tc, c := setup(t, `CREATE TABLE "Odd ""T""" (id int PRIMARY KEY)`, []TableName{{Name: `Odd "T"`}}, func(c *Config) {
		c.Publication = `Pub "x", y`
	})
	s := startStream(t, c)
	exec(t, tc, `INSERT INTO "Odd ""T""" VALUES (1)`)
	txn := next(t, s, 30*time.Second)
	if ch := txn.Changes[0]; ch.Relation.Name != `Odd "T"` || ch.New[0].String() != "1" {
		t.Errorf("got %+v", ch)
	}
}
