package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fkmat/fkmat/internal/testenv"
)

// badCase is one configuration problem driven through `fkmat <cmd>`: the
// schema to create, the joins YAML, the exit code and the fragments the
// message must contain (the problem and its fix).
type badCase struct {
	name   string
	schema string
	yaml   string
	cmd    string
	code   int
	want   []string
}

// TestBadInputCLI: each configuration problem (bad input gets an error that
// names the fix, and loses nothing) makes the
// CLI exit 2 with a message naming the fix, and nothing is created: no slot,
// no publication, no Redis state.
func TestBadInputCLI(t *testing.T) {
	cases := []badCase{
		{
			name:   "no_primary_key",
			schema: `CREATE TABLE customers (id bigint PRIMARY KEY, name text); CREATE TABLE orders (id bigint, customer_id bigint)`,
			yaml:   joinYAML("left", "public.orders", "public.customers", "[customer_id]", "", ""),
			cmd:    "check", code: 2,
			want: []string{"public.orders", "no primary key", "left.key"},
		},
		{
			name:   "unknown_table",
			schema: shop,
			yaml:   joinYAML("left", "public.orderz", "public.customers", "[customer_id]", "", ""),
			cmd:    "check", code: 2,
			want: []string{"left table public.orderz does not exist in the source database (did you mean public.orders?)"},
		},
		{
			name:   "misspelled_right_table",
			schema: shop,
			yaml: `
joins:
  - name: j
    type: left
    left: {table: public.orders}
    right:
      - {table: public.custmers, foreign_key: [customer_id]}
    target: {table: public.j}
`,
			cmd: "check", code: 2,
			want: []string{"right[0] (custmers): table public.custmers does not exist in the source database (did you mean public.customers?)"},
		},
		{
			name:   "unknown_column",
			schema: shop,
			yaml:   joinYAML("left", "public.orders", "public.customers", "[customer_id]", "[id, customer_id, amount, nope]", ""),
			cmd:    "check", code: 2,
			want: []string{`"nope"`},
		},
		{
			name:   "fk_type_mismatch",
			schema: `CREATE TABLE customers (id bigint PRIMARY KEY, name text); CREATE TABLE orders (id bigint PRIMARY KEY, customer_id text)`,
			yaml:   joinYAML("left", "public.orders", "public.customers", "[customer_id]", "", ""),
			cmd:    "check", code: 2,
			want: []string{"customer_id", "text", "bigint"},
		},
		{
			name:   "unknown_join_type",
			schema: shop,
			yaml:   joinYAML("outer", "public.orders", "public.customers", "[customer_id]", "", ""),
			cmd:    "check", code: 2,
			want: []string{`"outer"`, "use `type: inner` or `type: left`"},
		},
		{
			name:   "duplicate_join_names",
			schema: shop,
			yaml: joinYAML("left", "public.orders", "public.customers", "[customer_id]", "", "") +
				strings.Replace(strings.TrimPrefix(joinYAML("inner", "public.orders", "public.customers", "[customer_id]", "", ""), "joins:\n"),
					"public.orders_enriched", "public.orders_enriched2", 1),
			cmd: "check", code: 2,
			want: []string{"duplicate join name", "unique name"},
		},
		{
			name:   "target_other_shape",
			schema: shop + `; CREATE TABLE orders_enriched (id int PRIMARY KEY, something text)`,
			yaml:   joinYAML("left", "public.orders", "public.customers", "[customer_id]", "", ""),
			cmd:    "check", code: 2,
			want: []string{`"public"."orders_enriched"`, `column "something" is not produced by the join`, "choose another target.table"},
		},
		{
			name:   "target_other_shape_migrate",
			schema: shop + `; CREATE TABLE orders_enriched (id int PRIMARY KEY, something text)`,
			yaml:   joinYAML("left", "public.orders", "public.customers", "[customer_id]", "", ""),
			cmd:    "migrate", code: 2,
			want: []string{`"public"."orders_enriched"`, "choose another target.table"},
		},
		{
			name:   "target_other_shape_run",
			schema: shop + `; CREATE TABLE orders_enriched (id int PRIMARY KEY, something text)`,
			yaml:   joinYAML("left", "public.orders", "public.customers", "[customer_id]", "", ""),
			cmd:    "run", code: 2,
			want: []string{`"public"."orders_enriched"`, "choose another target.table"},
		},
		{
			name:   "malformed_yaml",
			schema: shop,
			yaml:   "joins:\n  - name: x\n    type: left\n   left: [",
			cmd:    "check", code: 2,
			want: []string{"malformed YAML", "line"},
		},
		{
			name:   "unknown_yaml_key",
			schema: shop,
			yaml:   strings.Replace(joinYAML("left", "public.orders", "public.customers", "[customer_id]", "", ""), "foreign_key", "foreign_keys", 1),
			cmd:    "check", code: 2,
			want: []string{`left has no key "foreign_keys"; did you mean foreign_key?`},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, c.schema)
			env := cliEnv(t, tc, c.yaml)
			r := runCLI(t, env, c.cmd)
			t.Logf("fkmat %s: exit %d: %s", c.cmd, r.code, strings.TrimSpace(r.stderr))
			if r.code != c.code {
				t.Fatalf("fkmat %s: exit %d, want %d\nstdout: %s\nstderr: %s", c.cmd, r.code, c.code, r.stdout, r.stderr)
			}
			for _, w := range c.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("fkmat %s: message lacks %q:\n%s", c.cmd, w, r.stderr)
				}
			}
			assertNothingCreated(t, tc)
		})
	}
}

