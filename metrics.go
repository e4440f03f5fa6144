package fkmat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/buildinfo"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

// observer publishes the running daemon's counters on /metrics and its
// health on /healthz and /readyz. It reads the components' Stats() on each
// scrape; the core logic knows nothing of it. The pipeline it observes is
// replaced when Run restarts it, so counters are carried across restarts.
// What belongs to one join (its target's rows, its engine's and Redis
// state's counters, its verification) carries a join label; what belongs
// to the slot or the process does not.
type observer struct {
	mu    sync.Mutex
	p     *pipeline.Pipeline
	phase string // "starting", "backfilling", "streaming"
	// joins are the configured joins' names: the per-join series have a
	// sample for each from the start.
	joins []string
	base  pipelineCounters
	// stall is the pipeline's current stall, nil when it is not stalled.
	stall *Stall
	// slot is the last sample of the replication slot, nil before one.
	slot *cdc.SlotInfo
	// restarts counts the pipeline restarts after an error.
	restarts int64
	// resizes counts, per join, the Redis states resized as their tables
	// grew, and the time the stream waited for them.
	resizes map[string]resizeCounts
	// verify are the background verifier's counters (nil: none).
	verify *verifyCounters
	// batchSeconds is the time batches spend in each phase.
	batchSeconds *prometheus.HistogramVec
	// builds are, while a backfill runs, its rows done and estimated
	// total per join.
	builds map[string][2]int64
	// rebuilds are the phases of the rebuilds beside the running joins,
	// per join; rebuilt counts the ones switched in.
	rebuilds map[string]string
	rebuilt  map[string]int
	// moves counts, per partitioned table, the partition changes followed.
	moves map[string]moveCounts
	// stuckAfter is how long the stream may stand still while changes wait
	// before the daemon says it is not ready (0: never); confirmed and
	// movedAt are the stream's confirmable position at the last look, and
	// when it last moved.
	stuckAfter time.Duration
	confirmed  wal.LSN
	movedAt    time.Time
}

// stuckLocked says how long the stream has stood still while changes wait
// (0: it moves, or nothing waits). o.mu is held.
func (o *observer) stuckLocked(now time.Time) time.Duration {
	if o.p == nil || o.phase != "streaming" || o.stuckAfter <= 0 {
		return 0
	}
	st := o.p.SourceStats()
	if st.ConfirmableLSN != o.confirmed || o.movedAt.IsZero() {
		o.confirmed, o.movedAt = st.ConfirmableLSN, now
	}
	waiting := st.BufferedChanges > 0 || st.ReceivedLSN > st.AckedLSN || st.ServerWALEnd > st.ConfirmableLSN
	if still := now.Sub(o.movedAt); waiting && still >= o.stuckAfter {
		return still
	}
	return 0
}

// moveCounts are the partition changes followed on one table.
type moveCounts struct {
	n, left, entered int64
	seconds          float64
}

// resizeCounts are the resizes of one join's Redis states.
type resizeCounts struct {
	n       int64
	seconds float64
}

// newObserver returns the observer of a daemon running cfg.
func newObserver(cfg *config.Config) *observer {
	o := &observer{phase: "starting", resizes: map[string]resizeCounts{}, moves: map[string]moveCounts{}}
	for _, j := range cfg.Joins {
		o.joins = append(o.joins, j.Name)
	}
	o.batchSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "fkmat_pipeline_batch_seconds",
		Help:    "Time a committed batch spent in each phase (collect, map, join, write, verify, target_commit, redis_commit, total).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10), // 0.5 ms to 131 s
	}, []string{"phase"})
	return o
}

// timingHook returns observeBatch, or nil without metrics.
func (o *observer) timingHook() func(pipeline.BatchTiming) {
	if o == nil {
		return nil
	}
	return o.observeBatch
}

