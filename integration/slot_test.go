package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fkmat/fkmat"
	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/testenv"
)

// scraper reads one metric of a daemon's /metrics.
type scraper struct {
	t    *testing.T
	base string
}

func boundScraper(t *testing.T, bound <-chan net.Addr) *scraper {
	t.Helper()
	select {
	case a := <-bound:
		return &scraper{t: t, base: "http://" + a.String()}
	case <-time.After(30 * time.Second):
		t.Fatal("metrics server not bound")
		return nil
	}
}

func (s *scraper) body() string {
	s.t.Helper()
	resp, err := http.Get(s.base + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue returns the sample of series (a name with its labels, as
// printed), and whether it is there. A name alone sums its samples over
// every label set (the joins of a per-join series).
func metricValue(body, series string) (float64, bool) {
	labels := ` `
	if !strings.Contains(series, "{") {
		labels = `(?:\{[^}]*\})? `
	}
	sum, found := 0.0, false
	for _, m := range regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(series)+labels+`(\S+)$`).FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum, found = sum+v, true
	}
	return sum, found
}

// TestSlotSafety, on a Postgres of its own with a small
// max_slot_wal_keep_size: the slot's retained WAL, wal_status and
// safe_wal_size are exported; run warns when the slot retains more than
// --slot-retained-warn; fkmat status reports a fresh daemon as fine; once
// the stopped daemon's slot is invalidated (wal_status lost), status
// reports it with the fix and run stops naming fkmat backfill --force and
// max_slot_wal_keep_size; the rebuild streams again and the target equals
// the SQL join.
func TestSlotSafety(t *testing.T) {
	tc := testenv.New(t)
	x := tc.Env.ExtraPostgres(t, append(slices.Clone(testenv.PostgresArgs), "-c", "max_slot_wal_keep_size=48MB")...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	src, err := pgxpool.New(ctx, x.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	exec := func(stmts ...string) {
		t.Helper()
		for _, s := range stmts {
			if _, err := src.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
	}
	exec(shop, `CREATE TABLE filler (id bigint, pad text)`,
		`INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 20) g`,
		`INSERT INTO orders SELECT g, g % 25, g, 'n' FROM generate_series(1, 500) g`)
	cfg, err := config.ParseConfig([]byte(leftJoinYAML))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Source = x.URL
	cfg.Redis = (&url.URL{Scheme: "redis", Host: tc.Env.RedisAddr, Path: "/0"}).String()
	cfg.Slot, cfg.Publication = tc.Slot, tc.Publication
	cfg.ApplyDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), tc.Redis, "fkmat:"+tc.Slot+":") })
	caughtUp := func() {
		t.Helper()
		var want string
		if err := src.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&want); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 90*time.Second, "caught up", func() bool {
			var ok *bool
			_ = src.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn AND (SELECT count(*) = 0 FROM fkmat.join_state WHERE phase <> 'streaming')
				FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot, want).Scan(&ok)
			return ok != nil && *ok
		})
	}

	logs := &syncBuffer{}
	bound := make(chan net.Addr, 1)
	opts := fkmat.Options{MetricsAddr: "127.0.0.1:0", MetricsBound: func(a net.Addr) { bound <- a },
		SlotRetainedWarn: 4 << 20, SlotCheckInterval: 300 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	d := startDaemon(t, cfg, opts)
	m := boundScraper(t, bound)
	caughtUp()
	var body string
	waitFor(t, 10*time.Second, "a sample of the slot streaming in /metrics", func() bool {
		body = m.body()
		v, ok := metricValue(body, "fkmat_slot_active")
		return ok && v == 1
	})
	for _, series := range []string{`fkmat_slot_wal_status{status="reserved"}`, `fkmat_slot_active`} {
		if v, ok := metricValue(body, series); !ok || v != 1 {
			t.Errorf("%s = %v (present %v), want 1", series, v, ok)
		}
	}
	if v, ok := metricValue(body, "fkmat_slot_safe_wal_size_bytes"); !ok || v <= 0 || v > 64<<20 {
		// The server counts from the start of the oldest segment kept.
		t.Errorf("fkmat_slot_safe_wal_size_bytes = %v (present %v), want within (0, 48 MiB + a 16 MiB segment]", v, ok)
	}
	if !regexp.MustCompile(`(?m)^fkmat_build_info\{goversion="go[^"]+",version="[^"]+"\} 1$`).MatchString(body) {
		t.Errorf("/metrics lacks fkmat_build_info with version and goversion")
	}

	// 10 MB of WAL in a table no join uses: retained WAL passes the 4 MiB
	// threshold (restart_lsn moves only at the server's running-xacts
	// records), and run warns.
	exec(`INSERT INTO filler SELECT g, repeat('x', 1000) FROM generate_series(1, 10000) g`)
	waitFor(t, 30*time.Second, "retained WAL above 4 MiB in /metrics", func() bool {
		v, ok := metricValue(m.body(), "fkmat_slot_retained_wal_bytes")
		return ok && v > 4<<20
	})
	waitFor(t, 10*time.Second, "the retained-WAL warning", func() bool {
		return strings.Contains(logs.String(), "the replication slot retains much WAL")
	})
	if err := d.stop(t); err != nil {
		t.Fatal(err)
	}
	st, err := fkmat.Status(ctx, cfg, fkmat.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st[0].Problems) != 0 || st[0].Daemon == nil || !st[0].Daemon.Live || st[0].WALStatus != "reserved" {
		t.Fatalf("status after a clean stop: problems %q, daemon %+v, wal_status %q; want none, a live heartbeat, reserved",
			st[0].Problems, st[0].Daemon, st[0].WALStatus)
	}

	// The daemon is away; the source writes past max_slot_wal_keep_size and
	// checkpoints: the slot is invalidated.
	waitFor(t, 2*time.Minute, "the slot invalidated", func() bool {
		exec(`INSERT INTO filler SELECT g, repeat('y', 1000) FROM generate_series(1, 30000) g`, `SELECT pg_switch_wal()`, `CHECKPOINT`)
		var status *string
		_ = src.QueryRow(ctx, `SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot).Scan(&status)
		return status != nil && *status == "lost"
	})
	st, err = fkmat.Status(ctx, cfg, fkmat.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if st[0].WALStatus != "lost" || !slices.ContainsFunc(st[0].Problems, func(p string) bool {
		return strings.Contains(p, "invalidated") && strings.Contains(p, "fkmat backfill --force") && strings.Contains(p, "max_slot_wal_keep_size")
	}) {
		t.Fatalf("status of an invalidated slot: wal_status %q, problems %q", st[0].WALStatus, st[0].Problems)
	}
	d = startDaemon(t, cfg, fkmat.Options{})
	select {
	case err := <-d.done:
		d.cancel = nil
		if !errors.Is(err, cdc.ErrSlotInvalidated) || !strings.Contains(err.Error(), "fkmat backfill --force") ||
			!strings.Contains(err.Error(), "max_slot_wal_keep_size") {
			t.Fatalf("run on an invalidated slot: %v; want ErrSlotInvalidated naming fkmat backfill --force and max_slot_wal_keep_size", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run on an invalidated slot did not stop")
	}

	if err := fkmat.BackfillIfNeeded(ctx, cfg, true, fkmat.Options{}); err != nil {
		t.Fatal(err)
	}
	startDaemon(t, cfg, fkmat.Options{})
	exec(`UPDATE customers SET name = 'again' WHERE id < 5`, `INSERT INTO orders VALUES (9001, 3, 1, 'after')`)
	caughtUp()
	assertOracle(t, cfg)
}

// TestSlotOwnedByAnotherFile: two configuration files naming the same slot
// with different joins. The second one's check, backfill and run refuse
// it, naming the first file's join and the fix, and leave the slot's
// publication as it was: the first file's join keeps following every
// change of its tables. So do a file naming the first one's publication
// with another slot, and one naming its target.
func TestSlotOwnedByAnotherFile(t *testing.T) {
	tc := testenv.New(t)
	sqlExec(t, tc, shop, `CREATE TABLE products (id bigint PRIMARY KEY, title text)`,
		`ALTER TABLE orders ADD COLUMN product_id bigint`,
		`INSERT INTO customers SELECT g, 'c' || g, 't' FROM generate_series(1, 20) g`,
		`INSERT INTO products SELECT g, 'p' || g FROM generate_series(1, 5) g`,
		`INSERT INTO orders SELECT g, 1 + g % 21, g, 'n', 1 + g % 5 FROM generate_series(1, 200) g`)
	first := daemonConfig(t, tc, leftJoinYAML)
	d := startDaemon(t, first, fkmat.Options{})
	waitCaughtUp(t, tc, d)

	other := func(slot, pub, target string) *config.Config {
		cfg := daemonConfig(t, tc, fmt.Sprintf(`
joins:
  - name: orders_products
    type: left
    left: {table: public.orders, foreign_key: [product_id], columns: [id, product_id]}
    right: {table: public.products, columns: [title]}
    target: {table: %s}
`, target))
		cfg.Slot, cfg.Publication = slot, pub
		return cfg
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pubTables := func() string {
		var s string
		if err := tc.Pool.QueryRow(ctx, `SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables WHERE pubname = $1`,
			tc.Publication).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := pubTables()
	for _, c := range []struct {
		name string
		cfg  *config.Config
		want []string
	}{
		{"same slot", other(tc.Slot, tc.Publication, "public.orders_products"),
			[]string{fmt.Sprintf("replication slot %q belongs to joins this file does not define: \"orders_enriched\"", tc.Slot), "add them to this file"}},
		{"same publication", other(tc.Slot+"_b", tc.Publication, "public.orders_products"),
			[]string{fmt.Sprintf("publication %q belongs to joins of another slot: \"orders_enriched\"", tc.Publication), "set another publication"}},
		{"same target", other(tc.Slot+"_c", tc.Publication+"_c", "public.orders_enriched"),
			[]string{"target public.orders_enriched is maintained by join \"orders_enriched\"", "choose another target table"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for what, err := range map[string]error{
				"check":    fkmat.Check(ctx, c.cfg, fkmat.Options{}),
				"backfill": fkmat.BackfillIfNeeded(ctx, c.cfg, true, fkmat.Options{}),
				"run":      fkmat.Run(ctx, c.cfg, fkmat.Options{}),
			} {
				var ce *config.ConfigError
				if !errors.As(err, &ce) {
					t.Fatalf("%s: %v, want a configuration error", what, err)
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %v\nwant it to say %q", what, err, w)
					}
				}
			}
			if got := pubTables(); got != before {
				t.Errorf("publication %s holds %s, was %s", tc.Publication, got, before)
			}
		})
	}
	// The first file's join still follows every table it joins.
	sqlExec(t, tc, `UPDATE customers SET name = name || '+' WHERE id % 3 = 0`, `UPDATE orders SET amount = amount + 1 WHERE id % 7 = 0`)
	waitCaughtUp(t, tc, d)
	assertOracle(t, first)
	// The second file with a slot and publication of its own works beside.
	second := other(tc.Slot+"_d", tc.Publication+"_d", "public.orders_products")
	d2 := startDaemon(t, second, fkmat.Options{})
	sqlExec(t, tc, `UPDATE products SET title = 'x' WHERE id = 2`)
	tc2 := *tc
	tc2.Slot = second.Slot
	waitCaughtUp(t, &tc2, d2)
	waitCaughtUp(t, tc, d)
	assertOracle(t, second)
	assertOracle(t, first)
}
