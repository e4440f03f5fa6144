package redisstore

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

// BenchmarkClusterCommit commits the same stream of W1-like batches (new
// orders with a subscription each, a tenth of them updated, 5,000 changes per
// batch) to a state on one local redis-server and on a local 3-primary
// cluster (3 replicas, AOF on both), side by side: changes/s, and keys and
// memory per primary; and each again with Config.WaitReplicas 1 (WAIT for
// one replica after each write; the one server has a replica too). Store
// level: no Postgres, no target.
//
//	go test -run '^$' -bench BenchmarkClusterCommit -benchtime 1x ./redisstore
func BenchmarkClusterCommit(b *testing.B) {
	const batches, perBatch = 40, 5000
	ctx := context.Background()
	mk := func(batch int) join.Mutations {
		m := join.Mutations{PutLeft: map[join.Key]join.LeftState{}}
		for i := range perBatch {
			pk := int64(batch*perBatch + i)
			if i%10 == 9 && batch > 0 {
				pk = int64((batch-1)*perBatch + i) // an update of an earlier row
			} else {
				m.AddSubs = append(m.AddSubs, sub(b, pk%50_000, pk))
			}
			m.PutLeft[intKeyB(pk)] = leftRowB(pk)
		}
		return m
	}
	run := func(name string, rdb redis.UniversalClient, wait int, per func() string) {
		s, err := Open(ctx, rdb, Config{Prefix: "fkmat:bench:" + name, WaitReplicas: wait})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Init(ctx, NewEpoch(), "bench", Size{LeftRows: batches * perBatch, RightRows: 50_000}); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for i := range batches {
			if err := s.Commit(ctx, mk(i), wal.LSN(i+1)); err != nil {
				b.Fatal(err)
			}
		}
		el := time.Since(start)
		rate := float64(batches*perBatch) / el.Seconds()
		b.ReportMetric(rate, name+"_changes/s")
		if s.WaitShort() != 0 {
			b.Errorf("%s: %d writes not confirmed by %d replicas", name, s.WaitShort(), wait)
		}
		b.Logf("%s: %d changes in %v (%.0f changes/s); per primary: %s", name, batches*perBatch, el.Round(time.Millisecond), rate, per())
	}
	for range b.N {
		dir := b.TempDir()
		one := exec.Command("redis-server", "--port", "26390", "--bind", "127.0.0.1", "--dir", dir,
			"--appendonly", "yes", "--save", "", "--logfile", filepath.Join(dir, "log"))
		if err := one.Start(); err != nil {
			b.Fatal(err)
		}
		rdir := b.TempDir()
		replica := exec.Command("redis-server", "--port", "26391", "--bind", "127.0.0.1", "--dir", rdir,
			"--appendonly", "yes", "--save", "", "--replicaof", "127.0.0.1", "26390", "--logfile", filepath.Join(rdir, "log"))
		if err := replica.Start(); err != nil {
			b.Fatal(err)
		}
		single := redis.NewClient(&redis.Options{Addr: "127.0.0.1:26390"})
		for single.Ping(ctx).Err() != nil {
			time.Sleep(20 * time.Millisecond)
		}
		for !strings.Contains(single.Info(ctx, "replication").Val(), "connected_slaves:1") {
			time.Sleep(20 * time.Millisecond)
		}
		c := testenv.NewCluster(b)
		perPrimary := func() string {
			var parts []string
			_ = c.Client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				parts = append(parts, n.Options().Addr+" "+memInfo(ctx, n))
				return nil
			})
			return strings.Join(parts, "; ")
		}
		run("one_server", single, 0, func() string { return memInfo(ctx, single) })
		run("cluster_3", c.Client, 0, perPrimary)
		run("one_server_wait1", single, 1, func() string { return memInfo(ctx, single) })
		run("cluster_3_wait1", c.Client, 1, perPrimary)
		_ = single.Close()
		for _, p := range []*exec.Cmd{replica, one} {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}
}

func memInfo(ctx context.Context, c *redis.Client) string {
	info := c.Info(ctx, "memory", "keyspace").Val()
	mem, _ := infoField(info, "used_memory")
	keys := "0"
	if ks, ok := infoField(info, "db0"); ok {
		keys, _, _ = strings.Cut(strings.TrimPrefix(ks, "keys="), ",")
	}
	n, _ := strconv.ParseInt(mem, 10, 64)
	return keys + " keys, " + strconv.FormatInt(n>>20, 10) + " MiB"
}

func intKeyB(n int64) join.Key {
	k, _ := join.EncodeKey([]join.Family{join.FamilyInt}, []join.Value{join.TextValue(strconv.FormatInt(n, 10))})
	return k
}

func leftRowB(pk int64) join.LeftState {
	return leftRow(pk, pk%50_000, "note-"+strconv.FormatInt(pk, 10))
}