// joinYAML is a one-join definition of orders -> customers.
func joinYAML(typ, left, right, fk, leftCols, rightCols string) string {
	y := "joins:\n  - name: orders_enriched\n    type: " + typ + "\n    left:\n      table: " + left + "\n      foreign_key: " + fk + "\n"
	if leftCols != "" {
		y += "      columns: " + leftCols + "\n"
	}
	y += "    right:\n      table: " + right + "\n"
	if rightCols != "" {
		y += "      columns: " + rightCols + "\n"
	}
	return y + "    target:\n      table: public.orders_enriched\n"
}

// assertNothingCreated: a refused configuration leaves no slot, no
// publication and no Redis state behind.
func assertNothingCreated(t *testing.T, tc *testenv.Case) {
	t.Helper()
	ctx := context.Background()
	var slots, pubs int
	if err := tc.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1),
		(SELECT count(*) FROM pg_publication WHERE pubname = $2)`, tc.Slot, tc.Publication).Scan(&slots, &pubs); err != nil {
		t.Fatal(err)
	}
	if slots != 0 || pubs != 0 {
		t.Errorf("after a refused configuration: %d slots, %d publications", slots, pubs)
	}
	keys, err := tc.Redis.Keys(ctx, "fkmat:"+tc.Slot+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 0 {
		t.Errorf("after a refused configuration: redis keys %v", keys)
	}
}

// writeFile writes a file under the test's temp dir.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBadInputNoReplication: a role without the REPLICATION attribute fails
// fkmat check with exit 2 naming ALTER ROLE ... REPLICATION, and fkmat run
// exits 2 (no retrying) with the same fix, creating no slot.
func TestBadInputNoReplication(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop)
	role, roleURL := createRole(t, tc, "NOREPLICATION", minimalGrants(tc)...)
	env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_SOURCE_URL", roleURL)
	want := "ALTER ROLE " + pgx.Identifier{role}.Sanitize() + " REPLICATION"
	r := runCLI(t, env, "check")
	if r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Fatalf("check without REPLICATION: exit %d, want 2 naming %q\n%s%s", r.code, want, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "run")
	if r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Fatalf("run without REPLICATION: exit %d, want 2 naming %q\n%s%s", r.code, want, r.stdout, r.stderr)
	}
	var slots int
	if err := tc.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("slots after a refused run: %d, %v", slots, err)
	}
}

// TestBadInputSlotInUse: a second fkmat run on the same configuration while
// one runs gives up after --slot-busy-timeout (FKMAT_SLOT_BUSY_TIMEOUT, 4 s
// here) with a message naming the slot, the process that holds it and how
// long it waited; the first daemon keeps working and the target stays equal to
// the SQL join.
func TestBadInputSlotInUse(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold')`, `INSERT INTO orders VALUES (1, 1, 1, 'n')`)
	env := cliEnv(t, tc, leftJoinYAML)
	first := startRunCLI(t, env)
	waitCaughtUp(t, tc, first.daemon)
	// Caught up is reported once the backfill is done, which can be a
	// moment before the daemon's stream takes the slot.
	pid := slotHolder(t, tc)
	start := time.Now()
	r := runCLI(t, append(env, "FKMAT_SLOT_BUSY_TIMEOUT=4s"), "run")
	t.Logf("second run gave up after %s: exit %d: %s", time.Since(start).Round(time.Second), r.code, tail(r.stderr, 600))
	for _, want := range []string{"replication slot is in use", tc.Slot, fmt.Sprint(pid), "still after 4s"} {
		if r.code == 0 || !strings.Contains(r.stderr, want) {
			t.Errorf("second run: exit %d, message lacks %q:\n%s", r.code, want, tail(r.stderr, 3000))
		}
	}
	if r := runCLI(t, env, "run", "--slot-busy-timeout", "0s"); r.code != 2 || !strings.Contains(r.stderr, "--slot-busy-timeout 0s: use a positive duration") {
		t.Errorf("run --slot-busy-timeout 0s: exit %d, want 2 naming the flag:\n%s", r.code, tail(r.stderr, 3000))
	}
	sqlExec(t, tc, `UPDATE customers SET name = 'ANN'`, `INSERT INTO orders VALUES (2, 1, 2, 'x')`)
	waitCaughtUp(t, tc, first.daemon)
	assertOracle(t, daemonConfig(t, tc, leftJoinYAML))
	if err := first.term(t); err != nil {
		t.Fatalf("first run: %v\n%s", err, first.stderr.String())
	}
}

