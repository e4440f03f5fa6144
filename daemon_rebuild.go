package fkmat

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/internal/config"
	"github.com/fkmat/fkmat/internal/pipeline"
	"github.com/fkmat/fkmat/internal/plan"
	"github.com/fkmat/fkmat/internal/wal"
	"github.com/fkmat/fkmat/redisstore"
	"github.com/fkmat/fkmat/sink"
)

// A rebuild beside the running join (a changed definition, or backfill
// --force while the joins stream): the old definition keeps maintaining
// the target while the new one is built, and the new one replaces it in
// one target transaction once it has caught up.
//
//  1. The daemon streams the join as it was built (plan.Stored, from
//     fkmat.join_state.definition).
//  2. A second slot (rebuildSlot) is created with an exported snapshot; the
//     new definition's Redis state (the next generation,
//     redisstore.GenerationPrefix) and a shadow of the target are loaded from it,
//     exactly as the backfill does.
//  3. A second pipeline streams that slot from its consistent point into
//     the new state and the shadow.
//  4. Once it has caught up, a marker is written into the WAL
//     (cdc.EmitSwitch) and both streams stop there (cdc.Stream.StopAt):
//     both pipelines have applied exactly the transactions before it.
//  5. One target transaction swaps the shadow in (sink.Tx.Swap), records
//     the new definition, epoch and generation, and the slot's checkpoint;
//     the old generation's state and the second slot are dropped after it,
//     and the daemon restarts from its checkpoints with the new definition.
//
// A crash before the swap's commit leaves the old join as it was: the next
// start builds again (the second slot, the shadow and the new generation
// left behind are replaced). A crash after it leaves the old generation and
// the second slot, which the next start drops.

// rebuildJob is one join to build anew beside the running one.
type rebuildJob struct {
	// old is the definition the target was built with, which streams
	// until the switch; plan the one to build.
	old, plan *plan.JoinPlan
	// gen is the generation of the new state: the old one's plus one.
	gen    int
	reason string
	// frozenAt, when old is nil, is where the join stopped being
	// maintained (freeze).
	frozenAt wal.LSN
}

// errRebuilt stops a run once a rebuild has switched in: Run starts again
// at once, with the new definitions.
var errRebuilt = errors.New("rebuilt joins switched in")

// planRebuild says whether join p, whose state st records, is built anew
// beside the running join: its definition changed since it was built
// (other than by widened types, which widen followed), or a rebuild was
// asked for. What would make the switch lose something is refused here,
// before anything is built.
func (d *daemon) planRebuild(ctx context.Context, p *plan.JoinPlan, st joinState) (*rebuildJob, error) {
	if !d.opts.online || !st.exists || st.phase != "streaming" || st.definition == nil {
		return nil, nil // a backfill, if anything: assess says
	}
	reason := ""
	switch {
	case st.frozenLSN != 0:
		// A rebuild that left the join unmaintained was interrupted: its
		// state is behind the slot, so only a rebuild can serve it.
		if was, err := plan.DefinitionTarget(st.definition); err != nil {
			return nil, err
		} else if err := d.checkAttached(ctx, &was, p); err != nil {
			return nil, err
		}
		return &rebuildJob{plan: p, gen: st.generation + 1, frozenAt: st.frozenLSN,
			reason: "a rebuild that left the join unmaintained was interrupted; the target is not maintained until it switches in"}, nil
	case d.opts.rebuildAll && st.fingerprint == p.Fingerprint:
		reason = "fkmat backfill --force"
	case st.fingerprint == p.Fingerprint:
		return nil, nil
	case d.opts.rebuildAll:
		reason = "fkmat backfill --force (the join's definition changed)"
	}
	old, stale, err := plan.Stored(ctx, d.source, p.Name, st.definition)
	if err != nil {
		return nil, err
	}
	if stale != "" {
		// The old definition cannot be followed: the target keeps its
		// rows, not maintained, until the rebuild switches in.
		was, err := plan.DefinitionTarget(st.definition)
		if err != nil {
			return nil, err
		}
		if was.Ident() != p.Target.Ident() {
			return nil, targetChanged(p.Name, &was, &p.Target)
		}
		if err := d.checkAttached(ctx, &was, p); err != nil {
			return nil, err
		}
		return &rebuildJob{plan: p, gen: st.generation + 1, reason: fmt.Sprintf(
			"the join's definition changed, and the %s it was built with is gone from the source (renamed, dropped or retyped): "+
				"the target keeps its rows, not maintained, until the rebuild switches in", stale)}, nil
	}
	if old.Fingerprint != st.fingerprint {
		return nil, fmt.Errorf("the stored definition of join %q does not match its fingerprint %s; run fkmat backfill --force", p.Name, st.fingerprint)
	}
	if old.Target.Ident() != p.Target.Ident() {
		return nil, targetChanged(p.Name, &old.Target, &p.Target)
	}
	if err := d.checkAttached(ctx, &old.Target, p); err != nil {
		return nil, err
	}
	if reason == "" {
		reason = "the join's definition changed: " + describeChange(old, p)
	}
	return &rebuildJob{old: old, plan: p, gen: st.generation + 1, reason: reason}, nil
}

