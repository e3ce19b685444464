package perf

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Workload names.
const (
	WPingPong   = "pingpong"   // one connection, request and echo of Size bytes
	WThroughput = "throughput" // one-way, Size-byte writes
	WBidir      = "bidir"      // both ways at once, Size-byte writes
	WSetup      = "setup"      // dial, handshake, one round trip, close
	WConns      = "conns"      // N connections doing 64-byte ping-pong at once
	WHTTP       = "http"       // net/http GET requests, N connections and callers
	WGRPC       = "grpc"       // gRPC unary calls, N connections and callers
	WIdle       = "idle"       // N idle connections: memory, threads, fds
)

// AllWorkloads lists every workload in the order they run.
var AllWorkloads = []string{WPingPong, WThroughput, WBidir, WSetup, WConns, WHTTP, WGRPC, WIdle}

// Metric names.
const (
	MetricP50  = "p50_us"
	MetricP90  = "p90_us"
	MetricP99  = "p99_us"
	MetricP999 = "p999_us"
	MetricMax  = "max_us"

	MetricGBps     = "gb_per_s"     // payload bytes per second, both directions for bidir, 1e9
	MetricCPUPerGB = "cpu_s_per_gb" // CPU seconds of both processes per 1e9 bytes moved
	MetricRate     = "per_s"        // round trips, connections, requests or calls per second
	// MetricOneMoreRTT is plain TCP's setup rate with one more round trip
	// over its rate without (setup workload, plain TCP only): the ceiling
	// of rsock's setup ratio, whose Dial waits for the server's answer.
	MetricOneMoreRTT = "one_more_rtt_x"

	MetricConns         = "conns" // idle connections open when measured
	MetricRSSClient     = "rss_kib_per_conn_client"
	MetricRSSServer     = "rss_kib_per_conn_server"
	MetricVSZClient     = "vsz_kib_per_conn_client"
	MetricVSZServer     = "vsz_kib_per_conn_server"
	MetricFDsClient     = "fds_per_conn_client"
	MetricFDsServer     = "fds_per_conn_server"
	MetricThreadsClient = "threads_client"
	MetricThreadsServer = "threads_server"
	MetricPinnedClient  = "pinned_kib_per_conn_client" // registered with the device (rsock ConnInfo.Registered)
)

// MetricInfo says how to show a metric and which way is better.
type MetricInfo struct {
	Label        string
	Unit         string
	HigherBetter bool
	// NoRatio: a ratio to plain TCP would mislead (plain TCP's figure is
	// near zero, its socket memory being in the kernel, not in RSS).
	NoRatio bool
	// PlainOnly: only plain TCP's run measures it.
	PlainOnly bool
}

var metricInfo = map[string]MetricInfo{
	MetricP50:           {Label: "p50", Unit: "us"},
	MetricP90:           {Label: "p90", Unit: "us"},
	MetricP99:           {Label: "p99", Unit: "us"},
	MetricP999:          {Label: "p99.9", Unit: "us"},
	MetricMax:           {Label: "max", Unit: "us"},
	MetricGBps:          {Label: "throughput", Unit: "GB/s", HigherBetter: true},
	MetricCPUPerGB:      {Label: "CPU per GB", Unit: "s/GB"},
	MetricRate:          {Label: "rate", Unit: "/s", HigherBetter: true},
	MetricOneMoreRTT:    {Label: "rate with one more round trip / rate", Unit: "x", HigherBetter: true, NoRatio: true, PlainOnly: true},
	MetricConns:         {Label: "idle conns", Unit: "", HigherBetter: true},
	MetricRSSClient:     {Label: "RSS per conn, client", Unit: "KiB", NoRatio: true},
	MetricRSSServer:     {Label: "RSS per conn, server", Unit: "KiB", NoRatio: true},
	MetricVSZClient:     {Label: "mapped per conn, client", Unit: "KiB", NoRatio: true},
	MetricVSZServer:     {Label: "mapped per conn, server", Unit: "KiB", NoRatio: true},
	MetricFDsClient:     {Label: "fds per conn, client", Unit: ""},
	MetricFDsServer:     {Label: "fds per conn, server", Unit: ""},
	MetricThreadsClient: {Label: "OS threads, client", Unit: ""},
	MetricThreadsServer: {Label: "OS threads, server", Unit: ""},
	MetricPinnedClient:  {Label: "registered per conn, client", Unit: "KiB", NoRatio: true},
}

// InfoOfMetric returns how to show metric m.
func InfoOfMetric(m string) MetricInfo {
	if i, ok := metricInfo[m]; ok {
		return i
	}
	return MetricInfo{Label: m}
}

// Unit is one measurement: a workload with its parameter, run in one mode
// for about a duration.
type Unit struct {
	Workload string
	Size     int // bytes: message size (pingpong) or write size (throughput, bidir)
	N        int // connections (conns, idle) or connections and callers (http, grpc)
}

// Param names the unit's parameter: "64B", "1MiB", "c=16", "n=1000".
func (u Unit) Param() string {
	switch u.Workload {
	case WPingPong, WThroughput, WBidir:
		return FormatSize(u.Size)
	case WHTTP, WGRPC:
		return fmt.Sprintf("c=%d", u.N)
	case WConns, WIdle:
		return fmt.Sprintf("n=%d", u.N)
	}
	return ""
}

// Key is "workload/param" (or the workload alone without a parameter).
func (u Unit) Key() string {
	if p := u.Param(); p != "" {
		return u.Workload + "/" + p
	}
	return u.Workload
}

// FormatSize writes a byte count the short way: 1B, 64KiB, 4MiB.
func FormatSize(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// Measurement is what one unit produced.
type Measurement struct {
	Metrics map[string]float64
	Hist    *hdrhistogram.Histogram // latencies, if the workload has them
}

// Run runs u against t for about d.
func (u Unit) Run(ctx context.Context, t *Target, d time.Duration) (Measurement, error) {
	switch u.Workload {
	case WPingPong:
		return pingPong(ctx, t, u.Size, d)
	case WThroughput:
		return throughput(ctx, t, u.Size, d)
	case WBidir:
		return bidir(ctx, t, u.Size, d)
	case WSetup:
		return setupRate(ctx, t, d)
	case WConns:
		return manyConns(ctx, t, u.N, d)
	case WHTTP:
		return httpLoad(ctx, t, u.N, d)
	case WGRPC:
		return grpcLoad(ctx, t, u.N, d)
	case WIdle:
		return idleConns(ctx, t, u.N)
	}
	return Measurement{}, fmt.Errorf("unknown workload %q", u.Workload)
}

// ParseWorkloads parses a comma-separated list of workload names ("all":
// every one).
func ParseWorkloads(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" || strings.TrimSpace(s) == "" {
		return append([]string(nil), AllWorkloads...), nil
	}
	want := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		ok := false
		for _, w := range AllWorkloads {
			ok = ok || w == f
		}
		if !ok {
			return nil, fmt.Errorf("unknown workload %q (want %s)", f, strings.Join(AllWorkloads, ", "))
		}
		want[f] = true
	}
	var out []string
	for _, w := range AllWorkloads {
		if want[w] {
			out = append(out, w)
		}
	}
	return out, nil
}
