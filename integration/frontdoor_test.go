package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
)

// TestTeardownWhileRunning: teardown while run streams names the daemon
// (its pid and host, from fkmat.daemon) and says to stop it, rather than
// suggesting to end its walsender; it drops nothing. Once run is stopped,
// teardown works.
func TestTeardownWhileRunning(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 10) g`,
		`INSERT INTO orders SELECT g, g % 10, 1, 'n' FROM generate_series(1, 100) g`)
	env := cliEnv(t, tc, leftJoinYAML)
	p := startCLIDaemon(t, env)
	waitCaughtUp(t, tc, p.d)
	waitFor(t, 30*time.Second, "the daemon's report in fkmat.daemon", func() bool {
		return queryInt(t, tc, `SELECT count(*) FROM fkmat.daemon WHERE slot = $1`, tc.Slot) == 1
	})
	r := runCLI(t, env, "teardown")
	want := fmt.Sprintf("fkmat pid %d on host", p.cmd.Process.Pid)
	if r.code == 0 || !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, "stop that fkmat") ||
		strings.Contains(r.stderr, "pg_terminate_backend") {
		t.Fatalf("teardown while run streams: exit %d\n%s%s\nwant it to name %q and say to stop it", r.code, r.stdout, r.stderr, want)
	}
	if n := queryInt(t, tc, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, tc.Slot); n != 1 {
		t.Fatal("teardown dropped the slot of a running daemon")
	}
	p.mustRun("after the refused teardown")
	p.kill()
	// Stopped, the join is not called streaming.
	waitFor(t, 30*time.Second, "status to say no run streams the join", func() bool {
		return strings.Contains(runCLI(t, env, "status").stdout, "phase:      built, not streaming: no fkmat run streams it")
	})
	if r := runCLI(t, env, "teardown"); r.code != 0 {
		t.Fatalf("teardown after run stopped: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	// After a deliberate teardown, status does not call the state lost.
	r = runCLI(t, env, "status")
	if strings.Contains(r.stdout, "lost") || !strings.Contains(r.stdout, "redis:      none") {
		t.Fatalf("status after teardown:\n%s%s", r.stdout, r.stderr)
	}
}
