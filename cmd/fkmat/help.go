package main

import (
	"bytes"
	"io"
	"regexp"
	"strings"

	"github.com/urfave/cli/v2"
)

// helpWidth is the width --help fits its lines in.
const helpWidth = 80

// commandExamples are shown at the end of each command's --help.
var commandExamples = map[string][]string{
	"check": {
		"fkmat check -c fkmat.yaml",
		"fkmat check -c fkmat.yaml --plan          # what run will create, and its cost",
		"FKMAT_CONFIG=fkmat.yaml fkmat check --json",
	},
	"migrate":  {"fkmat migrate -c fkmat.yaml"},
	"backfill": {"fkmat backfill -c fkmat.yaml", "fkmat backfill -c fkmat.yaml --force   # rebuild every join"},
	"run": {
		"fkmat run -c fkmat.yaml",
		"fkmat run -c fkmat.yaml --metrics-addr 127.0.0.1:9187 --verify-interval 1h",
		"fkmat run -c fkmat.yaml --standby           # on a second host",
	},
	"status":   {"fkmat status -c fkmat.yaml", "fkmat status -c fkmat.yaml --json"},
	"verify":   {"fkmat verify -c fkmat.yaml", "fkmat verify -c fkmat.yaml --wait 5m"},
	"teardown": {"fkmat teardown -c fkmat.yaml --dry-run   # what it would drop", "fkmat teardown -c fkmat.yaml --drop-target"},
	"completion": {
		"fkmat completion bash > /etc/bash_completion.d/fkmat",
		"fkmat completion zsh > \"${fpath[1]}/_fkmat\"",
		"fkmat completion fish > ~/.config/fish/completions/fkmat.fish",
	},
	"man":     {"fkmat man > /usr/local/share/man/man1/fkmat.1"},
	"version": {"fkmat version"},
}

// withExamples adds each command's examples to its description.
func withExamples(cmds []*cli.Command) {
	for _, c := range cmds {
		ex := commandExamples[c.Name]
		if len(ex) == 0 {
			continue
		}
		text := "Examples:\n   " + strings.Join(ex, "\n   ")
		if c.Description != "" {
			text = c.Description + "\n\n" + text
		}
		c.Description = text
	}
}

// printHelp is cli.HelpPrinter: urfave/cli's help, with "(default: false)"
// left out (a switch is off unless given) and every line wrapped at
// helpWidth under its own column.
func printHelp(w io.Writer, templ string, data any) {
	var buf bytes.Buffer
	cli.HelpPrinterCustom(&buf, templ, data, nil)
	out := strings.ReplaceAll(buf.String(), " (default: false)", "")
	_, _ = io.WriteString(w, wrapHelp(out, helpWidth))
}

// column finds where a help line's text starts: after a flag's names (two
// spaces or more), after "name - " on a NAME line, or its indentation.
var column = regexp.MustCompile(`^(\s+\S.*?\s{2,}|\s+\S[^-]*? - |\s+)`)

// wrapHelp wraps the lines of s longer than width at spaces, each
// continuation indented to its line's column.
func wrapHelp(s string, width int) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if len(line) <= width {
			b.WriteString(line + "\n")
			continue
		}
		indent := len(column.FindString(line))
		if indent > width/2 {
			indent = 6
		}
		pad := strings.Repeat(" ", indent)
		cur := line[:indent]
		rest := strings.Fields(line[indent:])
		n := 0 // words on cur
		for _, word := range rest {
			if n > 0 && len(cur)+1+len(word) > width {
				b.WriteString(cur + "\n")
				cur, n = pad, 0
			}
			if n > 0 {
				cur += " "
			}
			cur += word
			n++
		}
		b.WriteString(cur + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}
