package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/join"
)

// Values and fields of the undo log <prefix>:undo. A field names what a
// partial transaction touched: the data key without "<prefix>:" (it ends at
// its first '}') followed by the hash field or sorted-set member, or
// undoMeta followed by a meta field. Its value is the pre-image.
const (
	// undoAbsent: the hash field or sorted-set member did not exist.
	undoAbsent = "-"
	// undoPresent: the sorted-set member existed (all scores are 0).
	undoPresent = "+"
	// undoValue starts the pre-image of a hash field that existed.
	undoValue = "="
	// undoMeta starts the field that records a meta field: a generation, or
	// the subscription count (undoAbsent when it was unknown).
	undoMeta = "m:"
)

// maxRecoverPasses bounds the scans of the undo log in one Recover; a pass
// after the first one only runs when entries appeared during the scan.
const maxRecoverPasses = 10

// inFlightError describes the partial transaction txn that blocks a write.
func inFlightError(txn wal.LSN) error {
	return fmt.Errorf("%w (transaction %s): call Recover to roll it back, or FinishPartial once it is committed in the target",
		ErrInFlight, txn)
}

// CommitPartial writes one chunk of the large source transaction txn (its
// commit LSN, or any non-zero id): it applies m at once, so that the
// next chunk's reads see it, but leaves the checkpoint where it is until
// FinishPartial. In the same MULTI/EXEC as the writes it records, in the
// undo log, the value that every field and member it touches had before the
// transaction began (only at the first touch: later chunks never overwrite
// it), the generation a Clear replaces, and the in-flight marker txn in the
// meta hash. Recover uses the log to bring the state back to the checkpoint.
//
// The subscription count (Meta.Subscriptions) is updated in the same MULTI
// by the members the chunk really adds and removes, known from the
// pre-images, so a chunk sent again is not counted twice; the first chunk
// logs the count from before the transaction for Recover.
//
// While txn is in flight, Commit and a CommitPartial of another transaction
// fail with ErrInFlight, and Sweep deletes nothing. Calling CommitPartial
// again with the same chunk (after an error) is safe: its writes set final
// values and the log keeps the first pre-images (a Clear in it starts one
// more generation, with the same content). The pre-images are read
// before the MULTI, under WATCH of the meta hash; like Commit, CommitPartial
// assumes it is the only writer of the state.
func (s *Store) CommitPartial(ctx context.Context, m join.Mutations, txn wal.LSN) error {
	defer s.right.drop()
	if txn == 0 {
		return errors.New("commit partial redis state: transaction id 0 is invalid")
	}
	if m.Tables != nil {
		return errors.New("commit partial redis state: the mutations of a join of several tables are committed table by table, each in its own state")
	}
	var pre preImageSet
	undo := s.keys.undo()
	pl := s.takePlanner()
	defer s.givePlanner(pl)
	return s.writeUnit(ctx, unitWrite{
		what: "commit partial redis state of " + txn.String(), name: "partial commit of " + txn.String(),
		prepare: func(ctx context.Context, tx *redis.Tx, stored Meta) (Meta, *writes, int64, error) {
			if stored.InFlight != 0 && stored.InFlight != txn {
				return stored, nil, 0, inFlightError(stored.InFlight)
			}
			next := stored
			next.InFlight = txn
			if m.ClearLeft {
				next.LeftGen++
			}
			if m.ClearRight {
				next.RightGen++
			}
			w := s.plan(pl, &m, next)
			// On a cluster the data keys lie in other slots than the meta
			// hash WATCH holds: read them through the cluster client (the
			// store is their only writer, and unitMu is held).
			var reader redis.Cmdable = tx
			if s.Cluster() {
				reader = s.rdb
			}
			var err error
			if pre, err = s.preImages(ctx, reader, w); err != nil {
				return next, nil, 0, err
			}
			next.Subscriptions = countSubs(stored.Subscriptions, m.ClearLeft, pre.subs)
			return next, &w, pre.subs, nil
		},
		before: func(ctx context.Context, p redis.Pipeliner, stored, _ Meta) {
			if stored.InFlight == 0 {
				// A log without a marker cannot be valid: never keep its
				// entries as this transaction's pre-images.
				p.Unlink(ctx, undo)
			}
			subs := undoAbsent
			if stored.Subscriptions >= 0 {
				subs = strconv.FormatInt(stored.Subscriptions, 10)
			}
			p.HSetNX(ctx, undo, undoMeta+fieldSubs, subs)
			if m.ClearLeft {
				p.HSetNX(ctx, undo, undoMeta+fieldLeftGen, strconv.FormatUint(stored.LeftGen, 10))
			}
			if m.ClearRight {
				p.HSetNX(ctx, undo, undoMeta+fieldRightGen, strconv.FormatUint(stored.RightGen, 10))
			}
			for i := 0; i < len(pre.entries); i += 2 {
				p.HSetNX(ctx, undo, pre.entries[i], pre.entries[i+1])
			}
		},
		metaFields: func(next Meta) []any {
			return appendSubs([]any{fieldInFlight, strconv.FormatUint(uint64(txn), 10),
				fieldLeftGen, strconv.FormatUint(next.LeftGen, 10),
				fieldRightGen, strconv.FormatUint(next.RightGen, 10)}, next.Subscriptions)
		},
	})
}

