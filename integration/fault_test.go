package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// faultSeed returns FKMAT_FAULT_SEED or a time-based seed, logged so that a
// failing run can be replayed.
func faultSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FKMAT_FAULT_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FKMAT_FAULT_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with FKMAT_FAULT_SEED=%d)", seed, seed)
	return seed
}

// faultOps returns FKMAT_FAULT_OPS or def.
func faultOps(t *testing.T, def int) int {
	t.Helper()
	if s := os.Getenv("FKMAT_FAULT_OPS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("FKMAT_FAULT_OPS=%q: want a positive integer", s)
		}
		return v
	}
	return def
}

// syncBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// cliDaemon is `fkmat run` as a subprocess.
type cliDaemon struct {
	t      *testing.T
	env    []string
	cmd    *exec.Cmd
	d      *daemon
	stderr *syncBuffer
	exited bool
	err    error // exit status once exited
}

// startCLIDaemon starts `fkmat run` with extra arguments.
func startCLIDaemon(t *testing.T, env []string, args ...string) *cliDaemon {
	t.Helper()
	p := &cliDaemon{t: t, env: env, stderr: &syncBuffer{}}
	p.cmd = exec.Command(fkmatBinary(t), append([]string{"run"}, args...)...)
	p.cmd.Env = env
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.d = &daemon{done: make(chan error, 1)}
	go func() { p.d.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.kill() })
	return p
}

// poll records whether the process has exited, without blocking.
func (p *cliDaemon) poll() bool {
	if !p.exited {
		select {
		case err := <-p.d.done:
			p.exited, p.err = true, err
		default:
		}
	}
	return p.exited
}

// wait waits up to timeout for the process to exit.
func (p *cliDaemon) wait(timeout time.Duration) bool {
	if p.poll() {
		return true
	}
	select {
	case err := <-p.d.done:
		p.exited, p.err = true, err
	case <-time.After(timeout):
	}
	return p.exited
}

// kill sends SIGKILL and waits for the process.
func (p *cliDaemon) kill() {
	if p.poll() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait(30 * time.Second)
}

// mustRun fails the test when the daemon has exited on its own.
func (p *cliDaemon) mustRun(what string) {
	p.t.Helper()
	if p.poll() {
		p.t.Fatalf("%s: the daemon exited by itself (%v); stderr:\n%s", what, p.err, tail(p.stderr.String(), 4000))
	}
}

var (
	logMsg = regexp.MustCompile(`msg="([^"]*)"`)
	// logErr keeps the head of an err attribute: enough to tell causes apart.
	logErr    = regexp.MustCompile(`err="((?:[^"\\]|\\.){0,100})`)
	logReason = regexp.MustCompile(`reason="((?:[^"\\]|\\.){0,100})`)
	// digits folds LSNs, ports and counts so that messages group.
	digits = regexp.MustCompile(`[0-9]+`)
)

// faultKind is one kind of injected fault.
type faultKind int

const (
	faultKill faultKind = iota
	faultRedisRestart
	faultRedisPause
	faultLostRebuild // the join's Redis keys deleted under a running daemon (rebuild)
	faultLostRefuse  // keys deleted, daemon started with --on-lost-state refuse
	faultPGRestart
	faultPGPause
	faultCheck // mid-run convergence check
	// The definition of a join changed (a column removed or added back):
	// rebuilt beside the running joins, the daemon killed during the build
	// half the times.
	faultRedefine
	// On a Redis Cluster only:
	faultFailover // a primary killed under load; its replica takes over
	faultReshard  // slots moved between primaries under load
	numFaultKinds
)

var faultNames = [numFaultKinds]string{"kill-9", "redis-restart", "redis-pause", "lost-state-rebuild",
	"lost-state-refuse", "pg-restart", "pg-pause", "oracle-check", "redefine", "redis-failover", "redis-reshard"}

