package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/testenv"
)

// TestRelease runs make release's script (untagged, into a temporary dist)
// and checks what users download: the two archives (binary, man page,
// completions, LICENSE), the image tarball, and SHA256SUMS over them. The
// amd64 binary runs `fkmat version` and `fkmat check --help` alone in an
// empty container (no libc, no files: a static binary), and so does the
// image, loaded from its tarball.
func TestRelease(t *testing.T) {
	testenv.New(t) // Docker, as for the other integration tests
	const version = "v0.0.0-releasetest"
	dist := t.TempDir()
	cmd := exec.Command("bash", filepath.Join("..", "scripts", "release.sh"), version)
	cmd.Env = append(os.Environ(), "FKMAT_RELEASE_UNTAGGED=1", "DIST="+dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("release: %v\n%s", err, out)
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	check := exec.Command("sha256sum", "-c", "SHA256SUMS")
	check.Dir = dist
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c: %v\n%s", err, out)
	}
	for _, f := range []string{"linux-amd64.tar.gz", "linux-arm64.tar.gz", "image.tar.gz"} {
		if !strings.Contains(string(sums), "fkmat-"+version+"-"+f) {
			t.Errorf("SHA256SUMS lacks fkmat-%s-%s:\n%s", version, f, sums)
		}
	}
	out, err := exec.Command("tar", "-tzf", filepath.Join(dist, "fkmat-"+version+"-linux-arm64.tar.gz")).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"/fkmat", "/LICENSE", "/man/man1/fkmat.1", "/completions/fkmat.bash", "/completions/_fkmat", "/completions/fkmat.fish",
		"/deploy/systemd/fkmat.service"} {
		if !strings.Contains(string(out), "fkmat-"+version+"-linux-arm64"+f+"\n") {
			t.Errorf("the arm64 archive lacks %s:\n%s", f, out)
		}
	}

	// The amd64 binary alone in an empty image: it needs nothing else.
	unpacked := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", filepath.Join(dist, "fkmat-"+version+"-linux-amd64.tar.gz"), "-C", unpacked).CombinedOutput(); err != nil {
		t.Fatalf("untar: %v\n%s", err, out)
	}
	img := "fkmat-release-test:" + strings.TrimPrefix(version, "v")
	imp := exec.Command("sh", "-c", "tar -C "+filepath.Join(unpacked, "fkmat-"+version+"-linux-amd64")+" -c fkmat | docker import - "+img)
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("docker import: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", img, "fkmat:"+version).Run() })
	run := func(image string, args ...string) string {
		t.Helper()
		out, err := exec.Command("docker", append([]string{"run", "--rm", "--network", "none", image}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("docker run %s %v: %v\n%s", image, args, err, out)
		}
		return string(out)
	}
	if v := run(img, "/fkmat", "version"); !strings.Contains(v, "fkmat "+version) {
		t.Errorf("fkmat version in an empty container: %q", v)
	}
	if h := run(img, "/fkmat", "check", "--help"); !strings.Contains(h, "fkmat check") || !strings.Contains(h, "Examples:") {
		t.Errorf("fkmat check --help in an empty container:\n%s", h)
	}
	// The image, loaded from its tarball.
	if out, err := exec.Command("sh", "-c", "gunzip -c "+filepath.Join(dist, "fkmat-"+version+"-image.tar.gz")+" | docker load").CombinedOutput(); err != nil {
		t.Fatalf("docker load: %v\n%s", err, out)
	}
	if v := run("fkmat:"+version, "version"); !strings.Contains(v, "fkmat "+version) {
		t.Errorf("the image's fkmat version: %q", v)
	}
}
