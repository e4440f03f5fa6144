package fkmat

import (
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/fkmat/fkmat/internal/pipeline"
)

// What Run does when the Redis state of a join is lost or foreign.
const (
	LostStateRebuild = "rebuild" // run the backfill again (default)
	LostStateRefuse  = "refuse"  // stop with an error naming fkmat backfill --force
)

// Options tune the daemon and the commands. The zero value is usable.
type Options struct {
	// Logger receives logs; nil discards them.
	Logger *slog.Logger
	// Batch bounds the batches of the streaming loop.
	Batch pipeline.BatchLimits
	// OnLostState is LostStateRebuild (default) or LostStateRefuse.
	OnLostState string
	// RedisWaitReplicas, when positive, makes every Redis write that
	// advances a checkpoint wait (WAIT, up to redisstore.DefaultWaitTimeout)
	// until that many replicas of each primary written to have it, so that
	// a failover rarely loses acknowledged state (which is then rebuilt).
	RedisWaitReplicas int
	// SubShards and RowShards override the Redis layout (tests use small
	// values); zero means redisstore's defaults.
	SubShards, RowShards int
	// PageSize bounds the dependents resolved per fan-out page; zero means
	// join.DefaultPageSize.
	PageSize int
	// SlotBusyTimeout is how long run waits for a replication slot that
	// another process streams from before it stops with cdc.ErrSlotInUse;
	// zero means cdc.DefaultSlotBusyTimeout.
	SlotBusyTimeout time.Duration
	// Standby makes run a standby: before anything else (it writes
	// nothing meanwhile) it waits, without limit, until no other process
	// holds the replication slot, then starts as run does; and when
	// another process takes the slot first, it waits again instead of
	// stopping. See waitForSlot.
	Standby bool
	// TargetChunkBytes bounds the left table's bytes each transaction of
	// a backfill's target fill reads, within the source's database; zero
	// means DefaultTargetChunkBytes (tests use small values).
	TargetChunkBytes int64
	// PartitionCheckInterval is how often run compares the partitions of
	// the joined partitioned tables with the ones it knows; zero means
	// DefaultPartitionCheckInterval.
	PartitionCheckInterval time.Duration
	// GrowCheckInterval is how often run compares the joined tables' sizes
	// with their Redis states' layouts and resizes the states they
	// outgrew; zero means DefaultGrowCheckInterval.
	GrowCheckInterval time.Duration
	// ProgressBars, when set (a terminal), shows backfill progress bars on
	// it; otherwise progress goes to Logger as periodic lines.
	ProgressBars io.Writer
	// Force lets a rebuild (backfill --force) replace a target that fkmat
	// built for the join but whose shape no longer matches the definition
	// (e.g. a column added to a table joined with the default "all columns").
	Force bool
	// MetricsAddr, when set, serves Prometheus /metrics, /healthz and
	// /readyz on that address while Run runs.
	MetricsAddr string
	// MaxStallRestarts is how many times run restarts a pipeline that fails
	// with the same error at the same source position before it stops
	// with ErrStalled; zero means DefaultMaxStallRestarts.
	MaxStallRestarts int
	// MetricsBound, when set, receives the address the metrics server
	// listens on (useful with port 0).
	MetricsBound func(net.Addr)
	// SlotRetainedWarn is the WAL the slot may retain on the source before
	// run warns; zero means DefaultSlotRetainedWarn. run warns as well when
	// the slot's safe_wal_size falls below it.
	SlotRetainedWarn int64
	// SlotCheckInterval is how often run samples the slot and reports
	// itself in fkmat.daemon; zero means 10 s.
	SlotCheckInterval time.Duration
	// SummaryInterval is how often run logs its summary line; zero means
	// a minute.
	SummaryInterval time.Duration
	// VerifyInterval, when set, makes run compare every target with its SQL
	// join in the background, a round per interval (see verifyLoop).
	VerifyInterval time.Duration
	// online lets run build a join whose definition changed beside the
	// running one (daemon_rebuild.go); rebuildAll builds every join so
	// (backfill --force while the joins stream).
	online, rebuildAll bool
	// StuckAfter is how long the stream may stand still while changes wait
	// before /readyz says not ready (a hung Redis, a frozen target); zero
	// means DefaultStuckAfter.
	StuckAfter time.Duration
	// VerifyWait bounds how long verify waits for a streaming daemon to
	// pass the source's position before it compares; zero means
	// DefaultVerifyWait.
	VerifyWait time.Duration
	// MaxInactive is how long status accepts that no daemon streams from a
	// streaming join's slot before it reports a problem; zero means
	// DefaultMaxInactive.
	MaxInactive time.Duration
}

// The defaults of Options' durations and limits.
const (
	// DefaultStuckAfter is the default Options.StuckAfter.
	DefaultStuckAfter = 30 * time.Second
	// DefaultMaxInactive is the default Options.MaxInactive.
	DefaultMaxInactive = 5 * time.Minute
	// DefaultSlotRetainedWarn is the default Options.SlotRetainedWarn: 1 GiB.
	DefaultSlotRetainedWarn = 1 << 30
	// DefaultGrowCheckInterval is the default Options.GrowCheckInterval.
	DefaultGrowCheckInterval = time.Minute
	// DefaultPartitionCheckInterval is how often the daemon compares the
	// partitions of the joined partitioned tables with the ones it knows
	// (Options.PartitionCheckInterval).
	DefaultPartitionCheckInterval = 2 * time.Second
	// DefaultMaxStallRestarts is how many times the same error may recur at
	// the same source position before run gives up (Options.MaxStallRestarts).
	DefaultMaxStallRestarts = 10
	// DefaultVerifyWait is the default Options.VerifyWait.
	DefaultVerifyWait = time.Minute
)

// setDefaults fills the zero fields with their defaults.
func (o *Options) setDefaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	orDefault(&o.OnLostState, LostStateRebuild)
	orDefault(&o.MaxStallRestarts, DefaultMaxStallRestarts)
	orDefault(&o.SlotRetainedWarn, DefaultSlotRetainedWarn)
	orDefault(&o.SummaryInterval, time.Minute)
	orDefault(&o.MaxInactive, DefaultMaxInactive)
	orDefault(&o.VerifyWait, DefaultVerifyWait)
	orDefault(&o.StuckAfter, DefaultStuckAfter)
	orDefault(&o.SlotCheckInterval, 10*time.Second)
	orDefault(&o.PartitionCheckInterval, DefaultPartitionCheckInterval)
	orDefault(&o.GrowCheckInterval, DefaultGrowCheckInterval)
	o.Batch.SetDefaults()
}

// slotBusyTimeout is how long the stream and a backfill wait for a slot
// that another process holds. A standby has waited for the slot before it
// started, without limit: a slot held now was taken by another process
// first, and the standby goes back to waiting at once.
func (o *Options) slotBusyTimeout() time.Duration {
	if o.Standby {
		return time.Nanosecond
	}
	return o.SlotBusyTimeout
}

// orDefault sets *v to def when it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
