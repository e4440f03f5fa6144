package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

// The layout benchmark's reference workload: 3M subscriptions, 15
// per foreign key, 200k foreign keys, bigint keys; 3M left rows.
const (
	layoutFKs   = 200_000
	layoutPerFK = 15
	layoutSubs  = layoutFKs * layoutPerFK
	// layoutBatch is the number of subscriptions or rows per Commit.
	layoutBatch = 50_000
)

// benchFK assigns each of the layoutSubs primary keys 1..layoutSubs to one of
// the foreign keys 1..layoutFKs, exactly layoutPerFK each, scattered (7919 is
// prime to 200000).
func benchFK(pk int64) int64 { return (pk*7919)%layoutFKs + 1 }

// benchInt is the join encoding of a bigint.
func benchInt(n int64) join.Key {
	k, err := join.EncodeKey([]join.Family{join.FamilyInt}, texts(strconv.FormatInt(n, 10)))
	if err != nil {
		panic(err)
	}
	return k
}

// BenchmarkLayout loads the reference workload into Redis in several layouts
// and reports per layout the memory per subscription or row (INFO memory
// used_memory delta / count), the latency of one lookup from this client
// (ns/op) and its server-side cost (INFO commandstats). It takes a few
// minutes and ~1.5 GB of Redis memory:
//
//	go test -run X -bench Layout -benchtime 20000x ./redisstore/
func BenchmarkLayout(b *testing.B) {
	if testing.Short() {
		b.Skip("loads 3M subscriptions into Redis")
	}
	tc := testenv.New(b)
	rdb := tc.Redis
	ctx := context.Background()

	for _, shards := range []int{16384, 65536, 262144, 1 << 20} {
		b.Run(fmt.Sprintf("subs=sharded/shards=%d", shards), func(b *testing.B) {
			benchStoreSubs(ctx, b, rdb, Config{Prefix: tc.RedisPrefix + ":s" + strconv.Itoa(shards), SubShards: shards})
		})
	}
	b.Run("subs=per-fk", func(b *testing.B) {
		benchRawSubs(ctx, b, rdb, perFKLayout{prefix: tc.RedisPrefix + ":f"})
	})
	b.Run("subs=one-set", func(b *testing.B) {
		benchRawSubs(ctx, b, rdb, oneSetLayout{key: tc.RedisPrefix + ":big"})
	})

	for _, row := range []struct {
		name string
		vals func(pk int64) []join.Value
	}{
		// orders(id, customer_id, amount, status): a 42-byte row.
		{"narrow", func(pk int64) []join.Value {
			return texts(strconv.FormatInt(pk%100000, 10)+".45", "shipped")
		}},
		// ... with created_at and a 64-byte note: a 135-byte row.
		{"wide", func(pk int64) []join.Value {
			return texts(strconv.FormatInt(pk%100000, 10)+".45", "shipped", "2024-05-01 12:34:56.789+00",
				strings.Repeat(string(rune('a'+pk%26)), 64))
		}},
	} {
		state := func(pk int64) join.LeftState {
			return join.NewLeftState(texts(strconv.FormatInt(pk, 10)), texts(strconv.FormatInt(benchFK(pk), 10)), row.vals(pk))
		}
		for _, shards := range []int{16384, 262144} {
			b.Run(fmt.Sprintf("left=hash/row=%s/shards=%d", row.name, shards), func(b *testing.B) {
				benchStoreRows(ctx, b, rdb, Config{Prefix: tc.RedisPrefix + ":l" + strconv.Itoa(shards), RowShards: shards}, state)
			})
		}
		b.Run(fmt.Sprintf("left=string/row=%s", row.name), func(b *testing.B) {
			benchStringRows(ctx, b, rdb, tc.RedisPrefix+":sl:", state)
		})
	}
	b.Run("left=hash/row=wide/shards=16384/hash-max-listpack-value=256", func(b *testing.B) {
		old, err := rdb.ConfigGet(ctx, "hash-max-listpack-value").Result()
		if err != nil {
			b.Skipf("config get: %v", err)
		}
		if err := rdb.ConfigSet(ctx, "hash-max-listpack-value", "256").Err(); err != nil {
			b.Skipf("config set: %v", err)
		}
		b.Cleanup(func() { _ = rdb.ConfigSet(ctx, "hash-max-listpack-value", old["hash-max-listpack-value"]).Err() })
		benchStoreRows(ctx, b, rdb, Config{Prefix: tc.RedisPrefix + ":lw", RowShards: 16384}, func(pk int64) join.LeftState {
			return join.NewLeftState(texts(strconv.FormatInt(pk, 10)), texts(strconv.FormatInt(benchFK(pk), 10)),
				texts("123.45", "shipped", "2024-05-01 12:34:56.789+00", strings.Repeat(string(rune('a'+pk%26)), 64)))
		})
	})
}

