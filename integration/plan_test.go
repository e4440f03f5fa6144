package integration

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// planJoins are a two-table join and a chain of three tables over the same
// tables, with text columns of a few widths, for check --plan.
const planJoins = `
joins:
  - name: orders_plan
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
      columns: [id, customer_id, amount, note]
    right:
      table: public.customers
      columns: [name AS customer_name, tier]
    target:
      table: public.orders_plan
  - name: orders_chain
    type: left
    left:
      table: public.orders
      columns: [id, amount]
    right:
      - table: public.customers
        foreign_key: [customer_id]
        columns: [name AS customer_name]
      - table: public.regions
        from: customers
        foreign_key: [region_id]
        columns: [name AS region_name]
    target:
      table: public.orders_chain
`

// TestCheckPlan: `check --plan` names what run will create (slot,
// publication, metadata schema, each target's DDL, the Redis prefix) and
// estimates the Redis state; a real backfill then creates exactly those,
// its state is within a factor of 2 of the estimate (the README's and the
// plan's stated bound), and after it the plan finds them all existing.
func TestCheckPlan(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc,
		`CREATE TABLE regions (id int PRIMARY KEY, name text)`,
		`CREATE TABLE customers (id bigint PRIMARY KEY, name text, tier text, region_id int)`,
		`CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text)`,
		`INSERT INTO regions SELECT g, 'region ' || g FROM generate_series(1, 5) g`,
		`INSERT INTO customers SELECT g, 'customer number ' || g, (ARRAY['bronze','silver','gold'])[1 + g % 3], 1 + g % 5 FROM generate_series(1, 4000) g`,
		`INSERT INTO orders SELECT g, 1 + g % 4000, (g % 997) * 1.25, 'a note of some length ' || g FROM generate_series(1, 120000) g`,
		`ANALYZE regions, customers, orders`)
	env := cliEnv(t, tc, planJoins)

	r := runCLI(t, env, "check", "--plan", "--json")
	if r.code != 0 {
		t.Fatalf("check --plan --json: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	var res struct {
		OK   bool          `json:"ok"`
		Plan fkmat.RunPlan `json:"plan"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("check --plan --json: %v\n%s", err, r.stdout)
	}
	p := res.Plan
	if !res.OK || p.Slot.Name != tc.Slot || p.Slot.Exists || !strings.Contains(p.Slot.Statement, "CREATE_REPLICATION_SLOT") ||
		p.Publication.Exists || !strings.Contains(p.Publication.Statement, `"public"."orders"`) || len(p.Joins) != 2 {
		t.Fatalf("plan before the backfill: %+v", p)
	}
	for _, j := range p.Joins {
		if j.Target.Exists || !strings.HasPrefix(j.Target.Statement, "CREATE TABLE") || !strings.HasPrefix(j.RedisPrefix, "fkmat:"+tc.Slot+":"+j.Name) {
			t.Fatalf("plan of join %s: %+v", j.Name, j)
		}
		if j.BackfillRows < 120000 || j.RedisBytes <= 0 || j.BackfillSeconds <= 0 {
			t.Fatalf("plan of join %s: no estimate: %+v", j.Name, j)
		}
	}
	// The spools hold the four largest tables' states at most (here: every
	// table of both joins, 5 in all: all but the smallest).
	if p.BackfillDiskBytes <= 0 || p.BackfillDiskBytes >= p.RedisBytes {
		t.Fatalf("temporary disk estimate %d B, Redis %d B", p.BackfillDiskBytes, p.RedisBytes)
	}
	text := runCLI(t, env, "check", "--plan")
	for _, want := range []string{"fkmat run will use:", "slot " + tc.Slot, "CREATE TABLE \"public\".\"orders_plan\"", "redis keys: fkmat:" + tc.Slot + ":orders_chain",
		"estimate, all joins: Redis", "temporary disk during the backfill"} {
		if text.code != 0 || !strings.Contains(text.stdout, want) {
			t.Fatalf("check --plan: exit %d, no %q in\n%s%s", text.code, want, text.stdout, text.stderr)
		}
	}
	t.Logf("check --plan:\n%s", text.stdout)

	start := time.Now()
	if r := runCLI(t, env, "backfill"); r.code != 0 {
		t.Fatalf("backfill: exit %d\n%s", r.code, r.stderr)
	}
	took := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, j := range p.Joins {
		real := stateBytes(ctx, t, tc.Redis, strings.TrimSuffix(j.RedisPrefix, ":"))
		ratio := float64(j.RedisBytes) / float64(real)
		t.Logf("join %s: Redis estimate %d B, real %d B (MEMORY USAGE), estimate/real %.2f; backfill estimate %.1f s, both joins took %.1f s",
			j.Name, j.RedisBytes, real, ratio, j.BackfillSeconds, took.Seconds())
		if ratio < 0.5 || ratio > 2 {
			t.Errorf("join %s: Redis estimate %d B is not within 2x of the real state's %d B", j.Name, j.RedisBytes, real)
		}
	}
	if r := runCLI(t, env, "verify"); r.code != 0 {
		t.Fatalf("verify after the backfill: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	r = runCLI(t, env, "check", "--plan", "--json")
	res.Plan = fkmat.RunPlan{}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 {
		t.Fatalf("check --plan --json after the backfill: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	if p := res.Plan; !p.Slot.Exists || !p.Publication.Exists || !p.Metadata.Exists || !p.Joins[0].Target.Exists || !p.Joins[1].Target.Exists {
		t.Fatalf("plan after the backfill: not everything exists: %+v", p)
	}
}

// stateBytes sums MEMORY USAGE over the keys of a join's state (every key
// under prefix, the per-table states of a join of several tables too).
func stateBytes(ctx context.Context, t *testing.T, rdb redis.UniversalClient, prefix string) int64 {
	t.Helper()
	var total int64
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			n, err := rdb.MemoryUsage(ctx, k, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
		if cursor = next; cursor == 0 {
			return total
		}
	}
}
