package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/urfave/cli/v2"
)

// probe runs the app as run builds it (common flags before and after the
// subcommand) with a subcommand that only loads the configuration and the
// log settings.
func probe(t *testing.T, args ...string) (*config.Config, string, string) {
	t.Helper()
	var cfg *config.Config
	var level, format string
	app := &cli.App{
		Name: "fkmat", Flags: commonFlags(), Writer: io.Discard, ErrWriter: io.Discard,
		Commands: []*cli.Command{{
			Name: "probe", Flags: commonFlags(),
			Action: func(c *cli.Context) error {
				var err error
				if cfg, err = loadConfig(c); err != nil {
					return err
				}
				if _, err := logger(c); err != nil {
					return err
				}
				level, format = flagString(c, "log-level"), flagString(c, "log-format")
				return nil
			},
		}},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	if err := app.Run(append([]string{"fkmat"}, args...)); err != nil {
		t.Fatalf("fkmat %v: %v", args, err)
	}
	return cfg, level, format
}

func writeConfig(t *testing.T, name, source string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	yml := "source: " + source + "\nredis: redis://file:6379/0\ntarget: postgres://file-target/db\n" + `
joins:
  - name: j
    type: left
    left: {table: orders, foreign_key: [customer_id]}
    right: {table: customers}
    target: {table: orders_enriched}
`
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestConfigPrecedence: flags beat environment variables beat the file, for
// every setting, whether the flag comes before or after the subcommand (an
// environment variable must not beat a flag given before the subcommand);
// a flag after the subcommand beats one before it.
func TestConfigPrecedence(t *testing.T) {
	fileA := writeConfig(t, "a.yaml", "postgres://file-a/db")
	fileB := writeConfig(t, "b.yaml", "postgres://file-b/db")
	for _, k := range []string{"FKMAT_CONFIG", "FKMAT_SOURCE_URL", "FKMAT_TARGET_URL", "FKMAT_REDIS_URL", "FKMAT_LOG_LEVEL", "FKMAT_LOG_FORMAT"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	cases := []struct {
		name                  string
		env                   map[string]string
		args                  []string
		source, target, redis string
		level, format         string
	}{{
		name: "file only", args: []string{"probe", "--config", fileA},
		source: "postgres://file-a/db", target: "postgres://file-target/db", redis: "redis://file:6379/0", level: "info", format: "text",
	}, {
		name: "env beats file",
		env: map[string]string{"FKMAT_CONFIG": fileA, "FKMAT_SOURCE_URL": "postgres://env/db", "FKMAT_TARGET_URL": "postgres://env-target/db",
			"FKMAT_REDIS_URL": "redis://env:6379/0", "FKMAT_LOG_LEVEL": "warn", "FKMAT_LOG_FORMAT": "json"},
		args:   []string{"probe"},
		source: "postgres://env/db", target: "postgres://env-target/db", redis: "redis://env:6379/0", level: "warn", format: "json",
	}, {
		name: "flags after the subcommand beat env",
		env: map[string]string{"FKMAT_CONFIG": fileA, "FKMAT_SOURCE_URL": "postgres://env/db", "FKMAT_TARGET_URL": "postgres://env-target/db",
			"FKMAT_REDIS_URL": "redis://env:6379/0", "FKMAT_LOG_LEVEL": "warn", "FKMAT_LOG_FORMAT": "json"},
		args: []string{"probe", "--config", fileB, "--source", "postgres://flag/db", "--target", "postgres://flag-target/db",
			"--redis", "redis://flag:6379/0", "--log-level", "error", "--log-format", "text"},
		source: "postgres://flag/db", target: "postgres://flag-target/db", redis: "redis://flag:6379/0", level: "error", format: "text",
	}, {
		name: "flags before the subcommand beat env",
		env: map[string]string{"FKMAT_CONFIG": fileA, "FKMAT_SOURCE_URL": "postgres://env/db", "FKMAT_TARGET_URL": "postgres://env-target/db",
			"FKMAT_REDIS_URL": "redis://env:6379/0", "FKMAT_LOG_LEVEL": "warn", "FKMAT_LOG_FORMAT": "json"},
		args: []string{"--config", fileB, "--source", "postgres://flag/db", "--target", "postgres://flag-target/db",
			"--redis", "redis://flag:6379/0", "--log-level", "error", "--log-format", "text", "probe"},
		source: "postgres://flag/db", target: "postgres://flag-target/db", redis: "redis://flag:6379/0", level: "error", format: "text",
	}, {
		name:   "--config before the subcommand beats FKMAT_CONFIG",
		env:    map[string]string{"FKMAT_CONFIG": fileA},
		args:   []string{"--config", fileB, "probe"},
		source: "postgres://file-b/db", target: "postgres://file-target/db", redis: "redis://file:6379/0", level: "info", format: "text",
	}, {
		name:   "flag after the subcommand beats flag before it",
		args:   []string{"--config", fileA, "--source", "postgres://before/db", "probe", "--source", "postgres://after/db"},
		source: "postgres://after/db", target: "postgres://file-target/db", redis: "redis://file:6379/0", level: "info", format: "text",
	}, {
		name:   "flag before the subcommand beats the file",
		args:   []string{"--source", "postgres://before/db", "probe", "--config", fileB},
		source: "postgres://before/db", target: "postgres://file-target/db", redis: "redis://file:6379/0", level: "info", format: "text",
	}, {
		name:   "target defaults to the winning source when nowhere set",
		env:    map[string]string{"FKMAT_SOURCE_URL": "postgres://env/db"},
		args:   []string{"probe", "--config", writeTargetless(t)},
		source: "postgres://env/db", target: "postgres://env/db", redis: "redis://file:6379/0", level: "info", format: "text",
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			cfg, level, format := probe(t, c.args...)
			if cfg.Source != c.source || cfg.Target != c.target || cfg.Redis != c.redis {
				t.Errorf("source, target, redis = %s, %s, %s; want %s, %s, %s", cfg.Source, cfg.Target, cfg.Redis, c.source, c.target, c.redis)
			}
			if level != c.level || format != c.format {
				t.Errorf("log level, format = %s, %s; want %s, %s", level, format, c.level, c.format)
			}
		})
	}
}

func writeTargetless(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "t.yaml")
	yml := "source: postgres://file/db\nredis: redis://file:6379/0\njoins:\n  - {name: j, type: inner, left: {table: o, foreign_key: [c]}, right: {table: c}, target: {table: t}}\n"
	if err := os.WriteFile(path, []byte(yml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"fkmat", "--version"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if got := out.String(); !strings.HasPrefix(got, "fkmat ") || !strings.Contains(got, runtime.Version()) {
		t.Fatalf("--version printed %q, want fkmat <version> (<go version>)", got)
	}
}

// fkmat runs Go code on one thread on machines of at most 2 CPUs, unless
// GOMAXPROCS is set; elsewhere it keeps Go's default.
func TestMaxProcs(t *testing.T) {
	for _, c := range []struct {
		env       string
		goDefault int
		want      int
	}{
		{"", 1, 1}, {"", 2, 1}, {"", 3, 3}, {"", 16, 16},
		{"2", 2, 2}, {"4", 4, 4}, {"1", 1, 1},
	} {
		if got := maxProcs(c.env, c.goDefault); got != c.want {
			t.Errorf("maxProcs(GOMAXPROCS=%q, Go's default %d) = %d, want %d", c.env, c.goDefault, got, c.want)
		}
	}
}
