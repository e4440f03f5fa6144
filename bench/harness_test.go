package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/redisstore"
)

// db is one contender's fresh database with the workload's setup applied.
type db struct {
	*testenv.Case
	b   testing.TB
	env []string // fkmat's environment (config file, URLs)
	// cluster, when set, holds the state instead of the shared Redis
	// (useCluster).
	cluster *testenv.Cluster
	// oracleTarget and oracleSQL: workload's.
	oracleTarget, oracleSQL string
	// bin, when set, is the fkmat binary to run instead of this tree's.
	bin string
}

func newDB(b testing.TB, w *workload) *db {
	b.Helper()
	d := &db{Case: testenv.New(b), b: b, oracleTarget: w.oracleTarget, oracleSQL: w.oracleSQL}
	d.exec(w.setup...)
	path := filepath.Join(b.TempDir(), "fkmat.yaml")
	yaml := w.yaml
	if yaml == "" {
		yaml = joinYAML
	}
	if err := os.WriteFile(path, []byte("slot: "+d.Slot+"\n"+yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), d.Redis, "fkmat:"+d.Slot+":") })
	d.env = append(os.Environ(), "FKMAT_CONFIG="+path, "FKMAT_SOURCE_URL="+d.DatabaseURL,
		"FKMAT_REDIS_URL="+(&url.URL{Scheme: "redis", Host: d.Env.RedisAddr, Path: "/0"}).String(),
		"FKMAT_LOG_FORMAT=json")
	if v := os.Getenv("FKMAT_BENCH_DAEMON_GOMAXPROCS"); v != "" {
		d.env = append(d.env, "GOMAXPROCS="+v)
	}
	return d
}

func (d *db) exec(sqls ...string) {
	d.b.Helper()
	for _, s := range sqls {
		if _, err := d.Pool.Exec(context.Background(), s); err != nil {
			d.b.Fatalf("%s: %v", s, err)
		}
	}
}

func (d *db) int64(q string, args ...any) int64 {
	d.b.Helper()
	var n int64
	if err := d.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		d.b.Fatalf("%s: %v", q, err)
	}
	return n
}

// assertJoin fails unless table holds exactly the SQL join of the source.
func (d *db) assertJoin(table string) {
	d.b.Helper()
	if d.oracleSQL != "" && (table == "orders_enriched" || strings.Contains(d.oracleTarget, table)) {
		d.assertQuery(table, d.oracleTarget, d.oracleSQL)
		return
	}
	d.assertQuery(table, `SELECT id, customer_id, amount, note, name, tier FROM `+pgx.Identifier{table}.Sanitize(), joinSQL)
}

// assertQueryIn fails unless the rows of got, in the database of pool,
// and of want, in the test's database, are the same multiset: compared by
// the digest of their rows' text, sorted.
func (d *db) assertQueryIn(pool *pgxpool.Pool, table, got, want string) {
	d.b.Helper()
	digest := func(pool *pgxpool.Pool, q string) (n int64, sum string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		err := pool.QueryRow(ctx, `SELECT count(*), coalesce(md5(string_agg(h, ',' ORDER BY h)), '')
			FROM (SELECT md5(q::text) AS h FROM (`+q+`) q) s`).Scan(&n, &sum)
		if err != nil {
			d.b.Fatal(err)
		}
		return n, sum
	}
	gn, gs := digest(pool, got)
	wn, ws := digest(d.Pool, want)
	if gn != wn || gs != ws {
		d.b.Fatalf("%s (%d rows) differs from the SQL join (%d rows)", table, gn, wn)
	}
}

// assertQuery fails unless the rows of got and of want (the SQL oracle)
// are the same multiset.
func (d *db) assertQuery(table, got, want string) {
	d.b.Helper()
	q := fmt.Sprintf(`SELECT count(*) FROM ((%[1]s EXCEPT ALL %[2]s) UNION ALL (%[2]s EXCEPT ALL %[1]s)) d`, got, want)
	if n := d.int64(q); n != 0 {
		d.b.Fatalf("%s differs from the SQL join in %d rows", table, n)
	}
	if g, w := d.int64(`SELECT count(*) FROM (`+got+`) g`), d.int64(`SELECT count(*) FROM (`+want+`) w`); g != w {
		d.b.Fatalf("%s has %d rows, the join %d", table, g, w)
	}
}

// write applies txns on one connection, one transaction per batch (a
// pipeline up to one Sync runs as one implicit transaction). rate > 0
// paces the writes to that many row changes per second.
func (d *db) write(txns []txn, rate int) time.Duration {
	d.b.Helper()
	ctx := context.Background()
	conn, err := d.Pool.Acquire(ctx)
	if err != nil {
		d.b.Fatal(err)
	}
	defer conn.Release()
	start := time.Now()
	done := 0
	for _, t := range txns {
		if rate > 0 {
			if ahead := time.Duration(float64(done)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		batch := &pgx.Batch{}
		for _, s := range t.stmts {
			batch.Queue(s.sql, s.args...)
		}
		if err := conn.SendBatch(ctx, batch).Close(); err != nil {
			d.b.Fatalf("write: %v", err)
		}
		done += t.changes
	}
	return time.Since(start)
}

// binDir holds the fkmat binary built for this run; TestMain removes it.
var binDir string

// fkmatBin builds the fkmat binary once per run.
var fkmatBin = sync.OnceValues(func() (string, error) {
	var err error
	if binDir, err = os.MkdirTemp("", "fkmat-bench-"); err != nil {
		return "", err
	}
	bin := filepath.Join(binDir, "fkmat")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/fkmat/fkmat/cmd/fkmat").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build fkmat: %v\n%s", err, out)
	}
	return bin, nil
})

