package integration

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fkmat/fkmat/internal/testenv"
)

// Shape of the fault workload's data: customers 1..faultCustomers exist at
// the start, foreign keys also point up to faultCustomers+faultAbsent
// (customers that mostly do not exist), and customers 1..faultHot have
// hundreds of dependents each, so that an update of one fans out widely.
const (
	faultCustomers = 300
	faultAbsent    = 40
	faultHot       = 4
	faultOrders    = 3000
	faultHotOrders = 300 // initial dependents per hot customer
)

// Table shapes of the fault workload.
const (
	shapePlain       = "plain"
	shapePartitioned = "partitioned" // both tables hash-partitioned by id
)

// faultSeedSQL creates the shop tables with hot customers, a TOASTed note
// on some orders and a TOASTed bio on some customers (rows that exist only
// from the backfill), and customers referring to customers (the
// self-referencing join), in the given shape.
func faultSeedSQL(shape string) []string {
	ddl := []string{shop}
	if shape == shapePartitioned {
		ddl = []string{
			`CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text) PARTITION BY HASH (id)`,
			`CREATE TABLE customers_h0 PARTITION OF customers FOR VALUES WITH (MODULUS 3, REMAINDER 0)`,
			`CREATE TABLE customers_h1 PARTITION OF customers FOR VALUES WITH (MODULUS 3, REMAINDER 1)`,
			`CREATE TABLE customers_h2 PARTITION OF customers FOR VALUES WITH (MODULUS 3, REMAINDER 2)`,
			`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text) PARTITION BY HASH (id)`,
			`CREATE TABLE orders_h0 PARTITION OF orders FOR VALUES WITH (MODULUS 4, REMAINDER 0)`,
			`CREATE TABLE orders_h1 PARTITION OF orders FOR VALUES WITH (MODULUS 4, REMAINDER 1)`,
			`CREATE TABLE orders_h2 PARTITION OF orders FOR VALUES WITH (MODULUS 4, REMAINDER 2)`,
			`CREATE TABLE orders_h3 PARTITION OF orders FOR VALUES WITH (MODULUS 4, REMAINDER 3)`,
			`CREATE INDEX ON orders (customer_id)`,
		}
	}
	return append(ddl,
		`ALTER TABLE customers ADD COLUMN bio text, ADD COLUMN referred_by bigint`,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g %% 3 = 0 THEN NULL ELSE 't' || (g %% 4) END,
				CASE WHEN g %% 10 = 0 THEN %[2]s END, CASE WHEN g %% 5 <> 0 THEN 1 + (g * 31) %% %[1]d END
			FROM generate_series(1, %[1]d) g`, faultCustomers, bigText(120)),
		fmt.Sprintf(`INSERT INTO orders SELECT g,
			CASE WHEN g <= %[1]d THEN 1 + g %% %[2]d WHEN g %% 17 = 0 THEN NULL ELSE 1 + (g * 7919) %% %[3]d END,
			g %% 1000, CASE WHEN g %% 20 = 0 THEN %[5]s ELSE 'n' END FROM generate_series(1, %[4]d) g`,
			faultHot*faultHotOrders, faultHot, faultCustomers+faultAbsent, faultOrders, bigText(100)),
	)
}

// faultYAML is the fault workload's configuration: orders joined to
// customers (type typ) with the TOASTed columns of both projected, the
// self-referencing join of customers to their referrer, and a join of more
// than two tables chaining the two: orders, their customer (type typ), and
// that customer's referrer (a customers row again, through as).
func faultYAML(typ string) string {
	return strings.Replace(toastJoinYAML, "type: left", "type: "+typ, 1) + `
  - name: customers_referrers
    type: left
    left:
      table: public.customers
      foreign_key: [referred_by]
      columns: [id, name, bio, referred_by]
    right:
      table: public.customers
      columns: [name AS referrer_name, tier AS referrer_tier]
    target:
      table: public.customers_referrers
  - name: orders_chain
    type: left
    left:
      table: public.orders
      columns: [id, customer_id, amount, note]
    right:
      - table: public.customers
        type: ` + typ + `
        foreign_key: [customer_id]
        columns: [name AS customer_name, bio AS customer_bio]
      - table: public.customers
        as: referrer
        from: customers
        foreign_key: [referred_by]
        columns: [name AS referrer_name, tier AS referrer_tier]
    target:
      table: public.orders_chain
`
}

// opKind names what a workload step did, so that the fault schedule can
// kill the daemon right after a large fan-out or a multi-row transaction.
type opKind int

const (
	opSingle    opKind = iota // one row on one side
	opFanout                  // an update of a hot customer (hundreds of dependents)
	opMulti                   // a multi-statement transaction on both sides
	opBulk                    // one statement moving many orders
	opTruncate                // TRUNCATE of one or both tables
	opHuge                    // one transaction of more than a chunk (> 10k changes)
	opPartition               // partition DDL that moves rows (shapePartitioned)
)

// The changes a single step makes, counted by name for the report: every
// change kind on both tables, on rows in every state (from the backfill or
// streamed, TOASTed, with a NULL or dangling foreign key, hot, changed
// earlier in the same transaction).
var singleOps = []string{
	"order insert", "order insert toasted", "order update plain", "order update toasted", "order update nullable",
	"order fk move", "order key change", "order key change back", "order delete", "order delete reinsert",
	"customer upsert", "customer update nullable", "customer update toasted", "customer key change",
	"customer delete", "customer delete reinsert", "customer referrer move", "order same-row chain",
	"outside column",
}

// workload is a seeded random writer on the shop tables: the cross product
// of change kinds (insert, updates of a plain, a NULL-able and a TOASTed
// column, FK moves to a row, to NULL and to a missing row, key changes,
// deletes, delete and re-insert, TRUNCATE) and row states (TOASTed, NULL
// or dangling FK, hot right row, rows from the backfill, rows changed
// earlier in the same transaction) on both tables, multi-row transactions
// and, rarely, one transaction bigger than a chunk. Steps are generated
// from the seed alone, so a seed replays the same statements.
type workload struct {
	tc        *testenv.Case
	r         *rand.Rand
	nextOrder int
	nextCust  int
	ops       int // steps executed
	truncates int
	retries   int // statements retried after a connection error
	// partitioned adds partition DDL to the steps (shapePartitioned).
	partitioned bool
	// last is the kind of the last step run.
	last opKind
	// counts counts the changes generated, by singleOps name and by kind
	// of step.
	counts map[string]int
	// journal lists the statements run other than single-row changes,
	// and the faults (note), with times and WAL positions: a failed fault
	// run writes it beside its log.
	journal []string
}

// note adds an event to the journal.
func (w *workload) note(event string) {
	w.journal = append(w.journal, time.Now().UTC().Format("15:04:05.000")+" "+event)
}

func newWorkload(tc *testenv.Case, seed uint64) *workload {
	return &workload{tc: tc, r: rand.New(rand.NewPCG(seed, 0x6b6d6174)), nextOrder: faultOrders + 1,
		nextCust: faultCustomers + faultAbsent + 1, counts: map[string]int{}}
}

// customer picks a foreign key: often hot, sometimes NULL or absent.
func (w *workload) customer() string {
	switch n := w.r.IntN(100); {
	case n < 10:
		return "NULL"
	case n < 25:
		return fmt.Sprint(1 + w.r.IntN(faultHot))
	default:
		return fmt.Sprint(1 + w.r.IntN(faultCustomers+faultAbsent))
	}
}

func (w *workload) order() int { return 1 + w.r.IntN(w.nextOrder-1) }

// anyCustomer is a customer id to write on the right side (not hot).
func (w *workload) anyCustomer() int {
	return faultHot + 1 + w.r.IntN(faultCustomers+faultAbsent-faultHot)
}

// big is SQL for an incompressible value stored out of line.
func (w *workload) big() string { return bigText(100 + w.r.IntN(40)) }

func (w *workload) single() string {
	op := singleOps[w.r.IntN(len(singleOps))]
	w.counts[op]++
	o, c := w.order(), w.anyCustomer()
	switch op {
	case "order insert":
		id := w.nextOrder
		w.nextOrder++
		return fmt.Sprintf(`INSERT INTO orders VALUES (%d, %s, %d, 'w')`, id, w.customer(), w.r.IntN(10000))
	case "order insert toasted":
		id := w.nextOrder
		w.nextOrder++
		return fmt.Sprintf(`INSERT INTO orders VALUES (%d, %s, %d, %s)`, id, w.customer(), w.r.IntN(10000), w.big())
	case "order update plain":
		return fmt.Sprintf(`UPDATE orders SET amount = amount + 1 WHERE id = %d`, o)
	case "order update toasted":
		return fmt.Sprintf(`UPDATE orders SET note = %s WHERE id = %d`, w.big(), o)
	case "order update nullable":
		return fmt.Sprintf(`UPDATE orders SET amount = %s WHERE id = %d`, []string{"NULL", "0", "1.5"}[w.r.IntN(3)], o)
	case "order fk move":
		return fmt.Sprintf(`UPDATE orders SET customer_id = %s WHERE id = %d`, w.customer(), o)
	case "order key change":
		id := w.nextOrder
		w.nextOrder++
		return fmt.Sprintf(`UPDATE orders SET id = %d WHERE id = %d`, id, o)
	case "order key change back":
		// To a key that may have been used before (if free): with the FK
		// changed too, sometimes.
		to := w.order()
		set := fmt.Sprintf("id = %d", to)
		if w.r.IntN(2) == 0 {
			set += ", customer_id = " + w.customer()
		}
		return fmt.Sprintf(`UPDATE orders SET %s WHERE id = %d AND NOT EXISTS (SELECT FROM orders WHERE id = %d)`, set, o, to)
	case "order delete":
		return fmt.Sprintf(`DELETE FROM orders WHERE id = %d`, o)
	case "order delete reinsert":
		return fmt.Sprintf(`DELETE FROM orders WHERE id = %[1]d; INSERT INTO orders VALUES (%[1]d, %[2]s, 1, %[3]s)`, o, w.customer(),
			[]string{"'re'", w.big()}[w.r.IntN(2)])
	case "customer upsert":
		return fmt.Sprintf(`INSERT INTO customers VALUES (%d, 'new%d', 'n') ON CONFLICT (id) DO UPDATE SET name = customers.name || 'u'`, c, c)
	case "customer update nullable":
		return fmt.Sprintf(`UPDATE customers SET tier = %s WHERE id = %d`, []string{"NULL", "'gold'", "'silver'"}[w.r.IntN(3)], c)
	case "customer update toasted":
		return fmt.Sprintf(`UPDATE customers SET bio = %s WHERE id = %d`, []string{"NULL", w.big()}[w.r.IntN(2)], c)
	case "customer key change":
		// Away to a fresh key (its orders dangle, its referrals too), or
		// onto a free key in the referenced range (dangling FKs match).
		to := w.nextCust
		w.nextCust++
		if w.r.IntN(2) == 0 {
			to = w.anyCustomer()
		}
		return fmt.Sprintf(`UPDATE customers SET id = %d WHERE id = %d AND NOT EXISTS (SELECT FROM customers WHERE id = %d)`, to, c, to)
	case "customer delete":
		return fmt.Sprintf(`DELETE FROM customers WHERE id = %d`, c)
	case "customer delete reinsert":
		return fmt.Sprintf(`DELETE FROM customers WHERE id = %[1]d; INSERT INTO customers VALUES (%[1]d, 'again%[1]d', 'a', %[2]s, %[3]s)`,
			c, []string{"NULL", w.big()}[w.r.IntN(2)], w.customer())
	case "customer referrer move":
		// To another customer, a missing one, NULL, or itself.
		to := []string{w.customer(), fmt.Sprint(c), "NULL", fmt.Sprint(w.nextCust + 1000)}[w.r.IntN(4)]
		return fmt.Sprintf(`UPDATE customers SET referred_by = %s WHERE id = %d`, to, c)
	case "order same-row chain":
		// One row changed several times in one transaction: a plain update,
		// a key change, an FK move and a TOASTed value.
		id := w.nextOrder
		w.nextOrder++
		return fmt.Sprintf(`UPDATE orders SET amount = amount + 2 WHERE id = %[1]d; UPDATE orders SET id = %[2]d WHERE id = %[1]d;
			UPDATE orders SET customer_id = %[3]s WHERE id = %[2]d; UPDATE orders SET note = %[4]s WHERE id = %[2]d`, o, id, w.customer(), w.big())
	}
	// A column outside every join: must write nothing to the targets.
	return fmt.Sprintf(`UPDATE orders SET note = note WHERE id = %d`, o)
}

// fanout changes a hot customer: an update of its joined columns, or (rarely)
// its delete and re-insert.
func (w *workload) fanout() string {
	h := 1 + w.r.IntN(faultHot)
	if w.r.IntN(10) == 0 {
		return fmt.Sprintf(`BEGIN; DELETE FROM customers WHERE id = %d; COMMIT;
			BEGIN; INSERT INTO customers VALUES (%d, 'hot%d', 'h') ON CONFLICT (id) DO NOTHING; COMMIT`, h, h, h)
	}
	return fmt.Sprintf(`INSERT INTO customers VALUES (%d, 'hot%d', 'h%d') ON CONFLICT (id) DO UPDATE SET name = 'hot%d-%d', tier = EXCLUDED.tier`,
		h, h, w.r.IntN(100), h, w.r.IntN(1000000))
}

func (w *workload) multi() string {
	var b strings.Builder
	b.WriteString("BEGIN;")
	for i, n := 0, 2+w.r.IntN(8); i < n; i++ {
		b.WriteString(w.single())
		b.WriteString(";")
	}
	b.WriteString("COMMIT")
	return b.String()
}

func (w *workload) bulk() string {
	lo := w.order()
	switch w.r.IntN(4) {
	case 0:
		return fmt.Sprintf(`UPDATE orders SET customer_id = %d WHERE id BETWEEN %d AND %d`, 1+w.r.IntN(faultHot), lo, lo+50+w.r.IntN(150))
	case 1:
		return fmt.Sprintf(`UPDATE orders SET customer_id = %s WHERE id BETWEEN %d AND %d`, w.customer(), lo, lo+w.r.IntN(100))
	case 2:
		// Many key changes in one statement, TOASTed rows among them.
		shift := w.nextOrder
		w.nextOrder += 200
		return fmt.Sprintf(`UPDATE orders SET id = id - %d + %d WHERE id BETWEEN %d AND %d`, lo, shift, lo, lo+w.r.IntN(100))
	default:
		return fmt.Sprintf(`UPDATE customers SET name = name || '.' WHERE id BETWEEN %d AND %d`, 1+w.r.IntN(faultCustomers), 1+w.r.IntN(faultCustomers)+20)
	}
}

// huge is one transaction larger than a chunk: 12k new orders, then key
// changes, TOASTed updates and deletes of rows old and new, and a customer
// key change, so that later chunks depend on state earlier ones wrote.
func (w *workload) huge() string {
	first := w.nextOrder
	w.nextOrder += 12000
	moved := w.nextOrder
	w.nextOrder += 200
	lo := w.order()
	cust := w.nextCust
	w.nextCust++
	return fmt.Sprintf(`BEGIN;
		INSERT INTO orders SELECT g, %[5]s, 1, 'h' FROM generate_series(%[1]d, %[1]d + 11999) g;
		UPDATE orders SET id = id - %[1]d + %[2]d WHERE id BETWEEN %[1]d AND %[1]d + 99;
		UPDATE orders SET note = %[6]s WHERE id = %[2]d + 1;
		UPDATE orders SET id = id - %[3]d + %[2]d + 100 WHERE id BETWEEN %[3]d AND %[3]d + 50;
		DELETE FROM orders WHERE id BETWEEN %[1]d + 100 AND %[1]d + 300;
		UPDATE customers SET id = %[4]d WHERE id = %[7]d AND NOT EXISTS (SELECT FROM customers WHERE id = %[4]d);
		COMMIT`, first, moved, lo, cust, w.customer(), w.big(), w.anyCustomer())
}

// truncate empties one or both tables and refills some rows in the same
// transaction, so that the workload keeps data to work on.
func (w *workload) truncate() string {
	refillCustomers := fmt.Sprintf(`INSERT INTO customers SELECT g, 'r' || g, 'r' FROM generate_series(1, %d) g ON CONFLICT (id) DO NOTHING`, faultCustomers)
	refillOrders := fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% %d, 1, 'r' FROM generate_series(1, %d) g ON CONFLICT (id) DO NOTHING`,
		faultCustomers+faultAbsent, w.nextOrder/2)
	switch w.r.IntN(3) {
	case 0:
		return "BEGIN; TRUNCATE orders; " + refillOrders + "; COMMIT"
	case 1:
		return "BEGIN; TRUNCATE customers; " + refillCustomers + "; COMMIT"
	default:
		return "BEGIN; TRUNCATE orders, customers; " + refillCustomers + "; " + refillOrders + "; COMMIT"
	}
}

