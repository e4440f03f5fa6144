package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Version is a Redis server's version.
type Version struct{ Major, Minor, Patch int }

// The versions fkmat tells apart: MinVersion is the oldest it supports;
// from RestoreVersion (RDB 10) the backfill writes each key whole with
// RESTORE of a listpack, before it with HSET and ZADD.
var (
	MinVersion     = Version{6, 2, 0}
	RestoreVersion = Version{7, 0, 0}
)

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Before reports whether v is older than w.
func (v Version) Before(w Version) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	return v.Patch < w.Patch
}

// ParseVersion parses "7.0.15" (a missing part is 0).
func ParseVersion(s string) (Version, error) {
	var n [3]int
	for i, p := range strings.SplitN(s, ".", 3) {
		var err error
		if n[i], err = strconv.Atoi(p); err != nil {
			return Version{}, fmt.Errorf("redis version %q: %w", s, err)
		}
	}
	return Version{n[0], n[1], n[2]}, nil
}

// ErrVersionUnknown means the server did not say its version: it does not
// know HELLO, or answers it without one.
var ErrVersionUnknown = errors.New("the Redis server's version is unknown")

// ServerVersion returns the version of the Redis server, from HELLO (which
// the least-privilege ACL allows, unlike INFO); on a Redis Cluster the
// oldest of its nodes'.
func ServerVersion(ctx context.Context, rdb redis.UniversalClient) (Version, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return helloVersion(ctx, rdb)
	}
	var mu sync.Mutex
	var oldest *Version
	err := cc.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error {
		v, err := helloVersion(ctx, node)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if oldest == nil || v.Before(*oldest) {
			oldest = &v
		}
		return nil
	})
	if err != nil {
		return Version{}, err
	}
	if oldest == nil {
		return Version{}, ErrVersionUnknown
	}
	return *oldest, nil
}

// helloVersion asks one server.
func helloVersion(ctx context.Context, rdb interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}) (Version, error) {
	res, err := rdb.Do(ctx, "HELLO").Result()
	switch {
	case err != nil && strings.Contains(err.Error(), "unknown command"):
		// HELLO came with 6.0; no ACL refuses it (it needs no
		// authentication), but a renamed command is unknown too.
		return Version{}, fmt.Errorf("%w: the server does not know HELLO: it is older than 6.0, or HELLO was renamed", ErrVersionUnknown)
	case err != nil:
		return Version{}, fmt.Errorf("ask Redis its version (HELLO): %w", err)
	}
	var version any
	switch r := res.(type) {
	case map[any]any: // RESP3
		version = r["version"]
	case []any: // RESP2: field, value, …
		for i := 0; i+1 < len(r); i += 2 {
			if r[i] == "version" {
				version = r[i+1]
			}
		}
	}
	s, ok := version.(string)
	if !ok {
		return Version{}, ErrVersionUnknown
	}
	return ParseVersion(s)
}

// CheckVersion returns an error naming the fix when the server is older
// than MinVersion, or does not say its version.
func CheckVersion(ctx context.Context, rdb redis.UniversalClient) error {
	v, err := ServerVersion(ctx, rdb)
	if errors.Is(err, ErrVersionUnknown) {
		return fmt.Errorf("%w: %w; fkmat needs Redis %s or newer", ErrTooOld, err, MinVersion)
	}
	if err != nil {
		return err
	}
	if v.Before(MinVersion) {
		return fmt.Errorf("%w: Redis %s is older than %s, the oldest fkmat supports: upgrade Redis", ErrTooOld, v, MinVersion)
	}
	return nil
}

// ErrTooOld is CheckVersion's error.
var ErrTooOld = errors.New("redis is too old")
