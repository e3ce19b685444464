#!/usr/bin/env bash
# suite.sh: the project's real-RDMA tests, as `make test` runs them.
#
#   1. builds the test binaries on the host (cgo, -race): the ibverbs
#      provider's conformance suite, rsock over verbs, and the e2e suites
#      (net/http, HTTP/2, TLS, gRPC), whose verbs rows run in the guest;
#      and rsockperf, whose quick compare over verbs runs as a check that
#      every workload works there (software RDMA under emulation: no speed
#      figure);
#   2. one guest (rxe0 on a veth pair): run.sh's built-in checks plus those
#      binaries;
#   3. two guests on a virtual wire, each with its own rxe0: the built-in
#      checks plus rsock's two-host test (client in one, server in the other).
#
# Prints each stage's time, and last the combined "N passed, M failed"; the
# exit status is 0 only if nothing failed and something passed.
#   SOFTROCE_SUITE_SKIP_TWO_HOSTS=1   skip stage 3
set -uo pipefail
cd "$(dirname "$0")/../.."
GO=${GO:-go}
cache=${SOFTROCE_CACHE:-.cache/softroce}
bin=$cache/bin
mkdir -p "$bin"

t0=$(date +%s)
stage() { printf 'softroce-suite: == %s: %ss\n' "$1" "$(($(date +%s) - $2))"; }

# The binaries need libibverbs only at run time (dlopen), but cgo needs a
# C compiler; run.sh installs gcc with its packages, so install first.
bash test/softroce/run.sh --install-only || exit 1

ts=$(date +%s)
for p in ibverbs:./internal/verbs/ibverbs rsock:./rsock e2e:./e2e; do
	CGO_ENABLED=1 "$GO" test -c -race -o "$bin/${p%%:*}.test" "${p#*:}" || { echo "softroce-suite: building ${p#*:} failed"; echo "0 passed, 1 failed"; exit 1; }
done
CGO_ENABLED=1 "$GO" build -o "$bin/rsockperf" ./cmd/rsockperf || { echo "softroce-suite: building rsockperf failed"; echo "0 passed, 1 failed"; exit 1; }
stage "build test binaries" "$ts"

# rsockperf reports a failed unit run and carries on (exit 0): here any
# failure fails the test. Its rsock modes get a generous handshake bound:
# sixteen verbs handshakes at once take seconds under emulation. (The
# probe needs none: the listener answers the magic before it prepares
# anything.)
# shellcheck disable=SC2016
perf='RSOCK_SNIFF_TIMEOUT=30s RSOCK_HANDSHAKE_TIMEOUT=30s rsockperf compare --quick --quiet --transports verbs --host "$SOFTROCE_IP" --idle-conns 50 --conns 8 >/tmp/rsockperf.out 2>&1; rc=$?; cat /tmp/rsockperf.out; [ "$rc" = 0 ] && ! grep -q FAILED /tmp/rsockperf.out'
# rsockperf doctor must find rxe0, a RoCE v2 GID with an IPv4 address,
# and verbs working by a connection to itself.
# shellcheck disable=SC2016
doctor='rsockperf doctor >/tmp/doctor.out 2>&1; rc=$?; cat /tmp/doctor.out; [ "$rc" = 0 ] && grep -q "^  rxe0 " /tmp/doctor.out && grep -q "RoCE v2.*IPv4" /tmp/doctor.out && grep -q "verbs on .*: works" /tmp/doctor.out'
one=(
	--bin "$bin/ibverbs.test" --bin "$bin/rsock.test" --bin "$bin/e2e.test" --bin "$bin/rsockperf"
	--test ibverbs='ibverbs.test -test.count=1 -test.timeout 150s -test.v'
	--test rsock='rsock.test -test.count=1 -test.timeout 200s -test.v -test.run Verbs'
	--test e2e='RSOCK_E2E_TRANSPORTS=verbs e2e.test -test.count=1 -test.timeout 200s -test.v -test.skip "^TestCurl"'
	--test rsockperf="$perf"
	--test doctor="$doctor"
	--test-timeout 220 --timeout 540
)
two=(
	--two-hosts --bin "$bin/rsock.test"
	--test rsock_two_hosts='rsock.test -test.count=1 -test.timeout 120s -test.v -test.run TwoHosts'
	--test-timeout 140 --timeout 240
)

passed=0
failed=0
tally() { # the summary line of a run.sh log
	local line
	line=$(tail -n 1 "$1")
	if [[ $line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
		passed=$((passed + BASH_REMATCH[1]))
		failed=$((failed + BASH_REMATCH[2]))
	else
		failed=$((failed + 1))
	fi
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
ts=$(date +%s)
GO="$GO" bash test/softroce/run.sh "${one[@]}" 2>&1 | tee "$log"
tally "$log"
stage "one guest" "$ts"

if [ "${SOFTROCE_SUITE_SKIP_TWO_HOSTS:-0}" != 1 ]; then
	ts=$(date +%s)
	GO="$GO" bash test/softroce/run.sh "${two[@]}" 2>&1 | tee "$log"
	tally "$log"
	stage "two guests" "$ts"
fi

stage "total" "$t0"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
