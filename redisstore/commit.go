package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

// Commit persists a batch's mutations together with its checkpoint lsn in one
// MULTI/EXEC: a reader sees all of it or none of it. It is idempotent by
// checkpoint: a batch whose lsn is not above the stored checkpoint was
// already applied (a replay after a crash) and is skipped, so a replayed
// Clear never wipes what later batches wrote. A Clear bumps the side's
// generation inside the same transaction; the old generation's keys are left
// to Sweep. Large sets are split into commands of at most Config.PageSize
// arguments, all inside the one MULTI.
//
// The same MULTI sets the subscription count (Meta.Subscriptions): 0 after
// a ClearLeft, plus len(m.AddSubs) minus len(m.DelSubs), since the engine's
// mutations are net (see countSubs). Should the replies of the ZADDs and
// ZREMs show otherwise, Commit corrects the count right after (fixSubs);
// on a cluster only when every shard's reply arrived (see apply).
//
// Commit fails with ErrEpoch when the state was re-initialised by someone
// else, and with ErrInFlight while a transaction written by CommitPartial is
// neither finished nor rolled back. After any other error it is safe to call
// Commit again with the same batch: the store reloads the checkpoint and
// skips the batch if it was applied after all.
func (s *Store) Commit(ctx context.Context, m join.Mutations, lsn wal.LSN) error {
	if lsn == 0 {
		return errors.New("commit redis state: LSN 0 is invalid")
	}
	if m.Tables != nil {
		return errors.New("commit redis state: the mutations of a join of several tables are committed table by table, each in its own state")
	}
	pl := s.takePlanner()
	defer s.givePlanner(pl)
	return s.writeUnit(ctx, unitWrite{
		what: "commit redis state at " + lsn.String(), name: "commit at " + lsn.String(),
		skip: func(cached Meta) bool { return lsn <= cached.Checkpoint && cached.InFlight == 0 },
		prepare: func(_ context.Context, _ *redis.Tx, stored Meta) (Meta, *writes, int64, error) {
			if stored.InFlight != 0 {
				return stored, nil, 0, inFlightError(stored.InFlight)
			}
			next := stored
			if lsn <= stored.Checkpoint {
				return next, nil, 0, nil
			}
			next.Checkpoint = lsn
			if m.ClearLeft {
				next.LeftGen++
			}
			if m.ClearRight {
				next.RightGen++
			}
			planned := int64(len(m.AddSubs))
			if !m.ClearLeft { // plan drops the deletes of a cleared side
				planned -= int64(len(m.DelSubs))
			}
			next.Subscriptions = countSubs(stored.Subscriptions, m.ClearLeft, planned)
			w := s.plan(pl, &m, next)
			return next, &w, planned, nil
		},
		metaFields: func(next Meta) []any {
			return appendSubs([]any{fieldCheckpoint, strconv.FormatUint(uint64(next.Checkpoint), 10),
				fieldLeftGen, strconv.FormatUint(next.LeftGen, 10),
				fieldRightGen, strconv.FormatUint(next.RightGen, 10)}, next.Subscriptions)
		},
		waitReplicas: true,
		applied: func(wrote bool, next Meta) {
			if wrote {
				s.right.apply(next.RightGen, &m)
			}
		},
	})
}

// countSubs returns the subscription count after a write that adds delta
// subscriptions, net, to a count of old (negative: unknown), clearing the
// left side first when clear is set.
//
// The count is kept from the mutations rather than from the replies of the
// ZADDs and ZREMs, which arrive only after EXEC, too late for the MULTI that
// must also write the count. Lua scripts could count inside the MULTI, but
// on the test host (50k subscriptions per MULTI, 2^20 sets) they made the
// subscription writes 1.5 times as slow with one script per MULTI and 2.7
// times with one per command; reading ZMSCORE first, as CommitPartial does
// anyway, 1.4-1.5 times, plus a round trip. It relies on the engine's
// join.Mutations being net against the state the batch read, which the
// overlay guarantees (a subscription is added only when the stored left
// row does not have that foreign key, deleted only when it does, and a Clear
// makes the stored state count as empty) and join/jointest's strict store
// checks in the join package's tests. Replays are skipped by checkpoint
// before any of this. fixSubs covers callers that break the rule.
func countSubs(old int64, clear bool, delta int64) int64 {
	switch {
	case clear:
		return delta
	case old < 0:
		return -1
	}
	return old + delta
}

