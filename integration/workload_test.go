package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// faultSeedSQL creates the shop tables with hot customers.
func faultSeedSQL() []string {
	return []string{shop,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g %% 3 = 0 THEN NULL ELSE 't' || (g %% 4) END
			FROM generate_series(1, %d) g`, faultCustomers),
		fmt.Sprintf(`INSERT INTO orders SELECT g,
			CASE WHEN g <= %[1]d THEN 1 + g %% %[2]d WHEN g %% 17 = 0 THEN NULL ELSE 1 + (g * 7919) %% %[3]d END,
			g %% 1000, 'n' FROM generate_series(1, %[4]d) g`,
			faultHot*faultHotOrders, faultHot, faultCustomers+faultAbsent, faultOrders),
	}
}

// opKind names what a workload step did, so that the fault schedule can
// kill the daemon right after a large fan-out or a multi-row transaction.
type opKind int

const (
	opSingle   opKind = iota // one row on one side
	opFanout                 // an update of a hot customer (hundreds of dependents)
	opMulti                  // a multi-statement transaction on both sides
	opBulk                   // one statement moving many orders
	opTruncate               // TRUNCATE of one or both tables
)

// workload is a seeded random writer on the shop tables: inserts, updates and
// deletes on both sides, foreign-key moves (to NULL, to absent customers, to
// hot customers), multi-row transactions and an occasional TRUNCATE. Steps
// are generated from the seed alone, so a seed replays the same statements.
type workload struct {
	tc        *testenv.Case
	r         *rand.Rand
	nextOrder int
	ops       int // steps executed
	truncates int
	retries   int // statements retried after a connection error
}

func newWorkload(tc *testenv.Case, seed uint64) *workload {
	return &workload{tc: tc, r: rand.New(rand.NewPCG(seed, 0x6b6d6174)), nextOrder: faultOrders + 1}
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

func (w *workload) single() string {
	switch w.r.IntN(9) {
	case 0, 1:
		id := w.nextOrder
		w.nextOrder++
		return fmt.Sprintf(`INSERT INTO orders VALUES (%d, %s, %d, 'w')`, id, w.customer(), w.r.IntN(10000))
	case 2:
		return fmt.Sprintf(`UPDATE orders SET amount = amount + 1 WHERE id = %d`, w.order())
	case 3:
		return fmt.Sprintf(`UPDATE orders SET customer_id = %s WHERE id = %d`, w.customer(), w.order())
	case 4:
		// A column outside the join: must write nothing to the target.
		return fmt.Sprintf(`UPDATE orders SET note = note || 'z' WHERE id = %d`, w.order())
	case 5:
		return fmt.Sprintf(`DELETE FROM orders WHERE id = %d`, w.order())
	case 6:
		c := w.anyCustomer()
		return fmt.Sprintf(`INSERT INTO customers VALUES (%d, 'new%d', 'n') ON CONFLICT (id) DO UPDATE SET name = customers.name || 'u'`, c, c)
	case 7:
		return fmt.Sprintf(`UPDATE customers SET tier = %s WHERE id = %d`,
			[]string{"NULL", "'gold'", "'silver'"}[w.r.IntN(3)], w.anyCustomer())
	default:
		return fmt.Sprintf(`DELETE FROM customers WHERE id = %d`, w.anyCustomer())
	}
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
	switch w.r.IntN(3) {
	case 0:
		return fmt.Sprintf(`UPDATE orders SET customer_id = %d WHERE id BETWEEN %d AND %d`, 1+w.r.IntN(faultHot), lo, lo+50+w.r.IntN(150))
	case 1:
		return fmt.Sprintf(`UPDATE orders SET customer_id = %s WHERE id BETWEEN %d AND %d`, w.customer(), lo, lo+w.r.IntN(100))
	default:
		return fmt.Sprintf(`UPDATE customers SET name = name || '.' WHERE id BETWEEN %d AND %d`, 1+w.r.IntN(faultCustomers), 1+w.r.IntN(faultCustomers)+20)
	}
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

// next returns the next step's SQL and kind; truncate forces a TRUNCATE.
func (w *workload) next(truncate bool) (string, opKind) {
	if truncate || w.r.IntN(4000) == 0 {
		return w.truncate(), opTruncate
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

// stepAs runs a statement of the given kind (opFanout or opMulti).
func (w *workload) stepAs(t *testing.T, kind opKind) {
	t.Helper()
	q := w.multi()
	if kind == opFanout {
		q = w.fanout()
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
			w.ops++
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