// observeBatch records a committed batch's timings.
func (o *observer) observeBatch(t pipeline.BatchTiming) {
	if o == nil {
		return
	}
	total := time.Duration(0)
	for _, ph := range t.Phases() {
		o.batchSeconds.WithLabelValues(ph.Name).Observe(ph.Time.Seconds())
		total += ph.Time
	}
	o.batchSeconds.WithLabelValues("total").Observe(total.Seconds())
}

// locked runs fn under the observer's lock; without metrics (o nil) it
// does nothing.
func (o *observer) locked(fn func()) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	fn()
}

// setVerify makes v the background verifier's counters.
func (o *observer) setVerify(v *verifyCounters) { o.locked(func() { o.verify = v }) }

// restarted counts a pipeline restart after an error.
func (o *observer) restarted() { o.locked(func() { o.restarts++ }) }

// resized counts a state of join resized in took.
func (o *observer) resized(join string, took time.Duration) {
	o.locked(func() {
		r := o.resizes[join]
		r.n++
		r.seconds += took.Seconds()
		o.resizes[join] = r
	})
}

// moved counts a partition change of table followed in took.
func (o *observer) moved(table string, left, entered int, took time.Duration) {
	o.locked(func() {
		m := o.moves[table]
		m.n++
		m.left += int64(left)
		m.entered += int64(entered)
		m.seconds += took.Seconds()
		o.moves[table] = m
	})
}

// setSlot records a sample of the slot.
func (o *observer) setSlot(s *cdc.SlotInfo) { o.locked(func() { o.slot = s }) }

// setStall records the current stall (nil: none).
func (o *observer) setStall(s *Stall) { o.locked(func() { o.stall = s }) }

// pipelineCounters are the cumulative counters of pipelines.
type pipelineCounters struct {
	pipeline.Counters
	reconnects int64
	joins      map[string]joinCounters
}

// joinCounters are the cumulative counters of one join.
type joinCounters struct {
	join.Stats
	upserted, deleted, waitShort int64
}

func (o *observer) setPhase(phase string) { o.locked(func() { o.phase = phase }) }

// setBuild records a running backfill's progress for join; an empty join
// ends it.
func (o *observer) setBuild(join string, done, total int64) {
	o.locked(func() {
		if join == "" {
			o.builds = nil
			return
		}
		if o.builds == nil {
			o.builds = map[string][2]int64{}
		}
		o.builds[join] = [2]int64{done, total}
	})
}

// setRebuild records the phase of a rebuild of join beside the running
// one; an empty phase ends it.
func (o *observer) setRebuild(join, phase string) {
	o.locked(func() {
		if o.rebuilds == nil {
			o.rebuilds = map[string]string{}
		}
		if phase == "" {
			delete(o.rebuilds, join)
			return
		}
		o.rebuilds[join] = phase
	})
}

// switchedIn counts a rebuild of join switched in.
func (o *observer) switchedIn(join string) {
	o.locked(func() {
		if o.rebuilt == nil {
			o.rebuilt = map[string]int{}
		}
		o.rebuilt[join]++
		delete(o.rebuilds, join)
	})
}

// attach makes p the observed pipeline, folding the previous one's counters
// into the base.
func (o *observer) attach(p *pipeline.Pipeline) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.p != nil {
		o.base = o.countersLocked()
	}
	o.p = p
}

func (o *observer) countersLocked() pipelineCounters {
	c := o.base
	c.joins = make(map[string]joinCounters, len(o.base.joins))
	for name, jc := range o.base.joins {
		c.joins[name] = jc
	}
	p := o.p
	if p == nil {
		return c
	}
	c.Counters.Add(p.Counters())
	for i, j := range p.Joins() {
		jc := c.joins[j.Plan().Name]
		jc.Add(j.Stats())
		upserted, deleted := p.JoinRows(i)
		jc.upserted += upserted
		jc.deleted += deleted
		for _, s := range j.Stores() {
			jc.waitShort += s.WaitShort()
		}
		c.joins[j.Plan().Name] = jc
	}
	c.reconnects += p.SourceStats().Reconnects
	return c
}