// checkAttached refuses a new shape for target was when what is attached
// to it would be lost by the rename that swaps the new shape in.
func (d *daemon) checkAttached(ctx context.Context, was *sink.Table, p *plan.JoinPlan) error {
	if !sameColumns(was, &p.Target) {
		// A new shape is swapped in by a rename, which loses what a rename
		// cannot carry: refused now, not at the switch.
		attached, err := d.writer.Attached(ctx, was)
		if err != nil {
			return err
		}
		if len(attached) > 0 {
			return fmt.Errorf("%w %s with the join's new shape: %s are attached to it, and the new shape is swapped in by a rename, which would lose them "+
				"(fkmat carries over grants and comments only): drop them, start fkmat again, and create them again on the new target",
				sink.ErrCannotSwap, p.Target.Ident(), strings.Join(attached, ", "))
		}
	}
	return nil
}

// serveLayout serves join j's Redis state of generation gen when this
// fkmat, with its options, would lay it out otherwise (an upgrade that
// changed the layout, other sub_shards or row_shards) but can still read
// it: the state is reopened as it is laid out, and the join is rebuilt
// beside in the layout of now, and switched to it once caught up. A state
// it cannot read is left to assess (lost: rebuilt from a new slot).
func (d *daemon) serveLayout(ctx context.Context, j pipeline.Join, gen int) (pipeline.Join, error) {
	p := j.Plan()
	if !d.opts.online || d.phases[p.Name] != "streaming" {
		return j, nil
	}
	stores := slices.Clone(j.Stores())
	var layouts []string
	for i, s := range stores {
		meta, err := s.Meta(ctx)
		if err != nil || s.CheckLayout(meta) == nil {
			continue // lost, or as it would be laid out now
		}
		cfg, err := s.Serving(meta)
		if err != nil {
			return j, nil // assess finds it lost
		}
		if stores[i], err = redisstore.Open(ctx, d.rdb, cfg); err != nil {
			return nil, err
		}
		layouts = append(layouts, meta.Layout)
	}
	if len(layouts) == 0 {
		return j, nil
	}
	served, err := d.joinOn(p, stores)
	if err != nil {
		return nil, err
	}
	if slices.ContainsFunc(d.builds, func(b *rebuildJob) bool { return b.plan.Name == p.Name }) {
		return served, nil // rebuilt beside already
	}
	b := &rebuildJob{old: p, plan: p, gen: gen + 1, reason: fmt.Sprintf(
		"the Redis state's layout changes (from %s; an upgraded fkmat or other sub_shards/row_shards): the old state serves until the new one has caught up",
		strings.Join(layouts, ", "))}
	d.builds = append(d.builds, b)
	d.log.Info("the join's Redis state has another layout than this fkmat makes: it serves while the join is rebuilt beside it",
		"join", p.Name, "layout", strings.Join(layouts, ", "))
	return served, nil
}

// targetChanged is the error of a join whose target table changed.
func targetChanged(name string, was, now *sink.Table) error {
	return &config.ConfigError{Problems: []string{fmt.Sprintf(
		"join %q: its target changed from %s to %s: a join keeps its target; give the join a new name for a new target "+
			"(and fkmat teardown the old one), or set the target back", name, was.Ident(), now.Ident())}}
}

