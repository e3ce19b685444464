package perf

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeReport aggregates made-up samples: two repeats, plain and shm, the
// second shm repeat of the throughput unit failed.
func fakeReport(t *testing.T) *Report {
	t.Helper()
	o := DefaultOptions(true)
	o.Workloads = []string{WPingPong, WThroughput, WIdle}
	o.PingSizes = []int{64}
	o.WriteSizes = []int{1 << 20}
	o.Repeats = 2
	plan := o.Plan()
	var samples []sample
	for r := range 2 {
		for _, mode := range []string{"plain-tcp", "rsock-shm"} {
			f := 1.0
			if mode == "rsock-shm" {
				f = 0.5
			}
			h := NewHist()
			Record(h, 10000)
			samples = append(samples,
				sample{unit: plan[0], mode: mode, repeat: r, m: Measurement{Metrics: map[string]float64{MetricP50: 10 * f * float64(r+1), MetricP99: 20 * f}, Hist: h}},
				sample{unit: plan[2], mode: mode, repeat: r, m: Measurement{Metrics: map[string]float64{MetricRSSClient: 3 * f, MetricThreadsServer: 9}}})
			if mode == "rsock-shm" && r == 1 {
				samples = append(samples, sample{unit: plan[1], mode: mode, repeat: r, err: errors.New("boom")})
			} else {
				samples = append(samples, sample{unit: plan[1], mode: mode, repeat: r, m: Measurement{Metrics: map[string]float64{MetricGBps: 4 / f, MetricCPUPerGB: 0.25}}})
			}
		}
	}
	rep := &Report{Tool: "rsockperf", Version: ReportVersion, Kind: "compare", Command: "rsockperf compare --quick", Options: o,
		Machine: Machine{CPU: "Test CPU", Cores: 2, Kernel: "6.0", GoVersion: "go1.26"},
		Modes: []ModeStatus{{Mode: "plain-tcp", Available: true}, {Mode: "rsock-shm", Transport: "shm", Available: true},
			{Mode: "rsock-verbs", Transport: "verbs", Reason: "no device"}}}
	rep.Results, rep.CDFs, rep.Failures = aggregate(plan, rep.AvailableModes(), o.Repeats, samples)
	return rep
}

func TestAggregate(t *testing.T) {
	rep := fakeReport(t)
	r, ok := rep.Find(WPingPong, "64B", MetricP50, "rsock-shm")
	require.True(t, ok)
	assert.Equal(t, Floats{5, 10}, r.Values)
	require.NotNil(t, r.Ratio)
	assert.Equal(t, Spread{Median: 0.5, Min: 0.5, Max: 0.5, N: 2}, *r.Ratio)
	base, ok := rep.Find(WPingPong, "64B", MetricP50, "plain-tcp")
	require.True(t, ok)
	assert.Nil(t, base.Ratio, "no ratio of the baseline to itself")

	tp, ok := rep.Find(WThroughput, "1MiB", MetricGBps, "rsock-shm")
	require.True(t, ok)
	assert.Equal(t, 8.0, tp.Values[0])
	assert.True(t, math.IsNaN(tp.Values[1]), "the failed repeat")
	assert.Equal(t, 1, tp.Ratio.N)
	require.Len(t, rep.Failures, 1)
	assert.Equal(t, Failure{Workload: WThroughput, Param: "1MiB", Mode: "rsock-shm", Repeat: 1, Error: "boom"}, rep.Failures[0])

	rss, ok := rep.Find(WIdle, "n=200", MetricRSSClient, "rsock-shm")
	require.True(t, ok)
	assert.Nil(t, rss.Ratio, "memory is not shown as a ratio to plain TCP's near-zero RSS")
	thr, _ := rep.Find(WIdle, "n=200", MetricThreadsServer, "rsock-shm")
	assert.NotNil(t, thr.Ratio)

	require.Len(t, rep.CDFs, 2)
	assert.EqualValues(t, 2, rep.CDFs[0].Summary.Count, "merged over repeats")
	assert.Equal(t, []string{"plain-tcp", "rsock-shm"}, rep.AvailableModes())
}