// joinNamesLocked returns the configured joins' names, then any other join
// a counter names (none, unless the configuration changed under Run).
func (o *observer) joinNamesLocked(c pipelineCounters) []string {
	names := slices.Clone(o.joins)
	var more []string
	add := func(name string) {
		if !slices.Contains(names, name) && !slices.Contains(more, name) {
			more = append(more, name)
		}
	}
	for name := range c.joins {
		add(name)
	}
	for name := range o.resizes {
		add(name)
	}
	if o.verify != nil {
		o.verify.each(func(name string, _ *joinVerify) { add(name) })
	}
	slices.Sort(more)
	return append(names, more...)
}

// descs lists every metric for Describe.
var descs []*prometheus.Desc

func desc(name, help string, labels ...string) *prometheus.Desc {
	d := prometheus.NewDesc(name, help, labels, nil)
	descs = append(descs, d)
	return d
}

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

var (
	mBatches    = desc("fkmat_pipeline_batches_total", "Batches committed to the target and Redis.")
	mTxns       = desc("fkmat_pipeline_transactions_total", "Source transactions applied.")
	mChanges    = desc("fkmat_pipeline_changes_total", "Source row changes applied.")
	mUpserted   = desc("fkmat_sink_rows_upserted_total", "Target rows inserted or changed, by join.", "join")
	mDeleted    = desc("fkmat_sink_rows_deleted_total", "Target rows deleted, by join.", "join")
	mStale      = desc("fkmat_join_stale_responses_total", "Responses discarded by the value-hash check, by join.", "join")
	mFanout     = desc("fkmat_join_fanout_rows_total", "Dependent rows resolved after right-side changes, by join.", "join")
	mDrops      = desc("fkmat_join_inner_null_fk_drops_total", "Inner-join left rows without a row because of a NULL foreign key, by join.", "join")
	mReconnects = desc("fkmat_cdc_reconnects_total", "Replication reconnects.")
	mLag        = desc("fkmat_cdc_lag_bytes", "Server WAL end minus the acknowledged position.")
	mAcked      = desc("fkmat_cdc_acked_lsn", "Highest acknowledged LSN (committed in the target).")
	mBuffered   = desc("fkmat_cdc_buffered_changes", "Changes received and not yet taken by the pipeline.")
	mReady      = desc("fkmat_ready", "1 while streaming.")
	mStuck      = desc("fkmat_stream_stuck_seconds", "How long the stream has stood still while changes wait, once past --stuck-after (0 otherwise): the daemon is not ready meanwhile.")
	mStalled    = desc("fkmat_pipeline_stalled", "1 while the pipeline fails with the same error at the same source position after restarts.")
	mStallCount = desc("fkmat_pipeline_stall_recurrences", "Recurrences of the current stall's error (0 when not stalled).")
	mRestarts   = desc("fkmat_pipeline_restarts_total", "Pipeline restarts from the checkpoints after an error (connection losses, stalls...).")
	mVerified   = desc("fkmat_verify_rows_checked_total", "Rows the background verification (run --verify-interval) compared with the SQL join, by join.", "join")
	mVerifyDiff = desc("fkmat_verify_differences", "Confirmed differences between a join's target and its SQL join: of the join's last completed verification, or of the one in progress once it found more.", "join")
	mVerifyRuns = desc("fkmat_verify_rounds_total", "Background verification rounds completed over every join.")
	mBuild      = desc("fkmat_build_info", "Always 1; the labels say which fkmat runs.", "version", "goversion")
	mLagSeconds = desc("fkmat_lag_seconds", "While there is a backlog, seconds since the source commit of the last applied transaction; 0 without one.")
	mLastCommit = desc("fkmat_last_applied_commit_timestamp_seconds", "Source commit time (Unix seconds) of the last applied transaction.")
	mRetained   = desc("fkmat_slot_retained_wal_bytes", "WAL the replication slot keeps on the source (pg_current_wal_lsn() - restart_lsn).")
	mSafeWAL    = desc("fkmat_slot_safe_wal_size_bytes", "WAL that can still be written before the slot is invalidated (safe_wal_size); absent when max_slot_wal_keep_size is unlimited.")
	mWALStatus  = desc("fkmat_slot_wal_status", "1 for the slot's current wal_status, 0 for the others.", "status")
	mSlotActive = desc("fkmat_slot_active", "1 while a walsender streams from the slot.")
	mWaitShort  = desc("fkmat_redis_wait_short_total", "Redis writes that run --redis-wait-replicas could not confirm on that many replicas within the WAIT timeout (or at all: written through a redirect), by join.", "join")
	mResizes    = desc("fkmat_redis_resizes_total", "Redis states moved to more buckets or lanes as their tables grew, by join.", "join")
	mResizeTime = desc("fkmat_redis_resize_seconds_total", "Time the stream waited for Redis states to be resized, by join.", "join")
	mSlotLag    = desc("fkmat_slot_lag_bytes", "pg_current_wal_lsn() - confirmed_flush_lsn of the slot, at the last sample.")
	mBuildDone  = desc("fkmat_backfill_rows_done", "While a backfill runs: the rows of the join's tables and target loaded so far, by join.", "join")
	mRollupIn   = desc("fkmat_rollup_child_changes_total", "Changes of a roll-up's child table applied, by join and roll-up (its child table).", "join", "rollup")
	mRollupOut  = desc("fkmat_rollup_parents_updated_total", "Parents whose roll-up a batch changed, counted per batch (and per chunk of a large transaction, whose last writes each parent once), by join and roll-up.", "join", "rollup")
	mRollupRead = desc("fkmat_rollup_set_reads_total", "Children's sorted sets read from Redis because the parent's state could not say its first children (the extreme of a min/max or one of a jsonb_agg's first n removed), by join and roll-up.", "join", "rollup")
	mMoves      = desc("fkmat_partition_moves_total", "Partition changes that moved rows (ATTACH of a filled table, DETACH or DROP of a partition with rows, TRUNCATE of one partition) followed online, by table.", "table")
	mMovedRows  = desc("fkmat_partition_moved_rows_total", "Rows those changes took out of (direction=\"left\") or brought into (\"entered\") a joined table, by table.", "table", "direction")
	mMoveTime   = desc("fkmat_partition_move_seconds_total", "Time spent following those changes, from the first look at the state to the commit of the rows written into the WAL, by table.", "table")
	mRebuild    = desc("fkmat_rebuild_phase", "1 while a join is rebuilt beside the running one (a changed definition, backfill --force), for its phase: loading, catching up or switching; by join.", "join", "phase")
	mRebuilt    = desc("fkmat_rebuilds_total", "Rebuilds beside the running join switched in, by join.", "join")
	mBuildTotal = desc("fkmat_backfill_rows_total", "While a backfill runs: the rows of the join's tables and target to load (an estimate that grows when low), by join.", "join")
)

