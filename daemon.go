package fkmat

import (
	"context"
	cryptorand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"

	"github.com/fkmat/fkmat/internal/config"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/migrations"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
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

// DefaultStuckAfter is the default Options.StuckAfter.
const DefaultStuckAfter = 30 * time.Second

// DefaultMaxInactive is the default Options.MaxInactive.
const DefaultMaxInactive = 5 * time.Minute

// DefaultSlotRetainedWarn is the default Options.SlotRetainedWarn: 1 GiB.
const DefaultSlotRetainedWarn = 1 << 30

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

// daemon holds the connections and components every command shares.
type daemon struct {
	cfg    *config.Config
	opts   Options
	log    *slog.Logger
	source *pgxpool.Pool
	target *pgxpool.Pool
	rdb    redis.UniversalClient
	plans  []*plan.JoinPlan
	cdc    *cdc.Client
	writer *sink.Writer
	joins  []pipeline.Join
	obs    *observer // nil without --metrics-addr
	// builds are the joins to build anew beside the running ones (a
	// changed definition, backfill --force): d.plans holds their old
	// definitions meanwhile (daemon_rebuild.go).
	builds []*rebuild
	// phases are the joins' phases in fkmat.join_state, as open read them.
	phases map[string]string
	// streaming says the joins stream while this daemon loads (a rebuild
	// beside them): the load spares their slot (chunkTarget).
	streaming bool
	// switching orders a rebuild's switch with the partition moves: a move
	// commits its rows into the WAL wholly before the switch's marker or
	// not in this run (the next one follows the change again), never
	// across it.
	switching sync.Mutex
}

// open connects to the source, the target and Redis, resolves the joins
// against the source catalog, migrates the target's metadata schema, creates
// (or checks) the target tables and opens each join's Redis state.
func open(ctx context.Context, cfg *config.Config, opts Options) (_ *daemon, err error) {
	opts.setDefaults()
	d := &daemon{cfg: cfg, opts: opts, log: opts.Logger}
	// d, not the result: a failing return has already set the result to nil.
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.source, err = connectPostgres(ctx, cfg.Source, "source", cfg.TimeZone); err != nil {
		return nil, err
	}
	if d.target, err = connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone); err != nil {
		return nil, err
	}
	if d.rdb, err = connectRedis(ctx, cfg.Redis); err != nil {
		return nil, err
	}
	if d.plans, err = plan.Resolve(ctx, d.source, cfg); err != nil {
		return nil, err
	}
	if err := migrate(ctx, d.target); err != nil {
		return nil, err
	}
	if err := checkOwners(ctx, d.target, cfg); err != nil {
		return nil, err
	}
	if err := recordPublication(ctx, d.target, cfg); err != nil {
		return nil, err
	}
	d.writer = sink.NewWriter(d.target)
	gens := make([]int, len(d.plans))
	d.phases = map[string]string{}
	for i, p := range d.plans {
		if err := d.widen(ctx, p); err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		st, err := d.loadJoinState(ctx, p.Name)
		if err != nil {
			return nil, err
		}
		gens[i] = st.generation
		if st.exists {
			d.phases[p.Name] = st.phase
		}
		b, err := d.planRebuild(ctx, p, st)
		if err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		if b != nil {
			d.builds = append(d.builds, b)
			d.plans[i] = b.old // until the new one is switched in; nil: frozen
			p = b.old
		}
		if p == nil {
			continue
		}
		// A join whose backfill was interrupted is backfilled again, and
		// the backfill swaps the new shape in.
		if err := d.ensureTarget(ctx, p, d.opts.Force || (st.exists && st.phase != "streaming")); err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
	}
	for _, b := range d.builds {
		if b.old == nil {
			if err := d.freeze(ctx, b); err != nil {
				return nil, err
			}
		}
	}
	published := slices.DeleteFunc(slices.Clone(d.plans), func(p *plan.JoinPlan) bool { return p == nil })
	for _, b := range d.builds {
		published = append(published, b.plan)
	}
	if d.cdc, err = cdc.New(cdc.Config{
		ConnString: cfg.Source, Slot: cfg.Slot, Publication: cfg.Publication,
		Tables: publishedTables(published), Logger: d.log, SlotBusyTimeout: opts.slotBusyTimeout(),
	}); err != nil {
		return nil, err
	}
	var running []*plan.JoinPlan
	for i, p := range d.plans {
		if p == nil {
			continue // frozen until its rebuild switches in
		}
		j, err := d.openJoin(ctx, p, gens[i])
		if err != nil {
			return nil, err
		}
		if j, err = d.serveLayout(ctx, j, gens[i]); err != nil {
			return nil, fmt.Errorf("join %q: %w", p.Name, err)
		}
		d.joins = append(d.joins, j)
		running = append(running, p)
	}
	d.plans = running
	return d, nil
}

