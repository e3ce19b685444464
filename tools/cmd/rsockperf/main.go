// Command rsockperf measures rsock against plain kernel TCP: ping-pong
// latency, one-way and bidirectional throughput, connection setup, many
// connections, net/http and gRPC, and what idle connections cost.
//
//	rsockperf compare --quick                 every workload over shm and tcp, ratios to plain TCP
//	rsockperf server --transport shm          serve the workloads
//	rsockperf client --transport shm --connect 127.0.0.1:7470
//
// The workloads, statistics and reports are in tools/internal/perf.
package main

import (
	"os"

	"github.com/rdmanet/rdmanet/tools/internal/perf"
)

func main() {
	os.Exit(perf.Main(os.Args[1:], os.Stdout, os.Stderr))
}
