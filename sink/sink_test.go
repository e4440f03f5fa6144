package sink_test

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
	"github.com/fkmat/fkmat/migrations"
	"github.com/fkmat/fkmat/sink"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// weirdTable has identifiers that must be quoted everywhere.
func weirdTable() *sink.Table {
	return &sink.Table{
		Schema: "public",
		Name:   `Orders "Enriched"; drop`,
		Columns: []sink.Column{
			{Name: "Id", Type: "bigint"},
			{Name: "amount", Type: "numeric(12,2)"},
			{Name: "note; x", Type: "text"},
			{Name: "Customer Name", Type: "text"},
			{Name: "tier", Type: "character varying(10)"},
		},
		KeyCount:  1,
		RightFrom: 3,
	}
}

func v(s string) join.Value { return join.TextValue(s) }

var null = join.NullValue()

func setup(t *testing.T) (*testenv.Case, *sink.Writer, *sink.Table, context.Context) {
	t.Helper()
	tc := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db, err := sql.Open("pgx", tc.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	w := sink.NewWriter(tc.Pool)
	tbl := weirdTable()
	created, err := w.EnsureTable(ctx, tbl)
	if err != nil || !created {
		t.Fatalf("EnsureTable = %v, %v", created, err)
	}
	if created, err := w.EnsureTable(ctx, tbl); err != nil || created {
		t.Fatalf("EnsureTable again = %v, %v; want existing table accepted", created, err)
	}
	return tc, w, tbl, ctx
}

func apply(t *testing.T, ctx context.Context, w *sink.Writer, tbl *sink.Table, lsn uint64, out join.Output) sink.Stats {
	t.Helper()
	tx, err := w.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Apply(ctx, tbl, out); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx, "slot_a", wal.LSN(lsn)); err != nil {
		t.Fatal(err)
	}
	return tx.Stats
}