func TestReportJSONShape(t *testing.T) {
	rep := fakeReport(t)
	b, err := json.Marshal(rep)
	require.NoError(t, err, "NaN must not break the JSON")
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	for _, k := range []string{"tool", "version", "kind", "command", "date", "machine", "options", "modes", "results", "cdfs", "failures"} {
		assert.Contains(t, m, k)
	}
	assert.Equal(t, "rsockperf", m["tool"])
	res := m["results"].([]any)
	var failedVals []any
	for _, x := range res {
		r := x.(map[string]any)
		for _, k := range []string{"workload", "metric", "mode", "values", "spread"} {
			assert.Contains(t, r, k)
		}
		if r["workload"] == WThroughput && r["mode"] == "rsock-shm" && r["metric"] == MetricGBps {
			failedVals = r["values"].([]any)
			assert.Contains(t, r, "ratio")
		}
	}
	require.Len(t, failedVals, 2)
	assert.Nil(t, failedVals[1], "a failed repeat is null")
	modes := m["modes"].([]any)
	assert.Equal(t, false, modes[2].(map[string]any)["available"])
	assert.Equal(t, "no device", modes[2].(map[string]any)["reason"])
	cdf := m["cdfs"].([]any)[0].(map[string]any)
	assert.Contains(t, cdf["summary"], "p999_us")
	assert.NotEmpty(t, cdf["points"])

	var back Report
	require.NoError(t, json.Unmarshal(b, &back))
	r, ok := back.Find(WThroughput, "1MiB", MetricGBps, "rsock-shm")
	require.True(t, ok)
	assert.True(t, math.IsNaN(r.Values[1]), "null reads back as NaN")
	assert.Equal(t, rep.Options, back.Options)
}

func TestTextAndMarkdown(t *testing.T) {
	rep := fakeReport(t)
	var text bytes.Buffer
	rep.WriteText(&text)
	out := text.String()
	assert.Contains(t, out, "rsock-verbs: UNAVAILABLE: no device")
	assert.Contains(t, out, "shm / plain")
	assert.Contains(t, out, "0.50x (0.50-0.50)")
	assert.Contains(t, out, "1 unit runs FAILED")
	assert.Contains(t, out, "Latency percentiles")

	var md bytes.Buffer
	rep.WriteMarkdown(&md, "BENCHMARKS.md", []string{"docs/bench/throughput-oneway.svg"})
	s := md.String()
	assert.Contains(t, s, "| unit | metric | plain-tcp | rsock-shm | shm / plain |")
	assert.Contains(t, s, "![throughput-oneway](docs/bench/throughput-oneway.svg)")
	assert.Contains(t, s, "**rsock-verbs:** unavailable, not measured: no device")
	assert.Contains(t, s, "Test CPU, 2 cores")
	assert.NotContains(t, s, MarkBegin, "the markers are RewriteRegion's")
}

func TestRewriteRegion(t *testing.T) {
	doc := "# Benchmarks\n\nprose before\n\n" + MarkBegin + "\nold table\n" + MarkEnd + "\n\n## Anchors\n\nSMC-D 0.55x\n"
	got, err := RewriteRegion(doc, "new table\n")
	require.NoError(t, err)
	assert.Equal(t, "# Benchmarks\n\nprose before\n\n"+MarkBegin+"\nnew table\n"+MarkEnd+"\n\n## Anchors\n\nSMC-D 0.55x\n", got)
	again, err := RewriteRegion(got, "new table\n")
	require.NoError(t, err)
	assert.Equal(t, got, again, "idempotent")

	got, err = RewriteRegion("# B\n\nprose", "gen")
	require.NoError(t, err)
	assert.Equal(t, "# B\n\nprose\n\n"+MarkBegin+"\ngen\n"+MarkEnd+"\n", got, "markers appended when missing")

	for _, bad := range []string{
		MarkEnd + "\nx\n" + MarkBegin,
		MarkBegin + MarkBegin + MarkEnd,
		MarkBegin + "\nno end",
		MarkBegin + MarkEnd + MarkBegin + MarkEnd,
	} {
		_, err := RewriteRegion(bad, "gen")
		assert.Error(t, err, "%q", bad)
	}
}

func TestUpdateMarkdownFileKeepsProse(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "BENCHMARKS.md")
	prose := "# Benchmarks\n\n## Method\n\nhand-written.\n\n" + MarkBegin + "\n" + MarkEnd + "\n\n## Anchors\n\n- SMC-D loopback-ism: about 0.55x TCP latency\n"
	require.NoError(t, os.WriteFile(path, []byte(prose), 0o644))
	rep := fakeReport(t)
	require.NoError(t, UpdateMarkdownFile(path, rep, []string{filepath.Join(dir, "docs", "bench", "a.svg")}))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := string(b)
	assert.True(t, strings.HasPrefix(s, "# Benchmarks\n\n## Method\n\nhand-written.\n\n"+MarkBegin+"\n"))
	assert.True(t, strings.HasSuffix(s, MarkEnd+"\n\n## Anchors\n\n- SMC-D loopback-ism: about 0.55x TCP latency\n"))
	assert.Contains(t, s, "](docs/bench/a.svg)", "plot links relative to the Markdown file")
	assert.Contains(t, s, "Headline: rsock / plain TCP")
}
