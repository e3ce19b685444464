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
#   3. two guests on two virtual wires, each with its own rxe0 and siw0: the
#      built-in checks plus rsock's two-host test (client in one, server in
#      the other) on each device.
#
# Every test of stages 2 and 3 runs on rxe0 (Soft-RoCE) and on siw0
# (soft-iWARP); the summary counts them per device ("other": the doctor,
# which checks both).
#
# Prints each stage's time, and last the combined "N passed, M failed"; the
# exit status is 0 only if nothing failed and something passed.
#   SOFTROCE_SUITE_SKIP_TWO_HOSTS=1   skip stage 3
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
GO=${GO:-go}
cache=${SOFTROCE_CACHE:-.cache/softroce}
bin=$cache/bin
mkdir -p "$bin" && bin=$(cd "$bin" && pwd) || exit 1

t0=$(date +%s)
stage() { printf 'softroce-suite: == %s: %ss\n' "$1" "$(($(date +%s) - $2))"; }

# The binaries need libibverbs only at run time (dlopen), but cgo needs a
# C compiler; run.sh installs gcc with its packages, so install first.
bash test/softroce/run.sh --install-only || exit 1

ts=$(date +%s)
# e2e and rsockperf are in the tools module (tools/go.mod).
for p in ibverbs:.:./internal/verbs/ibverbs rsock:.:./rsock e2e:tools:./e2e; do
	name=${p%%:*} dir=${p#*:} pkg=${p##*:} dir=${dir%%:*}
	(cd "$dir" && CGO_ENABLED=1 "$GO" test -c -race -o "$bin/$name.test" "$pkg") || { echo "softroce-suite: building $pkg failed"; echo "0 passed, 1 failed"; exit 1; }
done
(cd tools && CGO_ENABLED=1 "$GO" build -o "$bin/rsockperf" ./cmd/rsockperf) || { echo "softroce-suite: building rsockperf failed"; echo "0 passed, 1 failed"; exit 1; }
stage "build test binaries" "$ts"

# Every verbs test runs on both devices of the guest: rxe0 (Soft-RoCE, the
# guest's SOFTROCE_* defaults) and siw0 (soft-iWARP, connected through
# rdma_cm; the same variables pointed at it). The guest sets
# RSOCK_REQUIRE_VERBS=rxe0,siw0, so a test that finds no device fails.
# shellcheck disable=SC2016
siw='SOFTROCE_DEV=$SOFTROCE_SIW_DEV SOFTROCE_NETDEV=$SOFTROCE_SIW_NETDEV SOFTROCE_IP=$SOFTROCE_SIW_IP SOFTROCE_PEER_IP=$SOFTROCE_SIW_PEER_IP SOFTROCE_GID_INDEX=0'

# rsockperf reports a failed unit run and carries on (exit 0): here any
# failure fails the test. It runs with rsock's default timeouts: a dial
# costs one round trip on the switching protocol, and the rings are set
# up after it, however long sixteen at once take under emulation.
# shellcheck disable=SC2016
perf='rsockperf compare --quick --quiet --transports verbs --host "$SOFTROCE_IP" --idle-conns 50 --conns 8 >/tmp/rsockperf.out 2>&1; rc=$?; cat /tmp/rsockperf.out; [ "$rc" = 0 ] && ! grep -q FAILED /tmp/rsockperf.out'
# rsockperf doctor must find rxe0 with a RoCE v2 GID with an IPv4 address,
# siw0 through rdma_cm, and verbs working by a connection to itself on
# each device's address.
# shellcheck disable=SC2016
doctor='rsockperf doctor >/tmp/doctor.out 2>&1; rc=$?; cat /tmp/doctor.out; [ "$rc" = 0 ] && grep -q "^  rxe0 " /tmp/doctor.out && grep -q "RoCE v2.*IPv4" /tmp/doctor.out && grep -q "^  siw0 (iWARP" /tmp/doctor.out && grep -q "verbs on $SOFTROCE_IP: works" /tmp/doctor.out && grep -q "verbs on $SOFTROCE_SIW_IP: works" /tmp/doctor.out'
one=(
	--bin "$bin/ibverbs.test" --bin "$bin/rsock.test" --bin "$bin/e2e.test" --bin "$bin/rsockperf"
	--test doctor="$doctor"
	--test-timeout 470 --timeout 1500
)
for dev in rxe0 siw0; do
	env=
	[ "$dev" = siw0 ] && env="$siw "
	one+=(
		--test "ibverbs.$dev=${env}ibverbs.test -test.count=1 -test.timeout 150s -test.v"
		--test "rsock.$dev=${env}rsock.test -test.count=1 -test.timeout 450s -test.v -test.run Verbs"
		--test "e2e.$dev=${env}RSOCK_E2E_TRANSPORTS=verbs e2e.test -test.count=1 -test.timeout 200s -test.v -test.skip \"^TestCurl\""
		--test "rsockperf.$dev=${env}$perf"
	)
done
# rxe0 once more with its queue pairs connected through rdma_cm
# (RSOCK_VERBS_CM=1): the conformance suite, and rsock's stream over it.
one+=(
	--test "ibverbs_cm.rxe0=RSOCK_VERBS_CM=1 ibverbs.test -test.count=1 -test.timeout 150s -test.v -test.run \"TestConformance|TestQPAttributes\""
	--test "rsock_cm.rxe0=RSOCK_VERBS_CM=1 rsock.test -test.count=1 -test.timeout 150s -test.v -test.run \"TestNettestVerbs|TestVerbsStreamIntegrity\""
)
two=(
	--two-hosts --bin "$bin/rsock.test"
	--test-timeout 140 --timeout 360
)
for dev in rxe0 siw0; do
	env=
	[ "$dev" = siw0 ] && env="$siw "
	two+=(--test "rsock_two_hosts.$dev=${env}rsock.test -test.count=1 -test.timeout 120s -test.v -test.run TwoHosts")
done
# rxe0 once more through rdma_cm (the traffic class takes another path).
two+=(--test "rsock_two_hosts_cm.rxe0=RSOCK_VERBS_CM=1 rsock.test -test.count=1 -test.timeout 120s -test.v -test.run TwoHosts")

passed=0
failed=0
declare -A dev_pass=() dev_fail=()
tally() { # the summary line of a run.sh log, its results per device, and its failed tests' output (to tails)
	local line st name dev
	line=$(tail -n 1 "$1")
	if [[ $line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
		passed=$((passed + BASH_REMATCH[1]))
		failed=$((failed + BASH_REMATCH[2]))
	else
		failed=$((failed + 1))
	fi
	while read -r st name; do
		dev=other
		[[ $name =~ \.(rxe0|siw0)(@|$) ]] && dev=${BASH_REMATCH[1]}
		[[ $name == siw_* ]] && dev=siw0
		[[ $name =~ ^(devinfo|rc_pingpong|probe|probe_write)(@|$) ]] && dev=rxe0
		if [ "$st" = PASS ]; then
			dev_pass[$dev]=$((${dev_pass[$dev]:-0} + 1))
		else
			dev_fail[$dev]=$((${dev_fail[$dev]:-0} + 1))
		fi
	done < <(sed -n 's/^  \(PASS\|FAIL\)  \([^ ]*\) .*/\1 \2/p' "$1")
	sed -n '/^softroce: --- the last /,/^softroce: --- end of /p' "$1" >>"$tails"
}

log=$(mktemp)
tails=$(mktemp) # run.sh's blocks of failed tests' output, repeated at the end
trap 'rm -f "$log" "$tails"' EXIT
ts=$(date +%s)
# 2 GiB: TestVerbsThousandConnections holds 2,000 queue pairs at once; rxe
# maps about 210 KiB of queue memory per QP and CQ into the process, and
# the race detector doubles the heap (1 GiB ran out of memory).
SOFTROCE_MEM="${SOFTROCE_MEM:-2048}" GO="$GO" bash test/softroce/run.sh "${one[@]}" 2>&1 | tee "$log"
tally "$log"
stage "one guest" "$ts"

if [ "${SOFTROCE_SUITE_SKIP_TWO_HOSTS:-0}" != 1 ]; then
	ts=$(date +%s)
	GO="$GO" bash test/softroce/run.sh "${two[@]}" 2>&1 | tee "$log"
	tally "$log"
	stage "two guests" "$ts"
fi

stage "total" "$t0"
cat "$tails"
for dev in rxe0 siw0 other; do
	echo "softroce-suite: $dev: ${dev_pass[$dev]:-0} passed, ${dev_fail[$dev]:-0} failed"
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