// preImageSet is what preImages read.
type preImageSet struct {
	// entries are undo log entries, as field, value pairs.
	entries []string
	// subs is the number of members w adds that are absent minus the number
	// of those it removes that are present.
	subs int64
}

// preImages reads, in one pipeline, the current value of every field and
// member w touches and returns undo log entries for them, with the change
// w makes to the number of subscriptions.
func (s *Store) preImages(ctx context.Context, c redis.Cmdable, w writes) (preImageSet, error) {
	type read struct {
		key   string
		items []string
		hash  bool
		add   bool // members of a ZADD
		cmd   redis.Cmder
	}
	var reads []read
	page := s.cfg.PageSize
	p := c.Pipeline()
	for gi, group := range []map[string][]string{w.zrem, w.zadd} {
		for k, members := range group {
			for chunk := range slices.Chunk(members, page) {
				args := make([]any, 0, 2+len(chunk))
				args = append(args, "zmscore", k)
				for _, m := range chunk {
					args = append(args, m)
				}
				// Do, not ZMScore: go-redis turns an absent member's nil
				// into score 0, which every present member has too.
				reads = append(reads, read{k, chunk, false, gi == 1, p.Do(ctx, args...)})
			}
		}
	}
	for k, fields := range w.hdel {
		for chunk := range slices.Chunk(fields, page) {
			reads = append(reads, read{k, chunk, true, false, p.HMGet(ctx, k, chunk...)})
		}
	}
	for k, pairs := range w.hset {
		fields := make([]string, 0, len(pairs)/2)
		for i := 0; i < len(pairs); i += 2 {
			fields = append(fields, pairs[i])
		}
		for chunk := range slices.Chunk(fields, page) {
			reads = append(reads, read{k, chunk, true, false, p.HMGet(ctx, k, chunk...)})
		}
	}
	var out preImageSet
	if len(reads) == 0 {
		return out, nil
	}
	if _, err := p.Exec(ctx); err != nil {
		return out, fmt.Errorf("read pre-images: %w", err)
	}
	for _, r := range reads {
		var vals []any
		var err error
		switch cmd := r.cmd.(type) {
		case *redis.Cmd:
			vals, err = cmd.Slice()
		case *redis.SliceCmd:
			vals, err = cmd.Result()
		}
		if err == nil && len(vals) != len(r.items) {
			err = fmt.Errorf("%d replies for %d items", len(vals), len(r.items))
		}
		if err != nil {
			return preImageSet{}, fmt.Errorf("read pre-images of %s: %w", r.key, err)
		}
		for i, v := range vals {
			pre := undoAbsent
			switch {
			case v == nil && r.add:
				out.subs++
			case v == nil:
			case !r.hash:
				pre = undoPresent
				if !r.add {
					out.subs--
				}
			default:
				str, ok := v.(string)
				if !ok {
					return preImageSet{}, fmt.Errorf("read pre-images of %s: field value of type %T", r.key, v)
				}
				pre = undoValue + str
			}
			out.entries = append(out.entries, s.undoField(r.key, r.items[i]), pre)
		}
	}
	return out, nil
}

