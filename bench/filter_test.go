package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
)

// w1FilteredYAML is W1's join with a filter keeping half of the orders
// and a computed column.
const w1FilteredYAML = `
joins:
  - name: orders_enriched
    type: left
    left: {table: orders, foreign_key: [customer_id], where: "id % 2 = 0",
           columns: [id, customer_id, amount, note, "amount * 2 AS amount2"]}
    right: {table: customers}
    target: {table: orders_enriched}
`

// benchW1Filtered measures W1's catch-up with w1FilteredYAML beside plain
// W1, alternately (plain, filtered, plain, filtered), each on a fresh
// database: the cost per change of the filter and the expression (CPU of
// fkmat and redis-server, and the catch-up time), and the Redis state
// (INFO used_memory growth over the backfill and catch-up).
func benchW1Filtered(t *testing.T, s sizes, rep *report) {
	type result struct {
		catchUp, cpu, mem float64
	}
	measure := func(filtered bool) result {
		w := w1(s)
		if filtered {
			w.yaml = w1FilteredYAML
			w.oracleTarget = `SELECT id, customer_id, amount, note, amount2, name, tier FROM orders_enriched`
			w.oracleSQL = `SELECT o.id, o.customer_id, o.amount, o.note, o.amount * 2, c.name, c.tier
				FROM orders o LEFT JOIN customers c ON o.customer_id = c.id WHERE o.id % 2 = 0`
		}
		d := newDB(t, w)
		mem0 := d.redisInfo("memory", "used_memory")
		_, catchUp, u := d.catchUp(w, "catchup")
		mem := d.redisInfo("memory", "used_memory") - mem0
		// The next run measures its own state only.
		if err := testenv.DeleteKeys(context.Background(), d.Redis, "fkmat:"+d.Slot+":"); err != nil {
			t.Fatal(err)
		}
		return result{catchUp.Seconds(), u.cpu + u.redisCPU, mem}
	}
	var plain, filtered []result
	for range 2 {
		plain = append(plain, measure(false))
		filtered = append(filtered, measure(true))
	}
	n := float64(w1(s).changes())
	name := "W1 insert/update"
	var cpuRatio, timeRatio, memRatio float64
	for i := range plain {
		cpuRatio += filtered[i].cpu / plain[i].cpu / float64(len(plain))
		timeRatio += filtered[i].catchUp / plain[i].catchUp / float64(len(plain))
		memRatio += filtered[i].mem / plain[i].mem / float64(len(plain))
	}
	rep.row(name, "filtered (half the orders) + an expression: CPU per change / plain", cpuRatio, "ratio",
		fmt.Sprintf("fkmat + redis-server CPU per 1k changes: plain %.1f / %.1f ms, filtered %.1f / %.1f ms (A B A B)",
			1e6*plain[0].cpu/n, 1e6*plain[1].cpu/n, 1e6*filtered[0].cpu/n, 1e6*filtered[1].cpu/n), false)
	rep.row(name, "filtered + an expression: catch-up time / plain", timeRatio, "ratio",
		fmt.Sprintf("plain %.2f / %.2f s, filtered %.2f / %.2f s", plain[0].catchUp, plain[1].catchUp, filtered[0].catchUp, filtered[1].catchUp), false)
	rep.row(name, "filtered + an expression: Redis used_memory growth / plain", memRatio, "ratio",
		fmt.Sprintf("plain %.1f / %.1f MB, filtered %.1f / %.1f MB", plain[0].mem/1e6, plain[1].mem/1e6, filtered[0].mem/1e6, filtered[1].mem/1e6), false)
	rep.target("W1 with a 50% filter and an expression: CPU per change ≤ 1.2x plain", cpuRatio, "<=", 1.2, "x")
	rep.target("W1 with a 50% filter and an expression: Redis state ≤ 0.55x plain", memRatio, "<=", 0.55, "x")
}