// faultPlan places each fault at a random step of the workload. On a Redis
// Cluster, primary failovers and slot migrations take the place of the
// restarts and pauses of the one Redis server.
func faultPlan(r *rand.Rand, ops int, cluster bool) map[int][]faultKind {
	n := [numFaultKinds]int{
		faultKill:         max(20, ops/200),
		faultRedisRestart: max(3, ops/5000),
		faultRedisPause:   max(2, ops/10000),
		faultLostRebuild:  max(1, ops/40000),
		faultLostRefuse:   max(1, ops/40000),
		faultPGRestart:    max(2, ops/10000),
		faultPGPause:      max(2, ops/10000),
		faultCheck:        max(2, ops/10000),
		faultRedefine:     max(1, ops/20000),
	}
	if cluster {
		n[faultRedisRestart], n[faultRedisPause] = 0, 0
		n[faultFailover], n[faultReshard] = max(3, ops/5000), max(2, ops/10000)
	}
	plan := map[int][]faultKind{}
	for k, c := range n {
		for i := 0; i < c; i++ {
			at := 1 + r.IntN(ops)
			plan[at] = append(plan[at], faultKind(k))
		}
	}
	return plan
}

// faultRun is the state of one fault-injection run.
type faultRun struct {
	t  *testing.T
	tc *testenv.Case
	// cluster holds the state when set, instead of tc's Redis server.
	cluster *testenv.Cluster
	cfg     *config.Config
	yml     string // the joins of cfg
	env     []string
	r       *rand.Rand
	w       *workload
	p       *cliDaemon
	counts  [numFaultKinds]int
	kills   map[string]int // kill -9 by moment: fanout, batch, random
	// pendingKills counts kills that hit a daemon with unacknowledged WAL.
	pendingKills int
	// selfRestarts counts "pipeline failed; restarting" in daemon logs: the
	// daemon reconnecting by itself after Redis or Postgres went away.
	selfRestarts int
	// pagedBatches counts the batches whose chain fan-out was applied in
	// pages, as large transactions.
	pagedBatches int
	// warnings counts the daemon's WARN and ERROR log messages.
	warnings map[string]int
	rows     int64 // rows compared by the oracle checks
	// logs holds the log of every daemon process of the run, written to a
	// file when the run fails.
	logs strings.Builder
}

func (f *faultRun) restart(args ...string) {
	f.countSelfRestarts()
	f.p = startCLIDaemon(f.t, f.env, args...)
}

// countSelfRestarts adds the pipeline restarts of the current process; it
// is called once per process, when it is replaced and at the end.
func (f *faultRun) countSelfRestarts() {
	if f.p == nil {
		return
	}
	fmt.Fprintf(&f.logs, "--- a daemon process ---\n%s", f.p.stderr.String())
	f.selfRestarts += strings.Count(f.p.stderr.String(), "pipeline failed; restarting")
	f.pagedBatches += strings.Count(f.p.stderr.String(), "applying the batch's transactions one at a time, in pages")
	for _, line := range strings.Split(f.p.stderr.String(), "\n") {
		if !strings.Contains(line, "level=WARN") && !strings.Contains(line, "level=ERROR") {
			continue
		}
		msg := line
		if m := logMsg.FindStringSubmatch(line); m != nil {
			msg = m[1]
			if e := logErr.FindStringSubmatch(line); e != nil {
				msg += ": " + e[1]
			}
			if e := logReason.FindStringSubmatch(line); e != nil {
				msg += ": " + e[1]
			}
		}
		f.warnings[digits.ReplaceAllString(msg, "N")]++
	}
}

// waitStreaming waits until a daemon holds the slot, so that a kill lands
// while it streams rather than while it starts.
func (f *faultRun) waitStreaming() { f.waitActive(false) }

