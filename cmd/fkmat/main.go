package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args))
}

func run(args []string) int {
	app := &cli.App{
		Name:    "fkmat",
		Usage:   "keep a foreign-key join of two Postgres tables materialized, from logical replication",
		Version: version,
		Flags:   globalFlags(),
	}
	if err := app.Run(args); err != nil {
		fmt.Fprintln(os.Stderr, "fkmat:", err)
		return 1
	}
	return 0
}

// globalFlags are accepted before and after every subcommand.
func globalFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug | info | warn | error", EnvVars: []string{"FKMAT_LOG_LEVEL"}},
		&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text | json", EnvVars: []string{"FKMAT_LOG_FORMAT"}},
	}
}
