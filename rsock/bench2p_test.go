package rsock

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// Two-process benchmarks: the server is a helper process (the test binary
// re-executed, see twoproc_test.go), so they measure what a real
// deployment on one host sees. The baseline is plain kernel TCP: a
// net.Dial client against the helper's listener, which hands a client that
// does not speak rsock a plain TCP connection.

type twoProcVariant struct {
	name       string
	transports string // the helper's RSOCK_TRANSPORTS ("" means plain TCP)
	busyPoll   time.Duration
}

var twoProcVariants = []twoProcVariant{
	{name: "plain-tcp"},
	{name: "shm-event", transports: "shm"},
	{name: "shm-busypoll-10us", transports: "shm", busyPoll: 10 * time.Microsecond},
	{name: "shm-busypoll-20us", transports: "shm", busyPoll: 20 * time.Microsecond},
	{name: "shm-busypoll-50us", transports: "shm", busyPoll: 50 * time.Microsecond},
}

func (v twoProcVariant) dial(b *testing.B, role string) net.Conn {
	b.Helper()
	env := []string{"RSOCK_TRANSPORTS=tcp", "RSOCK_BUSY_POLL=0"}
	if v.transports != "" {
		env = []string{"RSOCK_TRANSPORTS=" + v.transports, "RSOCK_BUSY_POLL=" + v.busyPoll.String()}
	}
	h := startHelper(b, role, env...)
	if v.transports == "" {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	bp := v.busyPoll
	if bp == 0 {
		bp = -1 // off, whatever the environment says
	}
	d := Dialer{Config: &Config{Transports: []string{v.transports}, BusyPoll: bp}}
	c, err := d.Dial("tcp", h.addr)
	if err != nil {
		b.Fatal(err)
	}
	if TransportOf(c) != v.transports {
		b.Fatalf("transport %s, want %s", TransportOf(c), v.transports)
	}
	return c
}

// BenchmarkTwoProcessPingPong: one 64-byte round trip per op; reports the
// p50 and p99 of the round trips.
func BenchmarkTwoProcessPingPong(b *testing.B) {
	for _, v := range twoProcVariants {
		b.Run(v.name, func(b *testing.B) {
			c := v.dial(b, "echo")
			defer c.Close()
			buf := make([]byte, 64)
			for range 200 { // warm up
				_, _ = c.Write(buf)
				_, _ = io.ReadFull(c, buf)
			}
			rtts := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				rtts = append(rtts, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(rtts)
			b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(rtts[len(rtts)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}

// BenchmarkTwoProcessEchoStream: 1 MiB writes echoed back by the helper
// while a reader drains them: every byte crosses the process boundary
// twice, so MB/s counts each direction once.
func BenchmarkTwoProcessEchoStream(b *testing.B) {
	const size = 1 << 20
	for _, v := range twoProcVariants {
		if v.busyPoll == 10*time.Microsecond || v.busyPoll == 20*time.Microsecond {
			continue
		}
		b.Run(v.name, func(b *testing.B) {
			c := v.dial(b, "echo")
			defer c.Close()
			buf := make([]byte, size)
			done := make(chan error, 1)
			b.SetBytes(size)
			b.ResetTimer()
			go func() {
				_, err := io.CopyN(io.Discard, c, int64(b.N)*size)
				done <- err
			}()
			for range b.N { // not b.Loop: the reader needs b.N up front
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
