package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes parseSize accepts, in bytes. They are
// Postgres's memory units (kB, MB, GB, TB: multiples of 1024, as in
// max_slot_wal_keep_size = 512MB), their IEC spellings, and KB for kB.
var sizeUnits = []struct {
	suffix string
	bytes  int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1 << 40}, {"GB", 1 << 30}, {"MB", 1 << 20}, {"kB", 1 << 10}, {"KB", 1 << 10}, {"B", 1},
}

// parseSize parses a byte size as Postgres reads one: 512MB is 512 MiB,
// 1GiB is 1 GB, a plain number is bytes.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.bytes
			break
		}
	}
	n, err := strconv.ParseFloat(t, 64)
	if err != nil || n <= 0 || n*float64(mult) >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is not a size: write it as 1GB, 512MB (Postgres's units: 1024-based, like 512MiB) or a number of bytes", s)
	}
	return int64(n * float64(mult)), nil
}
