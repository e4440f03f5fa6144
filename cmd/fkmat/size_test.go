package main

import "testing"

// TestParseSize: sizes read as Postgres reads them (kB, MB, GB, TB are
// 1024-based), with the IEC spellings and plain bytes.
func TestParseSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{
		"512MB": 512 << 20, "512MiB": 512 << 20, "1GB": 1 << 30, "1GiB": 1 << 30, "2TB": 2 << 40, "2TiB": 2 << 40,
		"64kB": 64 << 10, "64KB": 64 << 10, "64KiB": 64 << 10, "1048576": 1 << 20, "100B": 100,
		"1.5 GiB": 3 << 29, " 16 MB ": 16 << 20,
	} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1GiB", "0", "1 parsec", "512mb", "1e30TB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}