func (d *db) command(args ...string) *exec.Cmd {
	d.b.Helper()
	bin, err := fkmatBin()
	if err != nil {
		d.b.Fatal(err)
	}
	if d.bin != "" {
		bin = d.bin
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = d.env
	return cmd
}

// usage is what one fkmat process used.
type usage struct {
	took      time.Duration
	cpu       float64 // seconds, user + system
	peakRSSMB float64
	redisCPU  float64 // seconds of redis-server CPU while it ran
	// walsenderCPU and backendCPU are the seconds of CPU of the daemon's
	// walsender and of its target backends (run only, and only with
	// testenv.HostNetwork, where their PIDs are host PIDs; else NaN).
	walsenderCPU, backendCPU float64
	upserted                 float64 // target rows written (run only)
	deleted                  float64
	fanoutRows               float64
	waitShort                float64 // writes not confirmed by --redis-wait-replicas
	// phases are the seconds committed batches spent in each pipeline
	// phase (fkmat_pipeline_batch_seconds_sum), run only.
	phases map[string]float64
	// redisCmds are the Redis commands run meanwhile (INFO commandstats,
	// every node), run only.
	redisCmds map[string]commandStat
	// allocBytes and allocs are what the Go runtime allocated in the
	// daemon since it started (go_memstats_alloc_bytes_total,
	// go_memstats_mallocs_total), run only.
	allocBytes, allocs float64
}

// commandStat is one command's line of INFO commandstats.
type commandStat struct {
	calls, usec float64
}

// redisCommands returns INFO commandstats summed over the Redis nodes, by
// command name (MULTI and EXEC count as commands; a script's own calls
// count under their names).
func (d *db) redisCommands() map[string]commandStat {
	d.b.Helper()
	out := map[string]commandStat{}
	for _, rdb := range d.redisNodes() {
		info, err := rdb.Info(context.Background(), "commandstats").Result()
		_ = rdb.Close()
		if err != nil {
			d.b.Fatal(err)
		}
		for _, line := range strings.Split(info, "\r\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
			if !ok || !strings.HasPrefix(line, "cmdstat_") {
				continue
			}
			c := out[name]
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				x, _ := strconv.ParseFloat(v, 64)
				switch k {
				case "calls":
					c.calls += x
				case "usec":
					c.usec += x
				}
			}
			out[name] = c
		}
	}
	return out
}

// pipelinePhases are the phases of fkmat_pipeline_batch_seconds, in the
// order a batch runs them.
var pipelinePhases = []string{"collect", "map", "join", "write", "verify", "target_commit", "redis_commit"}