// undoField returns the undo log field of item (a hash field or sorted-set
// member) of the data key.
func (s *Store) undoField(key, item string) string {
	return key[len(s.keys.prefix)+1:] + item
}

// FinishPartial ends the partial transaction in flight once it is committed
// in the target: in one MULTI/EXEC it sets the checkpoint to lsn, deletes the
// undo log (UNLINK: freed in the background) and clears the in-flight
// marker. Retrying it is safe: with no transaction in flight and lsn not
// above the checkpoint it does nothing. With no transaction in flight and
// lsn above the checkpoint it fails with ErrNotInFlight: the chunks were
// rolled back by Recover, and the checkpoint must not move past them.
func (s *Store) FinishPartial(ctx context.Context, lsn wal.LSN) error {
	defer s.right.drop()
	if lsn == 0 {
		return errors.New("finish partial redis state: LSN 0 is invalid")
	}
	cached, err := s.current(ctx)
	if err != nil {
		return fmt.Errorf("finish partial redis state at %s: %w", lsn, err)
	}
	var (
		next    Meta
		execErr error
	)
	key := s.keys.meta()
	err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		stored, err := readMeta(ctx, tx, key)
		if err != nil {
			return err
		}
		if err := sameState(cached, stored); err != nil {
			return err
		}
		next = stored
		if stored.InFlight == 0 {
			if lsn <= stored.Checkpoint {
				return nil // finished before: a retry
			}
			return fmt.Errorf("%w (checkpoint %s): it was rolled back by Recover or never started; replay the transaction",
				ErrNotInFlight, stored.Checkpoint)
		}
		if lsn <= stored.Checkpoint {
			return fmt.Errorf("LSN is not above checkpoint %s", stored.Checkpoint)
		}
		next.Checkpoint, next.InFlight = lsn, 0
		_, execErr = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, key, fieldCheckpoint, strconv.FormatUint(uint64(lsn), 10))
			p.HDel(ctx, key, fieldInFlight)
			p.Unlink(ctx, s.keys.undo())
			return nil
		})
		if execErr == nil {
			s.waitReplicas(ctx, tx)
		}
		return execErr
	}, key)
	if err := s.settle(ctx, err, execErr, next, "finish of a partial commit at "+lsn.String()); err != nil {
		return fmt.Errorf("finish partial redis state at %s: %w", lsn, err)
	}
	return nil
}

