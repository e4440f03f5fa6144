package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
	"github.com/urfave/cli/v2"
)

// completionCommand prints a shell completion script. The bash and zsh
// scripts ask fkmat itself for the candidates (urfave/cli answers
// `fkmat … --generate-bash-completion` with the subcommands or flags
// that fit); the fish script lists them all, generated from the commands.
func completionCommand() *cli.Command {
	return &cli.Command{
		Name:      "completion",
		Usage:     "print a shell completion script: bash, zsh or fish (e.g. fkmat completion bash > /etc/bash_completion.d/fkmat)",
		ArgsUsage: "bash|zsh|fish",
		BashComplete: func(c *cli.Context) {
			fmt.Fprintln(c.App.Writer, "bash\nzsh\nfish")
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return &exitError{code: exitUsage, err: errors.New("completion: name the shell: fkmat completion bash, zsh or fish")}
			}
			script, err := completionScript(c.App, c.Args().First())
			if err != nil {
				return err
			}
			_, err = io.WriteString(c.App.Writer, script)
			return err
		},
	}
}

// manCommand prints the man page, generated from the commands and flags.
func manCommand() *cli.Command {
	return &cli.Command{
		Name:  "man",
		Usage: "print the man page, section 1 (e.g. fkmat man > /usr/local/share/man/man1/fkmat.1)",
		Action: func(c *cli.Context) error {
			page, err := manPage(c.App)
			if err != nil {
				return err
			}
			_, err = io.WriteString(c.App.Writer, page)
			return err
		},
	}
}

// manPage renders app's Markdown documentation as a man page in section 1.
// It is App.ToManWithSection(1) but for the usages' "[$FKMAT_…]", which
// Markdown would read, before a "(default: …)", as a link.
func manPage(app *cli.App) (string, error) {
	md, err := app.ToMarkdown()
	if err != nil {
		return "", fmt.Errorf("write the man page: %w", err)
	}
	md = "% " + app.Name + " 1\n\n" + strings.ReplaceAll(md, "[$", `\[$`) + manSections
	return string(md2man.Render([]byte(md))), nil
}

// manSections are the man page's sections beyond the commands and flags.
const manSections = `
# DESCRIPTION

fkmat keeps the foreign-key join of Postgres tables materialized as a real
Postgres table, the target: a left table joined to the tables it references,
in a star or a chain, optionally filtered (where) and with computed columns.
It reads the source's changes from logical replication (pgoutput), keeps the
join's state in Redis, and writes the target and its checkpoint in one
transaction per batch, so the target equals the SQL join at every committed
position, through restarts and crashes.

# CONFIGURATION

A YAML file, given with -c or FKMAT_CONFIG:

    source: postgres://fkmat@db:5432/shop
    redis: redis://redis:6379/0
    joins:
      - name: orders_wide
        type: left
        left:
          table: public.orders
          where: "status <> 'draft'"
          columns: [id, customer_id, amount, "amount * qty AS total"]
        right:
          - table: public.customers
            foreign_key: [customer_id]
            columns: [name AS customer_name]
        target:
          table: public.orders_wide

Top-level keys: source, target (default: source), redis, slot, publication,
timezone (default UTC), joins. fkmat check validates a file against the
databases and prints every problem with its fix.

# ENVIRONMENT

FKMAT_CONFIG, FKMAT_SOURCE_URL, FKMAT_TARGET_URL, FKMAT_REDIS_URL,
FKMAT_LOG_LEVEL and FKMAT_LOG_FORMAT stand for the flags of the same names;
each command's flags name their variables (FKMAT_METRICS_ADDR,
FKMAT_STANDBY, ...). Postgres's PG* variables and URL parameters (sslmode,
sslrootcert, ...) apply to both databases.

# EXIT STATUS

0: done (run: stopped by SIGINT or SIGTERM after its last batch).
1: a failure: a database or Redis error that retries did not fix, a
difference found by verify, a problem reported by status.
2: a usage problem, or one only the configuration, a grant or a server
setting fixes (a refused password, wal_level, a Redis older than 6.2):
what run stops at at once instead of retrying. The message names the fix.
3: verify: the target is behind the source (no daemon streaming, or still
behind at the deadline of --wait); nothing was compared.

# EXAMPLES

    fkmat check -c fkmat.yaml --plan
    fkmat run -c fkmat.yaml --metrics-addr 127.0.0.1:9187
    fkmat status -c fkmat.yaml
    fkmat verify -c fkmat.yaml --wait 5m
    fkmat teardown -c fkmat.yaml --dry-run

# SEE ALSO

postgres(1), redis-server(1); the README and docs/ of the fkmat sources.
`

// completionScript returns the completion script of app for shell.
func completionScript(app *cli.App, shell string) (string, error) {
	switch shell {
	case "bash":
		return strings.ReplaceAll(bashCompletion, "PROG", app.Name), nil
	case "zsh":
		return strings.ReplaceAll(zshCompletion, "PROG", app.Name), nil
	case "fish":
		s, err := app.ToFishCompletion()
		if err != nil {
			return "", fmt.Errorf("write the fish completion: %w", err)
		}
		return s, nil
	}
	return "", &exitError{code: exitUsage, err: fmt.Errorf("completion %q: use bash, zsh or fish", shell)}
}

// bashCompletion completes the words of a PROG command line with what
// `PROG <words so far> [--partial-flag] --generate-bash-completion` prints.
// Install: PROG completion bash > /etc/bash_completion.d/PROG
const bashCompletion = `# bash completion for PROG: PROG completion bash > /etc/bash_completion.d/PROG
_PROG_complete() {
	local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" opts
	if [[ "$prev" == -c || "$prev" == --config ]]; then
		COMPREPLY=($(compgen -f -- "$cur")) # the configuration file
		return
	fi
	if [[ "$cur" == -* ]]; then
		opts=$("${COMP_WORDS[@]:0:COMP_CWORD}" "$cur" --generate-bash-completion 2>/dev/null)
	else
		opts=$("${COMP_WORDS[@]:0:COMP_CWORD}" --generate-bash-completion 2>/dev/null)
	fi
	COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}
complete -o bashdefault -o default -F _PROG_complete PROG
`

// zshCompletion does the same for zsh, as a file on $fpath (autoloaded)
// or sourced.
const zshCompletion = `#compdef PROG
# zsh completion for PROG: PROG completion zsh > "${fpath[1]}/_PROG"
_PROG() {
	local -a opts
	local cur=${words[-1]}
	if [[ "${words[-2]}" == -c || "${words[-2]}" == --config ]]; then
		_files # the configuration file
		return
	fi
	if [[ "$cur" == -* ]]; then
		opts=("${(@f)$(${words[@]:0:#words[@]-1} "$cur" --generate-bash-completion 2>/dev/null)}")
	else
		opts=("${(@f)$(${words[@]:0:#words[@]-1} --generate-bash-completion 2>/dev/null)}")
	fi
	if [[ -n "${opts[1]}" ]]; then
		_describe 'values' opts
	else
		_files
	fi
}
if [[ "${funcstack[1]}" == "_PROG" ]]; then
	_PROG "$@"
else
	compdef _PROG PROG
fi
`
