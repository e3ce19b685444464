#!/bin/sh
# Where the time of a net/http or gRPC request goes, over rsock shm and
# plain TCP: runs rsockperf's server and client (two processes) with CPU
# profiles, then splits each process's CPU per request into transport,
# scheduler (park, wake, goroutine hand-offs), allocation and GC, and the
# application (net/http, gRPC, the workload). BENCHMARKS.md quotes it.
#
#   test/profile/run.sh [http|grpc] [connections] [seconds]
set -eu
wl=${1:-http} conc=${2:-1} secs=${3:-3}
cd "$(dirname "$0")/../.."
out=${PROFILE_DIR:-$(mktemp -d)}
mkdir -p "$out" && out=$(cd "$out" && pwd) # absolute: rsockperf is built from tools/
bin=$out/rsockperf
(cd tools && go build -o "$bin" ./cmd/rsockperf)
port=7495
args=""
for mode in shm plain; do
	if [ $mode = shm ]; then m="-transport shm"; else m="-plain"; fi
	"$bin" server $m -listen 127.0.0.1:$port -cpuprofile "$out/server-$mode.prof" >"$out/server-$mode.log" 2>&1 &
	srv=$!
	sleep 1
	rate=$("$bin" client $m -connect 127.0.0.1:$port -workloads "$wl" -concurrency "$conc" -repeats 1 \
		-duration "${secs}s" -quiet -cpuprofile "$out/client-$mode.prof" | awk '/(requests|calls)\/s/ {print $3; exit}')
	kill -INT $srv
	wait $srv || true
	n=$(awk -v r="$rate" -v s="$secs" 'BEGIN {printf "%d", r * s}')
	echo "$wl c=$conc $mode: $rate per second"
	args="$args $out/client-$mode.prof $n $out/server-$mode.prof $n"
	port=$((port + 1))
done
echo "CPU per request (us), by where it goes; profiles in $out"
python3 test/profile/categories.py "$bin" $args