// Recover rolls back the partial transaction in flight, if any, and reports
// whether there was one. It scans the undo log (HSCAN, Config.PageSize
// entries at a time, so memory stays bounded whatever the log's size) and,
// page by page, writes the pre-images back and deletes their entries in one
// MULTI/EXEC; last, in one more MULTI/EXEC, it restores the generations,
// deletes the log and clears the marker. Every step is idempotent and leaves
// the marker in place, so after a failure (or a crash) Recover is simply
// called again. The daemon calls it at startup and whenever the replication
// stream restarts a transaction from its first chunk. It also forgets a
// Resize that never switched: its new generations become garbage.
func (s *Store) Recover(ctx context.Context) (rolledBack bool, err error) {
	defer s.right.drop()
	if s.Cluster() {
		// Resumed already when the daemon's start-up check (Resume) or this
		// process's last write found every shard at the meta hash's write.
		s.unitMu.Lock()
		err := s.resumeOnceLocked(ctx)
		s.unitMu.Unlock()
		if err != nil {
			return false, fmt.Errorf("recover redis state: resume redis cluster state: %w", err)
		}
	}
	cached, err := s.current(ctx)
	if err != nil {
		return false, fmt.Errorf("recover redis state: %w", err)
	}
	stored, err := readMeta(ctx, s.rdb, s.keys.meta())
	if err == nil {
		err = sameState(cached, stored)
	}
	if err != nil {
		return false, fmt.Errorf("recover redis state: %w", err)
	}
	if stored.Resizing != [2]uint64{} {
		// A Resize that never switched: its generations are garbage.
		if err := s.forgetResize(ctx); err != nil {
			return false, fmt.Errorf("recover redis state: %w", err)
		}
		stored.Resizing = [2]uint64{}
	}
	if stored.InFlight == 0 {
		s.mu.Lock()
		s.meta = &stored
		s.mu.Unlock()
		return false, nil
	}
	for range maxRecoverPasses {
		if err := s.restoreLog(ctx, cached); err != nil {
			return false, fmt.Errorf("recover redis state from transaction %s: %w", stored.InFlight, err)
		}
		done, err := s.endRecover(ctx, cached)
		if err != nil {
			return false, fmt.Errorf("recover redis state from transaction %s: %w", stored.InFlight, err)
		}
		if done {
			return true, nil
		}
	}
	return false, fmt.Errorf("recover redis state from transaction %s: the undo log keeps growing; is another process writing the state?",
		stored.InFlight)
}

// restoreLog makes one pass over the undo log, restoring a page at a time.
func (s *Store) restoreLog(ctx context.Context, cached Meta) error {
	var cursor uint64
	for {
		kv, next, err := s.rdb.HScan(ctx, s.keys.undo(), cursor, "", int64(s.cfg.PageSize)).Result()
		if err != nil {
			return fmt.Errorf("scan undo log: %w", err)
		}
		n, err := s.restorePage(ctx, cached, kv)
		if err != nil {
			return err
		}
		if s.afterRestore != nil {
			if err := s.afterRestore(n); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// restorePage writes back the pre-images of the undo log entries kv (field,
// value pairs, as HSCAN returns them) and deletes those entries, in one
// MULTI/EXEC. Entries of meta fields are left for endRecover. It returns the
// number of entries restored.
func (s *Store) restorePage(ctx context.Context, cached Meta, kv []string) (int, error) {
	w := newWrites()
	var done []string
	for i := 0; i+1 < len(kv); i += 2 {
		field, pre := kv[i], kv[i+1]
		if strings.HasPrefix(field, undoMeta) {
			continue
		}
		if err := s.addRestore(&w, field, pre); err != nil {
			return 0, err
		}
		done = append(done, field)
	}
	if len(done) == 0 {
		return 0, nil
	}
	var (
		stored  Meta
		execErr error
		rd      *redo
	)
	release, err := s.beginUnit(ctx)
	if err != nil {
		return 0, fmt.Errorf("restore pre-images: %w", err)
	}
	defer release()
	key, undo := s.keys.meta(), s.keys.undo()
	err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		var err error
		if stored, err = s.inFlight(ctx, tx, cached); err != nil {
			return err
		}
		_, execErr = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if _, rd, err = s.queueData(ctx, p, w, &stored); err != nil {
				return err
			}
			for chunk := range slices.Chunk(done, s.cfg.PageSize) {
				p.HDel(ctx, undo, chunk...)
			}
			return nil
		})
		return execErr
	}, key)
	if err := s.settle(ctx, err, execErr, stored, "recovery step"); err != nil {
		return 0, fmt.Errorf("restore pre-images: %w", err)
	}
	if _, _, err := s.finishUnit(ctx, rd); err != nil {
		return 0, fmt.Errorf("restore pre-images: %w", err)
	}
	return len(done), nil
}

