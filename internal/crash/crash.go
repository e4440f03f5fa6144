// Package crash turns a panic in one of fkmat's goroutines into an error
// that says where it happened, so that the daemon restarts from its
// checkpoints and counts the recurrences as a stall (shown by fkmat status,
// /readyz and the stall alert) instead of dying on every start.
package crash

import (
	"fmt"
	"runtime/debug"
	"sync/atomic"
)

// Error is a recovered panic.
type Error struct {
	// Where names the work that panicked: the goroutine, and the source
	// position and transaction when they are known.
	Where string
	// CommitLSN is the commit position of the transaction being handled,
	// zero when unknown. It is the LSN type's integer value: this package
	// imports nothing of fkmat's.
	CommitLSN uint64
	// Value is what panic was called with; Stack is the panicking
	// goroutine's stack.
	Value any
	Stack []byte
}

func (e *Error) Error() string {
	return fmt.Sprintf("panic %s: %v (a bug in fkmat: please report it with the stack trace logged beside this error)", e.Where, e.Value)
}

// Unwrap returns the panic's value when it is an error (a runtime error,
// say), so that the stall tracker sees the same cause at every recurrence.
func (e *Error) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Recover is deferred by a goroutine's function: a panic becomes an *Error
// in *errp, located by where (called only after a panic; it may read the
// state the goroutine was in). Any other return passes through.
//
//	defer crash.Recover(&err, func() (string, uint64) { return "decoding", uint64(lsn) })
func Recover(errp *error, where func() (string, uint64)) {
	v := recover()
	if v == nil {
		return
	}
	e := &Error{Value: v, Stack: debug.Stack()}
	e.Where, e.CommitLSN = where()
	*errp = e
}

// Go runs fn in a new goroutine and returns a channel that receives its
// error, a panic recovered as in Recover.
func Go(fn func() error, where func() (string, uint64)) <-chan error {
	ch := make(chan error, 1)
	go func() {
		var err error
		defer func() { ch <- err }()
		defer Recover(&err, where)
		err = fn()
	}()
	return ch
}

// hook is the test hook At calls.
var hook atomic.Pointer[func(point string, arg any)]

// SetTestHook makes At call fn (nil: nothing). Tests use it to make a
// goroutine of the daemon panic at a named point; it is not for production.
func SetTestHook(fn func(point string, arg any)) {
	if fn == nil {
		hook.Store(nil)
		return
	}
	hook.Store(&fn)
}

// At calls the test hook, if any, at a named point of a goroutine, with
// what the goroutine holds there: the points are "decode" (a chunk the
// stream assembled), "join" (a batch taken by the pipeline) and "commit"
// (a batch's commit begins), "target written" (its rows are written, the
// target transaction open), "target committed" and "state committed"
// (before the acknowledgement), each with its []*cdc.Txn; "backfill: slot
// created" and "backfill: loaded", with the configured slot's name.
func At(point string, arg any) {
	if h := hook.Load(); h != nil {
		(*h)(point, arg)
	}
}