// Describe implements prometheus.Collector.
func (o *observer) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
	o.batchSeconds.Describe(ch)
}

// Collect implements prometheus.Collector.
func (o *observer) Collect(ch chan<- prometheus.Metric) {
	o.mu.Lock()
	c := o.countersLocked()
	joins := o.joinNamesLocked(c)
	p, phase, stall, slot, restarts, verify := o.p, o.phase, o.stall, o.slot, o.restarts, o.verify
	stuck := o.stuckLocked(time.Now())
	builds, moves := maps.Clone(o.builds), maps.Clone(o.moves)
	rebuilds, rebuilt := maps.Clone(o.rebuilds), maps.Clone(o.rebuilt)
	resizes := make(map[string]resizeCounts, len(o.resizes))
	for name, r := range o.resizes {
		resizes[name] = r
	}
	o.mu.Unlock()
	o.batchSeconds.Collect(ch)
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gaugeOf := gaugeTo(ch)
	counter(mBatches, float64(c.Batches))
	counter(mTxns, float64(c.Txns))
	counter(mChanges, float64(c.Changes))
	for _, name := range joins {
		jc, r := c.joins[name], resizes[name]
		counter(mUpserted, float64(jc.upserted), name)
		counter(mDeleted, float64(jc.deleted), name)
		counter(mStale, float64(jc.StaleResponses), name)
		counter(mFanout, float64(jc.FanoutRows), name)
		counter(mDrops, float64(jc.InnerNullFKDrops), name)
		counter(mWaitShort, float64(jc.waitShort), name)
		counter(mResizes, float64(r.n), name)
		counter(mResizeTime, r.seconds, name)
		for _, rollup := range slices.Sorted(maps.Keys(jc.Rollups)) {
			rs := jc.Rollups[rollup]
			counter(mRollupIn, float64(rs.Changes), name, rollup)
			counter(mRollupOut, float64(rs.Parents), name, rollup)
			counter(mRollupRead, float64(rs.SetReads), name, rollup)
		}
		if verify != nil {
			jv := verify.join(name)
			counter(mVerified, float64(jv.checked.Load()), name)
			gaugeOf(mVerifyDiff, float64(jv.differences()), name)
		}
	}
	for table, m := range moves {
		counter(mMoves, float64(m.n), table)
		counter(mMovedRows, float64(m.left), table, "left")
		counter(mMovedRows, float64(m.entered), table, "entered")
		counter(mMoveTime, m.seconds, table)
	}
	for name, b := range builds {
		gaugeOf(mBuildDone, float64(b[0]), name)
		gaugeOf(mBuildTotal, float64(b[1]), name)
	}
	for name, phase := range rebuilds {
		for _, ph := range []string{"loading", "catching up", "switching"} {
			v := 0.0
			if ph == phase {
				v = 1
			}
			gaugeOf(mRebuild, v, name, ph)
		}
	}
	for name, n := range rebuilt {
		counter(mRebuilt, float64(n), name)
	}
	counter(mReconnects, float64(c.reconnects))
	counter(mRestarts, float64(restarts))
	if verify != nil {
		counter(mVerifyRuns, float64(verify.rounds.Load()))
	}
	ready, stalled, recurrences := 0.0, 0.0, 0.0
	if phase == "streaming" && stall == nil && stuck == 0 {
		ready = 1
	}
	gaugeOf(mStuck, stuck.Seconds())
	if stall != nil {
		stalled, recurrences = 1, float64(stall.Recurrences)
	}
	gaugeOf(mReady, ready)
	gaugeOf(mStalled, stalled)
	gaugeOf(mStallCount, recurrences)
	if p != nil {
		collectStream(ch, p)
	}
	ch <- prometheus.MustNewConstMetric(mBuild, prometheus.GaugeValue, 1, buildinfo.Version(), buildinfo.GoVersion())
	if slot != nil && slot.Exists {
		collectSlot(ch, slot)
	}
}