// partitionDDL moves rows in or out of a hash partition of either table
// without row changes in the WAL: a partition detached, changed while
// detached and attached back (in one transaction, or in two with the
// change between), truncated on its own, or dropped and created again
// empty.
func (w *workload) partitionDDL() string {
	table, modulus := "orders", 4
	change := `UPDATE %[1]s SET note = 'detached' WHERE id %% 5 = 0; DELETE FROM %[1]s WHERE id %% 7 = 0`
	if w.r.IntN(2) == 0 {
		table, modulus = "customers", 3
		change = `UPDATE %[1]s SET name = 'detached' WHERE id %% 5 = 0; DELETE FROM %[1]s WHERE id %% 7 = 0`
	}
	rem := w.r.IntN(modulus)
	leaf := fmt.Sprintf("%s_h%d", table, rem)
	detach := fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", table, leaf)
	attach := fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES WITH (MODULUS %d, REMAINDER %d)", table, leaf, modulus, rem)
	change = fmt.Sprintf(change, leaf)
	switch w.r.IntN(4) {
	case 3:
		w.counts["partition drop, create"]++
		create := fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES WITH (MODULUS %d, REMAINDER %d)", leaf, table, modulus, rem)
		return "DROP TABLE " + leaf + "; COMMIT; " + create
	case 0:
		w.counts["partition detach-change-attach, one transaction"]++
		return "BEGIN; " + detach + "; " + change + "; " + attach + "; COMMIT"
	case 1:
		w.counts["partition detach, change, attach"]++
		return detach + "; COMMIT; BEGIN; " + change + "; COMMIT; " + attach
	default:
		w.counts["partition truncate"]++
		return "TRUNCATE " + leaf
	}
}