// freeze records that join b is not maintained until its rebuild switches
// in, before anything streams: the slot then moves on without it.
func (d *daemon) freeze(ctx context.Context, b *rebuildJob) error {
	if b.frozenAt != 0 {
		return nil // already
	}
	at, err := d.writer.Checkpoint(ctx, d.cfg.Slot)
	if err != nil {
		return err
	}
	var text string
	if err := d.target.QueryRow(ctx, `UPDATE fkmat.join_state SET frozen_lsn = coalesce(frozen_lsn, $3::pg_lsn), updated_at = now()
		WHERE slot = $1 AND join_name = $2 RETURNING frozen_lsn::text`, d.cfg.Slot, b.plan.Name, at.String()).Scan(&text); err != nil {
		return fmt.Errorf("join %q: record it unmaintained: %w", b.plan.Name, err)
	}
	if b.frozenAt, err = wal.ParseLSN(text); err != nil {
		return err
	}
	d.log.Warn("the join's old definition cannot be followed: its target keeps its rows, not maintained, until its rebuild switches in",
		"join", b.plan.Name, "reason", b.reason)
	return nil
}

// sameColumns says whether a and b have the same columns, types and key.
func sameColumns(a, b *sink.Table) bool {
	return a.KeyCount == b.KeyCount && slices.Equal(a.Columns, b.Columns)
}

// switchSlack is how far behind the main stream the catch-up's may be
// received when the switch begins: the main pipeline waits at the marker
// for about the time the catch-up takes to decode and apply it.
const switchSlack = 16 << 20

// rebuildTimings are the phases of a rebuild, for its log line.
type rebuildTimings struct {
	load, catchUp, switchOver time.Duration
}

// runRebuilds builds d.builds beside the running joins (the main pipeline
// main, streaming mainStream) and switches them in; mainDone is closed
// once the main pipeline has stopped. It returns errRebuilt after the
// switch, or the error that stopped it: the next start builds again. Its
// steps are those of the header of this file: load the new generation
// from a second slot (loadBeside), catch it up to the running joins and
// stop both streams at one marker (catchUpBeside), then swap the shadows
// in (switchBeside).
func (d *daemon) runRebuilds(ctx context.Context, mainStream *cdc.Stream, mainDone <-chan struct{}) (err error) {
	started := time.Now()
	defer func() {
		if err != nil && !errors.Is(err, errRebuilt) {
			for _, b := range d.builds {
				d.obs.setRebuild(b.plan.Name, "")
			}
		}
	}()
	names := make([]string, len(d.builds))
	for i, b := range d.builds {
		names[i] = b.plan.Name
	}
	log := d.log.With("component", "rebuild", "joins", strings.Join(names, ","))
	slotName := rebuildSlot(d.cfg.Slot)
	client, err := cdc.New(cdc.Config{
		ConnString: d.cfg.Source, Slot: slotName, Publication: d.cfg.Publication, MessageSlot: d.cfg.Slot,
		Tables: d.cdc.Config().Tables, Logger: log, SlotBusyTimeout: d.opts.slotBusyTimeout(),
	})
	if err != nil {
		return err
	}
	if err := d.dropRebuildSlot(ctx, client); err != nil {
		return err
	}
	// The build's heartbeat: status calls a build that stops recording
	// interrupted.
	bctx, stopBeat := context.WithCancel(ctx)
	defer stopBeat()
	go d.buildHeartbeat(bctx, log)

	var tm rebuildTimings
	nb, err := d.loadBeside(ctx, log, client)
	if err != nil {
		return err
	}
	tm.load = time.Since(started)
	log.Info("rebuild loaded; catching up", "rows", nb.rows, "seconds", tm.load.Seconds())
	catching := time.Now()
	if err := d.catchUpBeside(ctx, log, client, nb, mainStream); err != nil {
		return err
	}
	tm.catchUp = time.Since(catching)
	switching := time.Now()
	at, err := d.switchBeside(ctx, nb, mainDone)
	if err != nil {
		return err
	}
	tm.switchOver = time.Since(switching)
	for _, b := range d.builds {
		d.obs.switchedIn(b.plan.Name)
	}
	// The second slot is garbage now. The old generations are dropped by
	// the next run, beside its stream (dropLeftovers): deleting a large
	// state's keys takes a while, and nothing streams until this returns.
	if err := client.DropSlot(ctx); err != nil {
		log.Warn("could not drop the rebuild's slot; the next start drops it", "slot", client.Config().Slot, "err", err)
	}
	log.Info("rebuild switched in", "rows", nb.rows, "load_seconds", tm.load.Seconds(), "catch_up_seconds", tm.catchUp.Seconds(),
		"switch_seconds", tm.switchOver.Seconds(), "seconds", time.Since(started).Seconds(), "checkpoint", at.String())
	return errRebuilt
}

