package perf

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// childEnv routes a re-executed test binary into rsockperf's Main, as
// compare's server child.
const childEnv = "RSOCKPERF_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestCompareSmoke runs a tiny compare end to end (server children, every
// workload, tcp and shm, and verbs, which must be reported unavailable
// unless this machine really has it) and checks the report's structure,
// never its timings.
func TestCompareSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	o := DefaultOptions(true)
	o.Transports = []string{"verbs", "shm", "tcp"}
	o.Repeats = 2
	o.Duration = 20 * time.Millisecond
	o.PingSizes = []int{1, 4 << 10}
	o.WriteSizes = []int{64 << 10}
	o.BidirSizes = []int{64 << 10}
	o.Conns = 4
	o.IdleConns = 20
	o.Concurrency = []int{1, 3}
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := Compare(ctx, o, ChildSpec{Exe: os.Args[0], Env: []string{childEnv + "=1"}}, &progress)
	require.NoError(t, err, progress.String())
	require.Empty(t, rep.Failures, "%+v", rep.Failures)

	require.Len(t, rep.Modes, 4)
	byName := map[string]ModeStatus{}
	for _, m := range rep.Modes {
		byName[m.Mode] = m
	}
	for _, name := range []string{"plain-tcp", "rsock-shm", "rsock-tcp"} {
		assert.True(t, byName[name].Available, "%s: %s", name, byName[name].Reason)
	}
	verbs := byName["rsock-verbs"]
	if !verbs.Available {
		assert.NotEmpty(t, verbs.Reason, "an unavailable transport says why")
		assert.Contains(t, progress.String(), "rsock-verbs unavailable")
	}
	modes := rep.AvailableModes()

	for _, u := range o.Plan() {
		for _, m := range modes {
			var metrics []string
			switch u.Workload {
			case WPingPong, WSetup, WConns, WHTTP, WGRPC:
				metrics = []string{MetricRate, MetricP50, MetricP90, MetricP99, MetricP999, MetricMax}
			case WThroughput, WBidir:
				metrics = []string{MetricGBps, MetricCPUPerGB}
			case WIdle:
				metrics = []string{MetricRSSClient, MetricRSSServer, MetricFDsClient, MetricFDsServer, MetricThreadsClient, MetricThreadsServer}
			}
			if u.Workload == WSetup {
				// The ceiling is plain TCP's alone: a rate over a rate of
				// the same run.
				r, ok := rep.Find(u.Workload, u.Param(), MetricOneMoreRTT, m)
				if m == Plain.Name() && assert.True(t, ok, "plain setup measures the ceiling") {
					for _, v := range r.Values {
						assert.Greater(t, v, 0.0)
					}
				} else if m != Plain.Name() {
					assert.False(t, ok, "%s measures no ceiling", m)
				}
			}
			for _, metric := range metrics {
				r, ok := rep.Find(u.Workload, u.Param(), metric, m)
				if !assert.True(t, ok, "%s %s %s", u.Key(), metric, m) {
					continue
				}
				assert.Len(t, r.Values, o.Repeats)
				for _, v := range r.Values {
					assert.False(t, math.IsNaN(v), "%s %s %s", u.Key(), metric, m)
				}
				assert.Equal(t, o.Repeats, r.Spread.N)
				if m == Plain.Name() || InfoOfMetric(metric).NoRatio {
					assert.Nil(t, r.Ratio)
				} else {
					assert.NotNil(t, r.Ratio, "%s %s %s", u.Key(), metric, m)
				}
			}
		}
	}
	// An shm connection keeps only its TCP bootstrap socket open: its
	// memfds are closed once mapped, and its doorbells and control
	// messages go through the link its process shares with the peer
	// process (a Unix socket and two eventfds per process pair, spread
	// over the n connections). A structural fact, not a timing.
	shmFDs, ok := rep.Find(WIdle, "n=20", MetricFDsClient, "rsock-shm")
	require.True(t, ok)
	tcpFDs, _ := rep.Find(WIdle, "n=20", MetricFDsClient, "plain-tcp")
	assert.LessOrEqual(t, shmFDs.Spread.Median, tcpFDs.Spread.Median+0.25)

	var cdfModes []string
	for _, c := range rep.CDFs {
		if c.Workload == WPingPong && c.Param == "1B" {
			cdfModes = append(cdfModes, c.Mode)
			assert.Equal(t, 1.0, c.Points[len(c.Points)-1].Fraction)
		}
	}
	assert.ElementsMatch(t, modes, cdfModes)

	b, err := json.Marshal(rep)
	require.NoError(t, err)
	var back Report
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, len(rep.Results), len(back.Results))

	var text bytes.Buffer
	rep.WriteText(&text)
	for _, s := range []string{"Headline", "setup rate ceiling: plain TCP with one more round trip", "net/http GET", "gRPC unary", "Idle connections", "shm / plain", "tcp / plain"} {
		assert.Contains(t, text.String(), s)
	}

	dir := t.TempDir()
	plots, err := WritePlots(rep, filepath.Join(dir, "bench"), "svg")
	require.NoError(t, err)
	assert.Len(t, plots, len(o.PingSizes)+2)
	for _, p := range plots {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		assert.True(t, strings.Contains(string(b), "<svg"), p)
	}
	md := filepath.Join(dir, "BENCHMARKS.md")
	require.NoError(t, os.WriteFile(md, []byte("# prose\n"), 0o644))
	require.NoError(t, UpdateMarkdownFile(md, rep, plots))
	got, err := os.ReadFile(md)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(got), "# prose\n"))
	assert.Contains(t, string(got), "](bench/latency-cdf-pingpong-1B.svg)")
}

