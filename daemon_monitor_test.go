package fkmat

import (
	"testing"
	"time"
)

func TestRateLimit(t *testing.T) {
	r := rateLimit{}
	now := time.Now()
	if !r.allow("a", now) || r.allow("a", now.Add(time.Minute)) || !r.allow("b", now.Add(time.Minute)) {
		t.Fatal("a kind repeats within warnEvery, or one kind holds back another")
	}
	if !r.allow("a", now.Add(warnEvery)) {
		t.Fatal("a kind stays silent after warnEvery")
	}
}