// addRestore adds to w the write that restores the pre-image pre recorded in
// the undo log under field.
func (s *Store) addRestore(w *writes, field, pre string) error {
	end := strings.IndexByte(field, '}')
	if end < 0 {
		return fmt.Errorf("parse undo log entry %q: no data key", field)
	}
	key, item := s.keys.prefix+":"+field[:end+1], field[end+1:]
	kind, _, ok := s.keys.parse(key)
	if !ok {
		return fmt.Errorf("parse undo log entry %q: %q is not a data key", field, key)
	}
	switch {
	case kind == kindSubs && pre == undoPresent:
		w.zadd[key] = append(w.zadd[key], item)
	case kind == kindSubs && pre == undoAbsent:
		w.zrem[key] = append(w.zrem[key], item)
	case kind != kindSubs && pre == undoAbsent:
		w.hdel[key] = append(w.hdel[key], item)
	case kind != kindSubs && strings.HasPrefix(pre, undoValue):
		w.hset[key] = append(w.hset[key], item, pre[len(undoValue):])
	default:
		return fmt.Errorf("parse undo log entry %q: pre-image %q does not fit key kind %c", field, pre, kind)
	}
	return nil
}

// inFlight reads the meta hash through tx and checks that it is still the
// cached state's, with a partial transaction in flight.
func (s *Store) inFlight(ctx context.Context, tx *redis.Tx, cached Meta) (Meta, error) {
	stored, err := readMeta(ctx, tx, s.keys.meta())
	if err != nil {
		return Meta{}, err
	}
	if err := sameState(cached, stored); err != nil {
		return Meta{}, err
	}
	if stored.InFlight == 0 {
		return Meta{}, fmt.Errorf("%w: finished or rolled back by another process", ErrNotInFlight)
	}
	return stored, nil
}

// endRecover restores the generations and the subscription count recorded
// in the undo log, deletes the log and clears the in-flight marker, in one
// MULTI/EXEC. A log without the count (written by a version that did not
// keep it) leaves the count unknown. It reports false, and changes nothing,
// when the log still holds data entries (written during the scan): they need
// another pass.
func (s *Store) endRecover(ctx context.Context, cached Meta) (done bool, err error) {
	var (
		next    Meta
		execErr error
	)
	key, undo := s.keys.meta(), s.keys.undo()
	err = s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		stored, err := s.inFlight(ctx, tx, cached)
		if err != nil {
			return err
		}
		var (
			gens *redis.SliceCmd
			size *redis.IntCmd
		)
		if _, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error {
			gens = p.HMGet(ctx, undo, undoMeta+fieldLeftGen, undoMeta+fieldRightGen, undoMeta+fieldSubs)
			size = p.HLen(ctx, undo)
			return nil
		}); err != nil {
			return fmt.Errorf("read undo log: %w", err)
		}
		next = stored
		next.InFlight = 0
		recorded := int64(0)
		for i, dst := range []*uint64{&next.LeftGen, &next.RightGen} {
			v, ok := gens.Val()[i].(string)
			if !ok {
				continue
			}
			recorded++
			if *dst, err = strconv.ParseUint(v, 10, 64); err != nil {
				return fmt.Errorf("read undo log: generation %q", v)
			}
		}
		next.Subscriptions = -1
		if v, ok := gens.Val()[2].(string); ok {
			recorded++
			next.Subscriptions = parseSubs(v) // undoAbsent: unknown before
		}
		if size.Val() > recorded {
			next = stored
			return nil
		}
		done = true
		_, execErr = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.HSet(ctx, key, appendSubs([]any{fieldLeftGen, strconv.FormatUint(next.LeftGen, 10),
				fieldRightGen, strconv.FormatUint(next.RightGen, 10)}, next.Subscriptions)...)
			if next.Subscriptions < 0 {
				p.HDel(ctx, key, fieldInFlight, fieldSubs)
			} else {
				p.HDel(ctx, key, fieldInFlight)
			}
			p.Unlink(ctx, undo)
			return nil
		})
		return execErr
	}, key)
	if err := s.settle(ctx, err, execErr, next, "end of recovery"); err != nil {
		return false, fmt.Errorf("end recovery: %w", err)
	}
	return done, nil
}
