package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// LocalRedis is a redis-server process of the test's own on 127.0.0.1,
// for server options a container is not started with (key-load-delay, to
// hold Redis in LOADING). Its data directory is kept across Restart, and
// it is stopped when the test ends.
type LocalRedis struct {
	t    testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// StartLocalRedis starts redis-server with RDB persistence only (no AOF,
// no automatic saves) and extra args, and waits until it answers.
func StartLocalRedis(t testing.TB, args ...string) *LocalRedis {
	t.Helper()
	skipUnmarked(t)
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found: install redis-server (make test does)")
	}
	port, err := ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	r := &LocalRedis{t: t, port: port, dir: t.TempDir()}
	t.Cleanup(r.kill)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.start(ctx, args...); err != nil {
		t.Fatal(err)
	}
	return r
}

// Addr is host:port.
func (r *LocalRedis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL is a redis:// URL of database 0.
func (r *LocalRedis) URL() string { return "redis://" + r.Addr() + "/0" }

// Client returns a client of the server that resends nothing, for probes.
func (r *LocalRedis) Client() *redis.Client { return nodeClient(r.Addr()) }

func (r *LocalRedis) start(ctx context.Context, args ...string) error {
	cmd := exec.Command("redis-server", append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--dir", r.dir, "--dbfilename", "dump.rdb", "--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--logfile", filepath.Join(r.dir, "redis.log")}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server on %d: %w", r.port, err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(r.done) }()
	// Up once it answers at all: PONG, or LOADING while it reads its data.
	rdb := r.Client()
	defer rdb.Close()
	for {
		err := rdb.Ping(ctx).Err()
		if err == nil || strings.HasPrefix(err.Error(), "LOADING") {
			return nil
		}
		select {
		case <-r.done:
			return fmt.Errorf("redis-server on %d exited: %s", r.port, r.logTail())
		case <-ctx.Done():
			return fmt.Errorf("redis-server on %d does not answer: %w", r.port, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Restart saves the data (SHUTDOWN SAVE) and starts the server again with
// args; it returns as soon as the server answers, which may be with
// LOADING while it reads the data back.
func (r *LocalRedis) Restart(ctx context.Context, args ...string) error {
	rdb := r.Client()
	err := rdb.ShutdownSave(ctx).Err() // the connection closes: an error either way
	_ = rdb.Close()
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("redis-server on %d did not shut down (%v): %w", r.port, err, ctx.Err())
	}
	return r.start(ctx, args...)
}

func (r *LocalRedis) kill() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	if r.t.Failed() {
		r.t.Logf("local redis-server log (last lines):\n%s", r.logTail())
	}
}

func (r *LocalRedis) logTail() string {
	b, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-15):], "\n")
}