func dump(t *testing.T, ctx context.Context, tc *testenv.Case, tbl *sink.Table) string {
	t.Helper()
	var s string
	err := tc.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(format('%s|%s|%s|%s|%s', t."Id", t.amount,
		coalesce(t."note; x", '<null>'), coalesce(t."Customer Name", '<null>'), coalesce(t.tier, '<null>')), ' ' ORDER BY t."Id"), '')
		FROM `+tbl.Ident()+` t`).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestWriterSkipsNoOps covers upserts, identical rewrites skipped, deletes of
// absent rows not counted, null-right and truncate, on quoted identifiers.
func TestWriterSkipsNoOps(t *testing.T) {
	tc, w, tbl, ctx := setup(t)

	st := apply(t, ctx, w, tbl, 100, join.Output{Upserts: []join.Row{
		{v("1"), v("10.50"), null, v("ann"), v("gold")},
		{v("2"), v("3"), v(""), null, null},
	}})
	if st.Upserted != 2 {
		t.Fatalf("first upsert wrote %d rows, want 2", st.Upserted)
	}
	if got, want := dump(t, ctx, tc, tbl), "1|10.50|<null>|ann|gold 2|3.00||<null>|<null>"; got != want {
		t.Fatalf("target = %q, want %q", got, want)
	}

	// Same values (numeric written differently but equal) and a delete of an
	// absent key: nothing is written.
	st = apply(t, ctx, w, tbl, 200, join.Output{
		Upserts: []join.Row{{v("1"), v("10.5"), null, v("ann"), v("gold")}},
		Deletes: [][]join.Value{{v("99")}},
	})
	if st.Upserted != 0 || st.Deleted != 0 {
		t.Fatalf("no-op batch wrote %+v", st)
	}

	st = apply(t, ctx, w, tbl, 300, join.Output{
		Upserts: []join.Row{{v("1"), v("11"), null, v("ann"), v("gold")}},
		Deletes: [][]join.Value{{v("2")}},
	})
	if st.Upserted != 1 || st.Deleted != 1 {
		t.Fatalf("update+delete wrote %+v, want 1 and 1", st)
	}

	st = apply(t, ctx, w, tbl, 400, join.Output{NullRight: true,
		Upserts: []join.Row{{v("3"), v("1"), null, null, null}}})
	if st.Nulled != 1 || st.Upserted != 1 {
		t.Fatalf("null-right wrote %+v", st)
	}
	if got, want := dump(t, ctx, tc, tbl), "1|11.00|<null>|<null>|<null> 3|1.00|<null>|<null>|<null>"; got != want {
		t.Fatalf("target = %q, want %q", got, want)
	}

	apply(t, ctx, w, tbl, 500, join.Output{Truncate: true, Upserts: []join.Row{{v("7"), v("7"), null, null, null}}})
	if got, want := dump(t, ctx, tc, tbl), "7|7.00|<null>|<null>|<null>"; got != want {
		t.Fatalf("after truncate target = %q, want %q", got, want)
	}
	if lsn, err := w.Checkpoint(ctx, "slot_a"); err != nil || uint64(lsn) != 500 {
		t.Fatalf("checkpoint = %v, %v; want 500", lsn, err)
	}
}

// TestUpdateRight: a right update sets only the right columns of the rows
// with the given keys (left columns untouched, absent keys no-ops), counts
// only the rows whose right part differed, and writes NULLs; quoted
// identifiers throughout.
func TestUpdateRight(t *testing.T) {
	tc, w, tbl, ctx := setup(t)
	apply(t, ctx, w, tbl, 100, join.Output{Upserts: []join.Row{
		{v("1"), v("10.50"), v("n1"), v("ann"), v("gold")},
		{v("2"), v("3"), null, v("bob"), v("gold")},
		{v("3"), v("4"), v("n3"), v("ann"), v("gold")},
	}})
	st := apply(t, ctx, w, tbl, 200, join.Output{RightUpdates: []join.RightUpdate{
		{Keys: [][]join.Value{{v("1")}, {v("3")}, {v("99")}}, Right: []join.Value{v("anna"), v("gold")}},
	}})
	if st.Upserted != 2 {
		t.Fatalf("right update wrote %d rows, want 2", st.Upserted)
	}
	if got, want := dump(t, ctx, tc, tbl), "1|10.50|n1|anna|gold 2|3.00|<null>|bob|gold 3|4.00|n3|anna|gold"; got != want {
		t.Fatalf("target = %q, want %q", got, want)
	}
	// Rows that already hold the values are not rewritten; NULLs are written.
	st = apply(t, ctx, w, tbl, 300, join.Output{RightUpdates: []join.RightUpdate{
		{Keys: [][]join.Value{{v("1")}}, Right: []join.Value{v("anna"), v("gold")}},
		{Keys: [][]join.Value{{v("2")}}, Right: []join.Value{null, null}},
	}})
	if st.Upserted != 1 {
		t.Fatalf("right updates wrote %d rows, want 1 (row 1 already equal)", st.Upserted)
	}
	if got, want := dump(t, ctx, tc, tbl), "1|10.50|n1|anna|gold 2|3.00|<null>|<null>|<null> 3|4.00|n3|anna|gold"; got != want {
		t.Fatalf("target = %q, want %q", got, want)
	}
}

// TestUpdateColumnsPerRow: column updates of the same columns, each with
// its own keys and values (a roll-up's results, one row each), go out as
// one statement and land as several would: each row its update's values,
// the last update's for a key named twice, a key without a row skipped,
// rows already equal not counted, and another set of columns beside.
func TestUpdateColumnsPerRow(t *testing.T) {
	tc, w, tbl, ctx := setup(t)
	apply(t, ctx, w, tbl, 100, join.Output{Upserts: []join.Row{
		{v("1"), v("1"), v("n1"), v("ann"), v("gold")},
		{v("2"), v("2"), v("n2"), v("bob"), null},
		{v("3"), v("3"), v("n3"), v("cy"), v("tin")},
	}})
	st := apply(t, ctx, w, tbl, 200, join.Output{ColumnUpdates: []join.ColumnUpdate{
		{Keys: [][]join.Value{{v("1")}}, Columns: []int{3, 4}, Values: []join.Value{v("ann2"), null}},
		{Keys: [][]join.Value{{v("2")}, {v("9")}}, Columns: []int{3, 4}, Values: []join.Value{v("a,b"), v("x")}},
		{Keys: [][]join.Value{{v("3")}}, Columns: []int{3, 4}, Values: []join.Value{v("cy"), v("tin")}},
		{Keys: [][]join.Value{{v("1")}}, Columns: []int{2}, Values: []join.Value{v("note")}},
		{Keys: [][]join.Value{{v("1")}}, Columns: []int{3, 4}, Values: []join.Value{v("ann3"), v("z")}},
	}})
	if got, want := dump(t, ctx, tc, tbl), "1|1.00|note|ann3|z 2|2.00|n2|a,b|x 3|3.00|n3|cy|tin"; got != want {
		t.Fatalf("target = %q, want %q", got, want)
	}
	if st.Upserted != 3 {
		t.Fatalf("%d rows written, want 3 (row 3 was equal already)", st.Upserted)
	}
}

// TestCheckpointNeverBackwards: a commit with an older LSN fails and leaves
// the target untouched.
func TestCheckpointNeverBackwards(t *testing.T) {
	tc, w, tbl, ctx := setup(t)
	apply(t, ctx, w, tbl, 1000, join.Output{Upserts: []join.Row{{v("1"), v("1"), null, null, null}}})

	tx, err := w.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Apply(ctx, tbl, join.Output{Deletes: [][]join.Value{{v("1")}}}); err != nil {
		t.Fatal(err)
	}
	err = tx.Commit(ctx, "slot_a", wal.LSN(999))
	if !errors.Is(err, sink.ErrCheckpointBackwards) {
		t.Fatalf("Commit(999) = %v, want ErrCheckpointBackwards", err)
	}
	if got := dump(t, ctx, tc, tbl); got != "1|1.00|<null>|<null>|<null>" {
		t.Fatalf("target changed by a refused commit: %q", got)
	}
}

// TestFence: once a second writer fenced the slot, the first writer's
// commits are refused (ErrFenced), a transaction begun before the fence
// included, and so is a new transaction, at its Begin; the target keeps
// the first writer's committed rows; the second writer commits and is the
// slot's owner; an older lsn is still ErrCheckpointBackwards.
func TestFence(t *testing.T) {
	tc, w, tbl, ctx := setup(t)
	if err := w.Fence(ctx, "slot_a", "host-a", 1, "s1"); err != nil {
		t.Fatal(err)
	}
	apply(t, ctx, w, tbl, 1000, join.Output{Upserts: []join.Row{{v("1"), v("1"), null, null, null}}})

	old, err := w.Begin(ctx) // begun before the takeover
	if err != nil {
		t.Fatal(err)
	}
	defer old.Rollback(ctx)
	if err := old.Apply(ctx, tbl, join.Output{Deletes: [][]join.Value{{v("1")}}}); err != nil {
		t.Fatal(err)
	}
	next := sink.NewWriter(tc.Pool)
	if err := next.Fence(ctx, "slot_a", "host-b", 2, "s2"); err != nil {
		t.Fatal(err)
	}
	if err := old.Commit(ctx, "slot_a", wal.LSN(2000)); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("a commit begun before the fence = %v, want ErrFenced", err)
	}
	// A transaction begun after the fence is refused before it writes.
	if _, err := w.Begin(ctx); !errors.Is(err, sink.ErrFenced) {
		t.Fatalf("a transaction begun after the fence = %v, want ErrFenced", err)
	}
	if s, err := w.Owner(ctx, "slot_a"); err != nil || s != "s2" {
		t.Fatalf("the slot's owner session = %q, %v; want s2", s, err)
	}
	if got := dump(t, ctx, tc, tbl); got != "1|1.00|<null>|<null>|<null>" {
		t.Fatalf("target changed by a fenced commit: %q", got)
	}
	if lsn, err := w.Checkpoint(ctx, "slot_a"); err != nil || lsn != 1000 {
		t.Fatalf("checkpoint after fenced commits = %v, %v; want 1000", lsn, err)
	}
	apply(t, ctx, next, tbl, 2000, join.Output{Upserts: []join.Row{{v("2"), v("2"), null, null, null}}})
	// Backwards stays backwards, not fenced, for the owner.
	tx, err := next.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx, "slot_a", wal.LSN(1500)); !errors.Is(err, sink.ErrCheckpointBackwards) {
		t.Fatalf("an older lsn from the owner = %v, want ErrCheckpointBackwards", err)
	}
}

func TestShapeMismatch(t *testing.T) {
	tc, w, tbl, ctx := setup(t)
	_ = tc
	other := *tbl
	other.Columns = append([]sink.Column(nil), tbl.Columns...)
	other.Columns[1].Type = "integer"
	other.Columns = append(other.Columns, sink.Column{Name: "extra", Type: "text"})
	_, err := w.EnsureTable(ctx, &other)
	if !errors.Is(err, sink.ErrShapeMismatch) {
		t.Fatalf("EnsureTable = %v, want ErrShapeMismatch", err)
	}
	for _, want := range []string{`column "amount" is numeric(12,2), want integer`, `column "extra" is missing`, "teardown --drop-target"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// TestValuesRoundTrip: values that a text-array literal would have to
// quote or escape (commas, braces, quotes, backslashes, the word NULL,
// empty strings, blanks, non-ASCII) and a large one arrive exactly as
// sent, through the upsert, a right update, a column update and a delete;
// NULLs stay NULL beside them.
func TestValuesRoundTrip(t *testing.T) {
	tc, w, tbl, ctx := setup(t)
	awkward := []string{`a,b`, `{x}`, `"q"`, `back\slash`, `NULL`, ``, ` `, "tab\there", "ünï ☃", `'`, strings.Repeat("x", 1<<20)}
	var rows []join.Row
	for i, s := range awkward {
		rows = append(rows, join.Row{v(strconv.Itoa(i + 1)), v("1"), v(s), null, v("t")})
	}
	apply(t, ctx, w, tbl, 100, join.Output{Upserts: rows})
	read := func(col string) map[string]*string {
		t.Helper()
		got := map[string]*string{}
		rs, err := tc.Pool.Query(ctx, `SELECT t."Id"::text, t.`+col+` FROM `+tbl.Ident()+` t`)
		if err != nil {
			t.Fatal(err)
		}
		for rs.Next() {
			var id string
			var s *string
			if err := rs.Scan(&id, &s); err != nil {
				t.Fatal(err)
			}
			got[id] = s
		}
		if err := rs.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	check := func(col string, want func(i int, s string) *string) {
		t.Helper()
		got := read(col)
		if len(got) != len(awkward) {
			t.Fatalf("%d rows, want %d", len(got), len(awkward))
		}
		for i, s := range awkward {
			g, w := got[strconv.Itoa(i+1)], want(i, s)
			if (g == nil) != (w == nil) || (g != nil && *g != *w) {
				t.Fatalf("row %d column %s: got %v, want %v", i+1, col, g, w)
			}
		}
	}
	check(`"note; x"`, func(_ int, s string) *string { return &s })
	check(`"Customer Name"`, func(int, string) *string { return nil })

	var keys [][]join.Value
	for i := range awkward {
		keys = append(keys, []join.Value{v(strconv.Itoa(i + 1))})
	}
	apply(t, ctx, w, tbl, 200, join.Output{RightUpdates: []join.RightUpdate{{Keys: keys, Right: []join.Value{v(`{"a,b"}`), null}}}})
	check(`"Customer Name"`, func(int, string) *string { s := `{"a,b"}`; return &s })
	check(`tier`, func(int, string) *string { return nil })
	apply(t, ctx, w, tbl, 300, join.Output{ColumnUpdates: []join.ColumnUpdate{{Keys: keys[:3], Columns: []int{2}, Values: []join.Value{null}}}})
	check(`"note; x"`, func(i int, s string) *string {
		if i < 3 {
			return nil
		}
		return &s
	})
	st := apply(t, ctx, w, tbl, 400, join.Output{Deletes: keys})
	if st.Deleted != int64(len(awkward)) {
		t.Fatalf("deleted %d rows, want %d", st.Deleted, len(awkward))
	}
}

