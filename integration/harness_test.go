package integration

import (
	"context"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/testenv"
	"github.com/fkmat/fkmat/redisstore"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// TestHarness proves the test environment: Postgres with wal_level=logical on
// loopback, a logical slot that pglogrepl can create and stream from, Redis
// reachable, and names isolated per test.
func TestHarness(t *testing.T) {
	a := testenv.New(t)
	b := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, c := range []*testenv.Case{a, b} {
		for _, raw := range []string{c.DatabaseURL, c.ReplicationURL} {
			u, err := url.Parse(raw)
			if err != nil {
				t.Fatal(err)
			}
			if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
				t.Fatalf("endpoint %s is not loopback", u.Host)
			}
		}
		if ip := net.ParseIP(hostOf(t, c.Env.RedisAddr)); ip == nil || !ip.IsLoopback() {
			t.Fatalf("redis endpoint %s is not loopback", c.Env.RedisAddr)
		}
	}
	if a.Database == b.Database || a.Slot == b.Slot || a.Publication == b.Publication || a.RedisPrefix == b.RedisPrefix {
		t.Fatalf("cases share names: %+v / %+v", a, b)
	}

	var level string
	if err := a.Pool.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil || level != "logical" {
		t.Fatalf("wal_level = %q, %v; want logical", level, err)
	}
	if _, err := a.Pool.Exec(ctx, `CREATE TABLE t (id bigint PRIMARY KEY, v text)`); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pool.Exec(ctx, `CREATE PUBLICATION `+a.Publication+` FOR TABLE t`); err != nil {
		t.Fatal(err)
	}

	conn, err := pgconn.Connect(ctx, a.ReplicationURL)
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	defer conn.Close(context.Background())
	slot, err := pglogrepl.CreateReplicationSlot(ctx, conn, a.Slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{})
	if err != nil {
		t.Fatalf("create slot: %v", err)
	}
	start, err := pglogrepl.ParseLSN(slot.ConsistentPoint)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Pool.Exec(ctx, `INSERT INTO t VALUES (1, 'hello')`); err != nil {
		t.Fatal(err)
	}
	err = pglogrepl.StartReplication(ctx, conn, a.Slot, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + a.Publication + "'"},
	})
	if err != nil {
		t.Fatalf("start replication: %v", err)
	}
	if !receiveInsert(ctx, t, conn) {
		t.Fatal("no insert received from the slot")
	}

	key := b.RedisPrefix + ":probe"
	if err := b.Redis.Set(ctx, key, "1", 0).Err(); err != nil {
		t.Fatalf("redis set: %v", err)
	}
	if n, err := a.Redis.Exists(ctx, a.RedisPrefix+":probe").Result(); err != nil || n != 0 {
		t.Fatalf("prefix isolation: exists=%d err=%v", n, err)
	}
}

func receiveInsert(ctx context.Context, t *testing.T, conn *pgconn.PgConn) bool {
	t.Helper()
	relations := map[uint32]*pglogrepl.RelationMessage{}
	for {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			continue
		}
		if cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			t.Fatal(err)
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			t.Fatal(err)
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			relations[m.RelationID] = m
		case *pglogrepl.InsertMessage:
			rel := relations[m.RelationID]
			if rel == nil || rel.RelationName != "t" {
				t.Fatalf("insert for unknown relation %d", m.RelationID)
			}
			if got := string(m.Tuple.Columns[1].Data); got != "hello" {
				t.Fatalf("insert value %q, want hello", got)
			}
			return true
		}
	}
}

func hostOf(t *testing.T, hostport string) string {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestHarnessRestart proves that a Postgres restart keeps the data and the
// loopback port, so tests can restart the server under a running consumer.
func TestHarnessRestart(t *testing.T) {
	c := testenv.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := c.Pool.Exec(ctx, `CREATE TABLE kept (id int PRIMARY KEY); INSERT INTO kept VALUES (7)`); err != nil {
		t.Fatal(err)
	}
	before := c.Env.PostgresHostPort()
	if err := c.Env.RestartPostgres(ctx); err != nil {
		t.Fatal(err)
	}
	if after := c.Env.PostgresHostPort(); after != before {
		t.Fatalf("port changed across restart: %s -> %s", before, after)
	}
	c.Pool.Reset()
	var id int
	if err := c.Pool.QueryRow(ctx, `SELECT id FROM kept`).Scan(&id); err != nil || id != 7 {
		t.Fatalf("after restart: id=%d err=%v", id, err)
	}
}

// joinState opens the Redis state of the join name as the daemon keeps it
// in tc's Redis, so that tests read or damage the state through redisstore
// (MetaKey, Meta, Drop) and never build key names.
func joinState(t testing.TB, tc *testenv.Case, name string) *redisstore.Store {
	t.Helper()
	return joinStateOn(t, tc.Redis, tc.Slot, name)
}

// joinStates opens every Redis state of join j on rdb: its one, or one per
// entry of a join of more than two tables.
func joinStates(t testing.TB, rdb redis.UniversalClient, slot string, j config.JoinConfig) []*redisstore.Store {
	t.Helper()
	if !j.IsList() {
		return []*redisstore.Store{joinStateOn(t, rdb, slot, j.Name)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []*redisstore.Store
	for _, prefix := range redisstore.StatePrefixes(slot, j.Name, len(j.Rights), 0) {
		s, err := redisstore.Open(ctx, rdb, redisstore.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// joinStateOn is joinState on another Redis (a cluster).
func joinStateOn(t testing.TB, rdb redis.UniversalClient, slot, name string) *redisstore.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := redisstore.Open(ctx, rdb, redisstore.Config{Prefix: redisstore.Prefix(slot, name)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
