//go:build race

package integration

import "github.com/fkmat/fkmat/internal/testenv"

// Under the race detector (make test-race) only the tests that call
// testenv.Race run: those that drive the daemon in process through its
// concurrent paths.
func init() { testenv.RaceMarkedOnly = true }
