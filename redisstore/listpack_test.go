package redisstore

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
)

// TestCRC64Jones: Redis's check value (crc64.c).
func TestCRC64Jones(t *testing.T) {
	t.Parallel()
	if got := crc64Jones([]byte("123456789")); got != 0xe9c6d914c4b8d9ca {
		t.Fatalf("crc64(123456789) = %x", got)
	}
	// The 8-byte path and the byte path agree.
	p := []byte(strings.Repeat("fkmat listpack payload ", 50))
	var crc uint64
	for _, c := range p {
		crc = crc64Tables[0][byte(crc)^c] ^ crc>>8
	}
	if got := crc64Jones(p); got != crc {
		t.Fatalf("crc64 by 8 bytes %x, by byte %x", got, crc)
	}
}

// TestDumpPayload: the payload built for a hash and a sorted set is the one
// DUMP gives for the same key written with HSET or ZADD (every integer and
// string encoding, every backlen length), and RESTORE loads it back equal.
func TestDumpPayload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A server of its own: the listpack limits are raised so that every
	// element fits, and DUMP must not compress.
	local := testenv.StartLocalRedis(t, "--hash-max-listpack-entries", "1000", "--hash-max-listpack-value", "100000",
		"--zset-max-listpack-entries", "1000", "--zset-max-listpack-value", "100000", "--rdbcompression", "no")
	rdb := local.Client()
	defer func() { _ = rdb.Close() }()
	rng := rand.New(rand.NewPCG(7, 7))
	ints := []int64{0, 1, 127, 128, -1, -4096, 4095, -4097, 4096, 32767, -32768, 32768, -32769,
		8388607, -8388608, 8388608, 2147483647, -2147483648, 2147483648, math.MaxInt64, math.MinInt64}
	elems := []string{"", "-", "-0", "007", "+1", "1.5", "9223372036854775808", "\x00\x01binary", "héllo",
		strings.Repeat("x", 63), strings.Repeat("y", 64), strings.Repeat("z", 127), strings.Repeat("w", 4095),
		strings.Repeat("v", 4096), strings.Repeat("u", 20000)}
	for _, v := range ints {
		elems = append(elems, strconv.FormatInt(v, 10))
	}
	for i := range 40 {
		elems = append(elems, strconv.Itoa(rng.IntN(1<<20)-1<<19)+"k"+strconv.Itoa(i))
	}
	// Each element as a field and as a value, in one hash; every element as
	// a member of one sorted set (score 0, in member order as Redis keeps it).
	key := "h"
	var lp listpack
	lp.reset()
	var args []any
	for i, e := range elems {
		v := elems[(i+7)%len(elems)]
		f := e + "#" + strconv.Itoa(i) // distinct fields
		if i%3 == 0 {
			f = e
		}
		args = append(args, f, v)
		lp.add(f)
		lp.add(v)
	}
	if err := rdb.HSet(ctx, key, args...).Err(); err != nil {
		t.Fatal(err)
	}
	checkDump(t, rdb, key, appendDumpPayload(nil, rdbTypeHashListpack, lp.bytes(), rdbVersion), "hash")

	zkey := "z"
	members := slices.Clone(elems)
	slices.Sort(members)
	members = slices.Compact(members)
	lp.reset()
	zs := make([]redis.Z, len(members))
	for i, m := range members {
		zs[i] = redis.Z{Member: m}
		lp.add(m)
		lp.add("0")
	}
	if err := rdb.ZAdd(ctx, zkey, zs...).Err(); err != nil {
		t.Fatal(err)
	}
	checkDump(t, rdb, zkey, appendDumpPayload(nil, rdbTypeZsetListpack, lp.bytes(), rdbVersion), "zset")
}

// checkDump compares payload with DUMP of key (but for the RDB version
// and checksum, which are the server's), and checks that RESTORE of
// payload gives the same key.
func checkDump(t *testing.T, rdb *redis.Client, key string, payload []byte, what string) {
	t.Helper()
	ctx := context.Background()
	enc, err := rdb.ObjectEncoding(ctx, key).Result()
	if err != nil || enc != "listpack" {
		t.Fatalf("%s: encoding %q, %v", what, enc, err)
	}
	dump, err := rdb.Dump(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal([]byte(dump[:len(dump)-10]), payload[:len(payload)-10]) {
		n := 0
		for n < min(len(dump), len(payload)) && dump[n] == payload[n] {
			n++
		}
		t.Fatalf("%s: payload differs from DUMP at byte %d of %d / %d", what, n, len(payload), len(dump))
	}
	copyKey := key + ":restored"
	if err := rdb.RestoreReplace(ctx, copyKey, 0, string(payload)).Err(); err != nil {
		t.Fatalf("%s: RESTORE: %v", what, err)
	}
	again, err := rdb.Dump(ctx, copyKey).Result()
	if err != nil || again != dump {
		t.Fatalf("%s: DUMP of the restored key differs (%v)", what, err)
	}
}
