package integration

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/internal/testenv"
)

// clusterWorkload runs random statements of every change kind on the shop
// tables (inserts, customer renames fanning out, FK changes, NULL and
// dangling FKs, key changes, deletes, several changes of one row in one
// transaction) until stop is closed.
func clusterWorkload(t *testing.T, tc *testenv.Case, seed uint64, stop <-chan struct{}) (int, error) {
	r := rand.New(rand.NewPCG(seed, 15))
	ctx := context.Background()
	n := 0
	next := int64(seed) * 1_000_000
	for {
		select {
		case <-stop:
			return n, nil
		default:
		}
		o, c := 1+r.IntN(600), 1+r.IntN(70)
		var q string
		switch r.IntN(9) {
		case 0:
			next++
			q = fmt.Sprintf(`INSERT INTO orders VALUES (%d, %d, 1, 'i')`, next, c)
		case 1:
			q = fmt.Sprintf(`UPDATE customers SET name = name || 'x' WHERE id = %d`, c)
		case 2:
			q = fmt.Sprintf(`UPDATE orders SET customer_id = %d WHERE id = %d`, c, o)
		case 3:
			q = fmt.Sprintf(`UPDATE orders SET customer_id = NULL WHERE id = %d`, o)
		case 4:
			next++
			q = fmt.Sprintf(`UPDATE orders SET id = %d WHERE id = %d`, next, o)
		case 5:
			q = fmt.Sprintf(`DELETE FROM customers WHERE id = %d`, c)
		case 6:
			q = fmt.Sprintf(`INSERT INTO customers VALUES (%d, 'n', 'gold') ON CONFLICT (id) DO UPDATE SET tier = 'silver'`, c)
		case 7:
			q = fmt.Sprintf(`BEGIN; UPDATE orders SET amount = amount + 1 WHERE id = %d; UPDATE orders SET customer_id = %d WHERE id = %d; UPDATE customers SET tier = 't' WHERE id = %d; COMMIT`, o, c, o, c)
		case 8:
			q = fmt.Sprintf(`DELETE FROM orders WHERE id = %d`, o)
		}
		if _, err := tc.Pool.Exec(ctx, q); err != nil {
			return n, fmt.Errorf("%s: %w", q, err)
		}
		n++
		if n%50 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// TestDaemonOnCluster runs the daemon with its state on a 3+3 Redis Cluster
// (redis+cluster:// URL) under a random workload, through a slot migration,
// a primary failover and a flushed primary, and after each checks that the
// target equals the SQL join once caught up. The flushed node is lost state:
// the daemon rebuilds it by itself (or, with --on-lost-state refuse, stops
// naming fkmat backfill --force).
func TestDaemonOnCluster(t *testing.T) {
	cl := testenv.NewCluster(t)
	tc := testenv.New(t)
	sqlExec(t, tc, shop,
		`INSERT INTO customers SELECT g, 'c' || g, CASE WHEN g % 2 = 0 THEN 'gold' END FROM generate_series(1, 60) g`,
		`INSERT INTO orders SELECT g, CASE WHEN g % 10 = 0 THEN NULL ELSE g % 75 END, g * 1.5, 'n' FROM generate_series(1, 600) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	cfg.Redis = cl.URL()
	logs := &syncBuffer{}
	d := startDaemon(t, cfg, fkmat.Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	waitCaughtUp(t, tc, d)
	assertOracle(t, cfg)
	ctx := context.Background()

	during := func(what string, seed uint64, event func() error) {
		t.Helper()
		stop := make(chan struct{})
		var n int
		var werr error
		done := make(chan struct{})
		go func() { n, werr = clusterWorkload(t, tc, seed, stop); close(done) }()
		time.Sleep(500 * time.Millisecond)
		eerr := event()
		time.Sleep(500 * time.Millisecond)
		close(stop)
		<-done
		if eerr != nil {
			t.Fatalf("%s: %v", what, eerr)
		}
		if werr != nil {
			t.Fatalf("workload during %s: %v", what, werr)
		}
		waitCaughtUp(t, tc, d)
		assertOracle(t, cfg)
		t.Logf("%s: %d statements, target equal to the SQL join", what, n)
	}
	prims, err := cl.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	during("slot migration", 1, func() error { return cl.Reshard(ctx, prims[0].ID, prims[1].ID, 2000) })
	during("primary failover", 2, func() error { return cl.FailPrimary(ctx, prims[2].Addr) })
	prims, err = cl.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	during("flushed primary", 3, func() error { return cl.Flush(ctx, prims[0].Addr) })
	out := logs.String()
	if !strings.Contains(out, "lost writes") && !strings.Contains(out, "is lost") {
		t.Errorf("the flushed primary was not reported as lost state; log:\n%s", lastN(out, 3000))
	}
	if err := d.stop(t); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}

func lastN(s string, n int) string { return s[max(0, len(s)-n):] }

// TestDaemonWaitReplicasShort: with run --redis-wait-replicas 1 and every
// replica stopped, the daemon goes on (each write waits up to the WAIT
// timeout), warns that its writes are not confirmed, saying why, and counts
// them in fkmat_redis_wait_short_total; the target stays equal to the SQL
// join.
func TestDaemonWaitReplicasShort(t *testing.T) {
	cl := testenv.NewCluster(t)
	tc := testenv.New(t)
	sqlExec(t, tc, shop,
		`INSERT INTO customers SELECT g, 'c' || g, 'gold' FROM generate_series(1, 20) g`,
		`INSERT INTO orders SELECT g, g % 25, g, 'n' FROM generate_series(1, 200) g`)
	cfg := daemonConfig(t, tc, leftJoinYAML)
	cfg.Redis = cl.URL()
	logs := &syncBuffer{}
	bound := make(chan net.Addr, 1)
	d := startDaemon(t, cfg, fkmat.Options{RedisWaitReplicas: 1, SlotCheckInterval: 200 * time.Millisecond,
		MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { bound <- a },
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	m := boundScraper(t, bound)
	waitCaughtUp(t, tc, d)
	if n, _ := metricValue(m.body(), "fkmat_redis_wait_short_total"); n != 0 || strings.Contains(logs.String(), "not confirmed") {
		t.Fatalf("%v writes not confirmed with every replica up; log:\n%s", n, lastN(logs.String(), 3000))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prims, err := cl.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var paused []string
	defer func() {
		for _, r := range paused {
			_ = cl.Unpause(r)
		}
	}()
	for _, p := range prims {
		r, err := cl.ReplicaOf(ctx, p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Pause(r); err != nil {
			t.Fatal(err)
		}
		paused = append(paused, r)
	}
	sqlExec(t, tc, `UPDATE customers SET name = 'x' || name WHERE id < 10`, `INSERT INTO orders VALUES (1000, 3, 1, 'late')`)
	waitCaughtUp(t, tc, d)
	waitFor(t, 30*time.Second, "a warning about unconfirmed writes", func() bool {
		return strings.Contains(logs.String(), "not confirmed by --redis-wait-replicas")
	})
	out := logs.String()
	t.Logf("%s", grepLines(out, "not confirmed"))
	if !strings.Contains(out, "0 of 1 replicas confirmed within 1s") {
		t.Errorf("the warning does not say why; log:\n%s", lastN(out, 3000))
	}
	if n, _ := metricValue(m.body(), "fkmat_redis_wait_short_total"); n < 1 {
		t.Errorf("fkmat_redis_wait_short_total = %v after writes with every replica stopped", n)
	}
	for _, r := range paused {
		if err := cl.Unpause(r); err != nil {
			t.Fatal(err)
		}
	}
	paused = nil
	assertOracle(t, cfg)
	if err := d.stop(t); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}