// gaugeTo returns a function that sends a gauge's value to ch.
func gaugeTo(ch chan<- prometheus.Metric) func(d *prometheus.Desc, v float64, labels ...string) {
	return func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
}

// collectStream sends the metrics of the stream's position and lag.
func collectStream(ch chan<- prometheus.Metric, p *pipeline.Pipeline) {
	gaugeOf := gaugeTo(ch)
	st := p.SourceStats()
	lag := 0.0
	if st.ServerWALEnd > st.AckedLSN {
		lag = float64(st.ServerWALEnd - st.AckedLSN)
	}
	gaugeOf(mLag, lag)
	gaugeOf(mAcked, float64(st.AckedLSN))
	gaugeOf(mBuffered, float64(st.BufferedChanges))
	lag, last := p.Lag(time.Now())
	gaugeOf(mLagSeconds, lag)
	if !last.IsZero() {
		gaugeOf(mLastCommit, float64(last.UnixNano())/1e9)
	}
}

// collectSlot sends the metrics of the replication slot.
func collectSlot(ch chan<- prometheus.Metric, slot *cdc.SlotInfo) {
	gaugeOf := gaugeTo(ch)
	gaugeOf(mRetained, float64(slot.RetainedBytes))
	if slot.SafeWALSize >= 0 {
		gaugeOf(mSafeWAL, float64(slot.SafeWALSize))
	}
	for _, s := range walStatuses {
		v := 0.0
		if s == slot.WALStatus {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(mWALStatus, prometheus.GaugeValue, v, s)
	}
	active := 0.0
	if slot.Active {
		active = 1
	}
	gaugeOf(mSlotActive, active)
	gaugeOf(mSlotLag, float64(slot.LagBytes))
}

// serveMetrics serves /metrics, /healthz and /readyz on addr until ctx is
// done. It returns once the listener is bound; wait returns once the server
// has shut down.
func serveMetrics(ctx context.Context, addr string, o *observer, log *slog.Logger) (_ net.Addr, wait func(), err error) {
	reg := prometheus.NewRegistry()
	// The Go runtime's and the process's series (go_*, process_*: heap,
	// GC, goroutines, RSS, CPU, open files) beside fkmat's own.
	for _, c := range []prometheus.Collector{o, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return nil, nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		o.mu.Lock()
		phase, stall, stuck := o.phase, o.stall, o.stuckLocked(time.Now())
		o.mu.Unlock()
		if stuck > 0 {
			http.Error(w, fmt.Sprintf("not ready: the stream has not moved for %s while changes wait (a server hung or slow?)",
				stuck.Round(time.Second)), http.StatusServiceUnavailable)
			return
		}
		if stall != nil {
			http.Error(w, fmt.Sprintf("not ready: stalled at %s (%d recurrences of the same error)", stall.Position, stall.Recurrences),
				http.StatusServiceUnavailable)
			return
		}
		if phase != "streaming" {
			http.Error(w, "not ready: "+phase, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen on --metrics-addr %s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	var g errgroup.Group
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	g.Go(func() error {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped; the daemon goes on without it", "err", err)
		}
		return nil
	})
	return l.Addr(), func() { _ = g.Wait() }, nil
}

// verifyCounters are the background verifier's figures, read by /metrics:
// the rounds completed over every join, and each join's own figures.
type verifyCounters struct {
	rounds atomic.Int64
	joins  sync.Map // join name → *joinVerify
}

// joinVerify are one join's verification figures.
type joinVerify struct {
	checked atomic.Int64 // rows compared, in all rounds
	// current counts the confirmed differences of the join's verification
	// in progress, last those of its last completed one.
	current, last atomic.Int64
}

// join returns the figures of the join named name.
func (v *verifyCounters) join(name string) *joinVerify {
	jv, _ := v.joins.LoadOrStore(name, &joinVerify{})
	return jv.(*joinVerify)
}

// each calls fn with every join's figures.
func (v *verifyCounters) each(fn func(name string, jv *joinVerify)) {
	v.joins.Range(func(k, jv any) bool {
		fn(k.(string), jv.(*joinVerify))
		return true
	})
}

// checked is the rows compared over every join.
func (v *verifyCounters) checked() (n int64) {
	v.each(func(_ string, jv *joinVerify) { n += jv.checked.Load() })
	return n
}

// differences is the sum of the joins' differences.
func (v *verifyCounters) differences() (n int64) {
	v.each(func(_ string, jv *joinVerify) { n += jv.differences() })
	return n
}

// differences is the gauge fkmat_verify_differences{join}: the confirmed
// differences of the join's last completed verification, or of the one in
// progress once it has found more.
func (jv *joinVerify) differences() int64 { return max(jv.current.Load(), jv.last.Load()) }

// waitShort sums the Redis writes that run --redis-wait-replicas could not
// confirm, over every join's states, and says why the last of them (of
// some state) came short.
func waitShort(joins []pipeline.Join) (n int64, why string) {
	for _, j := range joins {
		for _, s := range j.Stores() {
			if k := s.WaitShort(); k > 0 {
				n += k
				why = s.LastWaitShort()
			}
		}
	}
	return n, why
}