// next returns the next step's SQL and kind; truncate forces a TRUNCATE.
func (w *workload) next(truncate bool) (string, opKind) {
	if truncate || w.r.IntN(4000) == 0 {
		w.counts["truncate"]++
		return w.truncate(), opTruncate
	}
	if w.r.IntN(1500) == 0 {
		w.counts["huge transaction"]++
		return w.huge(), opHuge
	}
	if w.partitioned && w.r.IntN(120) == 0 {
		return w.partitionDDL(), opPartition
	}
	switch n := w.r.IntN(100); {
	case n < 8:
		return w.fanout(), opFanout
	case n < 20:
		return w.multi(), opMulti
	case n < 24:
		return w.bulk(), opBulk
	default:
		return w.single(), opSingle
	}
}

// step runs the next random statement (a TRUNCATE when truncate is set).
func (w *workload) step(t *testing.T, truncate bool) {
	t.Helper()
	q, kind := w.next(truncate)
	w.exec(t, q, kind)
}

// stepAs runs a statement of the given kind (opFanout, opHuge or opMulti).
func (w *workload) stepAs(t *testing.T, kind opKind) {
	t.Helper()
	var q string
	switch kind {
	case opFanout:
		q = w.fanout()
	case opHuge:
		w.counts["huge transaction"]++
		q = w.huge()
	default:
		q = w.multi()
	}
	w.exec(t, q, kind)
}

