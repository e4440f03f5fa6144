package bench

import (
	"fmt"
	"math/rand/v2"
)

// schema is the one every workload starts from.
const schema = `
CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text);
CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text);
CREATE INDEX ON orders (customer_id);
`

// joinYAML is the join every contender maintains: orders LEFT JOIN customers.
const joinYAML = `
joins:
  - name: orders_enriched
    type: left
    left: {table: orders, foreign_key: [customer_id]}
    right: {table: customers}
    target: {table: orders_enriched}
`

// joinSQL is the SQL oracle, in the target's column order.
const joinSQL = `SELECT o.id, o.customer_id, o.amount, o.note, c.name, c.tier
	FROM orders o LEFT JOIN customers c ON o.customer_id = c.id`

// stmt is one statement of a transaction.
type stmt struct {
	sql  string
	args []any
}

// txn is one source transaction of a workload.
type txn struct {
	stmts   []stmt
	changes int // source row changes
}

// workload is a deterministic stream of transactions applied to tables that
// setup prepared.
type workload struct {
	name, title string
	// setup runs before the measured writes (and before any backfill).
	setup []string
	txns  []txn
	// targetWrites is how many target rows the SQL result changes by over
	// txns: what the write limit writes.
	targetWrites int
	// orders is how many orders exist at the end (and how many rows the
	// write limit's first pass inserts).
	orders int
	// yaml is fkmat's join configuration (joinYAML when empty).
	yaml string
	// oracleTarget and oracleSQL, when set, replace assertJoin's query of
	// orders_enriched and its SQL (a join of another shape than joinYAML).
	oracleTarget, oracleSQL string
}

func (w *workload) changes() int {
	n := 0
	for _, t := range w.txns {
		n += t.changes
	}
	return n
}

const (
	insertCustomers = `INSERT INTO customers (id, name, tier) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[])`
	insertOrders    = `INSERT INTO orders (id, customer_id, amount, note) SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::numeric[], $4::text[])`
	updateAmount    = `UPDATE orders SET amount = $2 WHERE id = $1`
	updateCustomer  = `UPDATE orders SET customer_id = $2 WHERE id = $1`
	renameCustomer  = `UPDATE customers SET name = $2 WHERE id = $1`
)

var tiers = []string{"bronze", "silver", "gold"}

func note(id int64) string { return fmt.Sprintf("note %032x", uint64(id)*0x9e3779b97f4a7c15) }

// customerTxns inserts customers first..last (inclusive) in transactions
// of per rows.
func customerTxns(first, last, per int) []txn {
	var out []txn
	for lo := first; lo <= last; lo += per {
		hi := min(lo+per-1, last)
		var ids []int64
		var names, ts []string
		for id := lo; id <= hi; id++ {
			ids = append(ids, int64(id))
			names = append(names, fmt.Sprintf("customer %d", id))
			ts = append(ts, tiers[id%3])
		}
		out = append(out, txn{stmts: []stmt{{insertCustomers, []any{ids, names, ts}}}, changes: len(ids)})
	}
	return out
}

// orderTxns inserts orders first..last (inclusive) in transactions of per
// rows.
func orderTxns(first, last, per int, customer func(id int) *int64) []txn {
	var out []txn
	for lo := first; lo <= last; lo += per {
		hi := min(lo+per-1, last)
		var ids []int64
		var cust []*int64
		var amounts, notes []string
		for id := lo; id <= hi; id++ {
			ids = append(ids, int64(id))
			cust = append(cust, customer(id))
			amounts = append(amounts, fmt.Sprintf("%d.%02d", id%1000, id%100))
			notes = append(notes, note(int64(id)))
		}
		out = append(out, txn{stmts: []stmt{{insertOrders, []any{ids, cust, amounts, notes}}}, changes: len(ids)})
	}
	return out
}

func ptr(v int64) *int64 { return &v }

// sizes are the workload sizes: the reference ones in full, tiny in the smoke run.
type sizes struct {
	W1Customers, W1Orders, W1Updates       int
	W1Paced, W1PacedRate                   int // freshness phase: changes at changes/s
	W2Hot, W2Others, W2PerOther, W2Updates int
	W2TriggerUpdates                       int
	W3Orders, W3Customers, W3Updates       int
	W4Orders, W4Customers                  int
	W5Scale, W5Seconds                     int // pgbench -s and -T
	W6Customers, W6PerCustomer, W6Rounds   int
	W8Orders, W8Customers                  int
	W9Orders, W9Customers                  int // W9's backfill
	FreshSeconds                           int // seconds of writes per freshness rate
	FreshHot                               int // the hot parent's children (FR)
	Refreshes                              int
	ProbeEvery                             int // ms between freshness markers
}

var fullSizes = sizes{
	W1Customers: 10_000, W1Orders: 300_000, W1Updates: 200_000,
	W1Paced: 100_000, W1PacedRate: 5_000,
	W2Hot: 200_000, W2Others: 999, W2PerOther: 100, W2Updates: 200, W2TriggerUpdates: 10,
	W3Orders: 100_000, W3Customers: 10_000, W3Updates: 100_000,
	W4Orders: 1_000_000, W4Customers: 50_000,
	W5Scale: 2, W5Seconds: 20,
	W6Customers: 1_000, W6PerCustomer: 200, W6Rounds: 3,
	W8Orders: 1_000_000, W8Customers: 50_000,
	W9Orders: 1_000_000, W9Customers: 100_000,
	FreshSeconds: 10,
	FreshHot:     100_000,
	Refreshes:    3, ProbeEvery: 50,
}

