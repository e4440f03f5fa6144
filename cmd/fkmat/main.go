package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/buildinfo"
	"github.com/fkmat/fkmat/internal/crash"
)

// Exit codes: 0 ok, 1 failure or difference, 2 bad usage or configuration,
// 3 (verify) a target behind its source. The commands' errors are
// classified by fkmat.ExitCode, from what run restarts by.
const (
	exitFailure = fkmat.ExitFailure
	exitUsage   = fkmat.ExitConfig
)

// GC defaults, unless GOGC or GOMEMLIMIT say otherwise: fkmat's heap is
// mostly per-batch garbage, so collecting at 3x the live heap instead of 2x
// saves CPU (measured in make bench), and the soft limit keeps the process
// well inside the 300 MB it is meant to fit in.
const (
	defaultGCPercent   = 200
	defaultMemoryLimit = 192 << 20
)

// smallMachineCPUs is the most CPUs (the machine's, or the process's CPU
// limit) at which fkmat runs Go code on one thread at a time, unless
// GOMAXPROCS says otherwise. On such a machine fkmat usually shares its
// cores with Postgres or Redis, and Go's idle threads looking for work
// between a batch's round trips take CPU those need: on 2 cores, one P
// cut fkmat's CPU per W1 change by a fifth and sped the catch-up by about
// a tenth (docs/performance.md). Its Go code needs about one core at the
// decoder's pace.
const smallMachineCPUs = 2

// maxProcs returns the GOMAXPROCS fkmat runs with: goDefault (Go's) when
// env (the GOMAXPROCS variable) is set or the machine is larger than
// smallMachineCPUs, else 1.
func maxProcs(env string, goDefault int) int {
	if env != "" || goDefault > smallMachineCPUs {
		return goDefault
	}
	return 1
}

// freezeForTests makes the process stop itself (SIGSTOP) the first time a
// batch reaches the named point of its commit (crash.At): the integration
// tests freeze an active daemon there, as a long GC pause or a stopped VM
// would, and check that its standby takes over. Unset, it does nothing.
func freezeForTests(point string) {
	if point == "" {
		return
	}
	var once sync.Once
	crash.SetTestHook(func(at string, _ any) {
		if at == point {
			once.Do(func() { _ = syscall.Kill(os.Getpid(), syscall.SIGSTOP) })
		}
	})
}

func main() {
	// Only when it changes: setting it stops Go from following a changed
	// CPU limit of the container.
	def := runtime.GOMAXPROCS(0)
	if n := maxProcs(os.Getenv("GOMAXPROCS"), def); n != def {
		runtime.GOMAXPROCS(n)
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	freezeForTests(os.Getenv("FKMAT_TEST_FREEZE_AT"))
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
	cli.SuggestDidYouMeanTemplate = "did you mean %s?"
	cli.HelpPrinter = printHelp
	app := &cli.App{
		Name:      "fkmat",
		Usage:     "keep a foreign-key join of Postgres tables (a star or a chain of them) materialized as a table, from logical replication",
		Version:   buildinfo.Version(),
		Flags:     commonFlags(),
		Writer:    stdout,
		ErrWriter: stderr,

		// fkmat completion's bash and zsh scripts ask for the candidates.
		EnableBashCompletion: true,
		Commands: []*cli.Command{
			checkCommand(), migrateCommand(), backfillCommand(), runCommand(),
			statusCommand(), verifyCommand(), teardownCommand(), completionCommand(), manCommand(), versionCommand(),
		},
		Suggest: true,
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return unknownCommand(c, c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
		OnUsageError:   usageError,
		ExitErrHandler: func(*cli.Context, error) {},
	}
	withExamples(app.Commands)
	for _, c := range app.Commands {
		c.Flags = append(c.Flags, commonFlags()...)
		c.OnUsageError = app.OnUsageError
		if c.ArgsUsage == "" && c.Before == nil {
			c.Before = noArguments
		}
		switch c.Name { // commands whose --json prints usage errors too
		case "status":
			c.OnUsageError = statusUsageError(app.OnUsageError)
		case "check":
			c.OnUsageError = checkUsageError(app.OnUsageError)
		}
	}
	err := app.Run(args)
	if err == nil {
		return 0
	}
	msg := err.Error()
	if topic, ok := strings.CutPrefix(msg, "No help topic for "); ok { // fkmat help <unknown command>
		msg = "unknown command " + strings.Replace(topic, ". did you mean", "; did you mean", 1)
	}
	fmt.Fprintln(stderr, "fkmat:", msg)
	if ee, ok := errors.AsType[*exitError](err); ok {
		return ee.code
	}
	if strings.HasPrefix(err.Error(), "No help topic") { // fkmat help <unknown command>
		return exitUsage
	}
	return fkmat.ExitCode(err)
}

// versionCommand prints what --version prints.
func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print fkmat's version and the Go that built it",
		Action: func(c *cli.Context) error {
			cli.VersionPrinter(c)
			return nil
		},
	}
}