// slotHolder waits until a process holds the test's replication slot and
// returns its server PID.
func slotHolder(t *testing.T, tc *testenv.Case) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var pid *int
		err := tc.Pool.QueryRow(ctx, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot).Scan(&pid)
		if err == nil && pid != nil {
			return *pid
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no process holds slot %s within 30 s (last error: %v)", tc.Slot, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestBadInputUnreachable: with Postgres or Redis on a closed port, fkmat
// run keeps retrying with growing delays and logs why (the URL without its
// password), and SIGTERM ends it with exit 0; fkmat check exits 2 naming
// the redacted URL.
func TestBadInputUnreachable(t *testing.T) {
	const password = "Unreachable-Pw-7731"
	for _, which := range []string{"postgres", "redis"} {
		t.Run(which, func(t *testing.T) {
			tc := testenv.New(t)
			sqlExec(t, tc, shop)
			env := cliEnv(t, tc, leftJoinYAML)
			addr := closedPort(t)
			var bad, redacted string
			if which == "postgres" {
				bad = "postgres://fkmat:" + password + "@" + addr + "/shop?sslmode=disable"
				redacted = "postgres://fkmat:xxxxx@" + addr + "/shop"
				env = withEnv(env, "FKMAT_SOURCE_URL", bad)
			} else {
				bad = "redis://fkmat:" + password + "@" + addr + "/0"
				redacted = "redis://fkmat:xxxxx@" + addr + "/0"
				env = withEnv(env, "FKMAT_REDIS_URL", bad)
			}
			r := runCLI(t, env, "check")
			if r.code != 2 || !strings.Contains(r.stderr, redacted) || strings.Contains(r.stdout+r.stderr, password) {
				t.Fatalf("check: exit %d, want 2 naming %s without the password\n%s%s", r.code, redacted, r.stdout, r.stderr)
			}
			d := startRunCLI(t, env, "--log-format", "json")
			time.Sleep(8 * time.Second)
			if err := d.term(t); err != nil {
				t.Fatalf("run after SIGTERM: %v, want exit 0\n%s", err, d.stderr.String())
			}
			out := d.stderr.String()
			if strings.Contains(out, password) {
				t.Fatalf("run logged the password:\n%s", out)
			}
			var retries []time.Duration
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var rec struct {
					Msg     string `json:"msg"`
					Err     string `json:"err"`
					RetryIn int64  `json:"retry_in"` // slog's JSON form of a duration: nanoseconds
				}
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("--log-format json printed a non-JSON line: %q", line)
				}
				if rec.RetryIn == 0 {
					continue
				}
				if !strings.Contains(rec.Err, redacted) || !strings.Contains(rec.Err, "connect") {
					t.Errorf("retry log does not say why (connecting to %s): %s", redacted, line)
				}
				retries = append(retries, time.Duration(rec.RetryIn))
			}
			// 8 s with delays 0.5-1.5 s, 1-3 s, 2-6 s...: at least 2 attempts,
			// and the delay grows (the jittered third delay is at least
			// 2 s, above the first's 1.5 s maximum).
			if len(retries) < 2 {
				t.Fatalf("%d retries logged in 8 s, want >= 2:\n%s", len(retries), out)
			}
			if len(retries) >= 3 && retries[2] <= retries[0] {
				t.Errorf("retry delays do not grow: %v", retries)
			}
			t.Logf("retry delays: %v", retries)
		})
	}
}