func (d *db) backfill() usage {
	d.b.Helper()
	cmd := d.command("backfill", "--force")
	cmd.Env = append(cmd.Env, profileEnv(d.b, "backfill")...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	r0 := d.redisCPU()
	start := time.Now()
	if err := cmd.Start(); err != nil {
		d.b.Fatal(err)
	}
	rss := watchRSS(cmd.Process.Pid)
	err := cmd.Wait()
	u := usage{took: time.Since(start), peakRSSMB: rss()}
	if err != nil {
		d.b.Fatalf("fkmat backfill: %v\n%s", err, out.Bytes())
	}
	if name := profilePath(d.b, "backfill"); name != "" {
		_ = os.WriteFile(name+".log", out.Bytes(), 0o644)
	}
	u.cpu = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	u.redisCPU = d.redisCPU() - r0
	return u
}

// watchRSS samples the process's own peak RSS (VmHWM) until it exits and
// returns a function giving the last value seen, in MB. (The rusage of a
// child is no use here: Linux carries the parent's RSS over the exec.)
func watchRSS(pid int) func() float64 {
	var peak atomic.Int64 // KiB
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		path := fmt.Sprintf("/proc/%d/status", pid)
		for {
			for _, line := range strings.Split(readFile(path), "\n") {
				if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
					kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
					if kb > peak.Load() {
						peak.Store(kb)
					}
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() float64 {
		close(stop)
		<-done
		return float64(peak.Load()) / 1024
	}
}

// profilePath is $FKMAT_BENCH_PROFILE/<test>-<what>, where an fkmat
// process's profiles and log go; "" when that directory is not set.
func profilePath(b testing.TB, what string) string {
	dir := os.Getenv("FKMAT_BENCH_PROFILE")
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, strings.NewReplacer("/", "-", " ", "_").Replace(b.Name())+"-"+what)
}

// profileEnv asks fkmat for a CPU profile and an allocation profile at
// profilePath(b, what).{prof,allocs}.
func profileEnv(b testing.TB, what string) []string {
	name := profilePath(b, what)
	if name == "" {
		return nil
	}
	return []string{"FKMAT_CPUPROFILE=" + name + ".prof", "FKMAT_MEMPROFILE=" + name + ".allocs", "FKMAT_LOG_LEVEL=debug"}
}

// daemon is a running `fkmat run`.
type daemon struct {
	d       *db
	cmd     *exec.Cmd
	out     *bytes.Buffer
	metrics string
	start   time.Time
	redis0  float64
	cmds0   map[string]commandStat
	done    chan error
	rss     func() float64
}

// run starts `fkmat run`; what names its profile (FKMAT_BENCH_PROFILE).
func (d *db) run(what string) *daemon {
	d.b.Helper()
	port := freePort(d.b)
	p := &daemon{d: d, out: &bytes.Buffer{}, done: make(chan error, 1),
		metrics: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) + "/metrics"}
	p.cmd = d.command("run", "--metrics-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.Env = append(p.cmd.Env, profileEnv(d.b, what)...)
	p.redis0 = d.redisCPU()
	p.cmds0 = d.redisCommands()
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		d.b.Fatal(err)
	}
	p.rss = watchRSS(p.cmd.Process.Pid)
	go func() { p.done <- p.cmd.Wait() }()
	if name := profilePath(d.b, what); name != "" {
		d.b.Cleanup(func() { _ = os.WriteFile(name+".log", p.out.Bytes(), 0o644) })
	}
	d.b.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop reads the counters, stops the daemon with SIGTERM and returns what
// it used since it started.
func (p *daemon) stop() usage {
	b := p.d.b
	b.Helper()
	u := usage{took: time.Since(p.start)}
	u.upserted = p.metric("fkmat_sink_rows_upserted_total")
	u.deleted = p.metric("fkmat_sink_rows_deleted_total")
	u.fanoutRows = p.metric("fkmat_join_fanout_rows_total")
	u.waitShort = p.metric("fkmat_redis_wait_short_total")
	u.allocBytes = p.metric("go_memstats_alloc_bytes_total")
	u.allocs = p.metric("go_memstats_mallocs_total")
	u.phases = map[string]float64{}
	for _, ph := range pipelinePhases {
		u.phases[ph] = p.metricOr(`fkmat_pipeline_batch_seconds_sum\{phase="`+ph+`"\}`, 0)
	}
	u.redisCPU = p.d.redisCPU() - p.redis0
	u.redisCmds = map[string]commandStat{}
	for name, c := range p.d.redisCommands() {
		c0 := p.cmds0[name]
		if c.calls > c0.calls {
			u.redisCmds[name] = commandStat{calls: c.calls - c0.calls, usec: c.usec - c0.usec}
		}
	}
	u.walsenderCPU, u.backendCPU = p.d.postgresCPU()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			b.Fatalf("fkmat run: %v\n%s", err, p.out)
		}
	case <-time.After(30 * time.Second):
		b.Fatalf("fkmat run did not stop\n%s", p.out)
	}
	u.cpu = (p.cmd.ProcessState.UserTime() + p.cmd.ProcessState.SystemTime()).Seconds()
	u.peakRSSMB = p.rss()
	return u
}

// postgresCPU returns the CPU seconds used so far by the walsender serving
// fkmat's slot and by fkmat's other backends in the database (its target
// pool; they are opened when the daemon starts, so this is their use since
// then). Without testenv.HostNetwork the servers' PIDs are not host PIDs:
// both are NaN.
func (d *db) postgresCPU() (walsender, backends float64) {
	d.b.Helper()
	if !testenv.HostNetwork() {
		return math.NaN(), math.NaN()
	}
	rows, err := d.Pool.Query(context.Background(), `SELECT pid, backend_type = 'walsender' FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE 'fkmat%'`)
	if err != nil {
		d.b.Fatal(err)
	}
	type proc struct {
		PID       int
		Walsender bool
	}
	procs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[proc])
	if err != nil {
		d.b.Fatal(err)
	}
	for _, pr := range procs {
		cpu, err := processCPU(pr.PID)
		if err != nil {
			continue // exited since
		}
		if pr.Walsender {
			walsender += cpu
		} else {
			backends += cpu
		}
	}
	return walsender, backends
}