// fixSubs corrects the subscription count after a transaction that wrote
// the meta wrote, when the replies of its ZADDs and ZREMs show off more
// subscriptions than it counted: mutations that were not net, such as a
// batch applied again at a new LSN. It sets the count in one more MULTI, if
// the meta hash is still the one written; were it changed in between (by
// another writer, which the store does not support), it leaves it. A crash
// before the fix leaves the count off, as it would a caller's retry of the
// batch, which is skipped by checkpoint: only a batch that is not net risks
// it, and such a batch never comes from the engine.
func (s *Store) fixSubs(ctx context.Context, wrote Meta, off int64) error {
	if off == 0 || wrote.Subscriptions < 0 {
		return nil
	}
	fixed := wrote
	fixed.Subscriptions = max(wrote.Subscriptions+off, -1) // never below 0 when exact
	var execErr error
	key := s.keys.meta()
	err := s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		stored, err := readMeta(ctx, tx, key)
		if err != nil {
			return err
		}
		if stored != wrote {
			fixed = stored
			return nil
		}
		_, execErr = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if fixed.Subscriptions < 0 {
				p.HDel(ctx, key, fieldSubs)
			} else {
				p.HSet(ctx, key, fieldSubs, strconv.FormatInt(fixed.Subscriptions, 10))
			}
			return nil
		})
		return execErr
	}, key)
	if err := s.settle(ctx, err, execErr, fixed, "subscription count fix"); err != nil {
		return fmt.Errorf("fixing the subscription count failed: %w", err)
	}
	return nil
}

// sameState checks that the meta hash stored in Redis still belongs to the
// state the store's cache describes.
func sameState(cached, stored Meta) error {
	if stored.Epoch != cached.Epoch || stored.Layout != cached.Layout {
		return fmt.Errorf("%w: store has epoch %q, redis has %q", ErrEpoch, cached.Epoch, stored.Epoch)
	}
	return nil
}

// settle updates the cached meta after a write transaction on the meta hash:
// err is the outcome of the WATCH block, execErr the error of its MULTI/EXEC
// (nil when not sent), next the meta the transaction wrote and what names
// the transaction for the error that marks the state damaged. It returns err.
func (s *Store) settle(ctx context.Context, err, execErr error, next Meta, what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.right.drop() // what landed is not known
		s.resumed = false
	}
	switch {
	case err == nil:
		s.meta = &next
		return nil
	case isPartial(execErr):
		// EXEC ran and a command failed: Redis does not roll back. Drop the
		// epoch so that the daemon sees lost state and rebuilds.
		s.broken = fmt.Errorf("redis state is damaged by a failed %s (%v); re-initialise it", what, err)
		_ = s.rdb.HDel(context.WithoutCancel(ctx), s.keys.meta(), fieldEpoch).Err()
		s.meta = nil
	default:
		// Unknown whether EXEC ran (network error): reload before the next use.
		s.meta = nil
	}
	return err
}

// isPartial reports whether err, returned by a MULTI/EXEC, comes from a
// command that failed inside the executed transaction, rather than from a
// transaction that was discarded (EXECABORT: a command was rejected while
// queueing, e.g. for OOM or an ACL), aborted by WATCH, or not answered.
func isPartial(err error) bool {
	var rerr redis.Error
	if err == nil || !errors.As(err, &rerr) || errors.Is(err, redis.TxFailedErr) {
		return false
	}
	return !strings.HasPrefix(rerr.Error(), "EXECABORT")
}

// writes are a batch's commands grouped by key: the sorted-set members to
// remove and add, the hash fields to delete, and the field/value pairs to set;
// and keys to unlink (a sweep on a cluster).
type writes struct {
	zrem, zadd, hdel map[string][]string
	// hset holds each hash's fields and values, alternating.
	hset   map[string][]string
	unlink []string
	// args, when set, is the planner's memory for the commands' arguments.
	args *[]any
}

