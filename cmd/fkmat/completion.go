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
	md = "% " + app.Name + " 1\n\n" + strings.ReplaceAll(md, "[$", `\[$`)
	return string(md2man.Render([]byte(md))), nil
}

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
	local cur="${COMP_WORDS[COMP_CWORD]}" opts
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