// openJoin opens a join's Redis state (one per entry of a join of more
// than two tables) of generation gen (fkmat.join_state.generation) and its
// engine.
func (d *daemon) openJoin(ctx context.Context, p *plan.JoinPlan, gen int) (pipeline.Join, error) {
	prefixes := redisstore.StatePrefixes(d.cfg.Slot, p.Name, len(p.Edges), gen)
	stores := make([]*redisstore.Store, len(prefixes))
	for t, prefix := range prefixes {
		var err error
		stores[t], err = redisstore.Open(ctx, d.rdb, redisstore.Config{
			Prefix: prefix, SubShards: d.opts.SubShards, RowShards: d.opts.RowShards, WaitReplicas: d.opts.RedisWaitReplicas,
		})
		if err != nil {
			if p.Edges == nil {
				return nil, fmt.Errorf("join %q: %w", p.Name, err)
			}
			return nil, fmt.Errorf("join %q: table %d: %w", p.Name, t, err)
		}
	}
	return d.joinOn(p, stores)
}

// joinOn returns join p's engine on its Redis states stores.
func (d *daemon) joinOn(p *plan.JoinPlan, stores []*redisstore.Store) (pipeline.Join, error) {
	if p.Edges == nil {
		return pipeline.NewPair(p, stores[0], d.opts.PageSize)
	}
	return pipeline.NewTree(p, stores, d.opts.PageSize)
}

// sizes returns what each of the join's states is sized for at Init.
func (d *daemon) sizes(ctx context.Context, p *plan.JoinPlan) []redisstore.Size {
	if p.Edges == nil {
		return []redisstore.Size{{LeftRows: d.estimate(ctx, p.Left.Table), RightRows: d.estimate(ctx, p.Right.Table)}}
	}
	// A table's state holds its rows and the references of the entries
	// its rows reference: the references to an entry with many rows
	// referencing each of its keys (a supplier's lineitems) are spread
	// over lanes, by its average.
	rows := []int64{d.estimate(ctx, p.Left.Table)}
	for _, e := range p.Edges {
		rows = append(rows, d.estimate(ctx, e.Table.Table))
	}
	out := make([]redisstore.Size, len(rows))
	for t := range out {
		out[t].LeftRows = rows[t]
	}
	for i, e := range p.Edges {
		from, entry := e.Parent+1, i+1
		if rows[entry] > 0 && rows[from] > 0 {
			if fan := redisstore.FanFor(float64(rows[from]) / float64(rows[entry])); fan > 1 {
				if out[from].Fans == nil {
					out[from].Fans = map[byte]int{}
				}
				out[from].Fans[pipeline.EdgeKey(entry, "")[0]] = fan
			}
		}
	}
	return out
}

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

func (d *daemon) close() {
	if d.source != nil {
		d.source.Close()
	}
	if d.target != nil {
		d.target.Close()
	}
	if d.rdb != nil {
		_ = d.rdb.Close()
	}
}