// TestWrongTransportFails: a connection that is not over the transport
// asked for fails, on the client's check and on the server's.
func TestWrongTransportFails(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	err := CheckTransport(a, Mode{Transport: "shm"})
	var mm *MismatchError
	require.ErrorAs(t, err, &mm)
	assert.Equal(t, "shm", mm.Want)
	assert.NoError(t, CheckTransport(a, Plain))

	// An rsock client in tcp mode against a plain TCP server: a plain
	// connection, so the mode is refused.
	s, err := StartServer(Plain, "127.0.0.1:0", 0, 0)
	require.NoError(t, err)
	defer s.Close()
	_, err = Connect(context.Background(), Mode{Transport: "shm"}, s.Info().PerfAddr)
	assert.Error(t, err, "shm cannot be had from a plain TCP server")

	// A plain client against an rsock-shm server: the server hands plain
	// clients over as tcp and must refuse them.
	ss, err := StartServer(Mode{Transport: "shm"}, "127.0.0.1:0", 0, 0)
	require.NoError(t, err)
	defer ss.Close()
	_, err = Connect(context.Background(), Plain, ss.Info().PerfAddr)
	assert.Error(t, err)
}

// TestAwaitTransport: a switching connection is checked once it has
// settled: on its ring when the mode's transport is what it upgraded to,
// a mismatch otherwise; a plain connection only matches plain.
func TestAwaitTransport(t *testing.T) {
	ss, err := StartServer(Mode{Transport: "shm"}, "127.0.0.1:0", 0, 0)
	require.NoError(t, err)
	defer ss.Close()
	d := Dialer{Mode: Mode{Transport: "shm"}}
	c, err := d.Dial(ss.Info().PerfAddr)
	require.NoError(t, err)
	defer c.Close()
	deadline := time.Now().Add(time.Minute)
	require.NoError(t, AwaitTransport(context.Background(), c, Mode{Transport: "shm"}, deadline))
	var mm *MismatchError
	require.ErrorAs(t, AwaitTransport(context.Background(), c, Mode{Transport: "verbs"}, deadline), &mm)
	assert.Equal(t, "shm", mm.Got)

	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.NoError(t, AwaitTransport(context.Background(), a, Plain, deadline))
	require.ErrorAs(t, AwaitTransport(context.Background(), a, Mode{Transport: "shm"}, deadline), &mm)
}

// TestCompareControl: with Control, plain TCP is measured twice, each
// against a server of its own, and the second copy is reported as a mode
// with ratios to the first (the run's noise), without the baseline's
// one-more-round-trip ceiling.
func TestCompareControl(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	o := DefaultOptions(true)
	o.Transports = []string{"tcp"}
	o.Workloads = []string{WSetup}
	o.Repeats = 2
	o.Duration = 20 * time.Millisecond
	o.Control = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := Compare(ctx, o, ChildSpec{Exe: os.Args[0], Env: []string{childEnv + "=1"}}, &progress)
	require.NoError(t, err, progress.String())
	require.Empty(t, rep.Failures, "%+v", rep.Failures)
	assert.Equal(t, []string{"plain-tcp", "plain-tcp-control", "rsock-tcp"}, rep.AvailableModes())

	rate, ok := rep.Find(WSetup, "", MetricRate, Control.Name())
	require.True(t, ok, "the control's setup rate")
	require.NotNil(t, rate.Ratio, "the control has a ratio to plain TCP")
	assert.Greater(t, rate.Ratio.Median, 0.0)
	_, ok = rep.Find(WSetup, "", MetricOneMoreRTT, Plain.Name())
	assert.True(t, ok, "the baseline measures its ceiling")
	_, ok = rep.Find(WSetup, "", MetricOneMoreRTT, Control.Name())
	assert.False(t, ok, "the control does not")
	var text bytes.Buffer
	rep.WriteText(&text)
	assert.Contains(t, text.String(), "plain-tcp-control / plain")
}
