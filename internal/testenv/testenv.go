// Package testenv starts the real services fkmat's tests need: one Postgres 15
// (wal_level=logical) and one Redis 7 container per test package, through
// testcontainers-go, bound to 127.0.0.1 only. Each test gets its own database,
// replication slot and publication names and Redis key prefix, all cleaned up
// when the test ends.
//
// It works offline: when the default images are missing it builds them locally
// (scripts/test-images.sh: debootstrap + docker import), starting dockerd first
// when no engine answers. FKMAT_TEST_POSTGRES_IMAGE and FKMAT_TEST_REDIS_IMAGE
// select other images, such as the official postgres:15 and redis:7.
//
// Usage:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }
//
//	func TestSomething(t *testing.T) {
//		tc := testenv.New(t) // skipped under -short
//		...
//	}
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/redis/go-redis/v9"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/wait"
)

// Default images, built locally by `make test-images`.
const (
	DefaultPostgresImage = "fkmat-test/postgres:15"
	DefaultRedisImage    = "fkmat-test/redis:7"
)

// PostgresArgs are the server settings of the test Postgres: logical
// replication with room for many slots and senders.
var PostgresArgs = []string{
	"-c", "wal_level=logical",
	"-c", "max_replication_slots=100",
	"-c", "max_wal_senders=100",
	"-c", "max_connections=400",
	"-c", "shared_buffers=256MB",
	"-c", "max_wal_size=4GB",
}

// Env is the set of containers shared by the tests of one package.
type Env struct {
	Password string
	// AdminURL connects to the "postgres" database as the superuser.
	AdminURL string
	// RedisAddr is host:port of the Redis server.
	RedisAddr string

	pg        *testcontainers.DockerContainer
	rd        *testcontainers.DockerContainer
	pgPort    int
	redisPort int
	admin     *pgxpool.Pool
	redis     *redis.Client
}

// Case is one test's slice of the shared environment.
type Case struct {
	Env *Env
	// Database is the name of the test's own database.
	Database string
	// DatabaseURL connects to Database as the superuser.
	DatabaseURL string
	// ReplicationURL is DatabaseURL with replication=database.
	ReplicationURL string
	// Slot and Publication are unique names for this test; a slot of that
	// name (and every slot of the test database) is dropped at cleanup.
	Slot, Publication string
	// RedisPrefix is a unique key prefix; its keys are deleted at cleanup.
	RedisPrefix string
	// Redis is a client of the shared Redis.
	Redis *redis.Client
	// Pool is a connection pool on the test database.
	Pool *pgxpool.Pool
}

var (
	sharedMu  sync.Mutex
	shared    *Env
	sharedErr error
	// inMain says the tests run under Main, which removes the shared
	// containers once they are done.
	inMain bool
)

// Main runs the package's tests and then removes the containers it started.
// It returns the exit code for os.Exit.
func Main(m *testing.M) int {
	sharedMu.Lock()
	inMain = true
	sharedMu.Unlock()
	code := m.Run()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := shared.terminate(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "testenv: cleanup:", err)
		}
		shared = nil
	}
	return code
}

// Shared returns the package's environment, starting it on first use. It
// fails the test when the services cannot be started.
func Shared(t testing.TB) *Env {
	skipUnmarked(t)
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres and Redis containers; skipped under -short")
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if !inMain {
		// Nothing would remove the containers: they would outlive the
		// test process (Ryuk is off here).
		t.Fatal("testenv: the package's tests need func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }")
	}
	if shared == nil && sharedErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		shared, sharedErr = start(ctx)
	}
	if sharedErr != nil {
		t.Fatalf("testenv: %v", sharedErr)
	}
	return shared
}

// New gives the test its own database, names and Redis prefix, all removed
// when the test ends.
func New(t testing.TB) *Case {
	t.Helper()
	env := Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	id := uniqueName(t.Name())
	c := &Case{
		Env:         env,
		Database:    id,
		Slot:        id,
		Publication: id,
		RedisPrefix: "t:" + id,
		Redis:       env.redis,
	}
	if _, err := env.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{id}.Sanitize()); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	c.DatabaseURL = env.urlFor(id, nil)
	c.ReplicationURL = env.urlFor(id, url.Values{"replication": {"database"}})
	pool, err := pgxpool.New(ctx, c.DatabaseURL)
	if err != nil {
		t.Fatalf("testenv: connect test database: %v", err)
	}
	c.Pool = pool
	t.Cleanup(func() { c.cleanup(t) })
	return c
}

