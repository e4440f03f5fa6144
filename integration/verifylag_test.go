package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// TestVerifyBehind: verify compares only a caught-up target. With the
// daemon stopped and an update pending, it says how far behind and what
// to do, compares nothing and exits 3; with WAL written since that holds
// no change of the joined tables, it compares. With a daemon streaming, it
// waits for it to pass the source's position and then compares; a daemon
// that cannot move (a reader locking the target) is behind at the deadline.
func TestVerifyBehind(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 10) g`,
		`INSERT INTO orders SELECT g, 1 + g % 10, g, 'n' FROM generate_series(1, 60) g`,
		`CREATE TABLE unrelated (id int)`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	env := cliEnv(t, tc, leftJoinYAML)
	d := startDaemon(t, cfg, fkmat.Options{})
	waitCaughtUp(t, tc, d)
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Stopped, with WAL since that the join does not care about.
	sqlExec(t, tc, `INSERT INTO unrelated SELECT generate_series(1, 1000)`, `CHECKPOINT`)
	if r := runCLI(t, env, "verify"); r.code != 0 || !strings.Contains(r.stdout, "equal") {
		t.Fatalf("verify of a stopped, caught-up join: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Stopped, with a change of a joined table pending.
	sqlExec(t, tc, `UPDATE customers SET name = name || '+' WHERE id = 3`)
	r := runCLI(t, env, "verify")
	if r.code != 3 || !strings.Contains(r.stderr, "behind the source") || !strings.Contains(r.stderr, "no daemon streams from the slot: start fkmat run") ||
		!strings.Contains(r.stderr, "first change not in the targets committed at") || strings.Contains(r.stdout, "DIFFERENT") {
		t.Fatalf("verify with an update pending and no daemon: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Streaming: verify waits for the daemon, then compares.
	d = startDaemon(t, cfg, fkmat.Options{})
	sqlExec(t, tc, `UPDATE orders SET amount = amount + 1 WHERE id % 4 = 0`)
	reports, err := fkmat.Verify(ctx, cfg, fkmat.Options{})
	if err != nil || len(reports) != 1 || !reports[0].Equal() {
		t.Fatalf("verify beside a streaming daemon: %v %+v", err, reports)
	}

	// Streaming but stuck behind a reader's lock on the target.
	lock, err := tc.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE orders_enriched IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	sqlExec(t, tc, `UPDATE customers SET tier = 'u' WHERE id = 4`)
	_, err = fkmat.Verify(ctx, cfg, fkmat.Options{VerifyWait: 2 * time.Second})
	var behind *fkmat.BehindError
	if !errors.As(err, &behind) || !behind.Streaming || behind.Confirmed >= behind.Source ||
		!strings.Contains(err.Error(), "a daemon streams from the slot but had not passed") {
		t.Fatalf("verify behind a stuck daemon: %v", err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
}
