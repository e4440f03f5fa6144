package integration

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/testenv"
)

// TestImage runs the container image (the Dockerfile's, dockerfileImage;
// TestRelease checks the one make image builds) end to end against the
// test containers: the image
// serves its metrics by default (FKMAT_METRICS_ADDR=:9187, the port it
// exposes), the daemon in the image backfills and streams and answers on
// /readyz and /metrics, stops cleanly on docker stop, and fkmat verify in
// the image finds the target equal to the SQL join. The container uses the
// host's network to reach them on loopback (and so listens on a free
// loopback port of the host instead of 9187).
func TestImage(t *testing.T) {
	tc := testenv.New(t)
	image := strings.TrimSuffix(dockerfileImage(t), ":latest")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	docker := func(args ...string) (string, error) {
		out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
		return string(out), err
	}
	if out, err := docker("run", "--rm", image+":latest", "--version"); err != nil || !strings.HasPrefix(out, "fkmat ") {
		t.Fatalf("the image's --version: %v %q", err, out)
	}
	out, err := docker("image", "inspect", "-f", "{{json .Config.Env}} {{json .Config.ExposedPorts}} {{.Config.User}}", image+":latest")
	if err != nil || !strings.Contains(out, `"FKMAT_METRICS_ADDR=:9187"`) || !strings.Contains(out, `"9187/tcp"`) || !strings.Contains(out, "65532") {
		t.Fatalf("the image does not serve its metrics on the port it exposes, as user 65532: %v %s", err, out)
	}

	sqlExec(t, tc, shop, `INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 10) g`,
		`INSERT INTO orders SELECT g, g % 12, g, 'n' FROM generate_series(1, 300) g`)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	yml := "slot: " + tc.Slot + "\npublication: " + tc.Publication + "\n" + leftJoinYAML
	if err := os.WriteFile(filepath.Join(dir, "fkmat.yaml"), []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), tc.Redis, "fkmat:"+tc.Slot+":") })
	name := "fkmat-image-test-" + tc.Slot
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := l.Addr().String()
	_ = l.Close()
	common := []string{"--network", "host", "-v", dir + ":/cfg:ro", "-e", "FKMAT_METRICS_ADDR=" + metricsAddr,
		"-e", "FKMAT_SOURCE_URL=" + tc.DatabaseURL, "-e", "FKMAT_REDIS_URL=redis://" + tc.Env.RedisAddr + "/0", image + ":latest",
		"--config", "/cfg/fkmat.yaml"}
	if out, err := docker(append([]string{"run", "-d", "--name", name}, append(common, "--log-format", "json", "run")...)...); err != nil {
		t.Fatalf("docker run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		// Not docker(): its context is cancelled when the test returns,
		// before the cleanups run, and the container would be left.
		rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
		defer rcancel()
		if out, err := exec.CommandContext(rctx, "docker", "rm", "-f", name).CombinedOutput(); err != nil {
			t.Errorf("remove container %s: %v\n%s", name, err, out)
		}
	})
	waitCaughtUpMeta(t, tc, tc.Pool, &daemon{})
	sqlExec(t, tc, `UPDATE customers SET name = 'image' WHERE id < 4`, `INSERT INTO orders VALUES (1000, 2, 1, 'x')`, `DELETE FROM orders WHERE id = 7`)
	waitCaughtUpMeta(t, tc, tc.Pool, &daemon{})
	waitFor(t, 30*time.Second, "/readyz of the daemon in the image", func() bool {
		resp, err := http.Get("http://" + metricsAddr + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	m := &scraper{t: t, base: "http://" + metricsAddr}
	body := m.body()
	for _, series := range []string{`fkmat_sink_rows_upserted_total{join="orders_enriched"}`, "process_resident_memory_bytes", "go_goroutines"} {
		if _, ok := metricValue(body, series); !ok {
			t.Errorf("/metrics of the daemon in the image lacks %s", series)
		}
	}
	// On a machine of at most 2 CPUs fkmat runs Go code on one thread
	// (GOMAXPROCS unset); on a larger one, Go's default.
	want := float64(runtime.NumCPU())
	if want <= 2 {
		want = 1
	}
	if v, ok := metricValue(body, "go_sched_gomaxprocs_threads"); !ok || v != want {
		t.Errorf("the daemon in the image runs with GOMAXPROCS %v (present %t), want %v on %d CPUs", v, ok, want, runtime.NumCPU())
	}
	if out, err := docker("stop", "-t", "60", name); err != nil {
		t.Fatalf("docker stop: %v\n%s", err, out)
	}
	if out, _ := docker("inspect", "-f", "{{.State.ExitCode}}", name); strings.TrimSpace(out) != "0" {
		logs, _ := docker("logs", name)
		t.Fatalf("the daemon in the image exited %s after SIGTERM\n%s", out, tail(logs, 20))
	}
	out, err = docker(append([]string{"run", "--rm"}, append(common, "verify")...)...)
	if err != nil || !strings.Contains(out, "equal") {
		t.Fatalf("verify in the image: %v\n%s", err, out)
	}
	assertOracle(t, daemonConfig(t, tc, leftJoinYAML))
}
