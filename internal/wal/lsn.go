// Package wal holds the position type every stage shares: a place in the
// Postgres write-ahead log.
package wal

import (
	"fmt"
	"strconv"
	"strings"
)

// LSN is a position in the Postgres write-ahead log, printed as "XXX/XXX"
// like pg_lsn. The zero LSN means "no position".
type LSN uint64

// String formats the LSN like Postgres does ("16/B374D848").
func (l LSN) String() string {
	return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l))
}

// ParseLSN parses the textual pg_lsn form "XXX/XXX".
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("parse lsn %q: missing '/'", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("parse lsn %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("parse lsn %q: %w", s, err)
	}
	return LSN(h<<32 | l), nil
}
