package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/buildinfo"
	"github.com/fkmat/fkmat/sink"
)

// Exit codes: 0 ok, 1 failure or difference, 2 bad usage or configuration.
const (
	exitFailure = 1
	exitUsage   = 2
)

// GC defaults, unless GOGC or GOMEMLIMIT say otherwise: fkmat's heap is
// mostly per-batch garbage, so collecting at 3x the live heap instead of 2x
// saves CPU (measured in make bench), and the soft limit keeps the process
// well inside the 300 MB it is meant to fit in.
const (
	defaultGCPercent   = 200
	defaultMemoryLimit = 192 << 20
)

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	os.Exit(profiled(func() int { return run(os.Args, os.Stdout, os.Stderr) }))
}

// profiled runs fn under the profiles the environment asks for (make bench,
// performance work): FKMAT_CPUPROFILE=file writes a CPU profile of the whole
// run, FKMAT_MEMPROFILE=file the allocations at exit.
func profiled(fn func() int) int {
	if path := os.Getenv("FKMAT_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			defer func() {
				pprof.StopCPUProfile()
				_ = f.Close()
			}()
		}
	}
	if path := os.Getenv("FKMAT_MEMPROFILE"); path != "" {
		defer func() {
			if f, err := os.Create(path); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				_ = f.Close()
			}
		}()
	}
	return fn()
}

// exitError carries an exit code through urfave/cli.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func run(args []string, stdout, stderr io.Writer) int {
	cli.VersionPrinter = func(c *cli.Context) {
		fmt.Fprintf(c.App.Writer, "fkmat %s (%s)\n", buildinfo.Version(), buildinfo.GoVersion())
	}
	app := &cli.App{
		Name:      "fkmat",
		Usage:     "keep a foreign-key join of Postgres tables (two, or stars and chains of several) materialized, from logical replication",
		Version:   buildinfo.Version(),
		Flags:     commonFlags(),
		Writer:    stdout,
		ErrWriter: stderr,
		Commands: []*cli.Command{
			checkCommand(), migrateCommand(), backfillCommand(), runCommand(),
			statusCommand(), verifyCommand(), teardownCommand(),
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return &exitError{code: exitUsage, err: err}
		},
		ExitErrHandler: func(*cli.Context, error) {},
	}
	for _, c := range app.Commands {
		c.Flags = append(c.Flags, commonFlags()...)
		c.OnUsageError = app.OnUsageError
	}
	err := app.Run(args)
	if err == nil {
		return 0
	}
	fmt.Fprintln(stderr, "fkmat:", err)
	var ee *exitError
	var ce *config.ConfigError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ce):
		return exitUsage
	case errors.Is(err, sink.ErrShapeMismatch), errors.Is(err, cdc.ErrWALLevel), errors.Is(err, cdc.ErrReplicationPrivilege):
		// Configuration problems found only on the way (fkmat check reports
		// them too): an existing target of another shape, a server without
		// wal_level=logical, a role without REPLICATION.
		return exitUsage
	case strings.Contains(err.Error(), "flag provided but not defined"), strings.HasPrefix(err.Error(), "No help topic"):
		return exitUsage
	}
	return exitFailure
}

// commonFlags are accepted before and after every subcommand. Their
// environment variables (commonEnv) are read by flagString, not by
// urfave/cli: it would apply them to the subcommand's copy of the flag and
// so let them beat a flag given before the subcommand.
func commonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Usage: "join definition file (YAML) [$FKMAT_CONFIG]"},
		&cli.StringFlag{Name: "source", Usage: "source database URL [$FKMAT_SOURCE_URL]"},
		&cli.StringFlag{Name: "target", Usage: "target database URL (default: source) [$FKMAT_TARGET_URL]"},
		&cli.StringFlag{Name: "redis", Usage: "Redis URL [$FKMAT_REDIS_URL]"},
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug | info | warn | error [$FKMAT_LOG_LEVEL]"},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text | json [$FKMAT_LOG_FORMAT]"},
	}
}

// commonEnv names the environment variable of each common flag.
var commonEnv = map[string]string{
	"config":     "FKMAT_CONFIG",
	"source":     "FKMAT_SOURCE_URL",
	"target":     "FKMAT_TARGET_URL",
	"redis":      "FKMAT_REDIS_URL",
	"log-level":  "FKMAT_LOG_LEVEL",
	"log-format": "FKMAT_LOG_FORMAT",
}

// flagString returns the value of a common flag: from the innermost context
// whose command line sets it (after the subcommand beats before it), else
// from its environment variable, else its default. Flags beat env.
func flagString(c *cli.Context, name string) string {
	for _, ctx := range c.Lineage() {
		if ctx.Command != nil || ctx.App != nil {
			if ctx.IsSet(name) {
				return ctx.String(name)
			}
		}
	}
	if v := os.Getenv(commonEnv[name]); v != "" {
		return v
	}
	return c.String(name)
}

// loadConfig reads the file and applies env and flags over it: flags beat
// env, env beats the file.
func loadConfig(c *cli.Context) (*config.Config, error) {
	path := flagString(c, "config")
	if path == "" {
		return nil, &exitError{code: exitUsage, err: errors.New("no join definition: pass --config FILE or set FKMAT_CONFIG")}
	}
	cfg, err := config.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	for name, dst := range map[string]*string{"source": &cfg.Source, "target": &cfg.Target, "redis": &cfg.Redis} {
		if v := flagString(c, name); v != "" {
			*dst = v
		}
	}
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// logger builds the slog logger from --log-level and --log-format.
func logger(c *cli.Context) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(flagString(c, "log-level"))); err != nil {
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("--log-level %q: use debug, info, warn or error", flagString(c, "log-level"))}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f := flagString(c, "log-format"); f {
	case "text":
		return slog.New(slog.NewTextHandler(c.App.ErrWriter, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(c.App.ErrWriter, opts)), nil
	default:
		return nil, &exitError{code: exitUsage, err: fmt.Errorf("--log-format %q: use text or json", f)}
	}
}

// setup loads the configuration and the logger of a command.
func setup(c *cli.Context) (*config.Config, fkmat.Options, error) {
	log, err := logger(c)
	if err != nil {
		return nil, fkmat.Options{}, err
	}
	cfg, err := loadConfig(c)
	if err != nil {
		return nil, fkmat.Options{}, err
	}
	redis.SetLogger(redisLogger{log.With("component", "redis")})
	opts := fkmat.Options{Logger: log}
	// Progress bars on a terminal with text logs; plain lines otherwise.
	if f, ok := c.App.ErrWriter.(*os.File); ok && term.IsTerminal(int(f.Fd())) && flagString(c, "log-format") == "text" {
		opts.ProgressBars = f
	}
	return cfg, opts, nil
}

// signalContext is canceled by SIGINT or SIGTERM.
func signalContext(c *cli.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(c.Context, os.Interrupt, syscall.SIGTERM)
}