// queueData queues w in the MULTI p of a write that leads to next: on one
// server the commands themselves, on a cluster the redo record of a new
// write (see stage), which finishUnit applies once EXEC succeeded.
func (s *Store) queueData(ctx context.Context, p redis.Pipeliner, w writes, next *Meta) (subReplies, *redo, error) {
	if s.Cluster() {
		rd, err := s.stage(ctx, p, w, next, false)
		return subReplies{}, rd, err
	}
	return s.queue(ctx, p, w), nil, nil
}

func newWrites() writes {
	return writes{zrem: map[string][]string{}, zadd: map[string][]string{}, hdel: map[string][]string{}, hset: map[string][]string{}}
}

// planner groups a batch's writes by key (plan) into maps, lists and a
// buffer kept from batch to batch: a commit's grouping costs no allocation
// once they have grown to the batches' size. A plan is valid until the
// planner's next one; the store lends a planner to one write at a time
// (takePlanner).
type planner struct {
	w writes
	// free are the lists of the last plan, emptied, for the next one's keys.
	free [][]string
	// buf holds the rows' encodings; puts says whose they are.
	buf  []byte
	puts []put
	// args holds the commands' arguments (command).
	args []any
}

type put struct {
	key, field string
	end        int // where the row's encoding ends in buf
}

// maxKeptKeys bounds the keys a planner's map keeps room for.
const maxKeptKeys = 1 << 16

// reset empties the planner for a plan of m.
func (pl *planner) reset(m *join.Mutations) {
	if pl.w.zrem == nil {
		// Sized for m: grown a doubling at a time, the maps allocated twice
		// their final size.
		pl.w = writes{zrem: make(map[string][]string, len(m.DelSubs)), zadd: make(map[string][]string, len(m.AddSubs)),
			hdel: make(map[string][]string, len(m.DelLeft)+len(m.DelRight)), hset: make(map[string][]string, len(m.PutLeft)+len(m.PutRight))}
	}
	for _, g := range []*map[string][]string{&pl.w.zrem, &pl.w.zadd, &pl.w.hdel, &pl.w.hset} {
		for _, l := range *g {
			clear(l)
			pl.free = append(pl.free, l[:0])
		}
		if len(*g) > maxKeptKeys {
			*g = map[string][]string{}
		} else {
			clear(*g)
		}
	}
	pl.puts = pl.puts[:0]
	pl.buf = pl.buf[:0]
	clear(pl.args)
	pl.args = pl.args[:0]
	pl.w.args = &pl.args
}

// add appends vs to the list of key k in g.
func (pl *planner) add(g map[string][]string, k string, vs ...string) {
	l, ok := g[k]
	if !ok && len(pl.free) > 0 {
		l = pl.free[len(pl.free)-1]
		pl.free = pl.free[:len(pl.free)-1]
	}
	g[k] = append(l, vs...)
}

// takePlanner lends the store's planner, or a new one while it is lent.
func (s *Store) takePlanner() *planner {
	select {
	case pl := <-s.planners:
		return pl
	default:
		return new(planner)
	}
}

// givePlanner takes back a planner, once its plan is no longer used.
func (s *Store) givePlanner(pl *planner) {
	select {
	case s.planners <- pl:
	default:
	}
}

