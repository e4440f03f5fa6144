package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
)

// createRole creates a LOGIN role with a password for this test, runs the
// grants (with %[1]s standing for the quoted role name) as the superuser in
// the test database, and returns the role's URL for that database. The role
// and what it owns are dropped at cleanup.
func createRole(t *testing.T, tc *testenv.Case, attrs string, grants ...string) (name, pgURL string) {
	t.Helper()
	ctx := context.Background()
	name = tc.Database + "_role"
	if len(name) > 63 {
		name = name[len(name)-63:]
	}
	q := pgx.Identifier{name}.Sanitize()
	password := "Pw-" + tc.Database[len(tc.Database)-8:] + "-secret"
	if _, err := tc.Env.Admin().Exec(ctx, "CREATE ROLE "+q+" LOGIN "+attrs+" PASSWORD '"+password+"'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// The role's walsenders hold its slot: end them before dropping.
		_, _ = tc.Env.Admin().Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name)
		conn, err := pgx.Connect(ctx, tc.DatabaseURL)
		if err == nil {
			_, _ = conn.Exec(ctx, "DROP OWNED BY "+q+" CASCADE")
			_ = conn.Close(ctx)
		}
		if _, err := tc.Env.Admin().Exec(ctx, "DROP ROLE IF EXISTS "+q); err != nil {
			t.Logf("drop role %s: %v", name, err)
		}
	})
	for _, g := range grants {
		sqlExec(t, tc, strings.ReplaceAll(g, "%[1]s", q))
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(name, password), Host: tc.Env.PostgresHostPort(),
		Path: "/" + tc.Database, RawQuery: "sslmode=disable"}
	return name, u.String()
}

// withEnv returns env with the variable key set to val.
func withEnv(env []string, key, val string) []string {
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, key+"=") {
			out = append(out, e)
		}
	}
	return append(out, key+"="+val)
}

// childRun is `fkmat run` as a child process.
type childRun struct {
	*daemon
	cmd    *exec.Cmd
	stderr *syncBuffer
}

// startRunCLI starts `fkmat run args...` with env; it is killed at cleanup if
// still running.
func startRunCLI(t *testing.T, env []string, args ...string) *childRun {
	t.Helper()
	cmd := exec.Command(fkmatBinary(t), append([]string{"run"}, args...)...)
	cmd.Env = env
	buf := &syncBuffer{}
	cmd.Stderr, cmd.Stdout = buf, buf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &childRun{daemon: &daemon{done: make(chan error, 1)}, cmd: cmd, stderr: buf}
	go func() { d.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
		}
	})
	return d
}

// term sends SIGTERM and returns the exit error (nil = exit 0).
func (d *childRun) term(t *testing.T) error {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-d.done:
		return err
	case <-time.After(15 * time.Second):
		_ = d.cmd.Process.Kill()
		t.Fatalf("fkmat run did not exit within 15 s of SIGTERM\n%s", d.stderr.String())
		return nil
	}
}

// minimalGrants are the least privileges of README "Security" for a role
// that is both source and target role in one database: REPLICATION (role
// attribute), SELECT on the two tables, CREATE on the target schema, fkmat's
// metadata schema owned by the role, and the publication created by the
// tables' owner and handed over (ALTER ... OWNER TO needs CREATE on the
// database at that moment only).
func minimalGrants(tc *testenv.Case) []string {
	db, pub := pgx.Identifier{tc.Database}.Sanitize(), pgx.Identifier{tc.Publication}.Sanitize()
	return []string{
		`GRANT SELECT ON TABLE public.orders, public.customers TO %[1]s`,
		`GRANT CREATE ON SCHEMA public TO %[1]s`,
		`CREATE SCHEMA fkmat AUTHORIZATION %[1]s`,
		`CREATE PUBLICATION ` + pub + ` FOR TABLE public.orders, public.customers`,
		`GRANT CREATE ON DATABASE ` + db + ` TO %[1]s`,
		`ALTER PUBLICATION ` + pub + ` OWNER TO %[1]s`,
		`REVOKE CREATE ON DATABASE ` + db + ` FROM %[1]s`,
	}
}