// openBench opens and initialises a store for a benchmark and removes its
// keys (with Init + Sweep, which it times) when the benchmark ends.
func openBench(ctx context.Context, b *testing.B, rdb *redis.Client, cfg Config) *Store {
	s, err := Open(ctx, rdb, cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Init(ctx, NewEpoch(), "bench", Size{}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		start := time.Now()
		if err := s.Init(ctx, NewEpoch(), "bench", Size{}); err != nil {
			b.Error(err)
		}
		n, err := s.Sweep(ctx)
		if err != nil {
			b.Error(err)
		}
		b.Logf("sweep: %d keys in %v", n, time.Since(start).Round(time.Millisecond))
		_ = rdb.Del(ctx, s.keys.meta()).Err()
	})
	return s
}

func benchStoreSubs(ctx context.Context, b *testing.B, rdb *redis.Client, cfg Config) {
	s := openBench(ctx, b, rdb, cfg)
	before := usedMemory(ctx, b, rdb)
	start := time.Now()
	var m join.Mutations
	lsn := wal.LSN(1)
	for pk := int64(1); pk <= layoutSubs; pk++ {
		m.AddSubs = append(m.AddSubs, join.Subscription{FK: benchInt(benchFK(pk)), PK: benchInt(pk)})
		if len(m.AddSubs) == layoutBatch || pk == layoutSubs {
			lsn++
			if err := s.Commit(ctx, m, lsn); err != nil {
				b.Fatal(err)
			}
			m.AddSubs = m.AddSubs[:0]
		}
	}
	load := time.Since(start)
	after := usedMemory(ctx, b, rdb)

	resetStats(ctx, rdb)
	rng := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		fk := rng.Int64N(layoutFKs) + 1
		got, err := s.Dependents(ctx, benchInt(fk), "", 1000)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != layoutPerFK {
			b.Fatalf("fk %d: %d dependents, want %d", fk, len(got), layoutPerFK)
		}
	}
	b.StopTimer()
	reportSubs(ctx, b, rdb, after-before, load, sampleEncodings(ctx, rdb, s.keys.name(kindSubs, s.meta.LeftGen, 0), cfg.SubShards))
}

func reportSubs(ctx context.Context, b *testing.B, rdb *redis.Client, bytes int64, load time.Duration, enc string) {
	perSub := float64(bytes) / layoutSubs
	b.ReportMetric(perSub, "B/sub")
	b.ReportMetric(serverUsec(ctx, rdb, "zrange"), "server-µs/lookup")
	b.Logf("load %v (%.0f subs/s), %.1f B/sub, %s", load.Round(time.Millisecond),
		layoutSubs/load.Seconds(), perSub, enc)
}

func benchStoreRows(ctx context.Context, b *testing.B, rdb *redis.Client, cfg Config, state func(int64) join.LeftState) {
	s := openBench(ctx, b, rdb, cfg)
	before := usedMemory(ctx, b, rdb)
	start := time.Now()
	m := join.Mutations{PutLeft: map[join.Key]join.LeftState{}}
	lsn := wal.LSN(1)
	blob := 0
	for pk := int64(1); pk <= layoutSubs; pk++ {
		st := state(pk)
		if pk == 1 {
			blob = len(appendLeft(nil, string(benchInt(pk)), st))
		}
		m.PutLeft[benchInt(pk)] = st
		if len(m.PutLeft) == layoutBatch || pk == layoutSubs {
			lsn++
			if err := s.Commit(ctx, m, lsn); err != nil {
				b.Fatal(err)
			}
			clear(m.PutLeft)
		}
	}
	load := time.Since(start)
	after := usedMemory(ctx, b, rdb)

	resetStats(ctx, rdb)
	rng := rand.New(rand.NewPCG(3, 4))
	for b.Loop() {
		k := benchInt(rng.Int64N(layoutSubs) + 1)
		got, err := s.GetLeft(ctx, []join.Key{k})
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != 1 {
			b.Fatalf("key %x: not found", string(k))
		}
	}
	b.StopTimer()
	server := serverUsec(ctx, rdb, "hget")

	// A batch read of 1000 random rows: one pipelined round trip.
	keys := make([]join.Key, 1000)
	const rounds = 50
	bstart := time.Now()
	for range rounds {
		for i := range keys {
			keys[i] = benchInt(rng.Int64N(layoutSubs) + 1)
		}
		if _, err := s.GetLeft(ctx, keys); err != nil {
			b.Fatal(err)
		}
	}
	perRowBatch := float64(time.Since(bstart).Microseconds()) / (rounds * 1000)

	perRow := float64(after-before) / layoutSubs
	b.ReportMetric(perRow, "B/row")
	b.ReportMetric(server, "server-µs/get")
	b.ReportMetric(perRowBatch, "µs/row-in-1000-batch")
	b.Logf("row %d B, load %v (%.0f rows/s), %.1f B/row, %s", blob, load.Round(time.Millisecond),
		layoutSubs/load.Seconds(), perRow, sampleEncodings(ctx, rdb, s.keys.name(kindLeft, s.meta.LeftGen, 0), cfg.RowShards))
}