// publishedTables lists the tables of the joins, each once: joins may share
// tables, and a self-referencing join uses one table on both sides.
func publishedTables(plans []*plan.JoinPlan) []cdc.TableName {
	tables := make([]config.TableName, 0, 2*len(plans))
	for _, p := range plans {
		tables = append(tables, p.Tables()...)
	}
	return uniqueTables(tables)
}

// configuredTables is publishedTables from the configuration alone, for the
// commands that work without resolving the joins (teardown).
func configuredTables(cfg *config.Config) []cdc.TableName {
	tables := make([]config.TableName, 0, 2*len(cfg.Joins))
	for _, j := range cfg.Joins {
		tables = append(tables, j.Tables()...)
	}
	return uniqueTables(tables)
}

func uniqueTables(tables []config.TableName) []cdc.TableName {
	seen := map[config.TableName]bool{}
	var out []cdc.TableName
	for _, t := range tables {
		if !seen[t] {
			seen[t] = true
			out = append(out, cdc.TableName{Schema: t.Schema, Name: t.Name})
		}
	}
	return out
}

// processSession tells this process's Postgres sessions from another
// fkmat's: their application_name is "fkmat <processSession>", which the
// slot's owner records (sink.Writer.Fence) so that a run taking the slot
// over can end them (endSessions).
var processSession = func() string {
	b := make([]byte, 4)
	_, _ = cryptorand.Read(b)
	return hex.EncodeToString(b)
}()

// sessionLimits are the limits fkmat sets on its Postgres sessions: an
// idle transaction (a frozen process's) ends after a minute, a lock is
// waited for 30 s (then the batch is retried), a statement runs at most
// 12 hours (a backfill's INSERT … SELECT of a join of 10^8 rows included).
// A parameter of the same name in the URL wins.
var sessionLimits = map[string]string{
	"idle_in_transaction_session_timeout": "60s",
	"lock_timeout":                        "30s",
	"statement_timeout":                   "12h",
}

// textSettings are the settings fkmat fixes on its Postgres sessions: its
// filters and computed columns are evaluated under them, and values read
// in text form do not depend on the server's or the URL's. TimeZone is the
// configuration's (timezone:, UTC by default).
func textSettings(tz string) map[string]string {
	if tz == "" {
		tz = "UTC"
	}
	out := map[string]string{"TimeZone": tz}
	for name, value := range cdc.TextSettings {
		out[name] = value
	}
	return out
}

func connectPostgres(ctx context.Context, url, what, tz string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%s database URL %s: %w", what, config.RedactURL(url), redactErr(err, url))
	}
	pc.MaxConns = 8
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = "fkmat " + processSession
	}
	// A session of a process that froze (a GC pause, a stopped VM) must not
	// hold locks for ever: the server ends it. These bound fkmat's own
	// statements too; a parameter of the URL's wins.
	for name, value := range sessionLimits {
		if _, ok := pc.ConnConfig.RuntimeParams[name]; !ok {
			pc.ConnConfig.RuntimeParams[name] = value
		}
	}
	for name, value := range textSettings(tz) {
		pc.ConnConfig.RuntimeParams[name] = value
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to %s database %s: %w", what, config.RedactURL(url), redactErr(err, url))
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
			return nil, fmt.Errorf("%w: connect to %s database %s: %w", errAuthentication, what, config.RedactURL(url), redactErr(err, url))
		}
		if isCertificateError(err) {
			return nil, fmt.Errorf("%w: connect to %s database %s: %w", errCertificate, what, config.RedactURL(url), redactErr(err, url))
		}
		return nil, fmt.Errorf("connect to %s database %s: %w", what, config.RedactURL(url), redactErr(err, url))
	}
	return pool, nil
}

// isCertificateError reports whether err is a TLS server certificate
// verification failure.
func isCertificateError(err error) bool {
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return true
	}
	_, ok := errors.AsType[x509.CertificateInvalidError](err)
	return ok
}