// waitActive waits until a daemon holds the slot; with joins, until every
// join streams as well (the slot is active during a backfill too: its
// connection holds the snapshot).
func (f *faultRun) waitActive(joins bool) {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		f.p.mustRun("wait for streaming")
		var active bool
		err := f.tc.Pool.QueryRow(context.Background(),
			`SELECT active AND (NOT $2 OR coalesce((SELECT bool_and(phase = 'streaming') FROM fkmat.join_state WHERE slot = $1), false))
			FROM pg_replication_slots WHERE slot_name = $1`, f.tc.Slot, joins).Scan(&active)
		if err == nil && active {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill -9s the daemon at a random moment: right after a hot customer's
// update (a large fan-out), right after a multi-row transaction (a batch
// being committed), or after a random delay; then restarts it.
func (f *faultRun) kill() {
	f.waitStreaming()
	var moment string
	var delay time.Duration
	switch f.r.IntN(3) {
	case 0:
		f.w.stepAs(f.t, opFanout)
		moment, delay = "fanout", time.Duration(f.r.IntN(60))*time.Millisecond
	case 1:
		f.w.stepAs(f.t, opMulti)
		moment, delay = "batch", time.Duration(f.r.IntN(150))*time.Millisecond
	default:
		moment, delay = "random", time.Duration(f.r.IntN(400))*time.Millisecond
	}
	f.killAt(moment, delay)
}

// killAt kills the daemon with SIGKILL after delay, and restarts it.
func (f *faultRun) killAt(moment string, delay time.Duration) {
	time.Sleep(delay)
	f.p.mustRun("before kill -9")
	var pending bool
	if err := f.tc.Pool.QueryRow(context.Background(), `SELECT pg_current_wal_lsn() > confirmed_flush_lsn
		FROM pg_replication_slots WHERE slot_name = $1`, f.tc.Slot).Scan(&pending); err == nil && pending {
		f.pendingKills++
	}
	f.p.kill()
	f.w.note("killed (" + moment + ")")
	f.kills[moment]++
	f.restart()
}

// lostLog is what the daemon logs when it rebuilds lost Redis state.
const lostLog = "is lost (no state under"

// waitLog waits until the current daemon's log contains s n times.
func (f *faultRun) waitLog(s string, n int, fail string) {
	f.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for strings.Count(f.p.stderr.String(), s) < n {
		f.p.mustRun("wait for " + strconv.Quote(s))
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: no %q in the daemon's log within 90 s:\n%s", fail, s, tail(f.p.stderr.String(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// loseState deletes every join's Redis state (Drop: meta hash first).
func (f *faultRun) loseState() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rdb redis.UniversalClient = f.tc.Redis
	if f.cluster != nil {
		rdb = f.cluster.Client
	}
	for _, j := range f.cfg.Joins {
		for _, s := range joinStates(f.t, rdb, f.tc.Slot, j) {
			if err := s.Drop(ctx); err != nil {
				f.t.Fatal(err)
			}
		}
	}
}

// during runs fn (a cluster operation) in the background and keeps the
// workload writing until it returns.
func (f *faultRun) during(what string, fn func() error) {
	f.t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	for {
		select {
		case err := <-done:
			if err != nil {
				f.t.Fatalf("%s: %v", what, err)
			}
			return
		default:
		}
		f.w.step(f.t, false)
		time.Sleep(10 * time.Millisecond)
	}
}

// failover kills a random primary of the cluster while the workload
// writes, waits for its replica to take over, and restarts the killed node
// (it rejoins as a replica).
func (f *faultRun) failover(ctx context.Context) {
	prims, err := f.cluster.Primaries(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	addr := prims[f.r.IntN(len(prims))].Addr
	if err := f.cluster.Kill(addr); err != nil {
		f.t.Fatal(err)
	}
	f.during("failover of "+addr, func() error { return f.cluster.WaitFailover(ctx, addr) })
	if err := f.cluster.Restart(ctx, addr); err != nil {
		f.t.Fatal(err)
	}
}

// reshard moves 300-1,300 slots between two random primaries while the
// workload writes.
func (f *faultRun) reshard(ctx context.Context) {
	prims, err := f.cluster.Primaries(ctx)
	if err != nil {
		f.t.Fatal(err)
	}
	from := f.r.IntN(len(prims))
	to := (from + 1 + f.r.IntN(len(prims)-1)) % len(prims)
	slots := min(prims[from].Slots-1, 300+f.r.IntN(1000))
	f.during("reshard", func() error { return f.cluster.Reshard(ctx, prims[from].ID, prims[to].ID, slots) })
}

// refuse: with the state lost, `run --on-lost-state refuse` exits non-zero
// naming `fkmat backfill --force`; then the default (rebuild) converges.
func (f *faultRun) refuse() {
	waitCaughtUp(f.t, f.tc, f.p.d)
	f.p.kill()
	f.loseState()
	f.w.stepAs(f.t, opFanout)
	before := f.targetState()
	p := startCLIDaemon(f.t, f.env, "--on-lost-state", "refuse")
	if !p.wait(60 * time.Second) {
		f.t.Fatalf("run --on-lost-state refuse did not exit within 60 s with the Redis state lost; stderr:\n%s", tail(p.stderr.String(), 4000))
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.ExitCode() == 0 || !strings.Contains(p.stderr.String(), "fkmat backfill --force") {
		f.t.Fatalf("run --on-lost-state refuse with lost state: %v, want a non-zero exit naming fkmat backfill --force; stderr:\n%s",
			p.err, tail(p.stderr.String(), 4000))
	}
	// Refusing touches nothing: no target row, no acknowledgement.
	if after := f.targetState(); after != before {
		f.t.Fatalf("run --on-lost-state refuse changed the target or the slot: %s -> %s", before, after)
	}
	f.restart()
}

// targetState digests the target rows and the slot's confirmed_flush_lsn.
func (f *faultRun) targetState() string {
	f.t.Helper()
	var digest, flushed string
	err := f.tc.Pool.QueryRow(context.Background(), `
		SELECT coalesce(md5(string_agg(t::text, ',' ORDER BY t.id)), ''),
		       (SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1)
		FROM orders_enriched t`, f.tc.Slot).Scan(&digest, &flushed)
	if err != nil {
		f.t.Fatal(err)
	}
	return "target md5 " + digest + ", confirmed_flush_lsn " + flushed
}

// inject applies fault k and returns once the service is back (the daemon
// recovers on its own, checked by the next oracle check).
func (f *faultRun) inject(k faultKind) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env := f.tc.Env
	// away stops or pauses a service for d; when busy, the workload keeps
	// writing to the source meanwhile, so the daemon has work that needs it.
	away := func(stop, start func(context.Context) error, d time.Duration, busy bool) {
		if err := stop(ctx); err != nil {
			f.t.Fatal(err)
		}
		started := false
		defer func() {
			// A failure while away must not leave the service down for the
			// package's next tests.
			if !started {
				_ = start(context.Background())
			}
		}()
		if busy {
			// A step count rather than a clock, so that a seed replays the
			// same statements.
			for i := 0; i < int(d/(15*time.Millisecond)); i++ {
				f.w.step(f.t, false)
				time.Sleep(10 * time.Millisecond)
			}
		} else {
			time.Sleep(d)
		}
		started = true
		if err := start(ctx); err != nil {
			f.t.Fatal(err)
		}
	}
	// Longer than the clients' read timeouts (go-redis: 3 s, retried 3
	// times), sometimes longer than all the retries.
	pauseFor := 4*time.Second + time.Duration(f.r.IntN(7000))*time.Millisecond
	f.w.note("fault " + faultNames[k])
	defer f.w.note(faultNames[k] + " done")
	if k != faultLostRefuse {
		f.p.mustRun("before " + faultNames[k])
	}
	switch k {
	case faultPGRestart, faultPGPause:
		// Strike while the daemon works on a large fan-out.
		f.waitStreaming()
		f.w.stepAs(f.t, opFanout)
	}
	switch k {
	case faultKill:
		f.kill()
	case faultRedisRestart:
		away(env.StopRedis, env.StartRedis, time.Duration(500+f.r.IntN(3500))*time.Millisecond, true)
	case faultRedisPause:
		away(env.PauseRedis, env.UnpauseRedis, pauseFor, true)
	case faultLostRebuild:
		// State dropped during a backfill is found as an interrupted
		// backfill, not as lost state: drop it while the joins stream.
		f.waitActive(true)
		before := strings.Count(f.p.stderr.String(), lostLog)
		f.loseState()
		f.w.stepAs(f.t, opFanout)
		f.waitLog(lostLog, before+1, "lost Redis state was not detected")
	case faultLostRefuse:
		f.refuse()
	case faultPGRestart:
		if err := env.RestartPostgres(ctx); err != nil {
			f.t.Fatal(err)
		}
		f.tc.Pool.Reset()
	case faultPGPause:
		away(env.PausePostgres, env.UnpausePostgres, pauseFor, false)
	case faultCheck:
		f.check()
	case faultRedefine:
		f.redefine()
	case faultFailover:
		f.failover(ctx)
	case faultReshard:
		f.reshard(ctx)
	}
	f.counts[k]++
}

// redefine toggles the tier column of orders_enriched's right table in the
// configuration and restarts the daemon with it: it builds the new
// definition beside the running joins. Half the times the daemon is killed
// during the build, and started again.
func (f *faultRun) redefine() {
	f.t.Helper()
	// Once the joins were built: a configuration changed before the first
	// backfill of a join began meets the target created with the old
	// shape and no record of who made it, which run refuses (naming it).
	f.waitActive(true)
	const with, without = "columns: [name AS customer_name, tier, bio]", "columns: [name AS customer_name, bio]"
	yml := f.yml
	if strings.Contains(yml, with) {
		yml = strings.Replace(yml, with, without, 1)
	} else {
		yml = strings.Replace(yml, without, with, 1)
	}
	var path string
	for _, e := range f.env {
		if v, ok := strings.CutPrefix(e, "FKMAT_CONFIG="); ok {
			path = v
		}
	}
	if err := os.WriteFile(path, []byte("slot: "+f.tc.Slot+"\npublication: "+f.tc.Publication+"\n"+yml), 0o600); err != nil {
		f.t.Fatal(err)
	}
	cfg := daemonConfig(f.t, f.tc, yml)
	cfg.Redis = f.cfg.Redis
	f.cfg, f.yml = cfg, yml
	f.p.kill()
	f.restart()
	if f.r.IntN(2) == 0 {
		f.killAt("rebuild", time.Duration(f.r.IntN(3000))*time.Millisecond)
		f.counts[faultKill]++
	}
}

// check waits until the daemon has caught up and compares the target with
// the SQL join.
func (f *faultRun) check() {
	f.t.Helper()
	// A changed definition (redefine) is compared once it is switched in:
	// until then the target is the old definition's.
	// A daemon that has not migrated yet (a short run) has no build to
	// wait for: waitCaughtUp waits for it.
	deadline := time.Now().Add(3 * time.Minute)
	building := func() bool {
		return queryInt(f.t, f.tc, `SELECT count(*) FROM pg_tables WHERE schemaname = 'fkmat' AND tablename = 'build'`) > 0 &&
			queryInt(f.t, f.tc, `SELECT count(*) FROM fkmat.build WHERE slot = $1`, f.tc.Slot) > 0
	}
	for building() {
		f.p.mustRun("while a rebuild runs")
		if time.Now().After(deadline) {
			f.t.Fatalf("a rebuild did not finish within 3 minutes; stderr:\n%s", tail(f.p.stderr.String(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitCaughtUp(f.t, f.tc, f.p.d)
	// A daemon just started on a changed definition may not have begun its
	// build yet (no fkmat.build row): verify says so until it is switched in.
	for {
		n, err := tryOracleRows(f.t, f.cfg)
		if !errors.Is(err, fkmat.ErrDefinitionPending) {
			if err != nil {
				f.t.Fatal(err)
			}
			f.rows += n
			return
		}
		f.p.mustRun("while the new definition is built")
		if time.Now().After(deadline) {
			f.t.Fatalf("the new definition was not switched in within 3 minutes: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		waitCaughtUp(f.t, f.tc, f.p.d)
	}
}

// oracleRows is assertOracle returning the number of rows compared.
func oracleRows(t *testing.T, cfg *config.Config) int64 {
	t.Helper()
	n, err := tryOracleRows(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// tryOracleRows is oracleRows returning verify's error.
func tryOracleRows(t *testing.T, cfg *config.Config) (int64, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	reports, err := fkmat.Verify(ctx, cfg, fkmat.Options{})
	if err != nil {
		return 0, err
	}
	var n int64
	for _, r := range reports {
		n += r.Expected
		if !r.Equal() || r.Expected != r.Actual {
			t.Errorf("join %s: expected %d rows, target has %d; missing %d, extra %d, different %d; e.g. %v",
				r.Join, r.Expected, r.Actual, r.Missing, r.Extra, r.Different, r.Examples)
		}
	}
	return n, nil
}

func (f *faultRun) report(seed uint64, start time.Time) string {
	var parts []string
	for k := faultKind(0); k < numFaultKinds; k++ {
		parts = append(parts, fmt.Sprintf("%s=%d", faultNames[k], f.counts[k]))
	}
	var moments []string
	for m, n := range f.kills {
		moments = append(moments, fmt.Sprintf("%s:%d", m, n))
	}
	sort.Strings(moments)
	result := "equal"
	if f.t.Failed() {
		result = "FAILED"
	}
	f.countSelfRestarts()
	var warns []string
	for m, n := range f.warnings {
		warns = append(warns, fmt.Sprintf("%dx %s", n, m))
	}
	sort.Strings(warns)
	f.t.Logf("daemon warnings and errors:\n\t%s", strings.Join(warns, "\n\t"))
	return fmt.Sprintf("fault run: seed=%d join=%s ops=%d (truncates %d, retried statements %d) faults: %s (kill moments %s; %d with unacknowledged WAL) daemon self-restarts=%d chain batches paged=%d rows_compared=%d result=%s elapsed=%s",
		seed, f.cfg.Joins[0].Type, f.w.ops, f.w.truncates, f.w.retries, strings.Join(parts, " "), strings.Join(moments, " "),
		f.pendingKills, f.selfRestarts, f.pagedBatches, f.rows, result, time.Since(start).Round(time.Second))
}

// TestFaultInjection runs a seeded random workload against `fkmat run` (a
// subprocess) while injecting faults: kill -9 (at least 20, some right after
// a large fan-out or a multi-row transaction), Redis restarts (AOF on) and
// pauses beyond its timeouts, lost Redis state (rebuilt, or refused with a
// message naming fkmat backfill --force), Postgres restarts and pauses. The
// daemon reconnects by itself, and the target equals the SQL join at every
// check and at the end. FKMAT_FAULT_SEED replays a run, FKMAT_FAULT_OPS sets
// its length (make soak runs it long).
func TestFaultInjection(t *testing.T) {
	faultInjection(t, shapePlain, faultOps(t, 1500), false)
}

// TestFaultInjectionPartitioned is TestFaultInjection with both tables
// hash-partitioned: key changes move rows between partitions, and the
// TRUNCATEs of the partitioned tables must not trip the partition check.
// It found the TRUNCATE during a backfill (see TestTruncateDuringBackfill).
func TestFaultInjectionPartitioned(t *testing.T) {
	faultInjection(t, shapePartitioned, faultOps(t, 1500)/2, false)
}

// TestFaultInjectionCluster is TestFaultInjection with the state on a Redis
// Cluster of 3 primaries and 3 replicas (local processes, AOF on): kill -9
// of the daemon, primary failovers and slot migrations under the workload,
// lost state, Postgres restarts and pauses. A failover may lose the last
// acknowledged Redis writes; the daemon must then rebuild, never use them.
func TestFaultInjectionCluster(t *testing.T) {
	faultInjection(t, shapePlain, faultOps(t, 1500)/2, true)
}

func faultInjection(t *testing.T, shape string, ops int, cluster bool) {
	start := time.Now()
	seed := faultSeed(t)
	tc := testenv.New(t)
	sqlExec(t, tc, faultSeedSQL(shape)...)
	for _, table := range []string{"orders", "customers"} {
		if n := queryInt(t, tc, `SELECT count(*) FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
			WHERE i.inhparent = $1::regclass AND c.reltoastrelid <> 0 AND pg_relation_size(c.reltoastrelid) > 0`, table); shape == shapePartitioned && n == 0 {
			t.Fatalf("no partition of %s stores values out of line", table)
		} else if shape == shapePlain && queryInt(t, tc, `SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE relname = $1`, table) == 0 {
			t.Fatalf("%s stores no value out of line; the workload would not exercise unchanged TOAST", table)
		}
	}

	r := rand.New(rand.NewPCG(seed, 1))
	typ := []string{"left", "inner"}[r.IntN(2)]
	yml := faultYAML(typ)
	f := &faultRun{t: t, tc: tc, cfg: daemonConfig(t, tc, yml), yml: yml, env: cliEnv(t, tc, yml), r: r,
		w: newWorkload(tc, seed), kills: map[string]int{}, warnings: map[string]int{}}
	f.w.partitioned = shape == shapePartitioned
	if cluster {
		f.cluster = testenv.NewCluster(t)
		f.cfg.Redis = f.cluster.URL()
		// Every other seed waits for a replica of each primary written to.
		f.env = append(f.env, "FKMAT_REDIS_URL="+f.cluster.URL(), "FKMAT_REDIS_WAIT_REPLICAS="+strconv.Itoa(int(seed%2)))
		t.Logf("run --redis-wait-replicas %d", seed%2)
	}
	defer func() {
		t.Logf("%s shape, %s join: %s\nchanges: %s", shape, typ, f.report(seed, start), f.w.report())
		if t.Failed() && f.p != nil {
			t.Logf("the daemon's last log lines:\n%s", tail(f.p.stderr.String(), 6000))
			path := filepath.Join(os.TempDir(), fmt.Sprintf("fkmat-fault-%d.log", seed))
			if err := os.WriteFile(path, []byte(f.logs.String()), 0o644); err == nil {
				t.Logf("the log of every daemon process of the run: %s", path)
			}
			if err := os.WriteFile(path+".journal", []byte(strings.Join(f.w.journal, "\n")+"\n"), 0o644); err == nil {
				t.Logf("its statements other than single-row changes, and its faults, with times and WAL positions: %s.journal", path)
			}
		}
	}()

	plan := faultPlan(r, ops, cluster)
	truncateAt := 1 + r.IntN(ops) // at least one TRUNCATE per run
	hugeAt := 1 + r.IntN(ops)     // and one transaction bigger than a chunk
	f.restart()
	for i := 1; i <= ops; i++ {
		f.w.step(t, i == truncateAt)
		if i == hugeAt {
			f.w.stepAs(t, opHuge)
		}
		if f.w.last == opPartition && r.IntN(2) == 0 {
			// While the daemon follows the partition change.
			f.killAt("partition", time.Duration(r.IntN(800))*time.Millisecond)
			f.counts[faultKill]++
		}
		for _, k := range plan[i] {
			f.inject(k)
		}
	}
	f.p.mustRun("end of workload")
	f.check()
	f.p.mustRun("after the final check")
}

// TestFaultTargetUnavailable: the target is a separate database that stops
// accepting connections while the source keeps changing. The slot's
// confirmed_flush_lsn must not advance to the pending source commits (their
// WAL is retained) while the target is away; once it is back the daemon
// catches up by itself and the target equals the SQL join.
func TestFaultTargetUnavailable(t *testing.T) {
	seed := faultSeed(t)
	src := testenv.New(t)
	dst := testenv.New(t)
	sqlExec(t, src, faultSeedSQL(shapePlain)...)
	cfg := daemonConfig(t, src, leftJoinYAML)
	cfg.Target = dst.DatabaseURL
	d := startDaemon(t, cfg, fkmat.Options{})
	w := newWorkload(src, seed)
	for i := 0; i < 200; i++ {
		w.step(t, false)
	}
	waitCaughtUpMeta(t, src, dst.Pool, d)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := src.Env.Admin()
	db := pgx.Identifier{dst.Database}.Sanitize()
	allow := func(ok bool) {
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t", db, ok)); err != nil {
			t.Fatal(err)
		}
	}
	allow(false)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "ALTER DATABASE "+db+" ALLOW_CONNECTIONS true") })
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`,
		dst.Database); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	for i := 0; i < 300; i++ {
		w.step(t, false)
	}
	var pending string
	if err := src.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	// Hold the target away for a while, checking the slot all along.
	polls := 0
	for time.Since(down) < 8*time.Second {
		var covered, retained bool
		var flushed string
		if err := src.Pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text, confirmed_flush_lsn >= $1::pg_lsn, restart_lsn <= $1::pg_lsn
			FROM pg_replication_slots WHERE slot_name = $2`, pending, src.Slot).Scan(&flushed, &covered, &retained); err != nil {
			t.Fatal(err)
		}
		if covered || !retained {
			t.Fatalf("target unavailable, yet confirmed_flush_lsn %s covers the pending commit at %s (retained=%t)", flushed, pending, retained)
		}
		select {
		case err := <-d.done:
			d.cancel = nil
			t.Fatalf("daemon stopped while the target was unavailable: %v", err)
		case <-time.After(250 * time.Millisecond):
		}
		polls++
	}
	allow(true)
	dst.Pool.Reset()
	up := time.Now()
	waitCaughtUpMeta(t, src, dst.Pool, d)
	rows := oracleRows(t, cfg)
	result := "equal"
	if t.Failed() {
		result = "FAILED"
	}
	t.Logf("target unavailable: seed=%d ops=%d unavailable=%s slot polls=%d (confirmed_flush_lsn stayed below %s) caught up %.1fs after restore, rows_compared=%d result=%s",
		seed, w.ops, up.Sub(down).Round(time.Second), polls, pending, time.Since(up).Seconds(), rows, result)
}