var smokeSizes = sizes{
	W1Customers: 100, W1Orders: 3_000, W1Updates: 2_000,
	W1Paced: 1_000, W1PacedRate: 5_000,
	W2Hot: 2_000, W2Others: 9, W2PerOther: 10, W2Updates: 5, W2TriggerUpdates: 2,
	W3Orders: 1_000, W3Customers: 100, W3Updates: 1_000,
	W4Orders: 20_000, W4Customers: 1_000,
	W5Scale: 1, W5Seconds: 2,
	W6Customers: 20, W6PerCustomer: 10, W6Rounds: 1,
	W8Orders: 20_000, W8Customers: 1_000,
	W9Orders: 20_000, W9Customers: 2_000,
	FreshSeconds: 1,
	FreshHot:     2_000,
	Refreshes:    1, ProbeEvery: 50,
}

// w1 (insert/update): customers, then orders inserted in transactions of
// 100, then single-row amount updates in transactions of 10.
func w1(s sizes) *workload {
	rng := rand.New(rand.NewPCG(1, 1))
	w := &workload{name: "W1", title: "insert/update", setup: []string{schema}, orders: s.W1Orders}
	w.txns = append(w.txns, customerTxns(1, s.W1Customers, 100)...)
	w.txns = append(w.txns, orderTxns(1, s.W1Orders, 100, func(id int) *int64 { return ptr(int64(1 + id%s.W1Customers)) })...)
	w.txns = append(w.txns, amountTxns(rng, s.W1Orders, s.W1Updates, 0)...)
	w.targetWrites = s.W1Orders + s.W1Updates
	return w
}

// amountTxns sets the amount of random orders, 10 per transaction, each to
// a value no order had before (so every update changes its row).
func amountTxns(rng *rand.Rand, orders, updates, base int) []txn {
	var out []txn
	for u := 0; u < updates; u += 10 {
		t := txn{}
		for k := u; k < min(u+10, updates); k++ {
			id := 1 + rng.IntN(orders)
			t.stmts = append(t.stmts, stmt{updateAmount, []any{int64(id), fmt.Sprintf("%d.%02d", 1000+(base+k)/100, (base+k)%100)}})
			t.changes++
		}
		out = append(out, t)
	}
	return out
}

// w1Paced is W1's freshness phase: more amount updates, written at a fixed
// rate by the caller.
func w1Paced(s sizes) []txn {
	return amountTxns(rand.New(rand.NewPCG(2, 2)), s.W1Orders, s.W1Paced, s.W1Updates)
}

// w2 (hot fan-out): one customer with many orders plus many small ones, then
// renames of the hot customer, one per transaction.
func w2(s sizes) *workload {
	others := s.W2Others * s.W2PerOther
	w := &workload{name: "W2", title: "hot fan-out", orders: s.W2Hot + others, setup: []string{schema,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, 'gold' FROM generate_series(1, %d) g`, s.W2Others+1),
		fmt.Sprintf(`INSERT INTO orders SELECT g, 1, g %% 100, 'n' FROM generate_series(1, %d) g`, s.W2Hot),
		fmt.Sprintf(`INSERT INTO orders SELECT %d + g, 2 + g %% %d, 1, 'n' FROM generate_series(1, %d) g`, s.W2Hot, s.W2Others, others),
		`VACUUM ANALYZE customers, orders`}}
	for u := 1; u <= s.W2Updates; u++ {
		w.txns = append(w.txns, txn{stmts: []stmt{{renameCustomer, []any{int64(1), fmt.Sprintf("hot %d", u)}}}, changes: 1})
	}
	w.targetWrites = s.W2Hot * s.W2Updates
	return w
}

// w3 (FK churn): orders over customers, then updates reassigning
// customer_id, 10 per transaction, 5% to NULL.
func w3(s sizes) *workload {
	rng := rand.New(rand.NewPCG(3, 3))
	w := &workload{name: "W3", title: "FK churn", orders: s.W3Orders, setup: []string{schema,
		fmt.Sprintf(`INSERT INTO customers SELECT g, 'customer ' || g, (ARRAY['bronze','silver','gold'])[1 + g %% 3] FROM generate_series(1, %d) g`, s.W3Customers),
		fmt.Sprintf(`INSERT INTO orders SELECT g, 1 + g %% %d, (g %% 1000) * 0.25, md5(g::text) FROM generate_series(1, %d) g`, s.W3Customers, s.W3Orders),
		`VACUUM ANALYZE customers, orders`}}
	current := make([]int64, s.W3Orders+1) // 0 = NULL
	for id := 1; id <= s.W3Orders; id++ {
		current[id] = int64(1 + id%s.W3Customers)
	}
	for u := 0; u < s.W3Updates; u += 10 {
		t := txn{}
		for k := u; k < min(u+10, s.W3Updates); k++ {
			id := 1 + rng.IntN(s.W3Orders)
			var next *int64
			if rng.IntN(100) >= 5 {
				c := int64(1 + rng.IntN(s.W3Customers))
				for c == current[id] {
					c = int64(1 + rng.IntN(s.W3Customers))
				}
				next = &c
			} else if current[id] == 0 {
				c := int64(1 + rng.IntN(s.W3Customers))
				next = &c
			}
			if next == nil {
				current[id] = 0
			} else {
				current[id] = *next
			}
			t.stmts = append(t.stmts, stmt{updateCustomer, []any{int64(id), next}})
			t.changes++
		}
		w.txns = append(w.txns, t)
	}
	w.targetWrites = s.W3Updates
	return w
}