// connectRedis connects to the Redis of url: one server (redis://,
// rediss://) or a Redis Cluster (redis+cluster://, rediss+cluster://, with
// comma-separated seed nodes), and checks that it answers.
func connectRedis(ctx context.Context, url string) (redis.UniversalClient, error) {
	rdb, err := newRedisClient(url)
	if err != nil {
		return nil, fmt.Errorf("redis URL %s: %w", config.RedactURL(url), redactErr(err, url))
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		if msg := err.Error(); strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH") {
			return nil, fmt.Errorf("%w: connect to redis %s: %w", errAuthentication, config.RedactURL(url), redactErr(err, url))
		}
		if isCertificateError(err) {
			return nil, fmt.Errorf("%w: connect to redis %s: %w", errCertificate, config.RedactURL(url), redactErr(err, url))
		}
		return nil, fmt.Errorf("connect to redis %s: %w", config.RedactURL(url), redactErr(err, url))
	}
	return rdb, nil
}

// resolveSource connects to the source database and resolves the joins
// against its catalog; the caller closes the pool.
func resolveSource(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, []*plan.JoinPlan, error) {
	source, err := connectPostgres(ctx, cfg.Source, "source", cfg.TimeZone)
	if err != nil {
		return nil, nil, err
	}
	plans, err := plan.Resolve(ctx, source, cfg)
	if err != nil {
		source.Close()
		return nil, nil, err
	}
	return source, plans, nil
}

// openTarget connects to the target database and brings fkmat's metadata
// schema up to date; the caller closes the pool.
func openTarget(ctx context.Context, cfg *config.Config) (*pgxpool.Pool, error) {
	target, err := connectPostgres(ctx, cfg.Target, "target", cfg.TimeZone)
	if err != nil {
		return nil, err
	}
	if err := migrate(ctx, target); err != nil {
		target.Close()
		return nil, err
	}
	return target, nil
}

// newRedisClient returns a client of url, without connecting.
func newRedisClient(raw string) (redis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	base, cluster := strings.CutSuffix(scheme, "+cluster")
	if !ok || !cluster {
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, err
		}
		return redis.NewClient(o), nil
	}
	if base != "redis" && base != "rediss" {
		return nil, fmt.Errorf("scheme %s: use redis+cluster:// or rediss+cluster://", scheme)
	}
	// redis+cluster://[user:password@]host:port[,host:port...][/][?params]
	auth, hosts := "", rest
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		auth, hosts = rest[:i+1], rest[i+1:]
	}
	query := ""
	if i := strings.IndexByte(hosts, '?'); i >= 0 {
		hosts, query = hosts[:i], hosts[i+1:]
	}
	switch path := hosts[strings.IndexByte(hosts+"/", '/'):]; path {
	case "", "/", "/0":
		hosts = strings.TrimSuffix(strings.TrimSuffix(hosts, path), "/")
	default:
		return nil, fmt.Errorf("database %s: a Redis Cluster has only database 0; remove it from the URL", path)
	}
	seeds := strings.Split(hosts, ",")
	for _, h := range seeds {
		if h == "" || !strings.Contains(h, ":") {
			return nil, fmt.Errorf("seed node %q: give every seed node as host:port, comma-separated", h)
		}
	}
	u := base + "://" + auth + seeds[0]
	params := []string{}
	if query != "" {
		params = append(params, query)
	}
	for _, h := range seeds[1:] {
		params = append(params, "addr="+h)
	}
	if len(params) > 0 {
		u += "?" + strings.Join(params, "&")
	}
	o, err := redis.ParseClusterURL(u)
	if err != nil {
		return nil, err
	}
	if o.TLSConfig != nil {
		// Each node is verified against its own host name (the dialer
		// takes it from the address), not the first seed's.
		o.TLSConfig.ServerName = ""
		o.TLSConfig.MinVersion = tls.VersionTLS12
	}
	return redis.NewClusterClient(o), nil
}