// benchStringRows stores the same rows as one string key per row.
func benchStringRows(ctx context.Context, b *testing.B, rdb *redis.Client, prefix string, state func(int64) join.LeftState) {
	before := usedMemory(ctx, b, rdb)
	start := time.Now()
	p := rdb.Pipeline()
	for pk := int64(1); pk <= layoutSubs; pk++ {
		p.Set(ctx, prefix+string(benchInt(pk)), appendLeft(nil, string(benchInt(pk)), state(pk)), 0)
		if p.Len() >= 5000 {
			execPipe(ctx, b, p)
		}
	}
	execPipe(ctx, b, p)
	load := time.Since(start)
	after := usedMemory(ctx, b, rdb)
	b.Cleanup(func() {
		keys := make([]string, layoutSubs)
		for i := range keys {
			keys[i] = prefix + string(benchInt(int64(i+1)))
		}
		unlinkAll(ctx, b, rdb, keys)
	})

	resetStats(ctx, rdb)
	rng := rand.New(rand.NewPCG(3, 4))
	for b.Loop() {
		if err := rdb.Get(ctx, prefix+string(benchInt(rng.Int64N(layoutSubs)+1))).Err(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	perRow := float64(after-before) / layoutSubs
	b.ReportMetric(perRow, "B/row")
	b.ReportMetric(serverUsec(ctx, rdb, "get"), "server-µs/get")
	b.Logf("load %v (%.0f rows/s), %.1f B/row", load.Round(time.Millisecond), layoutSubs/load.Seconds(), perRow)
}

// rawLayout is a subscription layout the store does not use, for comparison.
type rawLayout interface {
	add(ctx context.Context, p redis.Pipeliner, fk int64, pks []int64)
	lookup(ctx context.Context, c redis.Cmdable, fk int64) ([]string, error)
	keys() []string
}

// perFKLayout is one sorted set per foreign key; members are the PKs.
type perFKLayout struct{ prefix string }

func (l perFKLayout) key(fk int64) string { return l.prefix + ":{" + string(benchInt(fk)) + "}" }

func (l perFKLayout) add(ctx context.Context, p redis.Pipeliner, fk int64, pks []int64) {
	ms := make([]redis.Z, len(pks))
	for i, pk := range pks {
		ms[i] = redis.Z{Member: string(benchInt(pk))}
	}
	p.ZAdd(ctx, l.key(fk), ms...)
}

func (l perFKLayout) lookup(ctx context.Context, c redis.Cmdable, fk int64) ([]string, error) {
	return c.ZRange(ctx, l.key(fk), 0, 999).Result()
}

func (l perFKLayout) keys() []string {
	ks := make([]string, layoutFKs)
	for i := range ks {
		ks[i] = l.key(int64(i + 1))
	}
	return ks
}

// oneSetLayout is one sorted set for all subscriptions; members FK ++ PK.
type oneSetLayout struct{ key string }

func (l oneSetLayout) add(ctx context.Context, p redis.Pipeliner, fk int64, pks []int64) {
	f := string(benchInt(fk))
	ms := make([]redis.Z, len(pks))
	for i, pk := range pks {
		ms[i] = redis.Z{Member: f + string(benchInt(pk))}
	}
	p.ZAdd(ctx, l.key, ms...)
}

func (l oneSetLayout) lookup(ctx context.Context, c redis.Cmdable, fk int64) ([]string, error) {
	lo, hi := depRange(benchInt(fk), "")
	return c.ZRangeArgs(ctx, redis.ZRangeArgs{Key: l.key, Start: lo, Stop: hi, ByLex: true, Count: 1000}).Result()
}

func (l oneSetLayout) keys() []string { return []string{l.key} }

func benchRawSubs(ctx context.Context, b *testing.B, rdb *redis.Client, l rawLayout) {
	before := usedMemory(ctx, b, rdb)
	start := time.Now()
	byFK := make([][]int64, layoutFKs+1)
	for pk := int64(1); pk <= layoutSubs; pk++ {
		fk := benchFK(pk)
		byFK[fk] = append(byFK[fk], pk)
	}
	p := rdb.Pipeline()
	for fk := int64(1); fk <= layoutFKs; fk++ {
		l.add(ctx, p, fk, byFK[fk])
		if p.Len() >= 1000 {
			execPipe(ctx, b, p)
		}
	}
	execPipe(ctx, b, p)
	load := time.Since(start)
	after := usedMemory(ctx, b, rdb)
	b.Cleanup(func() { unlinkAll(ctx, b, rdb, l.keys()) })

	resetStats(ctx, rdb)
	rng := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		fk := rng.Int64N(layoutFKs) + 1
		got, err := l.lookup(ctx, rdb, fk)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) != layoutPerFK {
			b.Fatalf("fk %d: %d dependents, want %d", fk, len(got), layoutPerFK)
		}
	}
	b.StopTimer()
	reportSubs(ctx, b, rdb, after-before, load, sampleEncodings(ctx, rdb, l.keys()[0], 1))
}

