package fkmat

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// progressInterval is the period of plain progress lines.
const progressInterval = 5 * time.Second

// progress counts the rows of each task of a backfill against an estimated
// total (pg_class.reltuples), refined as the task goes.
type progress struct {
	log   *slog.Logger
	start time.Time
	mu    sync.Mutex
	tasks []*task
	bars  *mpb.Progress
}

// task is one table being loaded.
type task struct {
	p *progress
	// join is the join the task loads part of.
	join  string
	name  string
	total atomic.Int64
	done  atomic.Int64
	over  atomic.Bool
	bar   *mpb.Bar
}

func newProgress(log *slog.Logger, bars io.Writer) *progress {
	p := &progress{log: log, start: time.Now()}
	if bars != nil {
		p.bars = mpb.New(mpb.WithOutput(bars), mpb.WithRefreshRate(200*time.Millisecond), mpb.WithWidth(40))
	}
	return p
}

// add registers a task with its estimated row count.
func (p *progress) add(join, name string, estimate int64) *task {
	t := &task{join: join, name: join + " " + name, p: p}
	t.total.Store(max(estimate, 1))
	if p.bars != nil {
		t.bar = p.bars.AddBar(t.total.Load(),
			mpb.PrependDecorators(decor.Name(name, decor.WCSyncSpaceR),
				decor.CountersNoUnit("%d / %d", decor.WCSyncWidth)),
			mpb.AppendDecorators(decor.AverageSpeed(nil, "%.0f rows/s", decor.WCSyncSpace),
				decor.Name(" eta "), decor.AverageETA(decor.ET_STYLE_GO)),
		)
	}
	p.mu.Lock()
	p.tasks = append(p.tasks, t)
	p.mu.Unlock()
	return t
}

// advance records n more rows.
func (t *task) advance(n int) {
	done := t.done.Add(int64(n))
	if done > t.total.Load() {
		// The estimate was low: keep the total just ahead of the count.
		t.total.Store(done + done/10)
		if t.bar != nil {
			t.bar.SetTotal(t.total.Load(), false)
		}
	}
	if t.bar != nil {
		t.bar.IncrBy(n)
	}
}

// finish marks the task complete with its exact count.
func (t *task) finish() {
	t.over.Store(true)
	t.total.Store(t.done.Load())
	t.p.log.Debug("backfill task done", "table", t.name, "rows", t.done.Load(),
		"after", time.Since(t.p.start).Round(time.Millisecond).String())
	if t.bar != nil {
		t.bar.SetTotal(t.done.Load(), true)
	}
}

// run prints plain progress lines until ctx is done (when no bars are drawn).
func (p *progress) run(ctx context.Context) {
	if p.bars != nil {
		return
	}
	tick := time.NewTicker(progressInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			p.report()
		}
	}
}

func (p *progress) report() {
	p.mu.Lock()
	tasks := append([]*task(nil), p.tasks...)
	p.mu.Unlock()
	secs := time.Since(p.start).Seconds()
	for _, t := range tasks {
		done, total := t.done.Load(), t.total.Load()
		rate := float64(done) / max(secs, 0.001)
		eta := "done"
		if !t.over.Load() {
			eta = "unknown"
			if rate > 0 {
				eta = (time.Duration(float64(max(total-done, 0))/rate) * time.Second).Round(time.Second).String()
			}
		}
		p.log.Info("backfill progress", "table", t.name, "rows", done, "total", total,
			"rows_per_second", int64(rate), "eta", eta)
	}
}

// close stops drawing bars.
func (p *progress) close() {
	if p.bars != nil {
		p.bars.Shutdown()
	}
}

// joins returns, per join, the rows its tasks loaded and their estimated
// total (which grows when an estimate was low).
func (p *progress) joins() map[string][2]int64 {
	p.mu.Lock()
	tasks := append([]*task(nil), p.tasks...)
	p.mu.Unlock()
	out := map[string][2]int64{}
	for _, t := range tasks {
		done, total := t.done.Load(), t.total.Load()
		s := out[t.join]
		out[t.join] = [2]int64{s[0] + done, s[1] + max(done, total)}
	}
	return out
}