// redactErr returns err with any password of url removed from its
// message, and err still in its chain.
func redactErr(err error, url string) error {
	msg := err.Error()
	if pw := config.PasswordOf(url); pw != "" {
		msg = strings.ReplaceAll(msg, pw, "xxxxx")
	}
	return &redactedError{msg: msg, err: err}
}

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return migrations.Up(ctx, db)
}

// joinState is a join's row in fkmat.join_state.
type joinState struct {
	exists        bool
	epoch         string
	fingerprint   string
	phase         string
	consistentLSN wal.LSN
	// definition is the one the join was built with (plan.Definition); nil
	// for a join built before fkmat kept it.
	definition []byte
	// widenedLSN is where the last widening was followed (0: none).
	widenedLSN wal.LSN
	// generation is the Redis state's (GenerationPrefix).
	generation int
	// frozenLSN, when set, is where the join stopped being maintained
	// until a rebuild beside it switches in (planRebuild).
	frozenLSN wal.LSN
}

func (d *daemon) loadJoinState(ctx context.Context, name string) (joinState, error) {
	return readJoinState(ctx, d.target, d.cfg.Slot, name)
}

// definitionChanged is the error run stops with when the definition of join
// name changed since its backfill other than by widened types (which open
// follows, daemon.widen); check reports the same.
func definitionChanged(name string) error {
	return &config.ConfigError{Problems: []string{fmt.Sprintf(
		"the definition of join %q (tables, keys, columns or types) changed since its backfill, other than by widened column types; "+
			"run fkmat backfill --force to rebuild it (the target keeps its rows until the rebuild replaces them)", name)}}
}

// readJoinState reads join name's row of fkmat.join_state for slot.
func readJoinState(ctx context.Context, db querier, slot, name string) (joinState, error) {
	var s joinState
	var lsn, widened, frozen *string
	err := db.QueryRow(ctx, `
		SELECT epoch, fingerprint, phase, consistent_lsn::text, definition::text, widened_lsn::text, generation, frozen_lsn::text FROM fkmat.join_state
		WHERE slot = $1 AND join_name = $2`, slot, name).Scan(&s.epoch, &s.fingerprint, &s.phase, &lsn, &s.definition, &widened, &s.generation, &frozen)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read state of join %q: %w", name, err)
	}
	s.exists = true
	for _, f := range []struct {
		text *string
		lsn  *wal.LSN
	}{{lsn, &s.consistentLSN}, {widened, &s.widenedLSN}, {frozen, &s.frozenLSN}} {
		if f.text != nil {
			if *f.lsn, err = wal.ParseLSN(*f.text); err != nil {
				return s, fmt.Errorf("read state of join %q: %w", name, err)
			}
		}
	}
	return s, nil
}

// assess says whether the joins can stream from their checkpoints, or why
// a backfill is needed ("" = ready).
func (d *daemon) assess(ctx context.Context) (reason string, lost bool, err error) {
	info, err := d.cdc.SlotInfo(ctx)
	if err != nil {
		return "", false, err
	}
	targetLSN, err := d.writer.Checkpoint(ctx, d.cfg.Slot)
	if err != nil {
		return "", false, err
	}
	for _, j := range d.joins {
		st, err := d.loadJoinState(ctx, j.Plan().Name)
		if err != nil {
			return "", false, err
		}
		switch {
		case !st.exists:
			return fmt.Sprintf("join %q was never backfilled", j.Plan().Name), false, nil
		case st.phase != "streaming":
			return fmt.Sprintf("the backfill of join %q was interrupted; starting it again", j.Plan().Name), false, nil
		case st.fingerprint != j.Plan().Fingerprint:
			return "", false, definitionChanged(j.Plan().Name)
		case !info.Exists:
			return fmt.Sprintf("replication slot %q is gone", d.cfg.Slot), true, nil
		}
		// A join of more than two tables has one state per table: any of them lost is the
		// join's state lost.
		for _, store := range j.Stores() {
			if why, lost, err := assessStore(ctx, j.Plan().Name, store, st.epoch, targetLSN); why != "" || err != nil {
				return why, lost, err
			}
		}
	}
	return "", false, nil
}

