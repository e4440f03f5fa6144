package integration

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
)

// repoRoot is the checkout this test file is in.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(file))
}

// quickStartLines returns the commands of one of the README's quick
// starts: the lines of the shell block between the <!-- name --> markers,
// without comments, blank lines and the clone (the test runs in this
// checkout).
func quickStartLines(t *testing.T, root, name string) []string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	start, end := strings.Index(s, "<!-- "+name+" -->"), strings.Index(s, "<!-- /"+name+" -->")
	if start < 0 || end < start {
		t.Fatalf("README.md has no <!-- %s --> ... <!-- /%s --> block", name, name)
	}
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s[start:end]))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "  #"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "```") || strings.HasPrefix(line, "<!--") ||
			strings.HasPrefix(line, "git clone") {
			continue
		}
		lines = append(lines, line)
	}
	if len(lines) < 5 {
		t.Fatalf("README quick start: only %d commands: %q", len(lines), lines)
	}
	return lines
}

// freePort is a loopback port reserved for this test process (see
// testenv.ReservePort).
func freePort(t *testing.T) int {
	t.Helper()
	port, err := testenv.ReservePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// imageOr is the image the environment names, else def.
func imageOr(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// compose runs the Compose command of a README line: with the `docker
// compose` plugin when this machine has it, else with docker-compose (v1,
// Debian's package), which has no `up --wait` (the test waits for the
// services' health checks itself) and needs `exec -T` without a terminal.
func compose(ctx context.Context, t *testing.T, root string, env []string, args []string) (string, error) {
	t.Helper()
	if exec.CommandContext(ctx, "docker", "compose", "version").Run() == nil {
		out, err := runIn(ctx, root, env, "docker", append([]string{"compose"}, args...)...)
		return out, err
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		t.Skip("neither `docker compose` nor docker-compose is installed (scripts/ensure-docker.sh installs docker-compose)")
	}
	wait := false
	var v1 []string
	for _, a := range args {
		switch a {
		case "--wait":
			wait = true
		case "exec":
			v1 = append(v1, "exec", "-T")
		default:
			v1 = append(v1, a)
		}
	}
	out, err := runIn(ctx, root, env, "docker-compose", v1...)
	if err != nil || !wait {
		return out, err
	}
	file := v1[slices.Index(v1, "-f")+1]
	ids, err := runIn(ctx, root, env, "docker-compose", "-f", file, "ps", "-q")
	if err != nil {
		return ids, err
	}
	for _, id := range strings.Fields(ids) {
		for {
			h, err := runIn(ctx, root, env, "docker", "inspect", "-f", "{{.State.Health.Status}}", id)
			if err != nil {
				return h, err
			}
			if strings.TrimSpace(h) == "healthy" {
				break
			}
			if strings.TrimSpace(h) == "unhealthy" {
				logs, _ := runIn(ctx, root, env, "docker", "logs", id)
				return logs, fmt.Errorf("container %s is unhealthy", id)
			}
			select {
			case <-ctx.Done():
				return "", fmt.Errorf("container %s not healthy: %w", id, ctx.Err())
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return out, nil
}

// runIn runs a command in dir and returns its combined output.
func runIn(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestReadmeQuickStart runs the README's two quick starts as written, in
// this checkout, each on its own Compose project (free ports, the local
// test images for Postgres and Redis: FKMAT_POSTGRES_IMAGE,
// FKMAT_REDIS_IMAGE). "compose": Docker alone; the fkmat service runs the
// image the repository's Dockerfile builds (buildDockerfile), healthy once
// the join streams,
// then a rename through psql, status and verify in the fkmat container.
// "build": Postgres and Redis only, then check --plan, run in the
// background, the rename, status and verify, and the stop. status and
// verify are retried until the daemon has caught up; the join is a chain
// (orders -> customers -> regions), and verify compares it with its SQL.
func TestReadmeQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Docker")
	}
	testenv.Shared(t) // Docker running, the test images built
	root := repoRoot(t)
	image := dockerfileImage(t)
	for _, name := range []string{"quickstart", "quickstart-build"} {
		t.Run(name, func(t *testing.T) {
			runQuickStart(t, root, quickStartLines(t, root, name), "FKMAT_IMAGE="+image)
		})
	}
}

// dockerfileImage returns the image the repository's Dockerfile builds,
// built once per test process (TestImage and TestReadmeQuickStart share
// it).
func dockerfileImage(t *testing.T) string {
	t.Helper()
	dockerfileOnce.Do(func() {
		ok := t.Run("dockerfile", func(t *testing.T) {
			dockerfileName = buildDockerfile(t, repoRoot(t), "fkmat-test/dockerfile")
		})
		if !ok {
			dockerfileName = ""
		}
	})
	if dockerfileName == "" {
		t.Fatal("the Dockerfile's image could not be built (see the first test that asked for it)")
	}
	return dockerfileName
}

var (
	dockerfileOnce sync.Once
	dockerfileName string
)

// buildDockerfile builds the repository's Dockerfile as `docker build .`
// does, from this checkout's files (tracked or not, not ignored), and
// returns the image's name. No registry is reachable here: the Go image is
// this machine's Go (scripts/go-image.sh), and modules come from this
// machine's module cache (GOPROXY=file://, a build argument of the
// Dockerfile). It checks what the image is: its version, user, port and
// metrics address.
func buildDockerfile(t *testing.T, root, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	goImage, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "go-image.sh")).Output()
	if err != nil {
		t.Fatalf("scripts/go-image.sh: %v", err)
	}
	modCache, err := exec.CommandContext(ctx, "go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyTree := fmt.Sprintf("git ls-files -co --exclude-standard -z | tar --null -c -T - | tar -x -C %q && cp -r %q %q",
		dir, filepath.Join(strings.TrimSpace(string(modCache)), "cache", "download"), filepath.Join(dir, ".modproxy"))
	if out, err := runIn(ctx, root, os.Environ(), "bash", "-c", copyTree); err != nil {
		t.Fatalf("the build context: %v\n%s", err, out)
	}
	image := name + ":latest"
	start := time.Now()
	if out, err := runIn(ctx, dir, os.Environ(), "docker", "build", "-q", "--build-arg", "GO_IMAGE="+strings.TrimSpace(string(goImage)),
		"--build-arg", "GOPROXY=file:///src/.modproxy", "--build-arg", "VERSION=v0.0.0-dockerfile", "-t", image, "."); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	t.Logf("docker build: %.1f s", time.Since(start).Seconds())
	if out, err := runIn(ctx, dir, os.Environ(), "docker", "run", "--rm", image, "version"); err != nil || !strings.HasPrefix(out, "fkmat v0.0.0-dockerfile ") {
		t.Fatalf("the Dockerfile's image, fkmat version: %v %q", err, out)
	}
	out, err := runIn(ctx, dir, os.Environ(), "docker", "image", "inspect", "-f", "{{json .Config.Env}} {{json .Config.ExposedPorts}} {{.Config.User}}", image)
	if err != nil || !strings.Contains(out, `"FKMAT_METRICS_ADDR=:9187"`) || !strings.Contains(out, `"9187/tcp"`) || !strings.Contains(out, "65532") {
		t.Fatalf("the Dockerfile's image does not serve its metrics on the port it exposes, as user 65532: %v %s", err, out)
	}
	return image
}

// runQuickStart runs the lines of a quick start.
func runQuickStart(t *testing.T, root string, lines []string, extraEnv ...string) {
	pgPort, redisPort, metricsPort := freePort(t), freePort(t), freePort(t)
	project := fmt.Sprintf("fkmatqs%d%d", os.Getpid(), pgPort)
	env := append(os.Environ(),
		"FKMAT_POSTGRES_IMAGE="+imageOr("FKMAT_TEST_POSTGRES_IMAGE", testenv.DefaultPostgresImage),
		"FKMAT_REDIS_IMAGE="+imageOr("FKMAT_TEST_REDIS_IMAGE", testenv.DefaultRedisImage),
		"FKMAT_POSTGRES_PORT="+strconv.Itoa(pgPort), "FKMAT_REDIS_PORT="+strconv.Itoa(redisPort),
		"FKMAT_METRICS_PORT="+strconv.Itoa(metricsPort), "COMPOSE_PROJECT_NAME="+project)
	env = append(env, extraEnv...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var file string
	var daemon *exec.Cmd
	var daemonOut bytes.Buffer
	t.Cleanup(func() {
		if daemon != nil && daemon.ProcessState == nil {
			_ = daemon.Process.Kill()
			_ = daemon.Wait()
		}
		if file != "" {
			cctx, ccancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer ccancel()
			if t.Failed() {
				out, _ := compose(cctx, t, root, env, []string{"-f", file, "logs", "--no-color"})
				t.Logf("docker compose logs:\n%s", out)
			}
			_, _ = compose(cctx, t, root, env, []string{"-f", file, "down", "-v"})
		}
		if t.Failed() && daemon != nil {
			t.Logf("fkmat run's output:\n%s", daemonOut.String())
		}
	})
	localize := func(s string) string {
		s = strings.ReplaceAll(s, "127.0.0.1:5432", "127.0.0.1:"+strconv.Itoa(pgPort))
		return strings.ReplaceAll(s, "127.0.0.1:6379", "127.0.0.1:"+strconv.Itoa(redisPort))
	}
	// run retries a command until it passes: the daemon backfills first.
	retried := func(line string, run func() (string, error)) {
		deadline := time.Now().Add(3 * time.Minute)
		for {
			out, err := run()
			if err == nil {
				t.Log(out)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v\n%s\nfkmat run:\n%s", line, err, out, daemonOut.String())
			}
			time.Sleep(time.Second)
		}
	}
	verified := false
	for _, line := range lines {
		line = localize(line)
		t.Logf("$ %s", line)
		waits := strings.Contains(line, "fkmat status") || strings.Contains(line, "fkmat verify")
		verified = verified || strings.Contains(line, "fkmat verify")
		switch {
		case strings.HasPrefix(line, "export "):
			env = append(env, strings.Fields(strings.TrimPrefix(line, "export "))...)
		case strings.HasPrefix(line, "docker compose "):
			args := strings.Fields(strings.TrimPrefix(line, "docker compose "))
			if i := slices.Index(args, "-f"); i >= 0 {
				file = args[i+1]
			}
			if slices.Index(args, "exec") >= 0 {
				// psql -c "…": the quoted SQL is one argument.
				args = shellWords(t, strings.TrimPrefix(line, "docker compose "))
			}
			if waits {
				retried(line, func() (string, error) { return compose(ctx, t, root, env, args) })
				continue
			}
			out, err := compose(ctx, t, root, env, args)
			if err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
			t.Log(out)
		case strings.HasSuffix(line, "&"):
			daemon = exec.Command("bash", "-c", "exec "+strings.TrimSuffix(line, "&"))
			daemon.Dir, daemon.Env = root, env
			daemon.Stdout, daemon.Stderr = &daemonOut, &daemonOut
			if err := daemon.Start(); err != nil {
				t.Fatal(err)
			}
		case strings.HasPrefix(line, "kill %1"):
			if daemon == nil {
				t.Fatal("kill %1 before a command in the background")
			}
			if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := daemon.Wait(); err != nil {
				t.Fatalf("fkmat run after SIGTERM: %v\n%s", err, daemonOut.String())
			}
			if rest := strings.TrimSpace(strings.TrimPrefix(strings.TrimPrefix(line, "kill %1"), " &&")); rest != "" {
				args := strings.Fields(strings.TrimPrefix(rest, "docker compose "))
				if out, err := compose(ctx, t, root, env, args); err != nil {
					t.Fatalf("%s: %v\n%s", rest, err, out)
				}
				file = ""
			}
		case waits:
			retried(line, func() (string, error) { return runIn(ctx, root, env, "bash", "-c", line) })
		default:
			out, err := runIn(ctx, root, env, "bash", "-c", line)
			if err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
			t.Log(out)
		}
	}
	if !verified {
		t.Fatal("the quick start never ran fkmat verify")
	}
	if daemon != nil && daemon.ProcessState == nil {
		t.Fatal("the quick start started fkmat run and never stopped it")
	}
}

// shellWords splits a command line as the shell would for the quick
// start's lines: words, and double-quoted strings as one word.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var out []string
	var cur strings.Builder
	quoted, in := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, in = !quoted, true
		case r == ' ' && !quoted:
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quotes in %q", s)
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// TestMakeDemo runs `make demo` (demo/demo.sh): its own containers, the
// sample data, the daemon, the live workload, and fkmat verify at the end
// (the script fails when verify finds a difference).
func TestMakeDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Docker")
	}
	testenv.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := runIn(ctx, repoRoot(t), os.Environ(), "bash", "demo/demo.sh")
	if err != nil {
		t.Fatalf("make demo: %v\n%s", err, out)
	}
	for _, want := range []string{"Asia-Pacific", "fkmat verify", "daemon exited cleanly"} {
		if !strings.Contains(out, want) {
			t.Fatalf("make demo: no %q in its output:\n%s", want, out)
		}
	}
	t.Log(out)
}