// TestSecurityLeastPrivilege: a role with exactly the documented grants
// passes fkmat check and runs the whole life cycle (migrate, run, verify,
// status, teardown --drop-target) with the target equal to the SQL join;
// the same role without SELECT on one table fails check with exit 2 naming
// the GRANT to run.
func TestSecurityLeastPrivilege(t *testing.T) {
	t.Run("minimal_role_works", func(t *testing.T) {
		tc := testenv.New(t)
		sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold'), (2, 'bob', NULL)`,
			`INSERT INTO orders SELECT g, 1 + g % 3, g, 'n' FROM generate_series(1, 30) g`)
		_, roleURL := createRole(t, tc, "REPLICATION", minimalGrants(tc)...)
		env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_SOURCE_URL", roleURL)
		for _, cmd := range []string{"check", "migrate"} {
			if r := runCLI(t, env, cmd); r.code != 0 {
				t.Fatalf("%s as the minimal role: exit %d\n%s%s", cmd, r.code, r.stdout, r.stderr)
			}
		}
		d := startRunCLI(t, env)
		waitCaughtUp(t, tc, d.daemon)
		sqlExec(t, tc, `UPDATE customers SET name = 'ANN' WHERE id = 1`, `INSERT INTO orders VALUES (31, 2, 1, 'x')`,
			`DELETE FROM customers WHERE id = 2`)
		waitCaughtUp(t, tc, d.daemon)
		if err := d.term(t); err != nil {
			t.Fatalf("run as the minimal role: %v\n%s", err, d.stderr.String())
		}
		for _, cmd := range [][]string{{"verify"}, {"status"}, {"teardown", "--drop-target"}} {
			if r := runCLI(t, env, cmd...); r.code != 0 {
				t.Fatalf("%v as the minimal role: exit %d\n%s%s", cmd, r.code, r.stdout, r.stderr)
			}
		}
		assertNothingCreated(t, tc)
	})
	t.Run("missing_select", func(t *testing.T) {
		tc := testenv.New(t)
		sqlExec(t, tc, shop)
		grants := minimalGrants(tc)
		grants[0] = `GRANT SELECT ON TABLE public.orders TO %[1]s`
		role, roleURL := createRole(t, tc, "REPLICATION", grants...)
		env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_SOURCE_URL", roleURL)
		r := runCLI(t, env, "check")
		want := `GRANT SELECT ON TABLE "public"."customers" TO ` + pgx.Identifier{role}.Sanitize()
		if r.code != 2 || !strings.Contains(r.stderr, want) {
			t.Fatalf("check without SELECT on customers: exit %d, want 2 and %q\n%s%s", r.code, want, r.stdout, r.stderr)
		}
		if strings.Contains(r.stderr, "orders\" TO") {
			t.Errorf("check reports a grant that exists:\n%s", r.stderr)
		}
	})
	t.Run("missing_everything", func(t *testing.T) {
		tc := testenv.New(t)
		sqlExec(t, tc, shop, `CREATE TABLE orders_enriched (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), customer_name text, tier text)`)
		role, roleURL := createRole(t, tc, "")
		r := pgx.Identifier{role}.Sanitize()
		env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_SOURCE_URL", roleURL)
		res := runCLI(t, env, "check")
		if res.code != 2 {
			t.Fatalf("check as a bare role: exit %d\n%s%s", res.code, res.stdout, res.stderr)
		}
		for _, want := range []string{
			"ALTER ROLE " + r + " REPLICATION",
			`GRANT SELECT ON TABLE "public"."orders" TO ` + r,
			`GRANT SELECT ON TABLE "public"."customers" TO ` + r,
			"GRANT CREATE ON DATABASE " + pgx.Identifier{tc.Database}.Sanitize() + " TO " + r,
			`ALTER TABLE "public"."orders_enriched" OWNER TO ` + r,
		} {
			if !strings.Contains(res.stderr, want) {
				t.Errorf("check as a bare role does not name %q:\n%s", want, res.stderr)
			}
		}
	})
}

