package testenv

import (
	"strings"
	"sync"
	"testing"
)

// RaceMarkedOnly, set by a test package built with the race detector
// (integration/race_test.go), skips every test that starts a database or
// Redis unless it called Race first: under the detector the whole
// integration suite would take too long, and only the tests that drive the
// daemon in process through its concurrent paths are worth it.
var RaceMarkedOnly bool

var raceMarked sync.Map // test name → true

// Race marks t (and its subtests) as a test that make test-race runs under
// the race detector. Call it first in the test.
func Race(t testing.TB) { raceMarked.Store(t.Name(), true) }

// skipUnmarked skips t under RaceMarkedOnly unless it or a parent called
// Race.
func skipUnmarked(t testing.TB) {
	if !RaceMarkedOnly {
		return
	}
	name := t.Name()
	for {
		if _, ok := raceMarked.Load(name); ok {
			return
		}
		i := strings.LastIndexByte(name, '/')
		if i < 0 {
			t.Skip("not run under the race detector (it does not call testenv.Race)")
		}
		name = name[:i]
	}
}
