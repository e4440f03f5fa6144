package fkmat

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/wal"
)

// TestMetricsLabels: /metrics carries the Go runtime's and the process's
// series, one sample per configured join of every per-join series (before
// any pipeline runs), and what one join did under its own label only.
func TestMetricsLabels(t *testing.T) {
	t.Parallel()
	o := newObserver(&config.Config{Joins: []config.JoinConfig{{Name: "orders_x"}, {Name: "items_x"}}})
	v := &verifyCounters{}
	o.setVerify(v)
	o.resized("items_x", 1500*time.Millisecond)
	v.join("items_x").last.Store(3)
	v.join("items_x").checked.Add(1000)
	v.rounds.Add(1)
	o.setBuild("orders_x", 1200, 5000)
	o.setRebuild("items_x", "catching up")
	o.switchedIn("orders_x")
	o.moved("public.orders", 100, 7, 2*time.Second)
	o.moved("public.orders", 0, 3, time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	addr, wait, err := serveMetrics(ctx, "127.0.0.1:0", o, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		wait()
	}()
	resp, err := http.Get("http://" + addr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	body := string(b)

	for _, line := range []string{
		"# TYPE go_goroutines gauge", "# TYPE go_memstats_heap_alloc_bytes gauge", "# TYPE process_resident_memory_bytes gauge",
		`fkmat_sink_rows_upserted_total{join="orders_x"} 0`, `fkmat_sink_rows_upserted_total{join="items_x"} 0`,
		`fkmat_sink_rows_deleted_total{join="orders_x"} 0`, `fkmat_join_fanout_rows_total{join="items_x"} 0`,
		`fkmat_join_stale_responses_total{join="orders_x"} 0`, `fkmat_join_inner_null_fk_drops_total{join="orders_x"} 0`,
		`fkmat_redis_wait_short_total{join="orders_x"} 0`,
		`fkmat_redis_resizes_total{join="items_x"} 1`, `fkmat_redis_resizes_total{join="orders_x"} 0`,
		`fkmat_redis_resize_seconds_total{join="items_x"} 1.5`,
		`fkmat_verify_differences{join="items_x"} 3`, `fkmat_verify_differences{join="orders_x"} 0`,
		`fkmat_verify_rows_checked_total{join="items_x"} 1000`,
		"fkmat_verify_rounds_total 1", "fkmat_pipeline_changes_total 0", "fkmat_ready 0", "fkmat_pipeline_restarts_total 0",
		`fkmat_backfill_rows_done{join="orders_x"} 1200`, `fkmat_backfill_rows_total{join="orders_x"} 5000`,
		`fkmat_partition_moves_total{table="public.orders"} 2`, `fkmat_partition_moved_rows_total{direction="left",table="public.orders"} 100`,
		`fkmat_partition_moved_rows_total{direction="entered",table="public.orders"} 10`, `fkmat_partition_move_seconds_total{table="public.orders"} 3`,
		`fkmat_rebuild_phase{join="items_x",phase="catching up"} 1`, `fkmat_rebuild_phase{join="items_x",phase="loading"} 0`,
		`fkmat_rebuilds_total{join="orders_x"} 1`,
	} {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if strings.Contains(body, `fkmat_rebuild_phase{join="orders_x"`) {
		t.Error("a join whose rebuild switched in still has fkmat_rebuild_phase")
	}
	// A join that is not backfilling has no backfill series.
	if strings.Contains(body, `fkmat_backfill_rows_done{join="items_x"}`) {
		t.Error("a join that is not backfilling has fkmat_backfill_rows_done")
	}
	// The slot's, the pipeline's and the process's series have no join.
	for _, name := range []string{"fkmat_pipeline_changes_total", "fkmat_pipeline_restarts_total", "fkmat_verify_rounds_total", "fkmat_ready"} {
		if strings.Contains(body, name+"{join=") {
			t.Errorf("%s has a join label", name)
		}
	}
}

// statsSource is a pipeline.Source whose stats a test sets.
type statsSource struct{ st cdc.StreamStats }

func (s *statsSource) Next(ctx context.Context) (*cdc.Txn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (s *statsSource) Ack(wal.LSN)            {}
func (s *statsSource) Stats() cdc.StreamStats { return s.st }

// TestStuck: the stream standing still for stuckAfter while changes wait
// (queued, delivered but not acknowledged, or WAL past the confirmable
// position) makes the daemon not ready; standing still with nothing to do
// does not; moving again clears it at once.
func TestStuck(t *testing.T) {
	t.Parallel()
	src := &statsSource{}
	o := newObserver(&config.Config{})
	o.stuckAfter = 30 * time.Second
	o.attach(pipeline.New(pipeline.Config{Source: src}))
	o.setPhase("streaming")
	now := time.Now()
	look := func(at time.Duration) time.Duration {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.stuckLocked(now.Add(at))
	}
	src.st = cdc.StreamStats{ConfirmableLSN: 100, ServerWALEnd: 100}
	if look(0) != 0 || look(time.Minute) != 0 {
		t.Fatal("an idle stream is stuck")
	}
	src.st = cdc.StreamStats{ConfirmableLSN: 100, ServerWALEnd: 100, ReceivedLSN: 200, AckedLSN: 100}
	if look(90*time.Second) != 90*time.Second {
		t.Fatalf("a delivered transaction never acknowledged for 90 s: stuck %s", look(90*time.Second))
	}
	src.st = cdc.StreamStats{ConfirmableLSN: 250, ServerWALEnd: 300}
	if look(91*time.Second) != 0 || look(100*time.Second) != 0 {
		t.Fatal("a moving stream is stuck")
	}
	if got := look(130 * time.Second); got != 39*time.Second {
		t.Fatalf("WAL waiting past the confirmable position for 39 s: stuck %s", got)
	}
}