func execPipe(ctx context.Context, b *testing.B, p redis.Pipeliner) {
	if _, err := p.Exec(ctx); err != nil {
		b.Fatalf("exec pipeline: %v", err)
	}
}

func unlinkAll(ctx context.Context, b *testing.B, rdb *redis.Client, keys []string) {
	p := rdb.Pipeline()
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		p.Unlink(ctx, keys[:n]...)
		keys = keys[n:]
		if p.Len() >= 50 {
			execPipe(ctx, b, p)
		}
	}
	execPipe(ctx, b, p)
}

// usedMemory returns INFO memory used_memory once lazy frees are done.
func usedMemory(ctx context.Context, b *testing.B, rdb *redis.Client) int64 {
	for {
		s, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			b.Fatalf("info memory: %v", err)
		}
		if v, _ := infoField(s, "lazyfree_pending_objects"); v != "" && v != "0" {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		v, ok := infoField(s, "used_memory")
		if !ok {
			b.Fatalf("info memory: no used_memory")
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			b.Fatalf("parse used_memory: %v", err)
		}
		return n
	}
}

func infoField(info, name string) (string, bool) {
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v, true
		}
	}
	return "", false
}

func resetStats(ctx context.Context, rdb *redis.Client) { _ = rdb.ConfigResetStat(ctx).Err() }

// serverUsec returns the server-side µs per call of cmd since the last
// CONFIG RESETSTAT, or -1 if Redis does not say.
func serverUsec(ctx context.Context, rdb *redis.Client, cmd string) float64 {
	s, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return -1
	}
	v, ok := infoField(s, "cmdstat_"+cmd)
	if !ok {
		return -1
	}
	for f := range strings.SplitSeq(v, ",") {
		if u, ok := strings.CutPrefix(f, "usec_per_call="); ok {
			if x, err := strconv.ParseFloat(u, 64); err == nil {
				return x
			}
		}
	}
	return -1
}

// sampleEncodings reports the encodings of up to 200 of the keys key0 names
// when its shard tag {0} is replaced by {0}..{n-1}.
func sampleEncodings(ctx context.Context, rdb *redis.Client, key0 string, n int) string {
	base, ok := strings.CutSuffix(key0, "{0}")
	if !ok {
		base, n = "", 1
	}
	counts := map[string]int{}
	step := max(1, n/200)
	for i := 0; i < n; i += step {
		k := key0
		if base != "" {
			k = base + "{" + strconv.Itoa(i) + "}"
		}
		enc, err := rdb.ObjectEncoding(ctx, k).Result()
		if err != nil {
			enc = "absent"
		}
		counts[enc]++
	}
	return fmt.Sprintf("encodings %v", counts)
}
