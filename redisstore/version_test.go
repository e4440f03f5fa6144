package redisstore

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
)

func TestParseVersion(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Version
		ok   bool
	}{
		{"7.0.15", Version{7, 0, 15}, true},
		{"6.2", Version{6, 2, 0}, true},
		{"255.255.255", Version{255, 255, 255}, true},
		{"7.x", Version{}, false},
		{"", Version{}, false},
	} {
		got, err := ParseVersion(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
	if !(Version{6, 2, 14}).Before(RestoreVersion) || (Version{7, 0, 0}).Before(RestoreVersion) || !(Version{6, 0, 16}).Before(MinVersion) ||
		(Version{6, 2, 0}).Before(MinVersion) || (Version{10, 0, 0}).Before(Version{9, 9, 9}) {
		t.Error("Before orders versions wrongly")
	}
}

// TestServerVersion reads the version of a server and of a cluster from
// HELLO, and checks it against what INFO says.
func TestServerVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tc := testenv.New(t)
	info, err := tc.Redis.Info(ctx, "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	var want Version
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			if want, err = ParseVersion(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, rdb := range map[string]redis.UniversalClient{"server": tc.Redis, "cluster": testenv.NewCluster(t).Client} {
		got, err := ServerVersion(ctx, rdb)
		if err != nil || got != want {
			t.Errorf("%s: ServerVersion = %v, %v; want %v", name, got, err, want)
		}
		if err := CheckVersion(ctx, rdb); err != nil {
			t.Errorf("%s: CheckVersion: %v", name, err)
		}
	}
}

// claimVersion makes a real server say it is of another version (HELLO's
// reply), and counts the RESTOREs sent to it.
type claimVersion struct {
	version  string
	restores atomic.Int64
}

func (h *claimVersion) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *claimVersion) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if c, ok := cmd.(*redis.Cmd); ok && err == nil && strings.EqualFold(cmd.Name(), "hello") {
			switch r := c.Val().(type) {
			case map[any]any:
				r["version"] = h.version
			case []any:
				for i := 0; i+1 < len(r); i += 2 {
					if r[i] == "version" {
						r[i+1] = h.version
					}
				}
			}
		}
		return err
	}
}

func (h *claimVersion) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if strings.EqualFold(c.Name(), "restore") {
				h.restores.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestCheckVersion refuses a server older than 6.2, naming the fix, and
// one that does not say its version; it lets 6.2 and newer pass.
func TestCheckVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tc := testenv.New(t)
	for version, tooOld := range map[string]bool{"6.0.16": true, "5.0.7": true, "6.2.0": false, "6.2.14": false, "7.2.4": false} {
		rdb := redis.NewClient(&redis.Options{Addr: tc.Env.RedisAddr})
		rdb.AddHook(&claimVersion{version: version})
		err := CheckVersion(ctx, rdb)
		_ = rdb.Close()
		if errors.Is(err, ErrTooOld) != tooOld {
			t.Errorf("Redis %s: CheckVersion = %v, want too old: %v", version, err, tooOld)
		}
		if tooOld && !strings.Contains(err.Error(), "Redis "+version+" is older than 6.2.0") || tooOld && !strings.Contains(err.Error(), "upgrade Redis") {
			t.Errorf("Redis %s: %v", version, err)
		}
	}
	// A server that does not know HELLO (before 6.0; here renamed away).
	old := testenv.StartLocalRedis(t, "--rename-command", "HELLO", "")
	rdb := redis.NewClient(&redis.Options{Addr: old.Addr(), Protocol: 2})
	defer func() { _ = rdb.Close() }()
	if _, err := ServerVersion(ctx, rdb); !errors.Is(err, ErrVersionUnknown) {
		t.Errorf("no HELLO: ServerVersion = %v, want ErrVersionUnknown", err)
	}
	if err := CheckVersion(ctx, rdb); !errors.Is(err, ErrTooOld) || !strings.Contains(err.Error(), "older than 6.0") {
		t.Errorf("no HELLO: CheckVersion = %v, want ErrTooOld", err)
	}
}

// TestSpoolOnRedis62: on a server that says it is 6.2, the backfill sends
// no RESTORE at all and writes every key with HSET and ZADD.
func TestSpoolOnRedis62(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tc := testenv.New(t)
	hook := &claimVersion{version: "6.2.14"}
	rdb := redis.NewClient(&redis.Options{Addr: tc.Env.RedisAddr})
	rdb.AddHook(hook)
	defer func() { _ = rdb.Close() }()
	s, err := Open(ctx, rdb, Config{Prefix: tc.RedisPrefix, PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	testSpool(t, s, false, false)
	if n := hook.restores.Load(); n != 0 {
		t.Errorf("%d RESTOREs sent to Redis 6.2", n)
	}
}