// hostileSchema has a schema, tables and columns whose names hold double
// quotes, spaces, upper case, semicolons and SQL comment markers. If any of
// them were spliced into SQL unquoted, the statements would fail or run
// the DROP.
const hostileSchema = `
CREATE SCHEMA "Shop ""X""; DROP TABLE canary; --";
CREATE TABLE canary (id int);
CREATE TABLE "Shop ""X""; DROP TABLE canary; --"."Cust""omers; DROP TABLE canary" (
	"Id;" bigint PRIMARY KEY, "Full Name" text, "TIER""s" text);
CREATE TABLE "Shop ""X""; DROP TABLE canary; --"."Order Lines" (
	"ID" bigint PRIMARY KEY, "Cust ""Ref""; --" bigint, "amount;drop" numeric(12,2), "Note" text);
`

const hostileYAML = `
joins:
  - name: hostile
    type: left
    left:
      table: '"Shop ""X""; DROP TABLE canary; --"."Order Lines"'
      foreign_key: ['Cust "Ref"; --'] # key lists hold exact names, unquoted
    right:
      table: '"Shop ""X""; DROP TABLE canary; --"."Cust""omers; DROP TABLE canary"'
      columns: ['"Full Name" AS "Customer Name; DROP TABLE canary"', '"TIER""s"']
    target:
      table: '"Shop ""X""; DROP TABLE canary; --"."Enriched ""Orders""; --"'
`

// TestSecurityQuotedIdentifiers: a join whose schema, tables, columns,
// aliases and target have hostile names goes through check, migrate,
// backfill, streaming (fan-out, FK moves, deletes), verify, status and
// teardown --drop-target through the CLI; the target equals the SQL join,
// the canary table survives, and no output holds the password.
func TestSecurityQuotedIdentifiers(t *testing.T) {
	tc := testenv.New(t)
	const s = `"Shop ""X""; DROP TABLE canary; --"`
	const cust, ord = s + `."Cust""omers; DROP TABLE canary"`, s + `."Order Lines"`
	sqlExec(t, tc, hostileSchema,
		`INSERT INTO `+cust+` SELECT g, 'c' || g, CASE WHEN g % 2 = 0 THEN 'gold' END FROM generate_series(1, 20) g`,
		`INSERT INTO `+ord+` SELECT g, CASE WHEN g % 7 = 0 THEN NULL ELSE g % 25 END, g, 'n' FROM generate_series(1, 100) g`)
	env := cliEnv(t, tc, hostileYAML)
	var outputs []string
	keep := func(what string, r result, want int) {
		t.Helper()
		outputs = append(outputs, r.stdout, r.stderr)
		if r.code != want {
			t.Fatalf("%s: exit %d, want %d\n%s%s", what, r.code, want, r.stdout, r.stderr)
		}
	}
	keep("check", runCLI(t, env, "check"), 0)
	keep("migrate", runCLI(t, env, "migrate"), 0)
	d := startRunCLI(t, env, "--log-level", "debug")
	waitCaughtUp(t, tc, d.daemon)
	cfg := daemonConfig(t, tc, hostileYAML)
	assertOracle(t, cfg)
	sqlExec(t, tc,
		`UPDATE `+cust+` SET "Full Name" = "Full Name" || ' "quoted"; --' WHERE "Id;" % 3 = 0`,
		`UPDATE `+ord+` SET "Cust ""Ref""; --" = "Cust ""Ref""; --" + 1 WHERE "ID" % 5 = 0`,
		`DELETE FROM `+cust+` WHERE "Id;" = 4`,
		`INSERT INTO `+ord+` VALUES (101, 1, 1, 'late')`,
		`DELETE FROM `+ord+` WHERE "ID" % 11 = 0`)
	waitCaughtUp(t, tc, d.daemon)
	assertOracle(t, cfg)
	if err := d.term(t); err != nil {
		t.Fatalf("run: %v\n%s", err, d.stderr.String())
	}
	outputs = append(outputs, d.stderr.String())
	keep("verify", runCLI(t, env, "verify"), 0)
	keep("status", runCLI(t, env, "status"), 0)
	r := runCLI(t, env, "status", "--json")
	keep("status --json", r, 0)
	if !strings.Contains(r.stdout, `Enriched \"\"Orders\"\"; --`) {
		t.Errorf("status --json does not name the target:\n%s", r.stdout)
	}
	keep("teardown", runCLI(t, env, "teardown", "--drop-target"), 0)
	var canary, target bool
	if err := tc.Pool.QueryRow(context.Background(), `SELECT to_regclass('canary') IS NOT NULL,
		to_regclass('`+strings.ReplaceAll(s, "'", "''")+`."Enriched ""Orders""; --"') IS NOT NULL`).Scan(&canary, &target); err != nil {
		t.Fatal(err)
	}
	if !canary || target {
		t.Fatalf("after teardown --drop-target: canary exists %v (want true), target exists %v (want false)", canary, target)
	}
	assertNothingCreated(t, tc)
	for _, o := range outputs {
		if strings.Contains(o, tc.Env.Password) {
			t.Fatalf("an output contains the database password:\n%s", o)
		}
	}
}

