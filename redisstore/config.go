package redisstore

import (
	"errors"
	"fmt"
	"strings"
)

// Defaults of Config, chosen by BenchmarkLayout (see the package
// documentation for the figures).
const (
	// DefaultSubShards keeps subscription sets in the compact listpack
	// encoding (at most 128 members each) up to some 60M subscriptions; at
	// 3M it costs 20.3 B per subscription, against 17.1 B for the best count
	// (65536) and 110.6 B for too few sets (16384).
	DefaultSubShards = 1 << 20
	// DefaultRowShards keeps row buckets within 512 fields, the listpack
	// limit of hashes, up to some 100M rows; at 3M rows of 32 bytes it costs
	// 67 B per row (57 B with 16384 buckets, 155 B as one string per row).
	DefaultRowShards = 1 << 18
	// DefaultPageSize bounds the arguments of one command and the keys of
	// one sweep step.
	DefaultPageSize = 512
	// DefaultRightCacheBytes bounds the cache of right rows: some 200k
	// rows of a few short columns.
	DefaultRightCacheBytes = 32 << 20
)

// Config configures a Store. The zero value of every field but Prefix means
// its default. SubShards and RowShards are part of the persistent layout:
// changing them requires re-initialising the state (see Store.Init).
type Config struct {
	// Prefix starts every key of the join, e.g. "fkmat:<slot>:<join>", so
	// that a Redis ACL user can be limited to "~<prefix>:*". It must not
	// contain glob characters (*?[]\) nor braces (the store places the hash
	// tags itself).
	Prefix string
	// SubShards is the number of sorted sets the subscriptions are spread
	// over, by a hash of the encoded foreign key. Size it so that a set holds
	// at most ~64 members on average (expected subscriptions / 64): beyond
	// 128 members a set leaves the compact listpack encoding and costs ~5x
	// the memory. Default DefaultSubShards.
	SubShards int
	// RowShards is the number of hashes the left rows, and separately the
	// right rows, are spread over by a hash of their encoded key. Hashes stay
	// compact up to 512 fields of at most 64 bytes each (expected rows / 256
	// is a good count). Default DefaultRowShards.
	RowShards int
	// RightCacheBytes bounds the in-process cache of right rows (about
	// this many bytes of rows and bookkeeping). Zero means
	// DefaultRightCacheBytes; negative disables the cache. Not part of the
	// persistent layout.
	RightCacheBytes int
	// PageSize is the largest number of members, fields or keys sent in one
	// command: Commit splits larger sets into several commands inside its one
	// MULTI, and Sweep scans and unlinks this many keys per step. Default
	// DefaultPageSize.
	PageSize int
}

// maxShards bounds SubShards and RowShards: more would only add keys.
const maxShards = 1 << 26

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.SubShards == 0 {
		c.SubShards = DefaultSubShards
	}
	if c.RowShards == 0 {
		c.RowShards = DefaultRowShards
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.RightCacheBytes == 0 {
		c.RightCacheBytes = DefaultRightCacheBytes
	}
	return c
}

// Validate reports whether c, with defaults applied, is usable.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	switch {
	case c.Prefix == "":
		errs = append(errs, errors.New("redis key prefix is empty; set a prefix such as fkmat:<slot>:<join>"))
	case strings.ContainsAny(c.Prefix, `*?[]\{}`):
		errs = append(errs, fmt.Errorf("redis key prefix %q contains one of *?[]\\{}; use letters, digits, ':', '_' or '-'", c.Prefix))
	}
	if c.SubShards < 1 || c.SubShards > maxShards {
		errs = append(errs, fmt.Errorf("sub shards %d out of range 1..%d", c.SubShards, maxShards))
	}
	if c.RowShards < 1 || c.RowShards > maxShards {
		errs = append(errs, fmt.Errorf("row shards %d out of range 1..%d", c.RowShards, maxShards))
	}
	if c.PageSize < 1 {
		errs = append(errs, fmt.Errorf("page size %d must be positive", c.PageSize))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid redis store config: %w", err)
	}
	return nil
}

// layoutVersion names the key layout and row encoding; bump it when either
// changes incompatibly.
const layoutVersion = 2

// layout describes the persistent layout c implies. It is stored in the meta
// hash; a store whose layout differs must be re-initialised.
func (c Config) layout() string {
	return fmt.Sprintf("v%d/sub_shards=%d/row_shards=%d", layoutVersion, c.SubShards, c.RowShards)
}