// processCPU reads a process's user + system CPU seconds from /proc.
func processCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name (which may hold spaces) in parentheses:
	// state is field 3, utime 14, stime 15.
	_, rest, ok := bytes.Cut(b, []byte(") "))
	if !ok {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / clockTicks, nil
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat times
// (100 on Linux for every architecture Go supports here).
const clockTicks = 100

// metric reads one value from the daemon's /metrics: the sum of the
// metric's samples over its label sets (the joins of a per-join series).
func (p *daemon) metric(name string) float64 {
	p.d.b.Helper()
	v, ok := p.scrape(name)
	if !ok {
		p.d.b.Fatalf("no %s in /metrics", name)
	}
	return v
}

// metricOr is metric, or def when /metrics has no such series (a
// histogram's label before its first observation).
func (p *daemon) metricOr(name string, def float64) float64 {
	p.d.b.Helper()
	if v, ok := p.scrape(name); ok {
		return v
	}
	return def
}

// scrape sums the samples of the series name (a regular expression; any
// labels) on p's /metrics.
func (p *daemon) scrape(name string) (float64, bool) {
	p.d.b.Helper()
	return sumSeries(p.fetchMetrics(), name)
}

// plainHTTP asks for /metrics uncompressed: the benchmarks poll it while
// they measure the daemon, and gzip would spend the daemon's CPU on them.
var plainHTTP = &http.Client{Transport: &http.Transport{DisableCompression: true}}

// fetchMetrics returns the body of p's /metrics.
func (p *daemon) fetchMetrics() []byte {
	b := p.d.b
	b.Helper()
	resp, err := plainHTTP.Get(p.metrics)
	if err != nil {
		b.Fatalf("%v\n%s", err, p.out)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		b.Fatalf("read /metrics: %v\n%s", err, p.out)
	}
	return body
}

// sumSeries sums the samples of the series name (a regular expression; any
// labels) in a /metrics body, and says whether there was any.
func sumSeries(body []byte, name string) (float64, bool) {
	ms := regexp.MustCompile(`(?m)^`+name+`(?:\{[^}]*\})? (\S+)$`).FindAllSubmatch(body, -1)
	if ms == nil {
		return 0, false
	}
	sum := 0.0
	for _, m := range ms {
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		sum += v
	}
	return sum, true
}

// written returns the target rows p has written (committed: the counters
// move after the commit), from one scrape.
func (p *daemon) written() float64 {
	b := p.d.b
	b.Helper()
	body := p.fetchMetrics()
	up, ok1 := sumSeries(body, "fkmat_sink_rows_upserted_total")
	del, ok2 := sumSeries(body, "fkmat_sink_rows_deleted_total")
	if !ok1 || !ok2 {
		b.Fatalf("no fkmat_sink_rows_upserted_total or fkmat_sink_rows_deleted_total in /metrics")
	}
	return up + del
}

// writeRows runs sql and returns the time until p has written n more
// target rows; it fails the benchmark after limit, or if p exits.
func (p *daemon) writeRows(sql string, n int64, limit time.Duration) time.Duration {
	b := p.d.b
	b.Helper()
	before := p.written()
	start := time.Now()
	p.d.exec(sql)
	for p.written() < before+float64(n) {
		select {
		case err := <-p.done:
			b.Fatalf("fkmat run exited: %v\n%s", err, p.out)
		default:
		}
		if time.Since(start) > limit {
			b.Fatalf("%s: %.0f of %d rows written after %s\n%s", sql, p.written()-before, n, limit, p.out)
		}
		// Every 10 ms: under 1% of the shortest fan-out measured (about
		// 2 s), and a scrape costs the daemon little at that rate.
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// waitServing waits until p serves its metrics: a daemon started after
// another finds the slot caught up and streaming before it listens.
func (p *daemon) waitServing() {
	b := p.d.b
	b.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(p.metrics)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case err := <-p.done:
			b.Fatalf("fkmat run exited: %v\n%s", err, p.out)
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("fkmat run serves no metrics after a minute: %v\n%s", err, p.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freshRun is what runToFresh measured.
type freshRun struct {
	total    time.Duration // from the start of run to caught up
	backfill time.Duration // from the start of run to the backfill's end
	// before and after are Redis's memory before run and once caught up.
	before, after memory
	wideUsed      float64 // w7Memory's
}

// runToFresh starts fkmat run on joins never backfilled (their targets and
// state are dropped first), waits until it has backfilled and caught up with
// every commit made until then, and stops it.
func (d *db) runToFresh(what string) freshRun {
	d.b.Helper()
	if out, err := d.command("teardown", "--drop-target").CombinedOutput(); err != nil {
		d.b.Fatalf("fkmat teardown: %v\n%s", err, out)
	}
	return d.runToFreshFrom(what, d.Pool)
}

// runToFreshInto is runToFresh with the targets in database target (a
// database of the test server, created here and dropped when the test
// ends), and the pool of that database, whose targets the caller checks
// (assertQueryIn). The targets and the state of the source's database
// are dropped first, and those of target database left behind.
func (d *db) runToFreshInto(what, target string) (freshRun, *pgxpool.Pool) {
	d.b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := d.command("teardown", "--drop-target").CombinedOutput(); err != nil {
		d.b.Fatalf("fkmat teardown: %v\n%s", err, out)
	}
	if _, err := d.Env.Admin().Exec(ctx, "CREATE DATABASE "+pgx.Identifier{target}.Sanitize()); err != nil {
		d.b.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, d.Env.URL(target, nil))
	if err != nil {
		d.b.Fatal(err)
	}
	d.b.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = d.Env.Admin().Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{target}.Sanitize()+" WITH (FORCE)")
	})
	env := d.env
	d.env = append(slices.Clone(env), "FKMAT_TARGET_URL="+d.Env.URL(target, nil))
	defer func() { d.env = env }()
	r := d.runToFreshFrom(what, pool)
	if out, err := d.command("teardown").CombinedOutput(); err != nil {
		d.b.Fatalf("fkmat teardown: %v\n%s", err, out)
	}
	return r, pool
}

// runToFreshFrom starts and measures a run on joins never backfilled whose
// fkmat schema (join_state) is in the database of state.
func (d *db) runToFreshFrom(what string, state *pgxpool.Pool) freshRun {
	d.b.Helper()
	r := freshRun{before: d.settledMemory()}
	p := d.run(what)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var target string
	poll := func(what string, done func() bool) time.Duration {
		p.pollUntil(ctx, what, done)
		return time.Since(p.start)
	}
	r.backfill = poll("the backfill did not end", func() bool {
		var streaming bool
		err := state.QueryRow(ctx, `SELECT coalesce((SELECT bool_and(phase = 'streaming') FROM fkmat.join_state WHERE slot = $1), false)`,
			d.Slot).Scan(&streaming)
		return err == nil && streaming
	})
	if err := d.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		d.b.Fatal(err)
	}
	r.total = poll("not caught up with "+target, func() bool {
		var ok bool
		err := d.Pool.QueryRow(ctx, `SELECT coalesce((SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2), false)`,
			target, d.Slot).Scan(&ok)
		return err == nil && ok
	})
	r.after = d.settledMemory()
	p.stop()
	return r
}

// memory is what INFO memory says, summed over the Redis nodes.
type memory struct {
	used, dataset, overhead float64
}

// settledMemory returns INFO memory once the server has freed what
// deletions left to its background thread (lazyfree_pending_objects 0).
func (d *db) settledMemory() memory {
	d.b.Helper()
	deadline := time.Now().Add(time.Minute)
	for d.redisInfo("memory", "lazyfree_pending_objects") > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	return memory{used: d.redisInfo("memory", "used_memory"), dataset: d.redisInfo("memory", "used_memory_dataset"),
		overhead: d.redisInfo("memory", "used_memory_overhead")}
}

// waitCaught waits until the slot's confirmed_flush_lsn covers every commit
// so far and the join is streaming, and returns when that was seen.
func (d *db) waitCaught(p *daemon) time.Time {
	d.b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var target string
	if err := d.Pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		d.b.Fatal(err)
	}
	p.pollUntil(ctx, "not caught up with "+target, func() bool {
		var ok bool
		err := d.Pool.QueryRow(ctx, `SELECT coalesce((SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2), false)
			AND coalesce((SELECT bool_and(phase = 'streaming') FROM fkmat.join_state WHERE slot = $2), false)`, target, d.Slot).Scan(&ok)
		return err == nil && ok
	})
	return time.Now()
}