func (c *Case) cleanup(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c.Pool.Close()
	env := c.Env
	if t.Failed() {
		// A test that failed between pausing or stopping a server and
		// bringing it back would fail every later test of the process.
		if err := env.revive(ctx); err != nil {
			t.Errorf("testenv: bring the servers back: %v", err)
		}
	}
	// Slots keep WAL and block DROP DATABASE: terminate their walsenders and
	// drop them first. Retried, since a walsender may take a moment to exit.
	var lastErr error
	for i := 0; i < 50; i++ {
		lastErr = env.dropSlots(ctx, c.Database, c.Slot)
		if lastErr == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if lastErr != nil {
		t.Errorf("testenv: drop slots of %s: %v", c.Database, lastErr)
	}
	if _, err := env.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{c.Database}.Sanitize()+" WITH (FORCE)"); err != nil {
		t.Errorf("testenv: drop database %s: %v", c.Database, err)
	}
	if err := DeleteKeys(ctx, env.redis, c.RedisPrefix); err != nil {
		t.Errorf("testenv: delete redis keys %s*: %v", c.RedisPrefix, err)
	}
}

func (e *Env) dropSlots(ctx context.Context, database, slot string) error {
	_, err := e.admin.Exec(ctx, `
		SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE (database = $1 OR slot_name = $2) AND active_pid IS NOT NULL`, database, slot)
	if err != nil {
		return err
	}
	_, err = e.admin.Exec(ctx, `
		SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE (database = $1 OR slot_name = $2) AND NOT active`, database, slot)
	if err != nil {
		return err
	}
	var left int
	if err := e.admin.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE database = $1 OR slot_name = $2`,
		database, slot).Scan(&left); err != nil {
		return err
	}
	if left > 0 {
		return fmt.Errorf("%d slots still present", left)
	}
	return nil
}

// DeleteKeys removes every key starting with prefix.
func DeleteKeys(ctx context.Context, rdb redis.UniversalClient, prefix string) error {
	iter := rdb.Scan(ctx, 0, escapeGlob(prefix)+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			if err := rdb.Unlink(ctx, batch...).Err(); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(batch) > 0 {
		return rdb.Unlink(ctx, batch...).Err()
	}
	return nil
}

func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// PostgresHostPort returns the loopback host:port of Postgres; it stays the
// same across RestartPostgres.
func (e *Env) PostgresHostPort() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(e.pgPort))
}

// RedisClient returns the shared Redis client.
func (e *Env) RedisClient() *redis.Client { return e.redis }

// Admin returns a pool on the "postgres" database as superuser.
func (e *Env) Admin() *pgxpool.Pool { return e.admin }

// URL returns a connection URL for database with extra query parameters.
func (e *Env) URL(database string, params url.Values) string { return e.urlFor(database, params) }

func (e *Env) urlFor(database string, params url.Values) string {
	u := url.URL{
		Scheme: "postgres",
		User:   url.UserPassword("postgres", e.Password),
		Host:   e.PostgresHostPort(),
		Path:   "/" + database,
	}
	q := url.Values{"sslmode": {"disable"}}
	for k, v := range params {
		q[k] = v
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// StopPostgres stops the Postgres container (fast shutdown).
func (e *Env) StopPostgres(ctx context.Context) error {
	timeout := 20 * time.Second
	if err := e.pg.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("stop postgres: %w", err)
	}
	return nil
}

// StartPostgres starts the stopped Postgres container again on the same port
// and waits until it accepts queries.
func (e *Env) StartPostgres(ctx context.Context) error {
	if err := e.pg.Start(ctx); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	e.admin.Reset()
	return waitPostgres(ctx, e.AdminURL)
}

// revive unpauses or starts Postgres and Redis where a test left them
// paused or stopped.
func (e *Env) revive(ctx context.Context) error {
	for _, c := range []struct {
		name      string
		container *testcontainers.DockerContainer
		start     func(context.Context) error
	}{{"postgres", e.pg, e.StartPostgres}, {"redis", e.rd, e.StartRedis}} {
		st, err := c.container.State(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		switch {
		case st.Paused:
			err = dockerPause(ctx, "unpause", c.container)
		case !st.Running:
			err = c.start(ctx)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return nil
}

// RestartPostgres stops and starts Postgres, keeping its data and port.
func (e *Env) RestartPostgres(ctx context.Context) error {
	if err := e.StopPostgres(ctx); err != nil {
		return err
	}
	return e.StartPostgres(ctx)
}

// StopRedis stops the Redis container.
func (e *Env) StopRedis(ctx context.Context) error {
	timeout := 10 * time.Second
	if err := e.rd.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("stop redis: %w", err)
	}
	return nil
}

// StartRedis starts the stopped Redis container again on the same port.
func (e *Env) StartRedis(ctx context.Context) error {
	if err := e.rd.Start(ctx); err != nil {
		return fmt.Errorf("start redis: %w", err)
	}
	return waitRedis(ctx, e.redis)
}

// RestartRedis stops and starts Redis on the same port.
func (e *Env) RestartRedis(ctx context.Context) error {
	if err := e.StopRedis(ctx); err != nil {
		return err
	}
	return e.StartRedis(ctx)
}

// PausePostgres freezes the Postgres container (docker pause): connections
// stay open but nothing answers until UnpausePostgres.
func (e *Env) PausePostgres(ctx context.Context) error { return dockerPause(ctx, "pause", e.pg) }

// UnpausePostgres resumes a paused Postgres container.
func (e *Env) UnpausePostgres(ctx context.Context) error { return dockerPause(ctx, "unpause", e.pg) }

// PauseRedis freezes the Redis container (docker pause) until UnpauseRedis.
func (e *Env) PauseRedis(ctx context.Context) error { return dockerPause(ctx, "pause", e.rd) }

// UnpauseRedis resumes a paused Redis container.
func (e *Env) UnpauseRedis(ctx context.Context) error { return dockerPause(ctx, "unpause", e.rd) }

// dockerPause runs `docker pause|unpause` on c with the docker CLI.
//
// On a loaded machine runc's cgroup v1 freezer can give up ("unable to
// freeze") when a process of the container does not reach the frozen state
// within its short wait, e.g. Postgres in an fsync; runc thaws the container
// again in that case. So a failed pause or unpause is retried until the
// container is in the state asked for, or ctx ends.
func dockerPause(ctx context.Context, verb string, c *testcontainers.DockerContainer) error {
	want := verb == "pause"
	var last error
	for attempt := 0; ; attempt++ {
		out, err := exec.CommandContext(ctx, "docker", verb, c.GetContainerID()).CombinedOutput()
		if err == nil {
			return nil
		}
		last = fmt.Errorf("docker %s (attempt %d): %w: %s", verb, attempt+1, err, strings.TrimSpace(string(out)))
		// A retry whose earlier attempt did take effect after all reports
		// "already paused" or "not paused": the state is what was asked.
		if paused, serr := containerPaused(ctx, c); serr == nil && paused == want {
			return nil
		}
		if attempt == 20 {
			return last
		}
		select {
		case <-ctx.Done():
			return errors.Join(last, ctx.Err())
		case <-time.After(time.Duration(attempt+1) * 100 * time.Millisecond):
		}
	}
}

// containerPaused says whether docker reports c as paused.
func containerPaused(ctx context.Context, c *testcontainers.DockerContainer) (bool, error) {
	out, err := exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.State.Paused}}", c.GetContainerID()).Output()
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(out)) == "true", nil
}

func (e *Env) terminate(ctx context.Context) error {
	if e.admin != nil {
		e.admin.Close()
	}
	if e.redis != nil {
		_ = e.redis.Close()
	}
	var errs []error
	for _, c := range []*testcontainers.DockerContainer{e.pg, e.rd} {
		if c != nil {
			errs = append(errs, c.Terminate(ctx))
		}
	}
	return errors.Join(errs...)
}

func start(ctx context.Context) (*Env, error) {
	if err := configureTestcontainers(); err != nil {
		return nil, err
	}
	pgImage := envOr("FKMAT_TEST_POSTGRES_IMAGE", DefaultPostgresImage)
	redisImage := envOr("FKMAT_TEST_REDIS_IMAGE", DefaultRedisImage)
	if err := prepareDocker(ctx); err != nil {
		return nil, err
	}
	pw, err := randomHex(12)
	if err != nil {
		return nil, err
	}
	e := &Env{Password: pw}
	if err := e.startPostgres(ctx, pgImage); err != nil {
		_ = e.terminate(ctx)
		return nil, err
	}
	if err := e.startRedis(ctx, redisImage); err != nil {
		_ = e.terminate(ctx)
		return nil, err
	}
	return e, nil
}

func (e *Env) startPostgres(ctx context.Context, image string) error {
	port, err := ReservePort()
	if err != nil {
		return err
	}
	args := append([]string{"postgres"}, PostgresArgs...)
	if HostNetwork() {
		args = append(args, "-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(port))
	}
	c, err := testcontainers.Run(ctx, image, append(publish("5432/tcp", port,
		func(hc *container.HostConfig) { hc.ShmSize = 512 << 20 }),
		testcontainers.WithEnv(map[string]string{
			"POSTGRES_PASSWORD": e.Password,
			"POSTGRES_USER":     "postgres",
			"POSTGRES_DB":       "postgres",
		}),
		testcontainers.WithCmd(args...),
		testcontainers.WithConfigModifier(func(c *container.Config) { c.StopSignal = "SIGINT" }),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithStartupTimeout(2*time.Minute)),
	)...)
	if c != nil {
		e.pg = c
	}
	if err != nil {
		return fmt.Errorf("start postgres container from %s: %w", image, err)
	}
	// With HostNetwork nothing is published: the server's own arguments
	// bind it to 127.0.0.1.
	if !HostNetwork() {
		if err := assertLoopback(ctx, c, "5432/tcp", port); err != nil {
			return err
		}
	}
	e.pgPort = port
	e.AdminURL = e.urlFor("postgres", nil)
	if err := waitPostgres(ctx, e.AdminURL); err != nil {
		return err
	}
	e.admin, err = pgxpool.New(ctx, e.AdminURL)
	if err != nil {
		return fmt.Errorf("connect postgres: %w", err)
	}
	return nil
}

func (e *Env) startRedis(ctx context.Context, image string) error {
	port, err := ReservePort()
	if err != nil {
		return err
	}
	args := []string{"redis-server", "--appendonly", "yes", "--appendfsync", "everysec"}
	if HostNetwork() {
		args = append(args, "--bind", "127.0.0.1", "--port", strconv.Itoa(port))
	}
	c, err := testcontainers.Run(ctx, image, append(publish("6379/tcp", port, nil),
		testcontainers.WithCmd(args...),
		testcontainers.WithWaitStrategy(wait.ForLog("Ready to accept connections").WithStartupTimeout(time.Minute)),
	)...)
	if c != nil {
		e.rd = c
	}
	if err != nil {
		return fmt.Errorf("start redis container from %s: %w", image, err)
	}
	// With HostNetwork nothing is published: the server's own arguments
	// bind it to 127.0.0.1.
	if !HostNetwork() {
		if err := assertLoopback(ctx, c, "6379/tcp", port); err != nil {
			return err
		}
	}
	e.redisPort = port
	e.RedisAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	e.redis = redis.NewClient(&redis.Options{Addr: e.RedisAddr, MaxRetries: -1})
	return waitRedis(ctx, e.redis)
}

// HostNetwork reports whether the shared containers run in the host's
// network and PID namespaces (FKMAT_TEST_NETWORK=host, which make bench
// sets): each server then listens on a loopback port of its own, and
// clients reach it without Docker's userland proxy (docker-proxy), which
// otherwise sits in every round trip and caps pgoutput decoding near half
// its real rate on this kind of machine. The servers' process IDs (a
// walsender's, a backend's) are then host PIDs, readable in /proc.
func HostNetwork() bool { return os.Getenv("FKMAT_TEST_NETWORK") == "host" }

// publish returns the options that make a container's port reachable on
// the loopback port hostPort: published through Docker (docker-proxy), or,
// with HostNetwork, the host's own namespaces (the server's arguments name
// the port). more, if set, modifies the host config further.
func publish(containerPort string, hostPort int, more func(*container.HostConfig)) []testcontainers.ContainerCustomizer {
	if !HostNetwork() {
		return []testcontainers.ContainerCustomizer{
			testcontainers.WithExposedPorts(containerPort),
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
				hc.PortBindings = loopbackBinding(containerPort, hostPort)
				if more != nil {
					more(hc)
				}
			}),
		}
	}
	return []testcontainers.ContainerCustomizer{
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.NetworkMode = "host"
			hc.PidMode = "host"
			if more != nil {
				more(hc)
			}
		}),
	}
}

// configureTestcontainers disables the reaper (no registry to pull it from)
// and pins the Docker host to loopback: this machine looks like a container,
// and testcontainers would otherwise pick the default gateway.
func configureTestcontainers() error {
	for k, v := range map[string]string{
		"TESTCONTAINERS_RYUK_DISABLED":  "true",
		"TESTCONTAINERS_HOST_OVERRIDE":  "127.0.0.1",
		"TESTCONTAINERS_CHECKS_DISABLE": "true",
	} {
		if os.Getenv(k) == "" {
			if err := os.Setenv(k, v); err != nil {
				return err
			}
		}
	}
	if os.Getenv("FKMAT_TEST_VERBOSE") == "" {
		tclog.SetDefault(tclog.NewNoopLogger())
	}
	host := os.Getenv("TESTCONTAINERS_HOST_OVERRIDE")
	if !isLoopback(host) {
		return fmt.Errorf("TESTCONTAINERS_HOST_OVERRIDE=%q is not a loopback address; fkmat's tests only talk to 127.0.0.1", host)
	}
	return nil
}

// prepareDocker runs scripts/test-images.sh, which starts dockerd when no
// engine answers (as root), installs missing packages and builds the default
// images when missing. It is fast when everything is in place.
func prepareDocker(ctx context.Context) error {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return errors.New("locate testenv source")
	}
	script := filepath.Join(filepath.Dir(file), "..", "..", "scripts", "test-images.sh")
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("prepare docker and test images (%s): %w", script, err)
	}
	return nil
}

func assertLoopback(ctx context.Context, c *testcontainers.DockerContainer, port string, want int) error {
	host, err := c.Host(ctx)
	if err != nil {
		return fmt.Errorf("container host: %w", err)
	}
	if !isLoopback(host) {
		return fmt.Errorf("container endpoint host %q is not loopback: refusing to send traffic there", host)
	}
	mapped, err := c.MappedPort(ctx, port)
	if err != nil {
		return fmt.Errorf("mapped port %s: %w", port, err)
	}
	if int(mapped.Num()) != want {
		return fmt.Errorf("mapped port %s is %d, want %d", port, mapped.Num(), want)
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.IsLoopback()
}

func loopbackBinding(port string, hostPort int) network.PortMap {
	return network.PortMap{
		network.MustParsePort(port): {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(hostPort)}},
	}
}

// waitPostgres retries until a query succeeds: the official image runs a
// temporary server before the real one, so a log line alone is not enough.
func waitPostgres(ctx context.Context, connURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var lastErr error
	for {
		conn, err := pgx.Connect(ctx, connURL)
		if err == nil {
			var level string
			err = conn.QueryRow(ctx, "SHOW wal_level").Scan(&level)
			_ = conn.Close(ctx)
			if err == nil && level != "logical" {
				return fmt.Errorf("test postgres has wal_level=%s, want logical", level)
			}
			if err == nil {
				return nil
			}
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for postgres: %w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitRedis(ctx context.Context, rdb *redis.Client) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for redis: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// uniqueName makes a Postgres/Redis-safe identifier from a test name: at most
// 40 characters, lowercase, unique per call.
func uniqueName(testName string) string {
	base := strings.Trim(nonName.ReplaceAllString(strings.ToLower(testName), "_"), "_")
	if len(base) > 24 {
		base = base[len(base)-24:]
	}
	suffix, err := randomHex(4)
	if err != nil {
		panic(err)
	}
	return "fk_" + strings.TrimLeft(base, "_") + "_" + suffix
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	return hex.EncodeToString(b), nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
