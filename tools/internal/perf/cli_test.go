package perf

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCompareDefaults(t *testing.T) {
	ca, err := ParseCompare(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, DefaultOptions(false), ca.Options)
	assert.Equal(t, []string{"shm", "tcp"}, ca.Options.Transports)
	assert.Equal(t, AllWorkloads, ca.Options.Workloads)
	assert.Equal(t, []int{1, 64, 1 << 10, 4 << 10, 16 << 10, 64 << 10}, ca.Options.PingSizes, "1 B to 64 KiB")
	assert.Equal(t, 4<<10, ca.Options.WriteSizes[0])
	assert.Equal(t, 4<<20, ca.Options.WriteSizes[len(ca.Options.WriteSizes)-1], "4 KiB to 4 MiB")
	assert.Equal(t, []int{1, 16}, ca.Options.Concurrency)

	q, err := ParseCompare([]string{"--quick"}, io.Discard)
	require.NoError(t, err)
	assert.True(t, q.Options.Quick)
	assert.Less(t, len(q.Options.Plan()), len(ca.Options.Plan()))
	assert.Less(t, q.Options.Duration, ca.Options.Duration)
}

func TestParseCompareFlags(t *testing.T) {
	ca, err := ParseCompare([]string{
		"--quick", "--transports", "all", "--repeats", "5", "--duration", "10ms",
		"--ping-sizes", "1-64k", "--write-sizes", "4k,1m", "--concurrency", "2,8",
		"--workloads", "grpc,pingpong", "--busy-poll", "20us", "--idle-conns", "300", "--control",
	}, io.Discard)
	require.NoError(t, err)
	o := ca.Options
	assert.Equal(t, []string{"verbs", "shm", "tcp"}, o.Transports)
	assert.Equal(t, 5, o.Repeats)
	assert.Equal(t, 10*time.Millisecond, o.Duration)
	assert.Equal(t, []int{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536}, o.PingSizes)
	assert.Equal(t, []int{4096, 1 << 20}, o.WriteSizes)
	assert.Equal(t, []int{2, 8}, o.Concurrency)
	assert.Equal(t, []string{WPingPong, WGRPC}, o.Workloads, "kept in run order")
	assert.Equal(t, 20*time.Microsecond, o.BusyPoll)
	assert.Equal(t, 300, o.IdleConns)
	assert.True(t, o.Control)
	var keys []string
	for _, u := range o.Plan() {
		keys = append(keys, u.Key())
	}
	assert.Equal(t, []string{"pingpong/1B", "pingpong/4B", "pingpong/16B", "pingpong/64B", "pingpong/256B",
		"pingpong/1KiB", "pingpong/4KiB", "pingpong/16KiB", "pingpong/64KiB", "grpc/c=2", "grpc/c=8"}, keys)
}

func TestParseCompareErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--transports", "rdma"},
		{"--transports", ""},
		{"--ping-sizes", "0"},
		{"--ping-sizes", "64k-1k"},
		{"--write-sizes", "128m"},
		{"--workloads", "pingpong,nope"},
		{"--concurrency", "0"},
		{"--repeats", "-1"},
		{"extra"},
	} {
		_, err := ParseCompare(args, io.Discard)
		var ue usageError
		assert.True(t, errors.As(err, &ue), "%v: %v", args, err)
	}
	_, err := ParseCompare([]string{"--no-such-flag"}, io.Discard)
	assert.Error(t, err)
}

func TestParseClientAndServer(t *testing.T) {
	ca, err := ParseClient([]string{"--transport", "shm", "--connect", "127.0.0.1:9000", "--quick"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, Mode{Transport: "shm"}, ca.Mode)
	assert.Equal(t, "127.0.0.1:9000", ca.Addr)
	assert.Equal(t, []string{"shm"}, ca.Options.Transports)

	ca, err = ParseClient([]string{"--plain"}, io.Discard)
	require.NoError(t, err)
	assert.True(t, ca.Mode.IsPlain())
	assert.Equal(t, "plain-tcp", ca.Mode.Name())

	for _, args := range [][]string{{}, {"--plain", "--transport", "tcp"}, {"--transport", "udp"}, {"--plain", "--markdown", "x.md"}} {
		_, err := ParseClient(args, io.Discard)
		assert.Error(t, err, "%v", args)
	}

	sa, err := ParseServer([]string{"--transport", "tcp", "--listen", ":0", "--busy-poll", "10us", "--exit-on-eof"}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, Mode{Transport: "tcp", BusyPoll: 10 * time.Microsecond}, sa.Mode)
	assert.Equal(t, "rsock-tcp", sa.Mode.Name())
	assert.True(t, sa.ExitOnEOF)
	_, err = ParseServer(nil, io.Discard)
	assert.Error(t, err, "a mode is required")
}

func TestMainUsage(t *testing.T) {
	assert.Equal(t, 2, Main(nil, io.Discard, io.Discard))
	assert.Equal(t, 2, Main([]string{"bogus"}, io.Discard, io.Discard))
	assert.Equal(t, 0, Main([]string{"help"}, io.Discard, io.Discard))
	assert.Equal(t, 2, Main([]string{"compare", "--transports", "rdma"}, io.Discard, io.Discard))
}

func TestMainReportRerenders(t *testing.T) {
	dir := t.TempDir()
	rep := fakeReport(t)
	b, err := json.Marshal(rep)
	require.NoError(t, err)
	js := filepath.Join(dir, "results.json")
	require.NoError(t, os.WriteFile(js, b, 0o644))
	md := filepath.Join(dir, "B.md")
	require.NoError(t, os.WriteFile(md, []byte("# keep me\n"), 0o644))
	var out bytes.Buffer
	require.Equal(t, 0, Main([]string{"report", "--plot", filepath.Join(dir, "plots"), "--markdown", md, js}, &out, io.Discard))
	assert.Contains(t, out.String(), "Headline: rsock / plain TCP")
	got, err := os.ReadFile(md)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(got), "# keep me\n"))
	assert.Contains(t, string(got), "](plots/throughput-oneway.svg)")

	require.NoError(t, os.WriteFile(js, []byte(`{"tool":"other"}`), 0o644))
	assert.Equal(t, 1, Main([]string{"report", js}, io.Discard, io.Discard))
	assert.Equal(t, 2, Main([]string{"report"}, io.Discard, io.Discard))
}
