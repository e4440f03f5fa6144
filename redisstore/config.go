package redisstore

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults of Config, chosen by BenchmarkLayout (see the package
// documentation for the figures).
const (
	// DefaultSubShards keeps subscription sets in the compact listpack
	// encoding (at most 128 members each) up to some 60M subscriptions; at
	// 3M it costs 20.3 B per subscription, against 17.1 B for the best count
	// (65536) and 110.6 B for too few sets (16384).
	DefaultSubShards = 1 << 20
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
	// RowShards, when positive, is the number of hashes the left rows, and
	// separately the right rows, are spread over by a hash of their encoded
	// key. Zero (the default) sizes each side at Init from its expected row
	// count (see Size and bucketsFor): hashes stay compact up to 512 fields
	// of at most 64 bytes each.
	RowShards int
	// RightCacheBytes bounds the in-process cache of right rows (about
	// this many bytes of rows and bookkeeping). Zero means
	// DefaultRightCacheBytes; negative disables the cache. Not part of the
	// persistent layout.
	RightCacheBytes int
	// Shards is the number of shards of a state on a Redis Cluster (see
	// cluster.go): each is one hash slot, written atomically. Zero means
	// DefaultShards. Ignored on one server. Part of the persistent layout.
	Shards int
	// PageSize is the largest number of members, fields or keys sent in one
	// command: Commit splits larger sets into several commands inside its one
	// MULTI, and Sweep scans and unlinks this many keys per step. Default
	// DefaultPageSize.
	PageSize int
	// WaitReplicas, when positive, makes every write that advances the
	// checkpoint (Commit, FinishPartial) wait, with WAIT, until this many
	// replicas of each primary it wrote to have it, or WaitTimeout passed:
	// a primary that fails over then loses no acknowledged write unless
	// the wait timed out (Store.WaitShort counts those). Zero: no waiting.
	// Not part of the persistent layout.
	WaitReplicas int
	// WaitTimeout bounds each WAIT. Default DefaultWaitTimeout.
	WaitTimeout time.Duration
}

// DefaultWaitTimeout bounds a WAIT for replicas (Config.WaitReplicas).
const DefaultWaitTimeout = time.Second

// maxShards bounds SubShards and RowShards: more would only add keys.
const maxShards = 1 << 26

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.SubShards == 0 {
		c.SubShards = DefaultSubShards
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.RightCacheBytes == 0 {
		c.RightCacheBytes = DefaultRightCacheBytes
	}
	if c.Shards == 0 {
		c.Shards = DefaultShards
	}
	if c.WaitTimeout == 0 {
		c.WaitTimeout = DefaultWaitTimeout
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
	if c.WaitReplicas < 0 || c.WaitTimeout < 0 {
		errs = append(errs, fmt.Errorf("wait for %d replicas within %s: use 0 or more replicas and a positive timeout", c.WaitReplicas, c.WaitTimeout))
	}
	if c.RowShards < 0 || c.RowShards > maxShards {
		errs = append(errs, fmt.Errorf("row shards %d out of range 0..%d (0 sizes them at Init)", c.RowShards, maxShards))
	}
	if c.Shards < 1 || c.Shards > clusterSlots {
		errs = append(errs, fmt.Errorf("cluster shards %d out of range 1..%d", c.Shards, clusterSlots))
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
// changes incompatibly. Version 2 is the lean row encoding (codec.go) and
// per-side row buckets sized at Init.
const layoutVersion = 2

// Shape is the number of subscription sets and of left and right row
// buckets of a state: every key of a row or a subscription depends on it.
// Init chooses it and records it in the meta hash's layout field, from
// which every later reader takes it.
type Shape struct {
	SubShards, LeftBuckets, RightBuckets int
	// Shards is the number of shards of a state on a Redis Cluster, 0 on
	// one server.
	Shards int
	// Fans spread the subscriptions to one foreign key over several sets
	// (lanes), by the first byte of the foreign key (a tree's entry):
	// the subscriptions to a key with thousands of dependents then stay in
	// sets small enough for the listpack encoding. A prefix absent has
	// one lane.
	Fans Fans
}

// Fans are the fans of a shape, by foreign-key prefix byte, in prefix
// order; the unused ones have no lanes. An array keeps Shape comparable.
type Fans [maxFans]Fan

// Fan is the number of lanes of the subscriptions to the foreign keys
// starting with Prefix.
type Fan struct {
	Prefix byte
	Lanes  uint16
}

// maxFans bounds the prefixes with a fan in one state: a state holds the
// subscriptions of the entries its table references.
const maxFans = 16

// lanes returns the lanes of prefix b (0 when it has no fan).
func (f *Fans) lanes(b byte) int {
	for _, x := range f {
		if x.Lanes > 1 && x.Prefix == b {
			return int(x.Lanes)
		}
	}
	return 0
}

// MaxFan bounds a fan: a read of one foreign key reads every lane.
const MaxFan = 256

// fan returns the lanes of the subscriptions to fk.
func (sh Shape) fan(fk string) int {
	if len(fk) == 0 {
		return 1
	}
	if n := sh.Fans.lanes(fk[0]); n > 1 {
		return n
	}
	return 1
}

// FanFor returns the lanes that keep about subsPerLane subscriptions in
// each set of a foreign key with perKey dependents on average: a power of
// two, 1..MaxFan.
func FanFor(perKey float64) int {
	n := 1
	for n < MaxFan && perKey/float64(n) > subsPerLane {
		n <<= 1
	}
	return n
}

// subsPerLane is the subscriptions per set a fan aims at: half the 128
// members of the listpack encoding, room for hot keys to double.
const subsPerLane = 64

// Size is what Init (and Outgrown) sizes the row buckets for: the expected
// rows of the left and the right table, 0 when empty or unknown; and the
// fans of the subscriptions (Shape.Fans, FanFor), none for one lane each.
type Size struct {
	LeftRows, RightRows int64
	Fans                map[byte]int
}

// Bucket sizing: about rowsPerBucket rows per hash at the expected size
// leaves room for the table to grow 8 times before a bucket passes 512
// fields and leaves the listpack encoding, which costs 2-3 times the memory
// (see the package documentation). A state whose tables grow is moved to
// more buckets by Resize (see Outgrown) before that.
const (
	// BucketFields is the most fields a row bucket holds in Redis's compact
	// listpack encoding (hash-max-listpack-entries, 512 by default).
	BucketFields    = 512
	rowsPerBucket   = 64
	minSizedBuckets = 1 << 10
	maxSizedBuckets = 1 << 22
)

// bucketsFor returns the row buckets of a side with rows expected rows: a
// power of two with at most rowsPerBucket rows each, within
// minSizedBuckets..maxSizedBuckets. An empty table (or one of unknown
// size) starts at minSizedBuckets and grows with Resize.
func bucketsFor(rows int64) int {
	n := minSizedBuckets
	for n < maxSizedBuckets && int64(n)*rowsPerBucket < rows {
		n <<= 1
	}
	return n
}

// shape returns the shape Init gives a state of size sz: c's counts where
// set, sized ones otherwise.
func (c Config) shape(sz Size, shards int) Shape {
	sh := Shape{SubShards: c.SubShards, LeftBuckets: c.RowShards, RightBuckets: c.RowShards, Shards: shards}
	if c.RowShards == 0 {
		sh.LeftBuckets, sh.RightBuckets = bucketsFor(sz.LeftRows), bucketsFor(sz.RightRows)
	}
	i := 0
	for _, b := range slices.Sorted(maps.Keys(sz.Fans)) {
		if n := sz.Fans[b]; n > 1 && i < maxFans {
			sh.Fans[i] = Fan{Prefix: b, Lanes: uint16(min(n, MaxFan))}
			i++
		}
	}
	return sh
}

// layout returns the layout string of a state of shape sh, as stored in
// the meta hash.
func (sh Shape) layout() string {
	l := fmt.Sprintf("v%d/sub_shards=%d/left_buckets=%d/right_buckets=%d", layoutVersion, sh.SubShards, sh.LeftBuckets, sh.RightBuckets)
	var fans []string
	for _, f := range sh.Fans {
		if f.Lanes > 1 {
			fans = append(fans, fmt.Sprintf("%d:%d", f.Prefix, f.Lanes))
		}
	}
	if len(fans) > 0 {
		l += "/fans=" + strings.Join(fans, ",")
	}
	if sh.Shards > 0 {
		l += fmt.Sprintf("/cluster_shards=%d", sh.Shards)
	}
	return l
}

// parseLayout returns the shape of a layout string written by this
// version; any other string (an older version, garbage) is an error.
func parseLayout(s string) (Shape, error) {
	var sh Shape
	var v int
	base, cluster, _ := strings.Cut(s, "/cluster_shards=")
	base, fans, _ := strings.Cut(base, "/fans=")
	n, err := fmt.Sscanf(base, "v%d/sub_shards=%d/left_buckets=%d/right_buckets=%d", &v, &sh.SubShards, &sh.LeftBuckets, &sh.RightBuckets)
	if err == nil && fans != "" {
		for i, f := range strings.Split(fans, ",") {
			var b, lanes int
			if _, err = fmt.Sscanf(f, "%d:%d", &b, &lanes); err != nil || i >= maxFans || b < 0 || b > 255 || lanes < 2 || lanes > MaxFan {
				err = errors.New("fan out of range")
				break
			}
			sh.Fans[i] = Fan{Prefix: byte(b), Lanes: uint16(lanes)}
		}
	}
	if err == nil && cluster != "" {
		if sh.Shards, err = strconv.Atoi(cluster); err == nil && (sh.Shards < 1 || sh.Shards > clusterSlots) {
			err = errors.New("cluster shards out of range")
		}
	}
	switch {
	case err != nil || n != 4 || v != layoutVersion:
		return Shape{}, fmt.Errorf("layout %q is not version %d", s, layoutVersion)
	case sh.layout() != s:
		return Shape{}, fmt.Errorf("layout %q is malformed", s)
	}
	for _, c := range []int{sh.SubShards, sh.LeftBuckets, sh.RightBuckets} {
		if c < 1 || c > maxShards {
			return Shape{}, fmt.Errorf("layout %q has a count out of range 1..%d", s, maxShards)
		}
	}
	return sh, nil
}

// accepts checks that a state of layout l can be used with c by a store
// with shards cluster shards (0: one server): it is of this version, and has
// c's counts where c sets them.
func (c Config) accepts(l string, shards int) error {
	sh, err := parseLayout(l)
	if err != nil {
		return err
	}
	switch {
	case sh.Shards != shards && shards == 0:
		return fmt.Errorf("layout %q is of a state on a Redis Cluster; this is one server", l)
	case sh.Shards != shards && sh.Shards == 0:
		return fmt.Errorf("layout %q is of a state on one Redis server; this is a Redis Cluster", l)
	case sh.Shards != shards:
		return fmt.Errorf("layout %q has %d cluster shards, not the configured %d", l, sh.Shards, shards)
	}
	if sh.SubShards != c.SubShards || (c.RowShards != 0 && (sh.LeftBuckets != c.RowShards || sh.RightBuckets != c.RowShards)) {
		return fmt.Errorf("layout %q has other counts than the configured sub_shards=%d, row_shards=%d", l, c.SubShards, c.RowShards)
	}
	return nil
}