// TestBadInputOldRedis: a Redis that does not say its version (one older
// than 6.0 does not know HELLO; here it is renamed away) is refused by
// check and by run, exit 2, naming the fix, before anything is written.
func TestBadInputOldRedis(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop)
	old := testenv.StartLocalRedis(t, "--rename-command", "HELLO", "")
	env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_REDIS_URL", old.URL())
	for _, args := range [][]string{{"check"}, {"run"}} {
		r := runCLI(t, env, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "does not know HELLO") || !strings.Contains(r.stderr, "fkmat needs Redis 6.2.0 or newer") {
			t.Errorf("%s: exit %d, want 2 naming the Redis version\n%s%s", args[0], r.code, r.stdout, r.stderr)
		}
	}
	if n, err := old.Client().DBSize(context.Background()).Result(); err != nil || n != 0 {
		t.Errorf("the old Redis holds %d keys (%v), want none", n, err)
	}
}

// TestBadInputLargeValues: source values of 2 MB on both sides (a text
// column of each table) go through backfill, streaming inserts, fan-out
// updates and unchanged-TOAST updates; the target equals the SQL join.
func TestBadInputLargeValues(t *testing.T) {
	tc := testenv.New(t)
	const big = `(SELECT string_agg(md5(random()::text || g), '') FROM generate_series(1, 65536) g)` // 2 MiB
	sqlExec(t, tc, shop,
		`INSERT INTO customers VALUES (1, `+big+`, 'gold'), (2, 'bob', `+big+`)`,
		`INSERT INTO orders VALUES (1, 1, 1, `+big+`), (2, 2, 2, 'n'), (3, 1, 3, `+big+`)`)
	const allColumns = `
joins:
  - name: orders_enriched
    type: left
    left:
      table: public.orders
      foreign_key: [customer_id]
    right:
      table: public.customers
      columns: [name AS customer_name, tier]
    target:
      table: public.orders_enriched
`
	env := cliEnv(t, tc, allColumns)
	d := startRunCLI(t, env)
	waitCaughtUp(t, tc, d.daemon)
	cfg := daemonConfig(t, tc, allColumns)
	assertOracle(t, cfg)
	sqlExec(t, tc,
		`INSERT INTO orders VALUES (4, 2, 4, `+big+`)`,
		`UPDATE customers SET name = `+big+` WHERE id = 1`, // fan-out of a new 2 MB value
		`UPDATE orders SET amount = amount + 1`,            // unchanged TOASTed notes
		`UPDATE customers SET tier = 't' WHERE id = 2`,     // unchanged TOASTed name, 2 MB tier replaced
		`UPDATE orders SET customer_id = 2 WHERE id = 3`)
	waitCaughtUp(t, tc, d.daemon)
	assertOracle(t, cfg)
	var maxLen int
	if err := tc.Pool.QueryRow(context.Background(), `SELECT max(length(note)) + max(length(customer_name)) FROM orders_enriched`).Scan(&maxLen); err != nil || maxLen != 4<<20 {
		t.Fatalf("largest values in the target: %d, %v; want 2 MiB each", maxLen, err)
	}
	if err := d.term(t); err != nil {
		t.Fatalf("run: %v\n%s", err, d.stderr.String())
	}
}

// TestBadInputWALLevel: against a Postgres with wal_level=replica, fkmat
// check exits 2 naming wal_level=logical, and fkmat run exits 2 with the
// same fix instead of retrying, creating no slot and no Redis state.
func TestBadInputWALLevel(t *testing.T) {
	tc := testenv.New(t)
	admin := tc.Env.ExtraPostgres(t, "-c", "wal_level=replica").URL
	sourceURL := strings.Replace(admin, "/postgres?", "/shop?", 1)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE shop"); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	if conn, err = pgx.Connect(ctx, sourceURL); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, shop); err != nil {
		t.Fatal(err)
	}
	env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_SOURCE_URL", sourceURL)
	r := runCLI(t, env, "check")
	if r.code != 2 || !strings.Contains(r.stderr, "set wal_level=logical") {
		t.Fatalf("check with wal_level=replica: exit %d, want 2 naming wal_level=logical\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = runCLI(t, env, "run")
	if r.code != 2 || !strings.Contains(r.stderr, "wal_level=logical") {
		t.Fatalf("run with wal_level=replica: exit %d, want 2 naming wal_level=logical\n%s%s", r.code, r.stdout, tail(r.stderr, 3000))
	}
	t.Logf("run: exit %d: %s", r.code, tail(r.stderr, 400))
	var slots int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("slots after a refused run: %d, %v", slots, err)
	}
	_ = conn.Close(ctx)
	assertNothingCreated(t, tc)
}
