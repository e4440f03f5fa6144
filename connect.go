package fkmat

import (
	"context"
	cryptorand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/migrations"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
)

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
// comma-separated seed nodes), and checks that it answers and is not older
// than redisstore.MinVersion.
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
	if err := redisstore.CheckVersion(ctx, rdb); err != nil {
		_ = rdb.Close()
		if errors.Is(err, redisstore.ErrTooOld) {
			return nil, &config.ConfigError{Problems: []string{fmt.Sprintf("redis %s: %v", config.RedactURL(url), err)}}
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
