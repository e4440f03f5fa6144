package pipeline

import (
	"errors"

	"github.com/fkmat/fkmat/internal/wal"
)

// The pipeline's errors. Which of them a restart can fix is decided by the
// daemon's classification (errors.go of the root package).
var (
	// ErrSchemaChanged means a source table changed in a way the join
	// cannot follow (a join column dropped or retyped): the pipeline stops
	// without acknowledging the change.
	ErrSchemaChanged = errors.New("source schema changed")
	// ErrWidened means a source column the join uses widened its type
	// (plan.Widens): the pipeline stops without acknowledging the change,
	// and the daemon restarts from its checkpoints with the new type,
	// widening the target column first.
	ErrWidened = errors.New("a joined column's type was widened")
	// ErrUnplaced means the stream carried a row change of a table no join
	// uses: applying the rest would silently drop it, so the pipeline stops.
	ErrUnplaced = errors.New("change of a table no join uses")
	// ErrStateChanged means a join's Redis state vanished or was replaced
	// while the pipeline ran; the daemon restarts and its start-up checks
	// decide (rebuild or refuse).
	ErrStateChanged = errors.New("redis state lost or replaced while running")
	// ErrFinalBatch marks a failure of the batch the pipeline finishes
	// during shutdown: its effect is not committed, and the exit must say
	// so.
	ErrFinalBatch = errors.New("the last batch failed during shutdown")
	// errEarlierFailed ends a batch whose predecessor failed: it commits
	// nothing more (the predecessor's error is the one reported).
	errEarlierFailed = errors.New("an earlier batch failed")
)

// TxnError is a pipeline error located in the source stream: the
// transaction whose change failed, the table and its key columns (never
// values: they may be personal data).
type TxnError struct {
	LSN        wal.LSN // commit LSN of the failing transaction
	Join       string
	Table      string
	KeyColumns []string
	err        error
}

func (e *TxnError) Error() string { return e.err.Error() }
func (e *TxnError) Unwrap() error { return e.err }