// catchUpBeside streams the second slot from its consistent point into the
// new generation and the targets' shadows. Once it is within a moment of
// the running joins, it writes a marker into the WAL and stops both
// streams there (cdc.EmitSwitch, cdc.Stream.StopAt); it returns once the
// catch-up has applied every transaction before the marker.
func (d *daemon) catchUpBeside(ctx context.Context, log *slog.Logger, client *cdc.Client, nb *besideBuild, mainStream *cdc.Stream) error {
	if _, err := d.target.Exec(ctx, `DELETE FROM fkmat.checkpoint WHERE slot = $1`, client.Config().Slot); err != nil {
		return fmt.Errorf("reset the rebuild's checkpoint: %w", err)
	}
	shadows, err := d.shadowJoins(ctx, nb.joins)
	if err != nil {
		return err
	}
	stream := client.NewStream(nb.consistent)
	catchUp := pipeline.New(pipeline.Config{
		Slot: client.Config().Slot, Publication: d.cfg.Publication, Joins: shadows, Source: stream,
		Target: pipeline.SinkTarget{W: sink.NewWriter(d.target)}, Limits: d.opts.Batch,
		Log: log.With("pipeline", "rebuild"), TargetCheckpoint: nb.consistent,
		Ignore:    func(config.TableName) bool { return true },
		Generator: d.generator(plansOf(shadows)...),
	})
	if err := d.recordRebuild(ctx, "catching up"); err != nil {
		return err
	}
	g, gctx := newGroup(ctx)
	streamCtx, stopStream := context.WithCancel(gctx)
	defer stopStream()
	g.Go(func() error {
		err := stream.Run(streamCtx)
		if errors.Is(err, cdc.ErrStopped) || streamCtx.Err() != nil {
			return nil
		}
		return err
	})
	caughtUp := make(chan struct{})
	g.Go(func() error {
		err := catchUp.Run(gctx)
		stopStream()
		if errors.Is(err, cdc.ErrStopped) {
			close(caughtUp)
			return nil
		}
		if err == nil {
			err = gctx.Err()
		}
		return err
	})
	g.Go(func() error { return d.switchWhenCaughtUp(gctx, log, catchUp, stream, mainStream, nb.consistent) })
	if err := g.Wait(); err != nil {
		return err
	}
	select {
	case <-caughtUp:
		return nil
	default:
		return errors.New("the rebuild's catch-up stopped before the switch marker")
	}
}

// switchWhenCaughtUp waits until the catch-up is within a moment of the
// source, then writes the switch marker and stops both streams at it: the
// main pipeline then waits for the catch-up at the marker only briefly.
func (d *daemon) switchWhenCaughtUp(ctx context.Context, log *slog.Logger, catchUp *pipeline.Pipeline, stream, mainStream *cdc.Stream,
	consistent wal.LSN) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	catching := time.Now()
	for ticked(ctx, t.C) {
		// At least a second (the stream may not have received
		// anything yet), then once the catch-up is within a second of
		// the source and its stream within switchSlack of the main
		// one's (a walsender busy decoding a large transaction sends
		// nothing, and its pipeline then looks idle).
		if lag, _ := catchUp.Lag(time.Now()); lag > 1 || time.Since(catching) < time.Second {
			continue
		}
		if got := max(stream.Stats().ReceivedLSN, consistent); got+switchSlack < mainStream.Stats().ReceivedLSN {
			continue
		}
		if err := d.recordRebuild(ctx, "switching"); err != nil {
			return err
		}
		// No partition move commits across the marker. Held for the
		// rest of this run: it ends at the switch, and the next run
		// follows a partition change seen meanwhile.
		d.switching.Lock()
		id := rand.Text()
		mainStream.StopAt(id)
		stream.StopAt(id)
		at, err := cdc.EmitSwitch(ctx, d.source, d.cfg.Slot, id)
		if err != nil {
			return err
		}
		log.Info("rebuild caught up; switching at the marker", "marker_lsn", at.String())
		return nil
	}
	return ctx.Err()
}

