package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// runFkmat runs the app as main does and returns its exit code and output.
func runFkmat(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"fkmat"}, args...), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestCompletionScripts: fkmat completion prints a script per shell that
// completes fkmat's commands and flags; an unknown or missing shell is a
// usage error.
func TestCompletionScripts(t *testing.T) {
	t.Parallel()
	for shell, want := range map[string][]string{
		"bash": {"complete -o bashdefault -o default -F _fkmat_complete fkmat", "--generate-bash-completion"},
		"zsh":  {"#compdef fkmat", "compdef _fkmat fkmat", "--generate-bash-completion"},
		"fish": {"complete -c fkmat", "__fish_seen_subcommand_from run", "-l metrics-addr", "__fish_seen_subcommand_from completion"},
	} {
		code, out, errOut := runFkmat("completion", shell)
		if code != 0 {
			t.Fatalf("fkmat completion %s: exit %d, %s", shell, code, errOut)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("fkmat completion %s lacks %q:\n%s", shell, w, out)
			}
		}
		if strings.Contains(out, "PROG") {
			t.Errorf("fkmat completion %s left a placeholder:\n%s", shell, out)
		}
		if sh, err := exec.LookPath(shell); err == nil {
			// The shell parses it.
			path := filepath.Join(t.TempDir(), "fkmat."+shell)
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
			if msg, err := exec.Command(sh, "-n", path).CombinedOutput(); err != nil {
				t.Errorf("%s -n on fkmat completion %s: %v\n%s", shell, shell, err, msg)
			}
		}
	}
	for _, args := range [][]string{{"completion"}, {"completion", "tcsh"}, {"completion", "bash", "zsh"}} {
		if code, _, errOut := runFkmat(args...); code != exitUsage || !strings.Contains(errOut, "bash, zsh or fish") {
			t.Errorf("fkmat %v: exit %d, %q; want %d naming the shells", args, code, errOut, exitUsage)
		}
	}
}

// TestBashCompletion runs the bash script's function on command lines, with
// fkmat a shell function that answers --generate-bash-completion as the
// binary does (the app's answers are checked in TestCompletionCandidates).
func TestBashCompletion(t *testing.T) {
	t.Parallel()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	_, script, _ := runFkmat("completion", "bash")
	harness := script + `
fkmat() { echo "$*" >>"$CALLS"; printf '%s\n' run status verify --metrics-addr --max-stall-restarts; }
COMP_WORDS=(fkmat st); COMP_CWORD=1; _fkmat_complete; echo "1: ${COMPREPLY[*]}"
COMP_WORDS=(fkmat run --met); COMP_CWORD=2; _fkmat_complete; echo "2: ${COMPREPLY[*]}"
COMP_WORDS=(fkmat run ''); COMP_CWORD=2; _fkmat_complete; echo "3: ${COMPREPLY[*]}"
cd "$DIR"; COMP_WORDS=(fkmat check -c fk); COMP_CWORD=3; _fkmat_complete; echo "4: ${COMPREPLY[*]}"
COMP_WORDS=(fkmat check --config ''); COMP_CWORD=3; _fkmat_complete; echo "5: ${COMPREPLY[*]}"
`
	calls := filepath.Join(t.TempDir(), "calls")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fkmat.yaml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, "-c", harness)
	cmd.Env = append(os.Environ(), "CALLS="+calls, "DIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	// After -c or --config, files: fkmat is not asked.
	for _, want := range []string{"1: status\n", "2: --metrics-addr\n", "3: run status verify --metrics-addr --max-stall-restarts\n",
		"4: fkmat.yaml\n", "5: fkmat.yaml\n"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("bash completion: want %q in\n%s", want, out)
		}
	}
	got, _ := os.ReadFile(calls)
	if want := "--generate-bash-completion\nrun --met --generate-bash-completion\nrun --generate-bash-completion\n"; string(got) != want {
		t.Errorf("the script asked fkmat\n%s\nwant\n%s", got, want)
	}
}

// TestCompletionCandidates: the app answers --generate-bash-completion with
// its commands, and after a partial flag with the command's flags that fit.
// urfave/cli reads the partial flag from os.Args, so this test sets it (and
// does not run in parallel).
func TestCompletionCandidates(t *testing.T) {
	saved := os.Args
	defer func() { os.Args = saved }()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--generate-bash-completion"}, []string{"run", "status", "completion", "man"}},
		{[]string{"run", "--metrics", "--generate-bash-completion"}, []string{"--metrics-addr"}},
		{[]string{"--con", "--generate-bash-completion"}, []string{"--config"}},
		{[]string{"completion", "--generate-bash-completion"}, []string{"bash", "zsh", "fish"}},
	} {
		os.Args = append([]string{"fkmat"}, c.args...)
		code, out, errOut := runFkmat(c.args...)
		if code != 0 {
			t.Fatalf("fkmat %v: exit %d, %s", c.args, code, errOut)
		}
		lines := strings.Fields(out)
		for _, w := range c.want {
			found := false
			for _, l := range lines {
				found = found || l == w
			}
			if !found {
				t.Errorf("fkmat %v: %q not among %q", c.args, w, lines)
			}
		}
	}
}

// TestManPage: fkmat man prints a man page (troff) that documents the
// commands and their flags.
func TestManPage(t *testing.T) {
	t.Parallel()
	code, out, errOut := runFkmat("man")
	if code != 0 {
		t.Fatalf("fkmat man: exit %d, %s", code, errOut)
	}
	for _, w := range []string{".TH fkmat 1", ".SH NAME", "fkmat \\-", ".SH COMMANDS", "run", "--metrics-addr", "--slot-retained-warn", "completion",
		".SH DESCRIPTION", ".SH CONFIGURATION", ".SH ENVIRONMENT", ".SH EXIT STATUS", ".SH EXAMPLES", ".SH SEE ALSO", "FKMAT_CONFIG", "3: verify"} {
		if !strings.Contains(out, w) {
			t.Errorf("fkmat man lacks %q", w)
		}
	}
	if man, err := exec.LookPath("man"); err == nil {
		path := filepath.Join(t.TempDir(), "fkmat.1")
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(man, "--warnings", "-l", path)
		cmd.Env = append(os.Environ(), "MANPAGER=cat", "MANWIDTH=100")
		if msg, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(msg), "metrics-addr") {
			t.Errorf("man -l: %v\n%s", err, msg)
		}
	}
}
