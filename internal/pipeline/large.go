package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/fkmat/fkmat/cdc"
	"github.com/fkmat/fkmat/join"
)

// applyLarge applies a transaction delivered in several chunks: all chunks
// go into one target transaction, committed at the source commit, while each
// chunk's Redis state is written at once with an undo log (CommitPartial),
// so that later chunks see it and a crash midway is rolled back (Recover).
// If the stream restarts the transaction from chunk 0 (a reconnect), the
// work so far is undone and the transaction starts over.
func (p *Pipeline) applyLarge(ctx context.Context, first *cdc.Txn) error {
	p.inLarge.Store(true)
	defer p.inLarge.Store(false)
	for {
		restart, err := p.tryLarge(ctx, first)
		if err != nil && ctx.Err() != nil {
			// Shutdown: the attempt was undone; the transaction is replayed
			// on the next start.
			p.log.Info("shutdown in the middle of a large transaction; it will be applied on restart", "xid", first.Xid)
			return nil
		}
		if err != nil || restart == nil {
			return err
		}
		p.log.Info("transaction restarted by the stream; undoing its partial work", "xid", first.Xid)
		first = restart
	}
}

// A chunkHolder holds what it writes once per transaction (a roll-up's
// results per parent) over the chunks of a large transaction before its
// last.
type chunkHolder interface {
	// holdChunks says whether the batches to come are such chunks (hold),
	// and whether a transaction starts (start: drop what was held).
	holdChunks(hold, start bool)
}

// tryLarge applies one attempt of a chunked transaction. It returns the
// chunk 0 that restarts it, if the stream sent one.
func (p *Pipeline) tryLarge(ctx context.Context, first *cdc.Txn) (restart *cdc.Txn, err error) {
	txnID := first.CommitLSN
	// Transactions are ordered by commit position: one that commits before
	// the target checkpoint is already in the target.
	writeTarget := first.CommitLSN >= p.targetCheckpoint()
	var tx TargetTx
	if writeTarget {
		if tx, err = p.target.Begin(ctx); err != nil {
			return nil, err
		}
	}
	partial := make([]bool, len(p.joins))
	done := false
	defer func() {
		if done {
			return
		}
		// Abandon the attempt: nothing of it may remain.
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if tx != nil {
			_ = tx.Rollback(bg)
		}
		for i, j := range p.joins {
			if h, ok := j.(chunkHolder); ok {
				h.holdChunks(false, true)
			}
			if partial[i] {
				if _, rerr := j.state().Recover(bg); rerr != nil && err == nil {
					err = fmt.Errorf("join %q: undo partial transaction: %w", j.Plan().Name, rerr)
				}
			}
		}
	}()
	chunk, changes := first, 0
	var truncations []truncation
	for {
		if err := p.checkPlaced(chunk); err != nil {
			return nil, err
		}
		truncations = appendTruncations(truncations, chunk)
		for i, j := range p.joins {
			if j.state().Checkpoint() > chunk.CommitLSN {
				continue // this join's state has the whole transaction
			}
			jc, err := j.mapChunk(chunk)
			if err != nil {
				return nil, err
			}
			if h, ok := j.(chunkHolder); ok {
				h.holdChunks(!chunk.Final, chunk == first)
			}
			m, err := j.apply(ctx, jc, chunk.CommitLSN+1, func(ctx context.Context, out join.Output) error {
				if tx == nil {
					return nil
				}
				return tx.Apply(ctx, &j.Plan().Target, out)
			})
			if err != nil {
				return nil, j.located([]txnSpan{{txn: chunk}}, fmt.Errorf("join %q: %w", j.Plan().Name, err))
			}
			if err := j.state().CommitPartial(ctx, m, txnID); err != nil {
				return nil, fmt.Errorf("join %q: %w", j.Plan().Name, err)
			}
			if m.Clears() {
				p.garbage.Store(true)
			}
			partial[i] = true
		}
		changes += len(chunk.Changes)
		if chunk.Final {
			break
		}
		next, err := p.source.Next(ctx)
		if err == nil {
			err = p.fill(ctx, next)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil // shutdown: undone by the deferred rollback, replayed on restart
			}
			return nil, err
		}
		if next.Chunk == 0 {
			return next, nil
		}
		chunk = next
	}
	end := chunk.EndLSN
	if tx != nil {
		if err := p.commitTargetTx(ctx, tx, truncations, end); err != nil {
			return nil, err
		}
	}
	done = true
	for i, j := range p.joins {
		if partial[i] {
			if err := j.state().FinishPartial(ctx, end); err != nil {
				return nil, fmt.Errorf("join %q: %w", j.Plan().Name, err)
			}
		}
	}
	p.acknowledge(1, changes, chunk, end, true)
	p.log.Info("large transaction applied", "xid", first.Xid, "changes", changes, "chunks", chunk.Chunk+1, "end_lsn", end.String())
	return nil, nil
}