// TestStatementBufferKept checks that a statement's bytes are encoded into
// a buffer the connection keeps: a statement of 1 MiB of rows, once the
// connection has sent one, allocates far less than its size (pgx's own
// buffer, regrown from 1 KB for each statement, allocated about twice it).
func TestStatementBufferKept(t *testing.T) {
	tc, w, tbl, ctx := setup(t)
	notes := make([]join.Value, 4)
	for i := range notes {
		notes[i] = v(strings.Repeat(string(rune('a'+i)), 16<<10))
	}
	rows := make([]join.Row, 64)
	for i := range rows {
		rows[i] = join.Row{v(strconv.Itoa(i + 1)), v("1"), null, v("c"), v("t")}
	}
	tx, err := w.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	write := func(note join.Value) {
		for i := range rows {
			rows[i][2] = note
		}
		if err := tx.Apply(ctx, tbl, join.Output{Upserts: rows}); err != nil {
			t.Fatal(err)
		}
	}
	write(notes[0]) // the connection's buffer and the parameters' grow here
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// TotalAlloc counts every goroutine of the test process (the pools'
	// and the test environment's too): the least of three measurements is
	// the statements' own.
	got := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, note := range notes[1:] {
			write(note)
		}
		runtime.ReadMemStats(&after)
		got = min(got, after.TotalAlloc-before.TotalAlloc)
	}
	if limit := uint64(256 << 10); got > limit {
		t.Fatalf("three statements of 1 MiB allocated %d KiB, want at most %d KiB", got>>10, limit>>10)
	}
	if err := tx.Commit(ctx, "slot_a", 100); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := tc.Pool.QueryRow(ctx, `SELECT count(*) FROM `+tbl.Ident()+` WHERE "note; x" = $1`, notes[3].Text).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(rows) {
		t.Fatalf("%d rows hold the last note, want %d", n, len(rows))
	}
}