// assessStore is assess for one Redis state of a join.
func assessStore(ctx context.Context, name string, store *redisstore.Store, epoch string, targetLSN wal.LSN) (string, bool, error) {
	meta, err := store.Meta(ctx)
	switch {
	case errors.Is(err, redisstore.ErrNoState):
		return fmt.Sprintf("the Redis state of join %q is lost (no state under %s)", name, store.Config().Prefix), true, nil
	case err != nil:
		return "", false, fmt.Errorf("join %q: %w", name, err)
	case meta.Epoch != epoch:
		return fmt.Sprintf("the Redis state of join %q is foreign (epoch %s, the target was built with %s)", name, meta.Epoch, epoch), true, nil
	case store.CheckLayout(meta) != nil:
		return fmt.Sprintf("the Redis state of join %q has another layout (%s)", name, meta.Layout), true, nil
	case meta.Checkpoint > targetLSN:
		// Redis is committed after the target, so it is never ahead of
		// it: the target was restored from an older backup, or the state
		// belongs to another run. Streaming from it would skip changes.
		return fmt.Sprintf("the Redis state of join %q is ahead of the target (%s > %s)",
			name, meta.Checkpoint, targetLSN), true, nil
	}
	// On a Redis Cluster: finish a write a crash left half done, and find
	// shards that a failover or a flushed node set back.
	if err := store.Resume(ctx); errors.Is(err, redisstore.ErrLost) {
		return fmt.Sprintf("the Redis state of join %q lost writes: %v", name, err), true, nil
	} else if err != nil {
		return "", false, fmt.Errorf("join %q: %w", name, err)
	}
	return "", false, nil
}

// ensureTarget creates the target or checks its shape. A target fkmat built
// for this join whose shape no longer matches is left to be replaced when
// replace says a backfill swaps the new rows and shape in (Options.Force,
// or a backfill due anyway), unless what is attached to it would be lost;
// otherwise it is reported with that fix.
func (d *daemon) ensureTarget(ctx context.Context, p *plan.JoinPlan, replace bool) error {
	_, err := d.writer.EnsureTable(ctx, &p.Target)
	if !errors.Is(err, sink.ErrShapeMismatch) {
		return err
	}
	var owned bool
	if qerr := d.target.QueryRow(ctx, `SELECT EXISTS (SELECT FROM fkmat.join_state
		WHERE slot = $1 AND join_name = $2 AND target_schema = $3 AND target_table = $4)`,
		d.cfg.Slot, p.Name, p.Target.Schema, p.Target.Name).Scan(&owned); qerr != nil {
		return fmt.Errorf("look up the owner of %s: %w", p.Target.Ident(), qerr)
	}
	if !owned {
		return err
	}
	if !replace {
		return fmt.Errorf("%w; fkmat built this table for the join: run fkmat backfill --force to rebuild it with the new shape", err)
	}
	attached, aerr := d.writer.Attached(ctx, &p.Target)
	if aerr != nil {
		return aerr
	}
	if len(attached) > 0 {
		return fmt.Errorf("%w %s with the join's new shape: %s are attached to it, and replacing the table would lose them "+
			"(fkmat carries over grants and comments only): drop them, run fkmat backfill --force, and create them again (%w)",
			sink.ErrCannotSwap, p.Target.Ident(), strings.Join(attached, ", "), err)
	}
	d.log.Warn("the target has the join's old shape: the backfill replaces it with the new one when it is done", "target", p.Target.Ident())
	return nil
}
