package crash

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

func TestRecover(t *testing.T) {
	t.Parallel()
	f := func(i int) (err error) {
		defer Recover(&err, func() (string, uint64) { return "in the test at 0/10", 0x10 })
		s := make([]int, 1)
		_ = s[i] // panics for i >= 1
		return errors.New("returned")
	}
	if err := f(0); err == nil || err.Error() != "returned" {
		t.Fatalf("no panic: %v", err)
	}
	err := f(3)
	e, ok := errors.AsType[*Error](err)
	if !ok || e.CommitLSN != 0x10 || !strings.Contains(err.Error(), "panic in the test at 0/10: runtime error: index out of range") {
		t.Fatalf("got %v", err)
	}
	if _, ok := errors.AsType[runtime.Error](err); !ok {
		t.Errorf("the runtime error is not in the chain")
	}
	if !strings.Contains(string(e.Stack), "crash.TestRecover") {
		t.Errorf("stack lacks the panicking function:\n%s", e.Stack)
	}
}

func TestGo(t *testing.T) {
	t.Parallel()
	err := <-Go(func() error { panic("boom") }, func() (string, uint64) { return "in the writer", 0 })
	if e, ok := errors.AsType[*Error](err); !ok || e.Value != "boom" || e.Unwrap() != nil {
		t.Fatalf("got %v", err)
	}
	if err := <-Go(func() error { return nil }, nil); err != nil {
		t.Fatalf("got %v", err)
	}
}
