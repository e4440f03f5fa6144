package pipeline

import (
	"context"
	"testing"
	"time"
)

func TestAfterGrace(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	gctx, cancel := afterGrace(parent, 50*time.Millisecond)
	defer cancel()
	stop()
	select {
	case <-gctx.Done():
		t.Fatal("canceled with its parent, before the grace passed")
	case <-time.After(20 * time.Millisecond):
	}
	select {
	case <-gctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("not canceled after the grace")
	}
	if context.Cause(gctx) == context.Canceled {
		t.Fatalf("cause %v, want the shutdown grace", context.Cause(gctx))
	}
}

func TestAfterGraceRunning(t *testing.T) {
	gctx, cancel := afterGrace(context.Background(), time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	if gctx.Err() != nil {
		t.Fatal("canceled while its parent runs")
	}
	cancel()
	if gctx.Err() == nil {
		t.Fatal("not canceled by its cancel func")
	}
}