// aclCommands is the command set fkmat uses in Redis (README "Security"):
// connection setup (HELLO, AUTH, PING; SELECT for a database other than 0),
// hashes, sorted sets (ZRANGE ... BYLEX, ZMSCORE), optimistic transactions
// (WATCH/MULTI/EXEC), SCAN and UNLINK for sweeping and teardown.
const aclCommands = "-@all +hello +auth +ping +select " +
	"+hset +hsetnx +hget +hmget +hdel +hlen +hincrby +hscan " +
	"+zadd +zrem +zrange +zmscore +multi +exec +discard +watch +unwatch +scan +unlink +del +restore"

// TestSecurityRedisACL: fkmat works end to end with a password-protected
// Redis ACL user limited to its key pattern fkmat:<slot>:* and the command
// set above (Redis logs no denied command or key), the password never shows
// in any output, and that user can touch no other key nor run admin
// commands. The workload covers backfill, streaming, a transaction larger
// than a chunk (undo log), TRUNCATE (sweep), backfill --force and teardown.
func TestSecurityRedisACL(t *testing.T) {
	tc := testenv.New(t)
	ctx := context.Background()
	user, password := "fkmat_"+tc.Slot, "Redis-ACL-Pw-"+tc.Slot[len(tc.Slot)-8:]
	acl := append([]any{"ACL", "SETUSER", user, "reset", "on", ">" + password, "~fkmat:" + tc.Slot + ":*", "resetchannels"},
		anySlice(strings.Fields(aclCommands))...)
	if err := tc.Redis.Do(ctx, acl...).Err(); err != nil {
		t.Fatalf("%v: %v", acl, err)
	}
	t.Cleanup(func() { _ = tc.Redis.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	if err := tc.Redis.Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold'), (2, 'bob', NULL)`,
		`INSERT INTO orders SELECT g, 1 + g % 3, g, 'n' FROM generate_series(1, 30) g`)
	redisURL := (&url.URL{Scheme: "redis", User: url.UserPassword(user, password), Host: tc.Env.RedisAddr, Path: "/0"}).String()
	env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_REDIS_URL", redisURL)
	var outputs []string
	keep := func(what string, r result, want int) {
		t.Helper()
		outputs = append(outputs, r.stdout, r.stderr)
		if r.code != want {
			t.Fatalf("%s: exit %d, want %d\n%s%s", what, r.code, want, r.stdout, r.stderr)
		}
	}
	keep("check", runCLI(t, env, "check"), 0)
	keep("migrate", runCLI(t, env, "migrate"), 0)
	// A wrong Redis password before run ever connected: exit 2 naming the fix.
	badURL := (&url.URL{Scheme: "redis", User: url.UserPassword(user, password+"x"), Host: tc.Env.RedisAddr, Path: "/0"}).String()
	bad := runCLI(t, withEnv(env, "FKMAT_REDIS_URL", badURL), "run")
	keep("run (wrong redis password)", bad, 2)
	if !strings.Contains(bad.stderr, "WRONGPASS") || !strings.Contains(bad.stderr, "fix the user or password") {
		t.Errorf("run with a wrong redis password does not say why and what to fix:\n%s", bad.stderr)
	}
	d := startRunCLI(t, env, "--log-level", "debug")
	waitCaughtUp(t, tc, d.daemon)
	sqlExec(t, tc, `UPDATE customers SET name = 'ANN' WHERE id = 1`, `UPDATE orders SET customer_id = 2 WHERE id < 10`,
		`DELETE FROM customers WHERE id = 2`,
		// Larger than a chunk (10k changes): the large-transaction path
		// with its undo log.
		`INSERT INTO orders SELECT g, 1 + g % 3, g, 'big' FROM generate_series(100, 25099) g`,
		`TRUNCATE customers`, `INSERT INTO customers VALUES (1, 'again', 'x')`)
	waitCaughtUp(t, tc, d.daemon)
	assertOracle(t, daemonConfig(t, tc, leftJoinYAML))
	if err := d.term(t); err != nil {
		t.Fatalf("run: %v\n%s", err, d.stderr.String())
	}
	outputs = append(outputs, d.stderr.String())
	keep("verify", runCLI(t, env, "verify"), 0)
	keep("status", runCLI(t, env, "status"), 0)
	keep("status --json", runCLI(t, env, "status", "--json"), 0)
	keep("backfill --force", runCLI(t, env, "backfill", "--force"), 0)
	keep("teardown", runCLI(t, env, "teardown", "--drop-target"), 0)
	// A wrong password: refused with the URL redacted.
	wrong := withEnv(env, "FKMAT_REDIS_URL", strings.Replace(redisURL, password, password+"-wrong", 1))
	r := runCLI(t, wrong, "check")
	keep("check with a wrong redis password", r, 2)
	if !strings.Contains(r.stderr, "redis://"+user+":xxxxx@") {
		t.Errorf("check with a wrong password does not name the redacted URL:\n%s", r.stderr)
	}
	for _, o := range outputs {
		if strings.Contains(o, password) {
			t.Fatalf("an output contains the redis password:\n%s", o)
		}
	}
	// Redis denied fkmat nothing: the ACL above is enough.
	entries, err := tc.Redis.Do(ctx, "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if s := fmt.Sprint(e); strings.Contains(s, user) && !strings.Contains(s, "auth") {
			t.Errorf("redis denied the fkmat user: %s", s)
		}
	}
	// The user can touch nothing else.
	o, err := redis.ParseURL(redisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(o)
	defer rdb.Close()
	for _, cmd := range [][]any{
		{"set", "other:key", "x"}, {"get", "fkmat:another_slot:j:meta"}, {"hset", "t:" + tc.Slot, "f", "v"},
		{"del", "fkmat:" + tc.Slot}, {"flushall"}, {"config", "get", "*"}, {"keys", "*"}, {"eval", "return 1", "0"},
	} {
		err := rdb.Do(ctx, cmd...).Err()
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("fkmat's ACL user ran %v: %v, want NOPERM", cmd, err)
		}
	}
	if err := rdb.Do(ctx, "hset", "fkmat:"+tc.Slot+":probe", "f", "x").Err(); err != nil {
		t.Errorf("fkmat's ACL user cannot write its own keys: %v", err)
	}
}