// pollUntil checks done every 10 ms until it holds; the test fails, with
// the daemon's output, when the daemon exits or ctx ends first (saying
// what).
func (p *daemon) pollUntil(ctx context.Context, what string, done func() bool) {
	p.d.b.Helper()
	for !done() {
		select {
		case err := <-p.done:
			p.d.b.Fatalf("fkmat run exited: %v\n%s", err, p.out)
		default:
		}
		if ctx.Err() != nil {
			p.d.b.Fatalf("%s\n%s", what, p.out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freePort returns a loopback port for a daemon's metrics, reserved
// against the other test processes (testenv.ReservePort).
func freePort(b testing.TB) int {
	b.Helper()
	port, err := testenv.ReservePort()
	if err != nil {
		b.Fatal(err)
	}
	return port
}

// useCluster makes fkmat keep the state on c (its redis+cluster:// URL),
// and redisCPU count the CPU of all of c's nodes.
func (d *db) useCluster(c *testenv.Cluster) {
	d.cluster = c
	d.env = append(d.env, "FKMAT_REDIS_URL="+c.URL())
}

// redisNodes returns a client of each Redis server that may hold the
// state: the shared one, or every node of the cluster. The caller closes
// them.
func (d *db) redisNodes() []*redis.Client {
	if d.cluster == nil {
		return []*redis.Client{redis.NewClient(d.Redis.Options())}
	}
	var out []*redis.Client
	for _, addr := range d.cluster.Addrs() {
		out = append(out, redis.NewClient(&redis.Options{Addr: addr}))
	}
	return out
}

// redisInfo returns the sum of numeric fields of INFO section over the
// Redis servers that may hold the state.
func (d *db) redisInfo(section string, fields ...string) float64 {
	d.b.Helper()
	var total float64
	for _, rdb := range d.redisNodes() {
		info, err := rdb.Info(context.Background(), section).Result()
		_ = rdb.Close()
		if err != nil {
			d.b.Fatal(err)
		}
		total += infoField(info, fields...)
	}
	return total
}

// infoField returns the sum of numeric fields of an INFO reply.
func infoField(info string, fields ...string) float64 {
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		for _, f := range fields {
			if v, ok := strings.CutPrefix(line, f+":"); ok {
				x, _ := strconv.ParseFloat(v, 64)
				total += x
			}
		}
	}
	return total
}

// nodeState is how much of the join's state one Redis primary holds.
type nodeState struct {
	addr  string
	keys  int
	bytes float64 // MEMORY USAGE summed over the keys
	used  float64 // INFO used_memory: the whole server, in bytes
}

// stateNodes returns, per primary, the join's keys and their memory.
func (d *db) stateNodes() []nodeState {
	d.b.Helper()
	ctx := context.Background()
	var out []nodeState
	for _, rdb := range d.redisNodes() {
		st, err := stateOn(ctx, rdb, "fkmat:"+d.Slot+":*")
		_ = rdb.Close()
		if err != nil {
			d.b.Fatal(err)
		}
		if st.keys > 0 || d.cluster == nil {
			out = append(out, st)
		}
	}
	return out
}

func stateOn(ctx context.Context, rdb *redis.Client, pattern string) (nodeState, error) {
	st := nodeState{addr: rdb.Options().Addr}
	info, err := rdb.Info(ctx, "replication", "memory").Result()
	if err != nil {
		return st, err
	}
	if strings.Contains(info, "role:slave") {
		return st, nil // a replica: its primary is counted
	}
	st.used = infoField(info, "used_memory")
	iter := rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	var names []string
	for iter.Next(ctx) {
		names = append(names, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return st, err
	}
	st.keys = len(names)
	for chunk := range slices.Chunk(names, 1000) {
		pipe := rdb.Pipeline()
		usage := make([]*redis.IntCmd, len(chunk))
		for i, k := range chunk {
			usage[i] = pipe.MemoryUsage(ctx, k, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return st, err
		}
		for _, u := range usage {
			st.bytes += float64(u.Val())
		}
	}
	return st, nil
}

func (d *db) redisCPU() float64 { return d.redisInfo("cpu", "used_cpu_sys", "used_cpu_user") }

// redisKeys describes the join's keys by kind letter (l left rows, r right
// rows, s subscriptions): MEMORY USAGE summed, and the keys per OBJECT
// ENCODING.
type redisKeys struct {
	bytes     map[byte]float64
	encodings map[byte]map[string]int
}

// encodingSummary returns kind's encodings as "listpack 262144 (100%)".
func (k redisKeys) encodingSummary(kind byte) string {
	total := 0
	for _, n := range k.encodings[kind] {
		total += n
	}
	var parts []string
	for _, e := range slices.Sorted(maps.Keys(k.encodings[kind])) {
		n := k.encodings[kind][e]
		parts = append(parts, fmt.Sprintf("%s %d (%.1f%%)", e, n, 100*float64(n)/float64(max(total, 1))))
	}
	return "OBJECT ENCODING: " + strings.Join(parts, ", ")
}

func (d *db) redisKeys() redisKeys {
	d.b.Helper()
	return d.redisKeysOf(redisstore.Prefix(d.Slot, "orders_enriched"))
}

// redisKeysOf is redisKeys for the state under prefix (a join's, or a step's
// of a join of more than two tables).
// generation is the generation of join's Redis state (fkmat.join_state).
func (d *db) generation(join string) int {
	d.b.Helper()
	var gen int
	if err := d.Pool.QueryRow(context.Background(), `SELECT generation FROM fkmat.join_state WHERE slot = $1 AND join_name = $2`,
		d.Slot, join).Scan(&gen); err != nil {
		d.b.Fatal(err)
	}
	return gen
}

func (d *db) redisKeysOf(prefix string) redisKeys {
	d.b.Helper()
	ctx := context.Background()
	store, err := redisstore.Open(ctx, d.Redis, redisstore.Config{Prefix: prefix})
	if err != nil {
		d.b.Fatal(err)
	}
	// Only the current generations: the garbage of a TRUNCATE or a resize
	// goes first.
	if _, err := store.Sweep(ctx); err != nil {
		d.b.Fatal(err)
	}
	out := redisKeys{bytes: map[byte]float64{}, encodings: map[byte]map[string]int{}}
	iter := d.Redis.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var names []string
	for iter.Next(ctx) {
		names = append(names, iter.Val())
	}
	if err := iter.Err(); err != nil {
		d.b.Fatal(err)
	}
	for chunk := range slices.Chunk(names, 1000) {
		pipe := d.Redis.Pipeline()
		usage := make([]*redis.IntCmd, len(chunk))
		enc := make([]*redis.StringCmd, len(chunk))
		for i, k := range chunk {
			usage[i] = pipe.MemoryUsage(ctx, k, 0)
			enc[i] = pipe.ObjectEncoding(ctx, k)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			d.b.Fatal(err)
		}
		for i, k := range chunk {
			kind, ok := store.KeyKind(k)
			if !ok {
				kind = '?' // meta, undo, redo
			}
			out.bytes[kind] += float64(usage[i].Val())
			if out.encodings[kind] == nil {
				out.encodings[kind] = map[string]int{}
			}
			out.encodings[kind][enc[i].Val()]++
		}
	}
	return out
}

// store opens the join's state on the shared Redis.
func (d *db) store() *redisstore.Store {
	d.b.Helper()
	s, err := redisstore.Open(context.Background(), d.Redis, redisstore.Config{Prefix: redisstore.Prefix(d.Slot, "orders_enriched")})
	if err != nil {
		d.b.Fatal(err)
	}
	return s
}

// leftBuckets returns the number of left-row buckets of the join's state
// (sized by the backfill), from its layout.
func (d *db) leftBuckets() int {
	d.b.Helper()
	m, err := d.store().Meta(context.Background())
	if err != nil || m.Shape.LeftBuckets == 0 {
		d.b.Fatalf("layout %q: %v", m.Layout, err)
	}
	return m.Shape.LeftBuckets
}

// redisFloor writes rows single-field HSETs (52-byte values, the size of a
// lean orders row, into buckets hashes: the state's) and subs single-member
// ZADDs (into 2^20 sorted sets), pipelined
// 10,000 at a time from one connection: the least Redis work a state of
// this layout takes to build. It returns the time and redis-server's CPU,
// and deletes the keys.
func (d *db) redisFloor(rows, subs, buckets int) (time.Duration, float64) {
	d.b.Helper()
	ctx := context.Background()
	prefix := "floor:" + d.Slot + ":"
	defer func() { _ = testenv.DeleteKeys(context.Background(), d.Redis, prefix) }()
	value := strings.Repeat("v", 52)
	cpu0, start := d.redisCPU(), time.Now()
	for _, side := range []struct {
		n     int
		write func(p redis.Pipeliner, i int)
	}{
		{rows, func(p redis.Pipeliner, i int) {
			p.HSet(ctx, prefix+"l:{"+strconv.Itoa(i%buckets)+"}", strconv.Itoa(i), value)
		}},
		{subs, func(p redis.Pipeliner, i int) {
			p.ZAdd(ctx, prefix+"s:{"+strconv.Itoa((i*7919)%(1<<20))+"}", redis.Z{Member: strconv.Itoa(i)})
		}},
	} {
		for lo := 0; lo < side.n; lo += 10_000 {
			p := d.Redis.Pipeline()
			for i := lo; i < min(lo+10_000, side.n); i++ {
				side.write(p, i)
			}
			if _, err := p.Exec(ctx); err != nil {
				d.b.Fatal(err)
			}
		}
	}
	return time.Since(start), d.redisCPU() - cpu0
}

// probe commits marker orders (negative ids) every interval while running
// and measures, for each, the time from sending its commit to seeing it in
// the target.
type probe struct {
	stopc chan struct{}
	done  chan []time.Duration
	err   error
}

// markers numbers the probe's marker rows across probes.
var markers atomic.Int64

func (d *db) probe(every time.Duration) *probe {
	p := &probe{stopc: make(chan struct{}), done: make(chan []time.Duration, 1)}
	go func() {
		var lat []time.Duration
		ctx := context.Background()
		defer func() { p.done <- lat }()
		for {
			select {
			case <-p.stopc:
				return
			case <-time.After(every):
			}
			k := markers.Add(1)
			start := time.Now()
			if _, p.err = d.Pool.Exec(ctx, `INSERT INTO orders VALUES ($1, 1, 0, 'probe')`, -k); p.err != nil {
				return
			}
			for {
				var seen bool
				if p.err = d.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM orders_enriched WHERE id = $1)`, -k).Scan(&seen); p.err != nil {
					return
				}
				if seen {
					lat = append(lat, time.Since(start))
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
		}
	}()
	return p
}

func (p *probe) stop(b testing.TB) []time.Duration {
	b.Helper()
	close(p.stopc)
	lat := <-p.done
	if p.err != nil {
		b.Fatalf("freshness probe: %v", p.err)
	}
	if len(lat) == 0 {
		b.Fatal("freshness probe: no marker measured")
	}
	slices.Sort(lat)
	return lat
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// drainBare is the decode limit: a bare pgoutput reader (receive, parse
// every message, ack) draining slot until it has seen txns commits.
func (d *db) drainBare(slot string, txns int) (changes, commits int, took time.Duration) {
	d.b.Helper()
	changes, commits, took, err := d.drain(slot, txns)
	if err != nil {
		d.b.Fatalf("bare reader: %v", err)
	}
	return changes, commits, took
}

// drain is drainBare returning its error (safe off the test goroutine).
func (d *db) drain(slot string, txns int) (changes, commits int, took time.Duration, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(ctx, d.ReplicationURL)
	if err != nil {
		return 0, 0, 0, err
	}
	defer conn.Close(context.Background())
	start := time.Now()
	err = pglogrepl.StartReplication(ctx, conn, pgx.Identifier{slot}.Sanitize(), 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + strings.ReplaceAll(pgx.Identifier{d.Publication}.Sanitize(), "'", "''") + "'"},
	})
	if err != nil {
		return 0, 0, 0, err
	}
	var pos pglogrepl.LSN
	for commits < txns {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			return 0, 0, 0, err
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err != nil {
				return 0, 0, 0, err
			}
			if ka.ReplyRequested {
				if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
					return 0, 0, 0, err
				}
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return 0, 0, 0, err
			}
			m, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return 0, 0, 0, err
			}
			switch m := m.(type) {
			case *pglogrepl.InsertMessage, *pglogrepl.UpdateMessage, *pglogrepl.DeleteMessage:
				changes++
			case *pglogrepl.CommitMessage:
				commits++
				pos = m.TransactionEndLSN
			}
		}
	}
	took = time.Since(start)
	_ = pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos})
	return changes, commits, took, nil
}

// writeLimit is the write limit: n target rows upserted with INSERT … ON
// CONFLICT from the client in batches of up to 10,000 rows (one
// transaction each), into a table of the target's shape already holding
// pre rows. Row i writes id 1 + i % orders with a value it did not have.
func (d *db) writeLimit(n, orders, pre int) time.Duration {
	d.b.Helper()
	ctx := context.Background()
	d.exec(`DROP TABLE IF EXISTS limit_t`,
		`CREATE TABLE limit_t (id bigint PRIMARY KEY, customer_id bigint, amount numeric(12,2), note text, name text, tier text)`,
		fmt.Sprintf(`INSERT INTO limit_t SELECT g, g %% 1000, 1, md5(g::text), 'customer ' || g, 'gold' FROM generate_series(1, %d) g`, pre),
		`VACUUM ANALYZE limit_t`)
	const q = `INSERT INTO limit_t AS t SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::numeric[], $4::text[], $5::text[], $6::text[])
		ON CONFLICT (id) DO UPDATE SET customer_id = excluded.customer_id, amount = excluded.amount, note = excluded.note,
			name = excluded.name, tier = excluded.tier
		WHERE (t.customer_id, t.amount, t.note, t.name, t.tier) IS DISTINCT FROM
			(excluded.customer_id, excluded.amount, excluded.note, excluded.name, excluded.tier)`
	per := min(10_000, orders)
	start := time.Now()
	for lo := 0; lo < n; lo += per {
		var ids, cust []int64
		var amounts, notes, names, ts []string
		for i := lo; i < min(lo+per, n); i++ {
			id := int64(1 + i%orders)
			ids = append(ids, id)
			cust = append(cust, id%1000)
			amounts = append(amounts, fmt.Sprintf("%d.%02d", 2000+i/100, i%100))
			notes = append(notes, note(id))
			names = append(names, fmt.Sprintf("customer %d", id%1000))
			ts = append(ts, tiers[id%3])
		}
		if _, err := d.Pool.Exec(ctx, q, ids, cust, amounts, notes, names, ts); err != nil {
			d.b.Fatalf("write limit: %v", err)
		}
	}
	return time.Since(start)
}

// installTriggers builds trig_t from the SQL join and keeps it maintained
// by row-level PL/pgSQL triggers on both tables.
func (d *db) installTriggers() {
	d.exec(`CREATE TABLE trig_t AS `+joinSQL,
		`ALTER TABLE trig_t ADD PRIMARY KEY (id)`,
		`CREATE INDEX ON trig_t (customer_id)`,
		`CREATE FUNCTION trig_orders() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.id <> NEW.id) THEN
				DELETE FROM trig_t WHERE id = OLD.id;
			END IF;
			IF TG_OP = 'DELETE' THEN
				RETURN OLD;
			END IF;
			INSERT INTO trig_t
				SELECT NEW.id, NEW.customer_id, NEW.amount, NEW.note, c.name, c.tier
				FROM (SELECT) AS one LEFT JOIN customers c ON c.id = NEW.customer_id
			ON CONFLICT (id) DO UPDATE SET customer_id = excluded.customer_id, amount = excluded.amount,
				note = excluded.note, name = excluded.name, tier = excluded.tier;
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER trig_orders AFTER INSERT OR UPDATE OR DELETE ON orders FOR EACH ROW EXECUTE FUNCTION trig_orders()`,
		`CREATE FUNCTION trig_customers() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.id <> NEW.id) THEN
				UPDATE trig_t SET name = NULL, tier = NULL WHERE customer_id = OLD.id;
			END IF;
			IF TG_OP = 'DELETE' THEN
				RETURN OLD;
			END IF;
			UPDATE trig_t SET name = NEW.name, tier = NEW.tier
				WHERE customer_id = NEW.id AND (name, tier) IS DISTINCT FROM (NEW.name, NEW.tier);
			RETURN NEW;
		END $$`,
		`CREATE TRIGGER trig_customers AFTER INSERT OR UPDATE OR DELETE ON customers FOR EACH ROW EXECUTE FUNCTION trig_customers()`,
		`VACUUM ANALYZE trig_t`)
}

// refreshMV creates the join as a materialized view with a unique index
// and returns the mean time of n REFRESH MATERIALIZED VIEW CONCURRENTLY.
func (d *db) refreshMV(n int) time.Duration {
	d.b.Helper()
	d.exec(`CREATE MATERIALIZED VIEW mv AS `+joinSQL, `CREATE UNIQUE INDEX ON mv (id)`, `VACUUM ANALYZE mv`)
	var total time.Duration
	for i := 0; i < n; i++ {
		// One change per refresh, so that each has something to do.
		d.exec(fmt.Sprintf(`UPDATE customers SET tier = 'refresh %d' WHERE id = 1`, i))
		start := time.Now()
		d.exec(`REFRESH MATERIALIZED VIEW CONCURRENTLY mv`)
		total += time.Since(start)
	}
	d.assertJoin("mv")
	return total / time.Duration(n)
}
