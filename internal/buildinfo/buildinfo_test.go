package buildinfo

import (
	"runtime/debug"
	"testing"
)

func TestFromSettings(t *testing.T) {
	for _, c := range []struct {
		settings []debug.BuildSetting
		want     string
	}{
		{nil, "dev"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "false"}}, "dev-0123456789ab"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}}, "dev-0123456789ab-dirty"},
		{[]debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}, "dev-abc"},
	} {
		if got := fromSettings(c.settings); got != c.want {
			t.Errorf("fromSettings(%v) = %q, want %q", c.settings, got, c.want)
		}
	}
}

func TestEmbedded(t *testing.T) {
	defer func(v string) { version = v }(version)
	version = "v1.2.3-4-gabcdef"
	if got := Version(); got != "v1.2.3-4-gabcdef" {
		t.Fatalf("Version() = %q, want the embedded one", got)
	}
}

// TestModuleVersion: a binary built by `go install …@v0.2.0` says v0.2.0;
// one built from a checkout says what its commit is.
func TestModuleVersion(t *testing.T) {
	rev := []debug.BuildSetting{{Key: "vcs.revision", Value: "0123456789abcdef0123"}}
	for _, c := range []struct {
		main string
		want string
	}{
		{"v0.2.0", "v0.2.0"},
		{"v0.2.1-0.20261206120000-0123456789ab", "v0.2.1-0.20261206120000-0123456789ab"},
		{"(devel)", "dev-0123456789ab"},
		{"", "dev-0123456789ab"},
	} {
		info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/fkmat/fkmat", Version: c.main}, Settings: rev}
		if got := fromInfo(info); got != c.want {
			t.Errorf("fromInfo(main %q) = %q, want %q", c.main, got, c.want)
		}
	}
}
