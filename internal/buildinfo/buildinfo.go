// Package buildinfo says which fkmat this is: the version the build
// embedded (make build and make image set it from git describe), or else
// the commit Go recorded in the binary, with a dirty flag.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version is set by the build: -ldflags "-X github.com/fkmat/fkmat/internal/buildinfo.version=v1.2.3".
var version string

// Version is the build's version: the one embedded at build time, or the
// module's version Go records for `go install …@v1.2.3`, or
// "dev-<commit>[-dirty]" from the VCS information Go records, or "dev".
func Version() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "dev"
	}
	return fromInfo(info)
}

// fromInfo is Version from what Go recorded in the binary.
func fromInfo(info *debug.BuildInfo) string {
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return fromSettings(info.Settings)
}

// GoVersion is the Go release the binary was built with.
func GoVersion() string { return runtime.Version() }

func fromSettings(settings []debug.BuildSetting) string {
	var rev string
	var dirty bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "dev"
	}
	v := "dev-" + rev[:min(12, len(rev))]
	if dirty {
		v += "-dirty"
	}
	return v
}