// noArguments refuses words after a command that takes none: a
// configuration file given without -c is the usual one.
func noArguments(c *cli.Context) error {
	if !c.Args().Present() {
		return nil
	}
	arg := c.Args().First()
	msg := fmt.Sprintf("`fkmat %s` takes no argument %q", c.Command.Name, arg)
	if ext := strings.ToLower(filepath.Ext(arg)); ext == ".yaml" || ext == ".yml" || ext == ".json" {
		msg += fmt.Sprintf("; pass the configuration with -c: fkmat %s -c %s (or set FKMAT_CONFIG)", c.Command.Name, arg)
	} else {
		msg += fmt.Sprintf(" (`fkmat %s --help` lists its flags)", c.Command.Name)
	}
	return &exitError{code: exitUsage, err: errors.New(msg)}
}

// unknownCommand is the error for `fkmat <name>` when no command is named
// name.
func unknownCommand(c *cli.Context, name string) error {
	msg := fmt.Sprintf("unknown command %q", name)
	var names []string
	for _, cmd := range c.App.VisibleCommands() {
		names = append(names, cmd.Name)
	}
	// "did you mean <name>?", in the wording run gives urfave/cli
	s := cli.SuggestCommand(c.App.VisibleCommands(), name)
	if s = nearest(strings.TrimSuffix(strings.TrimPrefix(s, "did you mean "), "?"), name); s != "" {
		msg += "; did you mean " + s + "?"
	}
	return &exitError{code: exitUsage, err: fmt.Errorf("%s (commands: %s)", msg, strings.Join(names, ", "))}
}