// plan groups m's writes by key, for the generations of next. The deletes of
// a side that is cleared are left out: its new generation starts empty.
func (s *Store) plan(pl *planner, m *join.Mutations, next Meta) writes {
	pl.reset(m)
	w := pl.w
	if !m.ClearLeft {
		for _, sub := range m.DelSubs {
			pl.add(w.zrem, s.keys.subs(next, string(sub.FK), string(sub.PK)), sub.Member())
		}
		for _, pk := range m.DelLeft {
			pl.add(w.hdel, s.keys.left(next, string(pk)), string(pk))
		}
	}
	if !m.ClearRight {
		for _, rk := range m.DelRight {
			pl.add(w.hdel, s.keys.right(next, string(rk)), string(rk))
		}
	}
	for _, sub := range m.AddSubs {
		pl.add(w.zadd, s.keys.subs(next, string(sub.FK), string(sub.PK)), sub.Member())
	}
	// The rows' encodings are one string over the planner's buffer, which
	// the next plan overwrites.
	for pk, st := range m.PutLeft {
		pl.buf = appendLeft(pl.buf, string(pk), st)
		pl.puts = append(pl.puts, put{s.keys.left(next, string(pk)), string(pk), len(pl.buf)})
	}
	for rk, st := range m.PutRight {
		pl.buf = appendRight(pl.buf, string(rk), st)
		pl.puts = append(pl.puts, put{s.keys.right(next, string(rk)), string(rk), len(pl.buf)})
	}
	rows, start := unsafe.String(unsafe.SliceData(pl.buf), len(pl.buf)), 0
	for _, p := range pl.puts {
		pl.add(w.hset, p.key, p.field, rows[start:p.end])
		start = p.end
	}
	return w
}

// subReplies are the queued ZADDs and ZREMs of a transaction.
type subReplies struct{ adds, rems []*redis.IntCmd }

// delta returns, once the transaction ran, the number of members its ZADDs
// added minus the number its ZREMs removed.
func (r subReplies) delta() int64 {
	var n int64
	for _, c := range r.adds {
		n += c.Val()
	}
	for _, c := range r.rems {
		n -= c.Val()
	}
	return n
}

// queue queues w's commands, at most Config.PageSize members or fields each:
// the removals first, then the additions (they concern distinct members).
// It returns the sorted-set commands, whose replies count the members they
// really added and removed.
func (s *Store) queue(ctx context.Context, p redis.Pipeliner, w writes) subReplies {
	var r subReplies
	page := s.cfg.PageSize
	for k, ms := range w.zrem {
		for chunk := range slices.Chunk(ms, page) {
			c := redis.NewIntCmd(ctx, command(w.args, "zrem", k, false, chunk)...)
			_ = p.Process(ctx, c)
			r.rems = append(r.rems, c)
		}
	}
	for k, fs := range w.hdel {
		for chunk := range slices.Chunk(fs, page) {
			_ = p.Process(ctx, redis.NewIntCmd(ctx, command(w.args, "hdel", k, false, chunk)...))
		}
	}
	for k, ms := range w.zadd {
		for chunk := range slices.Chunk(ms, page) {
			c := redis.NewIntCmd(ctx, command(w.args, "zadd", k, true, chunk)...)
			_ = p.Process(ctx, c)
			r.adds = append(r.adds, c)
		}
	}
	hsetChunks(ctx, p, w.hset, page, w.args)
	return r
}

// hsetChunks queues HSETs of the field/value pairs per hash, page pairs each.
func hsetChunks(ctx context.Context, p redis.Pipeliner, pairs map[string][]string, page int, slab *[]any) {
	for k, fv := range pairs {
		for chunk := range slices.Chunk(fv, 2*page) {
			_ = p.Process(ctx, redis.NewIntCmd(ctx, command(slab, "hset", k, false, chunk)...))
		}
	}
}

// command returns the arguments of command name on key with the strings
// ss, each preceded by a score of 0 when scored (ZADD). The strings go in
// by pointer, which an interface holds without an allocation (go-redis
// writes a *string as the string): the arguments cost one slice, not one
// boxed value each, cut from slab when it is set (a planner's, valid until
// its next plan). ss must not change until the command is written.
func command(slab *[]any, name, key string, scored bool, ss []string) []any {
	n := 2 + len(ss)
	if scored {
		n += len(ss)
	}
	var args []any
	if slab == nil {
		args = make([]any, 0, n)
	} else {
		if cap(*slab)-len(*slab) < n {
			// A new slab; the commands cut from the old one keep it.
			*slab = make([]any, 0, max(4096, 2*cap(*slab), n))
		}
		start := len(*slab)
		*slab = (*slab)[:start+n]
		args = (*slab)[start : start : start+n]
	}
	args = append(args, name, key)
	for i := range ss {
		if scored {
			args = append(args, "0")
		}
		args = append(args, &ss[i])
	}
	return args
}