// exec runs q, retrying through connection errors (the fault schedule
// restarts and pauses Postgres).
func (w *workload) exec(t *testing.T, q string, kind opKind) {
	t.Helper()
	if kind == opTruncate {
		w.truncates++
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := w.tc.Pool.Exec(ctx, q)
		cancel()
		if err == nil {
			if kind != opSingle {
				var lsn string
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = w.tc.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
				cancel()
				w.note(fmt.Sprintf("wal %s after: %.300s", lsn, q))
			}
			w.ops++
			w.last = kind
			return
		}
		var pgErr *pgconn.PgError
		if time.Now().After(deadline) || errors.As(err, &pgErr) && !transient(pgErr.Code) {
			t.Fatalf("workload: %s: %v", q, err)
		}
		w.retries++
		w.tc.Pool.Reset()
		time.Sleep(200 * time.Millisecond)
	}
}

// transient reports whether a Postgres error code comes from a server
// shutting down or restarting (classes 57, 08, 53), which a retry survives.
func transient(code string) bool {
	return strings.HasPrefix(code, "57") || strings.HasPrefix(code, "08") || strings.HasPrefix(code, "53")
}

// report lists the changes generated, by name.
func (w *workload) report() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(w.counts)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, w.counts[k]))
	}
	return strings.Join(parts, ", ")
}
