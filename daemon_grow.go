package fkmat

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/redisstore"
)

// growth is one state due for a Resize.
type growth struct {
	join  string
	table int
	store *redisstore.Store
	shape redisstore.Shape
	fkLen func(string) (int, error)
}

// grow keeps the joins' Redis states sized for their tables while they
// grow: every Options.GrowCheckInterval it sizes each state as a backfill
// would now (sizes: the tables' rows and fan-outs) and, for the states
// that outgrew their layout (redisstore.Store.Outgrown), has the pipeline
// resize them between two batches. The stream waits meanwhile (about a
// second per million rows and references moved); the target and the
// acknowledgements stay where they are, and a crash midway leaves the
// state as it was.
func (d *daemon) grow(ctx context.Context, p *pipeline.Pipeline) {
	t := time.NewTicker(d.opts.GrowCheckInterval)
	defer t.Stop()
	var busy atomic.Bool
	warned := rateLimit{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if busy.Load() {
			continue // the last resize has not run yet
		}
		var due []growth
		for _, j := range d.joins {
			sizes := stateSizes(ctx, d.source, j.Plan())
			for i, store := range j.Stores() { // sizes has one per state
				sh, grew, err := store.Outgrown(ctx, sizes[i])
				if err != nil {
					if ctx.Err() == nil && warned.allow(j.Plan().Name, time.Now()) {
						d.log.Warn("sizing the redis state failed (repeats at most every 10 minutes)", "join", j.Plan().Name, "err", err)
					}
					continue
				}
				if grew {
					due = append(due, growth{join: j.Plan().Name, table: i, store: store, shape: sh, fkLen: pipeline.MemberFK(j.Plan(), i)})
				}
			}
		}
		if len(due) == 0 {
			continue
		}
		busy.Store(true)
		p.Between(func(ctx context.Context) {
			defer busy.Store(false)
			for _, g := range due {
				start := time.Now()
				st, err := g.store.Resize(ctx, g.shape, g.fkLen)
				if err != nil {
					d.log.Warn("resizing the redis state failed; it stays as it was and is tried again", "join", g.join, "table", g.table, "err", err)
					continue
				}
				d.obs.resized(g.join, time.Since(start))
				d.log.Info("resized the redis state to its tables' size", "join", g.join, "table", g.table,
					"rows", st.Rows, "subscriptions", st.Subscriptions, "keys_copied", st.Copied,
					"took", time.Since(start).Round(time.Millisecond))
			}
			p.Garbage().Store(true)
		})
	}
}
