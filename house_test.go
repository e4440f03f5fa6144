package fkmat

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The root package's files are of three sides. A command (check, plan,
// status, verify, teardown, migrate) never reaches into the daemon, and the
// daemon never reaches into a command: what both need lives in a shared file,
// which uses neither.
var (
	commandFiles = []string{"check.go", "checkplan.go", "grants.go", "migrate.go", "status.go", "teardown.go", "verify.go"}
	sharedFiles  = []string{"connect.go", "doc.go", "errors.go", "joinstate.go", "lag.go", "options.go", "oracle.go",
		"owners.go", "sql.go", "stall.go", "tables.go"}
	// The daemon: daemon*.go and these.
	daemonFiles = []string{"generate.go", "metrics.go", "progress.go", "run.go", "standby.go"}
)

func sideOf(file string) string {
	switch {
	case contains(commandFiles, file):
		return "command"
	case contains(sharedFiles, file):
		return "shared"
	case strings.HasPrefix(file, "daemon") || contains(daemonFiles, file):
		return "daemon"
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestFilesKeepToTheirSide reads the package's files and fails on a name
// one side uses that another side's file declares. Names are resolved as
// the parser does: an identifier no declaration of its own file resolves
// is the package's (methods are reached through values, which the
// functions that make them bring along).
func TestFilesKeepToTheirSide(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	declaredIn := map[string]string{}
	files := map[string]*ast.File{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		if sideOf(path) == "" {
			t.Errorf("%s is on no side: add it to commandFiles, sharedFiles or daemonFiles in house_test.go", path)
		}
		files[path] = f
		for _, d := range f.Decls {
			for _, name := range declared(d) {
				declaredIn[name] = path
			}
		}
	}
	var problems []string
	for path, f := range files {
		from := sideOf(path)
		seen := map[string]bool{}
		for _, id := range f.Unresolved {
			in, ok := declaredIn[id.Name]
			if !ok || in == path || seen[id.Name] {
				continue
			}
			seen[id.Name] = true
			to := sideOf(in)
			if to != "shared" && to != from || from == "shared" && to != "shared" {
				problems = append(problems, fmt.Sprintf("%s (%s) uses %s of %s (%s)", path, from, id.Name, in, to))
			}
		}
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p + ": move it to a shared file, or keep it on its side")
	}
	if len(declaredIn) < 100 {
		t.Fatalf("read %d package-level names: the reader is broken", len(declaredIn))
	}
}

// declared returns the package-level names of a declaration (not methods).
func declared(d ast.Decl) []string {
	var out []string
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			out = append(out, d.Name.Name)
		}
	case *ast.GenDecl:
		for _, s := range d.Specs {
			switch s := s.(type) {
			case *ast.TypeSpec:
				out = append(out, s.Name.Name)
			case *ast.ValueSpec:
				for _, n := range s.Names {
					out = append(out, n.Name)
				}
			}
		}
	}
	return out
}