func anySlice(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// TestSecurityPasswordRedaction: with a role whose password holds URL
// special characters, every output of every command (check, migrate, run
// with debug logs in text and JSON, status, status --json, verify,
// backfill, teardown) and of every error path with a wrong password (each
// command, run retrying for a few seconds, the password in the URL's user
// info and in a password= parameter) is free of the password, in plain and
// URL-encoded form.
func TestSecurityPasswordRedaction(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold')`, `INSERT INTO orders VALUES (1, 1, 1, 'n'), (2, NULL, 2, 'x')`)
	role, roleURL := createRole(t, tc, "REPLICATION", minimalGrants(tc)...)
	u, err := url.Parse(roleURL)
	if err != nil {
		t.Fatal(err)
	}
	// A password with URL special characters, set on the role.
	password := "P@ss:w/rd %3F;" + tc.Slot[len(tc.Slot)-6:]
	sqlExec(t, tc, "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" PASSWORD '"+password+"'")
	u.User = url.UserPassword(role, password)
	roleURL = u.String()
	secrets := []string{password, url.UserPassword("", password).String()[1:], url.QueryEscape(password), tc.Env.Password}
	env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_SOURCE_URL", roleURL)
	var outputs []string
	keep := func(what string, r result, want int) {
		t.Helper()
		outputs = append(outputs, what+":\n"+r.stdout+r.stderr)
		if want >= 0 && r.code != want {
			t.Fatalf("%s: exit %d, want %d\n%s%s", what, r.code, want, r.stdout, r.stderr)
		}
	}
	keep("check", runCLI(t, env, "check", "--log-level", "debug"), 0)
	keep("migrate", runCLI(t, env, "migrate", "--log-level", "debug"), 0)
	for _, format := range []string{"text", "json"} {
		d := startRunCLI(t, env, "--log-level", "debug", "--log-format", format)
		waitCaughtUp(t, tc, d.daemon)
		sqlExec(t, tc, `UPDATE customers SET name = 'ANN'`, `INSERT INTO orders VALUES (3, 1, 3, 'y')`, `DELETE FROM orders WHERE id = 3`)
		waitCaughtUp(t, tc, d.daemon)
		if err := d.term(t); err != nil {
			t.Fatalf("run: %v\n%s", err, d.stderr.String())
		}
		outputs = append(outputs, "run --log-format "+format+":\n"+d.stderr.String())
	}
	keep("status", runCLI(t, env, "status", "--log-level", "debug"), 0)
	keep("status --json", runCLI(t, env, "status", "--json"), 0)
	keep("verify", runCLI(t, env, "verify", "--log-level", "debug"), 0)
	keep("backfill --force", runCLI(t, env, "backfill", "--force", "--log-level", "debug"), 0)

	// Wrong passwords, in the user info and in a password= parameter.
	wrongUser := *u
	wrongUser.User = url.UserPassword(role, password+"x")
	wrongParam := *u
	wrongParam.User = url.User(role)
	q := wrongParam.Query()
	q.Set("password", password+"y")
	wrongParam.RawQuery = q.Encode()
	for _, bad := range []string{wrongUser.String(), wrongParam.String()} {
		benv := withEnv(env, "FKMAT_SOURCE_URL", bad)
		// A refused password is bad configuration (exit 2, naming the fix),
		// for every command: run has never connected, and does not wait it
		// out as an outage.
		keep("check (wrong password)", runCLI(t, benv, "check", "--log-level", "debug"), 2)
		for _, cmd := range []string{"migrate", "backfill", "status", "verify", "teardown"} {
			keep(cmd+" (wrong password)", runCLI(t, benv, cmd, "--log-level", "debug"), 2)
		}
		d := startRunCLI(t, benv, "--log-level", "debug")
		select {
		case err := <-d.done:
			if code := exitCode(err); code != 2 {
				t.Errorf("run with a wrong password exited %d, want 2:\n%s", code, d.stderr.String())
			}
		case <-time.After(30 * time.Second):
			_ = d.term(t)
			t.Fatalf("run with a wrong password still running after 30 s:\n%s", d.stderr.String())
		}
		if out := d.stderr.String(); !strings.Contains(out, "password authentication failed") || !strings.Contains(out, "fix the user or password") {
			t.Errorf("run with a wrong password does not say why and what to fix:\n%s", out)
		}
		outputs = append(outputs, "run (wrong password):\n"+d.stderr.String())
	}
	keep("teardown", runCLI(t, env, "teardown", "--drop-target"), 0)
	for _, o := range outputs {
		for _, s := range secrets {
			if strings.Contains(o, s) {
				t.Fatalf("an output contains the password %q:\n%s", s, o)
			}
		}
	}
	t.Logf("%d outputs checked, %d bytes", len(outputs), len(strings.Join(outputs, "")))
}

// TestSecurityPostgresTLS: against a Postgres with ssl=on (the image's
// self-signed snakeoil certificate), fkmat runs end to end with
// sslmode=verify-ca&sslrootcert=<that certificate>, every connection it
// opens (catalog, target, replication) is encrypted (pg_stat_ssl), and the
// certificate really is verified: verify-full (the certificate does not
// name 127.0.0.1) and another CA fail fkmat check with exit 2.
func TestSecurityPostgresTLS(t *testing.T) {
	tc := testenv.New(t)
	ctx := context.Background()
	x := tc.Env.ExtraPostgres(t, append(slices.Clone(testenv.PostgresArgs), "-c", "ssl=on",
		"-c", "ssl_cert_file=/etc/ssl/certs/ssl-cert-snakeoil.pem", "-c", "ssl_key_file=/etc/ssl/private/ssl-cert-snakeoil.key")...)
	cert, err := x.ReadFile(ctx, "/etc/ssl/certs/ssl-cert-snakeoil.pem")
	if err != nil {
		t.Skipf("the Postgres image has no snakeoil certificate: %v", err)
	}
	ca := writeFile(t, "ca.pem", string(cert))
	admin, err := pgx.Connect(ctx, x.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE shop"); err != nil {
		t.Fatal(err)
	}
	plain := strings.Replace(x.URL, "/postgres?sslmode=disable", "/shop?", 1)
	db, err := pgx.Connect(ctx, plain+"sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	if _, err := db.Exec(ctx, shop+`; INSERT INTO customers VALUES (1, 'ann', 'gold'); INSERT INTO orders SELECT g, 1, g, 'n' FROM generate_series(1, 20) g`); err != nil {
		t.Fatal(err)
	}
	tlsURL := plain + "sslmode=verify-ca&sslrootcert=" + url.QueryEscape(ca)
	env := withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_SOURCE_URL", tlsURL)

	if r := runCLI(t, withEnv(env, "FKMAT_SOURCE_URL", plain+"sslmode=verify-full&sslrootcert="+url.QueryEscape(ca)), "check"); r.code != 2 || !strings.Contains(r.stderr, "certificate") {
		t.Fatalf("check with verify-full against a certificate without 127.0.0.1: exit %d, want 2 naming the certificate\n%s", r.code, r.stderr)
	}
	other := writeFile(t, "other.pem", string(newCA(t, "other CA").certPEM))
	for _, cmd := range []string{"check", "run"} {
		if r := runCLI(t, withEnv(env, "FKMAT_SOURCE_URL", plain+"sslmode=verify-ca&sslrootcert="+url.QueryEscape(other)), cmd); r.code != 2 || !strings.Contains(r.stderr, "certificate") {
			t.Fatalf("%s with another CA: exit %d, want 2 naming the certificate\n%s", cmd, r.code, r.stderr)
		}
	}
	if r := runCLI(t, env, "check"); r.code != 0 {
		t.Fatalf("check over TLS: exit %d\n%s", r.code, r.stderr)
	}
	d := startRunCLI(t, env)
	waitSlotStreaming(t, db, tc.Slot, d.daemon)
	if _, err := db.Exec(ctx, `UPDATE customers SET name = 'ANN'; INSERT INTO orders VALUES (21, 1, 1, 'x')`); err != nil {
		t.Fatal(err)
	}
	waitSlotStreaming(t, db, tc.Slot, d.daemon)
	var conns, encrypted int
	if err := db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a
		JOIN pg_stat_ssl s USING (pid) WHERE a.application_name LIKE 'fkmat%'`).Scan(&conns, &encrypted); err != nil {
		t.Fatal(err)
	}
	if conns == 0 || encrypted != conns {
		t.Fatalf("fkmat has %d connections, %d of them encrypted", conns, encrypted)
	}
	t.Logf("%d fkmat connections, all encrypted", conns)
	if err := d.term(t); err != nil {
		t.Fatalf("run: %v\n%s", err, d.stderr.String())
	}
	if r := runCLI(t, env, "verify"); r.code != 0 {
		t.Fatalf("verify over TLS: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := runCLI(t, env, "teardown", "--drop-target"); r.code != 0 {
		t.Fatalf("teardown over TLS: exit %d\n%s", r.code, r.stderr)
	}
}

// waitSlotStreaming is waitCaughtUp for a database outside tc: the slot
// covers the current WAL position and every join is streaming.
func waitSlotStreaming(t *testing.T, db *pgx.Conn, slot string, d *daemon) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var target string
	if err := db.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		t.Fatal(err)
	}
	for {
		var ok bool
		err := db.QueryRow(ctx, `SELECT coalesce((SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2), false)
			AND coalesce((SELECT count(*) > 0 AND bool_and(phase = 'streaming') FROM fkmat.join_state WHERE slot = $2), false)`,
			target, slot).Scan(&ok)
		if err == nil && ok {
			return
		}
		select {
		case err := <-d.done:
			t.Fatalf("daemon stopped before catching up: %v", err)
		case <-ctx.Done():
			t.Fatalf("not caught up with %s within 90 s (last error %v)", target, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// exitCode is a child's exit code from cmd.Wait's error (0 for nil, -1 when
// it did not exit normally).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// clusterACLCommands is what a Redis Cluster adds to aclCommands (README
// "Redis Cluster"): the command table and the topology (the cluster
// client's), the shards' script and what it runs, the redo record, and WAIT
// for run --redis-wait-replicas.
const clusterACLCommands = "+command +cluster|slots +cluster|shards +evalsha +eval +get +set +hgetall +type +wait"

// TestSecurityRedisClusterACL: the README's ACL line for a cluster, set on
// every node, is enough for fkmat end to end on a Redis Cluster (check,
// migrate, backfill, streaming with a transaction larger than a chunk and a
// TRUNCATE, run --redis-wait-replicas 1, verify, status, backfill --force,
// teardown): no node logs a denied command or key, and the target equals
// the SQL join.
func TestSecurityRedisClusterACL(t *testing.T) {
	tc := testenv.New(t)
	cl := testenv.NewCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	user, password := "fkmat_"+tc.Slot, "Cluster-ACL-Pw-"+tc.Slot[len(tc.Slot)-8:]
	acl := append([]any{"ACL", "SETUSER", user, "reset", "on", ">" + password, "~fkmat:" + tc.Slot + ":*", "resetchannels"},
		anySlice(strings.Fields(aclCommands+" "+clusterACLCommands))...)
	nodes := func(fn func(rdb *redis.Client) error) {
		t.Helper()
		for _, addr := range cl.Addrs() {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			err := fn(rdb)
			_ = rdb.Close()
			if err != nil {
				t.Fatalf("node %s: %v", addr, err)
			}
		}
	}
	nodes(func(rdb *redis.Client) error {
		if err := rdb.Do(ctx, acl...).Err(); err != nil {
			return err
		}
		return rdb.Do(ctx, "ACL", "LOG", "RESET").Err()
	})
	sqlExec(t, tc, shop, `INSERT INTO customers VALUES (1, 'ann', 'gold'), (2, 'bob', NULL)`,
		`INSERT INTO orders SELECT g, 1 + g % 3, g, 'n' FROM generate_series(1, 30) g`)
	a := cl.Addrs()
	redisURL := "redis+cluster://" + url.UserPassword(user, password).String() + "@" + a[0] + "," + a[1]
	env := append(withEnv(cliEnv(t, tc, leftJoinYAML), "FKMAT_REDIS_URL", redisURL), "FKMAT_REDIS_WAIT_REPLICAS=1")
	for _, cmd := range [][]string{{"check"}, {"migrate"}} {
		if r := runCLI(t, env, cmd...); r.code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", cmd, r.code, r.stdout, r.stderr)
		}
	}
	d := startRunCLI(t, env)
	waitCaughtUp(t, tc, d.daemon)
	sqlExec(t, tc, `UPDATE customers SET name = 'ANN' WHERE id = 1`, `UPDATE orders SET customer_id = 2 WHERE id < 10`,
		`DELETE FROM customers WHERE id = 2`,
		`INSERT INTO orders SELECT g, 1 + g % 3, g, 'big' FROM generate_series(100, 25099) g`,
		`TRUNCATE customers`, `INSERT INTO customers VALUES (1, 'again', 'x')`)
	waitCaughtUp(t, tc, d.daemon)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	cfg.Redis = redisURL
	assertOracle(t, cfg)
	if err := d.term(t); err != nil {
		t.Fatalf("run: %v\n%s", err, d.stderr.String())
	}
	for _, cmd := range [][]string{{"verify"}, {"status"}, {"backfill", "--force"}, {"teardown", "--drop-target"}} {
		if r := runCLI(t, env, cmd...); r.code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", cmd, r.code, r.stdout, r.stderr)
		}
	}
	nodes(func(rdb *redis.Client) error {
		entries, err := rdb.Do(ctx, "ACL", "LOG").Slice()
		for _, e := range entries {
			if s := fmt.Sprint(e); strings.Contains(s, user) && !strings.Contains(s, "auth") {
				t.Errorf("redis node %s denied the fkmat user: %s", rdb.Options().Addr, s)
			}
		}
		return err
	})
	keys, err := cl.KeysPerPrimary(ctx, "fkmat:"+tc.Slot+":*")
	if err != nil {
		t.Fatal(err)
	}
	for addr, n := range keys {
		if n != 0 {
			t.Errorf("teardown left %d keys on %s", n, addr)
		}
	}
}
