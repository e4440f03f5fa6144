package testenv

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// The repair WaitHealthy applies to a node stuck in cluster_state fail
// (CLUSTER BUMPEPOCH on the other primaries, CLUSTER MEET from the node to
// every other) is harmless to a healthy cluster: it stays healthy, every
// command succeeds, and data written before it is still there.
func TestClusterRepairStuckHarmless(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := NewCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, k := range []string{"a", "b", "c", "d"} {
		if err := c.Client.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	prims, err := c.Primaries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var logged []string
	c.t = logTB{TB: t, logs: &logged}
	c.repairStuck(ctx, prims[0].Addr, "test")
	c.t = t
	for _, l := range logged {
		if strings.Contains(l, "BUMPEPOCH") || strings.Contains(l, "MEET") {
			if !strings.HasSuffix(l, "<nil>") {
				t.Errorf("repair command failed: %s", l)
			}
		}
	}
	if len(logged) != 1+2+5 {
		t.Errorf("repair logged %d lines, want the view, 2 BUMPEPOCH and 5 MEET:\n%s", len(logged), strings.Join(logged, "\n"))
	}
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "c", "d"} {
		if v, err := c.Client.Get(ctx, k).Result(); err != nil || v != k {
			t.Fatalf("get %s after the repair: %q %v", k, v, err)
		}
	}
}

// A cluster node whose port is taken when it starts (by another process,
// between the reservation and the bind) exits; it is started again on
// other ports, and the cluster comes up healthy.
func TestClusterNodePortTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	calls := 0
	clusterPort = func() (int, error) {
		if calls++; calls == 2 { // node 0's bus port
			return taken.Addr().(*net.TCPAddr).Port, nil
		}
		return ReservePort()
	}
	defer func() { clusterPort = ReservePort }()
	var logged []string
	c := NewCluster(logTB{TB: t, logs: &logged})
	if !slices.ContainsFunc(logged, func(l string) bool { return strings.Contains(l, "node 0 exited on start") }) {
		t.Errorf("node 0 was not started again on other ports; logged:\n%s", strings.Join(logged, "\n"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.Client.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

// logTB records what is logged through it.
type logTB struct {
	testing.TB
	logs *[]string
}

func (l logTB) Logf(format string, args ...any) {
	l.TB.Helper()
	*l.logs = append(*l.logs, fmt.Sprintf(format, args...))
	l.TB.Logf(format, args...)
}