// The flag package inside urfave/cli words its errors for Go programmers
// (`invalid value "1hour" for flag -verify-interval: parse error`), and
// urfave/cli its errors about environment variables likewise; flagError
// rewrites each into one that names the fix.
var (
	undefinedFlag = regexp.MustCompile(`^flag provided but not defined: -+(.+)$`)
	invalidValue  = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([^:]+): `)
	invalidEnv    = regexp.MustCompile(`^could not parse "(.*)" as .* from environment variable "(.*)" for flag ([^:]+): `)
	missingValue  = regexp.MustCompile(`^flag needs an argument: -+(.+)$`)
)

// usageError is urfave/cli's OnUsageError: a flag error, rewritten to name
// the fix, and exit code 2.
func usageError(c *cli.Context, err error, isSubcommand bool) error {
	here := "fkmat"
	if isSubcommand {
		here += " " + c.Command.Name
	}
	return &exitError{code: exitUsage, err: flagError(c, err, here)}
}

func flagError(c *cli.Context, err error, here string) error {
	msg := err.Error()
	if m := undefinedFlag.FindStringSubmatch(msg); m != nil {
		return unknownFlag(c, m[1], here)
	}
	if m := invalidValue.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("%s %q: %s", dashed(m[2]), m[1], valueHint(lookupFlag(c.Command.Flags, m[2]), m[2], msg))
	}
	if m := invalidEnv.FindStringSubmatch(msg); m != nil {
		return fmt.Errorf("%s=%q (%s): %s", m[2], m[1], dashed(m[3]), valueHint(lookupFlag(c.Command.Flags, m[3]), m[3], msg))
	}
	if m := missingValue.FindStringSubmatch(msg); m != nil {
		example := "VALUE"
		switch lookupFlag(c.Command.Flags, m[1]).(type) {
		case *cli.DurationFlag:
			example = "5m"
		case *cli.IntFlag:
			example = "3"
		}
		return fmt.Errorf("%s needs a value, e.g. %s %s", dashed(m[1]), dashed(m[1]), example)
	}
	return err
}

// valueHint says how to write a value of flag f (named name).
func valueHint(f cli.Flag, name, otherwise string) string {
	switch f.(type) {
	case *cli.DurationFlag:
		return "not a duration; write it like 90s, 5m or 1h30m"
	case *cli.IntFlag:
		return "not a whole number; write it like 3"
	case *cli.BoolFlag:
		return fmt.Sprintf("not true or false; write %s alone, or %s=false", dashed(name), dashed(name))
	}
	return otherwise
}

// unknownFlag is the error for a flag that here (fkmat, or fkmat <command>)
// does not take: where it belongs when another command takes it, else the
// nearest flag here.
func unknownFlag(c *cli.Context, name, here string) error {
	var owners []string
	for _, cmd := range c.App.Commands {
		if cmd != c.Command && lookupFlag(cmd.Flags, name) != nil {
			owners = append(owners, "fkmat "+cmd.Name)
		}
	}
	switch {
	case len(owners) > 0 && here == "fkmat":
		return fmt.Errorf("flag %s belongs to `%s`: put it after the command, as in `%s %s`",
			dashed(name), strings.Join(owners, "` and `"), owners[0], dashed(name))
	case len(owners) > 0:
		return fmt.Errorf("`%s` has no flag %s; it belongs to `%s`", here, dashed(name), strings.Join(owners, "` and `"))
	}
	msg := fmt.Sprintf("`%s` has no flag %s", here, dashed(name))
	if s := nearest(cli.SuggestFlag(c.Command.VisibleFlags(), name, true), name); s != "" {
		msg += "; did you mean " + s + "?"
	}
	return fmt.Errorf("%s (`%s --help` lists its flags)", msg, here)
}

// nearest returns urfave/cli's suggestion for a misspelled name (a command,
// or a flag with its dashes), or "" when it starts with another letter:
// urfave/cli names the nearest name, however far.
func nearest(suggestion, name string) string {
	if s := strings.TrimLeft(suggestion, "-"); s == "" || name == "" || s[0] != name[0] {
		return ""
	}
	return suggestion
}

func lookupFlag(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		if slices.Contains(f.Names(), name) {
			return f
		}
	}
	return nil
}

// dashed writes a flag name as on the command line: -c, --config.
func dashed(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// commonFlags are accepted before and after every subcommand. Their
// environment variables (commonEnv) are read by flagString, not by
// urfave/cli: it would apply them to the subcommand's copy of the flag and
// so let them beat a flag given before the subcommand.
func commonFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "join definition file (YAML) [$FKMAT_CONFIG]"},
		&cli.StringFlag{Name: "source", Usage: "source database: a postgres:// URL or host=... dbname=... keywords [$FKMAT_SOURCE_URL]"},
		&cli.StringFlag{Name: "target", Usage: "target database, written like --source (default: source) [$FKMAT_TARGET_URL]"},
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

// loadConfig reads the file and applies env and flags over it (flags beat
// env, env beats the file), and reports every problem of the result.
func loadConfig(c *cli.Context) (*config.Config, error) {
	path := flagString(c, "config")
	if path == "" {
		return nil, &exitError{code: exitUsage, err: errors.New("no join definition: pass --config FILE (or -c FILE) or set FKMAT_CONFIG")}
	}
	return config.Load(path, func(cfg *config.Config) {
		for name, dst := range map[string]*string{"source": &cfg.Source, "target": &cfg.Target, "redis": &cfg.Redis} {
			if v := flagString(c, name); v != "" {
				*dst = v
			}
		}
	})
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
