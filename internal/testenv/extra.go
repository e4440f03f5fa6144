package testenv

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/moby/moby/api/types/container"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// ExtraPostgres starts a Postgres container of its own, next to the shared
// one, with the given server arguments instead of PostgresArgs (e.g.
// wal_level=replica to test what fkmat says about it), bound to loopback
// like the shared one and removed when the test ends. It returns a superuser
// URL for its "postgres" database; the password is e's.
func (e *Env) ExtraPostgres(t testing.TB, args ...string) *Extra {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	port, err := ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	c := runExtra(ctx, t, "postgres", envOr("FKMAT_TEST_POSTGRES_IMAGE", DefaultPostgresImage), "5432/tcp", port,
		testcontainers.WithEnv(map[string]string{"POSTGRES_PASSWORD": e.Password, "POSTGRES_USER": "postgres", "POSTGRES_DB": "postgres"}),
		testcontainers.WithCmd(append([]string{"postgres"}, args...)...),
		testcontainers.WithConfigModifier(func(c *container.Config) { c.StopSignal = "SIGINT" }),
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").
			WithStartupTimeout(2*time.Minute)),
	)
	u := (&url.URL{Scheme: "postgres", User: url.UserPassword("postgres", e.Password),
		Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	for {
		conn, err := pgx.Connect(ctx, u)
		if err == nil {
			_ = conn.Close(ctx)
			return &Extra{URL: u, c: c}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: extra postgres does not answer: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Extra is a Postgres container started by ExtraPostgres.
type Extra struct {
	// URL connects to its "postgres" database as the superuser.
	URL string
	c   *testcontainers.DockerContainer
}

// ReadFile returns a file of the container (e.g. its server certificate).
func (x *Extra) ReadFile(ctx context.Context, path string) ([]byte, error) {
	r, err := x.c.CopyFileFromContainer(ctx, path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}

// ExtraRedis starts a Redis container of its own, next to the shared one,
// running redis-server with args (e.g. TLS settings), with files copied in
// first (path in the container -> content), bound to loopback and removed
// when the test ends. The server listens on the container's port 6379 —
// args decide whether that is --port or --tls-port. It returns the
// loopback address; it does not connect, since the args decide how.
func (e *Env) ExtraRedis(t testing.TB, files map[string][]byte, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	port, err := ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	var cf []testcontainers.ContainerFile
	for path, content := range files {
		cf = append(cf, testcontainers.ContainerFile{Reader: bytes.NewReader(content), ContainerFilePath: path, FileMode: 0o644})
	}
	runExtra(ctx, t, "redis", envOr("FKMAT_TEST_REDIS_IMAGE", DefaultRedisImage), "6379/tcp", port,
		testcontainers.WithCmd(append([]string{"redis-server"}, args...)...),
		testcontainers.WithFiles(cf...),
		testcontainers.WithWaitStrategy(wait.ForLog("Ready to accept connections").WithStartupTimeout(time.Minute)),
	)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// runExtra starts a container of image for one test, with containerPort
// published on the loopback port hostPort only, and removes it when the
// test ends.
func runExtra(ctx context.Context, t testing.TB, what, image, containerPort string, hostPort int, opts ...testcontainers.ContainerCustomizer) *testcontainers.DockerContainer {
	t.Helper()
	opts = append(opts, testcontainers.WithExposedPorts(containerPort),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.PortBindings = loopbackBinding(containerPort, hostPort)
		}))
	c, err := testcontainers.Run(ctx, image, opts...)
	if c != nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := c.Terminate(ctx); err != nil {
				t.Errorf("testenv: remove extra %s: %v", what, err)
			}
		})
	}
	if err != nil {
		t.Fatalf("testenv: start extra %s: %v", what, err)
	}
	if err := assertLoopback(ctx, c, containerPort, hostPort); err != nil {
		t.Fatal(err)
	}
	return c
}

// BusyLoops runs n busy shell loops (separate processes, so that the test's
// own goroutines are not the ones slowed down by Go's scheduler) until the
// test ends: the load of a CI machine doing other work.
func BusyLoops(t testing.TB, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatalf("testenv: start a busy loop: %v", err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
}