// shadowJoins returns the rebuilt joins writing into their targets'
// shadows, resumed from their states.
func (d *daemon) shadowJoins(ctx context.Context, built []pipeline.Join) ([]pipeline.Join, error) {
	var shadows []pipeline.Join
	for _, j := range built {
		sp := *j.Plan()
		sp.Target = *sink.ShadowOf(&j.Plan().Target)
		sj, err := d.joinOn(&sp, j.Stores())
		if err != nil {
			return nil, err
		}
		if _, err := sj.Resume(ctx); err != nil {
			return nil, err
		}
		shadows = append(shadows, sj)
	}
	return shadows, nil
}

// switchBeside waits for the main pipeline to stop at the marker, then
// swaps the shadows in at the later of its checkpoint and the new
// generation's (switchRebuilt), and returns that position.
func (d *daemon) switchBeside(ctx context.Context, nb *besideBuild, mainDone <-chan struct{}) (wal.LSN, error) {
	select {
	case <-mainDone:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	at, err := d.writer.Checkpoint(ctx, d.cfg.Slot)
	if err != nil {
		return 0, err
	}
	for _, j := range nb.joins {
		for _, s := range j.Stores() {
			at = max(at, s.Checkpoint())
		}
	}
	return at, d.switchRebuilt(ctx, nb.joins, nb.epoch, rebuildSlot(d.cfg.Slot), at, nb.leaves)
}

// buildHeartbeat touches fkmat.build every second until ctx is done.
func (d *daemon) buildHeartbeat(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for ticked(ctx, t.C) {
		if _, err := d.target.Exec(ctx, `UPDATE fkmat.build SET updated_at = now() WHERE slot = $1`, d.cfg.Slot); err != nil && ctx.Err() == nil {
			log.Warn("could not record the rebuild's progress in fkmat.build", "err", err)
		}
	}
}

// besideBuild is the new generation of the rebuilt joins, loaded.
type besideBuild struct {
	joins      []pipeline.Join
	epoch      string
	consistent wal.LSN // the second slot's consistent point
	rows       int64
	leaves     map[uint32]leaf // as the snapshot saw them
}

// loadBeside opens the new generation of each rebuilt join's state (a
// build left behind by an earlier attempt is replaced), creates the second
// slot, and loads the states and the targets' shadows from its snapshot.
func (d *daemon) loadBeside(ctx context.Context, log *slog.Logger, client *cdc.Client) (*besideBuild, error) {
	nb := &besideBuild{epoch: redisstore.NewEpoch()}
	for _, b := range d.builds {
		j, err := d.openJoin(ctx, b.plan, b.gen)
		if err != nil {
			return nil, err
		}
		for _, s := range j.Stores() {
			if err := s.Drop(ctx); err != nil {
				return nil, fmt.Errorf("join %q: %w", b.plan.Name, err)
			}
		}
		nb.joins = append(nb.joins, j)
	}
	if err := d.recordRebuild(ctx, "loading"); err != nil {
		return nil, err
	}
	slot, err := client.CreateSlot(ctx, true)
	if err != nil {
		return nil, err
	}
	defer func() { _ = slot.Release(context.WithoutCancel(ctx)) }()
	log.Info("rebuild started beside the running joins", "slot", slot.Name, "consistent_point", slot.ConsistentPoint.String(),
		"reason", d.builds[0].reason)
	nb.consistent = slot.ConsistentPoint
	nb.rows, nb.leaves, err = d.loaderOf(nb.joins, log, true).run(ctx, nb.epoch, slot.SnapshotName, slot.ConsistentPoint)
	if err != nil {
		return nil, err
	}
	return nb, slot.Release(ctx)
}

// switchRebuilt is the target transaction of a rebuild's switch: each
// rebuilt target's shadow replaces it, and the joins' new definitions,
// epoch, generation and checkpoint are recorded. Readers see the old rows
// and shape until it commits, the new ones after.
func (d *daemon) switchRebuilt(ctx context.Context, built []pipeline.Join, epoch, slotName string, at wal.LSN, leaves map[uint32]leaf) error {
	return d.swapRetrying(ctx, "switching the rebuilt target in", func() error {
		return d.switchOnce(ctx, built, epoch, slotName, at, leaves)
	})
}

func (d *daemon) switchOnce(ctx context.Context, built []pipeline.Join, epoch, slotName string, at wal.LSN, leaves map[uint32]leaf) error {
	tx, err := d.writer.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+swapLockTimeout+"'"); err != nil {
		return fmt.Errorf("set the switch's lock timeout: %w", err)
	}
	for _, b := range d.builds {
		p := b.plan
		kind, err := tx.Swap(ctx, &p.Target, sink.ShadowOf(&p.Target))
		if err != nil {
			return fmt.Errorf("join %q: %w", p.Name, err)
		}
		err = tx.Exec(ctx, `UPDATE fkmat.join_state SET epoch = $3, fingerprint = $4, definition = $5, generation = $6, widened_lsn = NULL,
			frozen_lsn = NULL, phase = 'streaming', updated_at = now() WHERE slot = $1 AND join_name = $2`,
			d.cfg.Slot, p.Name, epoch, p.Fingerprint, string(plan.Definition(p)), b.gen)
		if err != nil {
			return fmt.Errorf("record the rebuilt join %q: %w", p.Name, err)
		}
		d.log.Info("the rebuilt target replaced the old one", "join", p.Name, "target", p.Target.Ident(), "how", string(kind))
	}
	if err := tx.Exec(ctx, `DELETE FROM fkmat.build WHERE slot = $1`, d.cfg.Slot); err != nil {
		return fmt.Errorf("end the build record: %w", err)
	}
	if err := tx.Exec(ctx, `DELETE FROM fkmat.checkpoint WHERE slot = $1`, slotName); err != nil {
		return fmt.Errorf("drop the rebuild's checkpoint: %w", err)
	}
	// The partitions of the tables only the new definitions join are
	// known as the snapshot saw them: the next start follows what changed
	// since. The others' are the running daemon's, which it kept.
	var now []config.TableName
	for _, p := range d.plans {
		if !slices.ContainsFunc(d.builds, func(b *rebuildJob) bool { return b.old == p }) {
			now = append(now, p.Tables()...)
		}
	}
	for _, b := range d.builds {
		now = append(now, b.plan.Tables()...)
	}
	var was []config.TableName
	for _, p := range d.plans {
		was = append(was, p.Tables()...)
	}
	var dropParents []string
	for _, t := range uniqueTables(now) {
		if !slices.Contains(was, config.TableName{Schema: t.Schema, Name: t.Name}) {
			dropParents = append(dropParents, config.TableName{Schema: t.Schema, Name: t.Name}.String())
		}
	}
	joined := map[string]bool{}
	for _, t := range uniqueTables(now) {
		joined[config.TableName{Schema: t.Schema, Name: t.Name}.String()] = true
	}
	if err := tx.Exec(ctx, `DELETE FROM fkmat.partitions WHERE slot = $1 AND (parent = ANY ($2) OR NOT parent = ANY ($3))`,
		d.cfg.Slot, dropParents, mapKeys(joined)); err != nil {
		return fmt.Errorf("record partitions: %w", err)
	}
	for _, l := range leaves {
		if !slices.Contains(dropParents, l.parent) {
			continue
		}
		if err := tx.Exec(ctx, `INSERT INTO fkmat.partitions (slot, parent, leaf_oid, leaf, relfilenode, truncated_xid, lost, attached, bound)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			d.cfg.Slot, l.parent, l.oid, l.name, l.relfilenode, l.truncatedXid, l.lost, l.attached, l.bound); err != nil {
			return fmt.Errorf("record partitions: %w", err)
		}
	}
	return tx.Commit(ctx, d.cfg.Slot, at)
}

func mapKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// recordRebuild records the rebuild's phase in fkmat.build (status shows
// it), starting the record at "loading".
func (d *daemon) recordRebuild(ctx context.Context, phase string) error {
	host, _ := os.Hostname()
	for _, b := range d.builds {
		_, err := d.target.Exec(ctx, `
			INSERT INTO fkmat.build (slot, join_name, reason, phase, host, pid) VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (slot, join_name) DO UPDATE SET reason = EXCLUDED.reason, phase = EXCLUDED.phase,
				rows_done = CASE WHEN EXCLUDED.phase = 'loading' THEN 0 ELSE fkmat.build.rows_done END,
				rows_total = CASE WHEN EXCLUDED.phase = 'loading' THEN 0 ELSE fkmat.build.rows_total END,
				host = EXCLUDED.host, pid = EXCLUDED.pid,
				started_at = CASE WHEN EXCLUDED.phase = 'loading' THEN now() ELSE fkmat.build.started_at END, updated_at = now()`,
			d.cfg.Slot, b.plan.Name, b.reason, phase, host, os.Getpid())
		if err != nil {
			return fmt.Errorf("record the rebuild of join %q: %w", b.plan.Name, err)
		}
		d.obs.setRebuild(b.plan.Name, phase)
	}
	return nil
}

// dropRebuildSlot drops the second slot an interrupted rebuild left
// behind, if any. Only this process streams the main slot, so a process
// still holding the second one is a dead predecessor's walsender, which is
// terminated.
func (d *daemon) dropRebuildSlot(ctx context.Context, client *cdc.Client) error {
	deadline := time.Now().Add(client.Config().SlotBusyTimeout)
	for {
		err := client.DropSlot(ctx)
		if !errors.Is(err, cdc.ErrSlotInUse) {
			return err
		}
		h, held, herr := client.Holder(ctx)
		if herr != nil {
			return herr
		}
		if held && h.PID != 0 {
			d.log.Warn("terminating the walsender a previous rebuild left on its slot", "slot", client.Config().Slot, "pid", h.PID)
			if _, err := d.source.Exec(ctx, `SELECT pg_terminate_backend($1)`, h.PID); err != nil {
				return fmt.Errorf("terminate the walsender of slot %s: %w", client.Config().Slot, err)
			}
		}
		if !time.Now().Before(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// dropLeftovers drops what a rebuild's crash left behind: the Redis state
// of the generation before each join's current one (the old one, after a
// switch), and, for the joins not being built, of the one after it (a
// build that did not finish) and the second slot.
func (d *daemon) dropLeftovers(ctx context.Context) error {
	if len(d.builds) == 0 {
		client, err := cdc.New(cdc.Config{ConnString: d.cfg.Source, Slot: rebuildSlot(d.cfg.Slot), Publication: d.cfg.Publication,
			Tables: d.cdc.Config().Tables, Logger: d.log, SlotBusyTimeout: d.opts.slotBusyTimeout()})
		if err != nil {
			return err
		}
		if err := d.dropRebuildSlot(ctx, client); err != nil {
			return err
		}
	}
	for _, j := range d.joins {
		name := j.Plan().Name
		st, err := d.loadJoinState(ctx, name)
		if err != nil {
			return err
		}
		gens := []int{st.generation - 1}
		if !slices.ContainsFunc(d.builds, func(b *rebuildJob) bool { return b.plan.Name == name }) {
			gens = append(gens, st.generation+1)
		}
		for _, gen := range gens {
			if gen < 0 {
				continue
			}
			if err := redisstore.DropGeneration(ctx, d.rdb, d.log, d.cfg.Slot, name, gen); err != nil {
				return fmt.Errorf("join %q: drop the Redis state of generation %d: %w", name, gen, err)
			}
		}
	}
	return nil
}
