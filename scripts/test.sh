#!/usr/bin/env bash
# The whole test suite (make test), in two streams that run side by side:
#
#   A: the unit packages (go test, two at a time), then the integration tests
#      that stop, pause or restart their Postgres and Redis containers (the
#      fault injection and restart tests), and those that build and run
#      images and releases and the long roll-up tests (which leaves the two
#      streams about as long);
#   B: the other integration tests.
#
# Each integration test process starts its own Postgres and Redis
# containers, so the tests of A never restart the containers B's tests use.
# Most integration tests wait on the databases more than they compute, which
# leaves room for A on the two cores of the development machine.
#
# B's output goes to the terminal as it runs; A's goes to a file, printed
# when both are done. The exit code is 0 only if both passed.
set -uo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
TIMEOUT=${TEST_TIMEOUT:-45m}
# The integration tests that need their containers to themselves, and those
# that build images and releases.
ALONE='^(TestFault.*|TestDaemonSurvivesRestarts|TestHarnessRestart|TestImage|TestReadmeQuickStart|TestMakeDemo|TestRelease|TestRollups|TestRollupHotParent|TestRollupKilledAndChanged|TestRollupsOnCluster)$'

mkdir -p .test-logs
log=.test-logs/unit-and-restarts.log
units=$($GO list ./... | grep -v '/integration$')

(
	rc=0
	# shellcheck disable=SC2086 # a list of packages
	$GO test -count=1 -timeout "$TIMEOUT" $units || rc=1
	$GO test -count=1 -timeout "$TIMEOUT" -run "$ALONE" ./integration/ || rc=1
	exit $rc
) >"$log" 2>&1 &
a=$!

$GO test -count=1 -timeout "$TIMEOUT" -skip "$ALONE" ./integration/
b=$?
wait "$a"
a=$?

echo "--- unit packages, then the integration tests that restart their containers ($log):"
cat "$log"
if [ "$a" -ne 0 ] || [ "$b" -ne 0 ]; then
	echo "make test: FAILED (unit and restart tests: exit $a; other integration tests: exit $b)" >&2
	exit 1
fi
echo "make test: ok"
