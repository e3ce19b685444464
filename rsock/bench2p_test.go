package rsock

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Two-process benchmarks: the server is a helper process (the test binary
// re-executed, see twoproc_test.go), so they measure what a real
// deployment on one host sees. The baseline is plain kernel TCP: a
// net.Dial client against the helper's listener, which hands a client that
// does not speak rsock a plain TCP connection.
//
// Besides time, each reports the CPU both processes spent per operation
// (cpu-us/op here, helper-cpu-us/op in the helper), which is what busy
// polling costs.

type twoProcVariant struct {
	name       string
	transports string        // the helper's RSOCK_TRANSPORTS ("" means plain TCP)
	busyPoll   time.Duration // both sides: >0 that window, 0 the default, <0 off
}

var twoProcVariants = []twoProcVariant{
	{name: "plain-tcp"},
	{name: "shm-event", transports: "shm", busyPoll: -1},
	{name: "shm-default", transports: "shm"},
	{name: "shm-busypoll-5us", transports: "shm", busyPoll: 5 * time.Microsecond},
	{name: "shm-busypoll-20us", transports: "shm", busyPoll: 20 * time.Microsecond},
	{name: "shm-busypoll-50us", transports: "shm", busyPoll: 50 * time.Microsecond},
}

// mainVariants are plain TCP, event-only shm and shm with the default
// busy-poll: the comparisons the targets are about.
func mainVariants() []twoProcVariant { return twoProcVariants[:3] }

// twoProcConn is a client connection to a helper, and the helper's pid.
type twoProcConn struct {
	net.Conn
	pid int
}

func (v twoProcVariant) dial(b *testing.B, role string) twoProcConn {
	b.Helper()
	env := []string{"RSOCK_TRANSPORTS=tcp", "RSOCK_BUSY_POLL=0"}
	if v.transports != "" {
		bp := "" // the default, whatever this process's environment says
		switch {
		case v.busyPoll < 0:
			bp = "0"
		case v.busyPoll > 0:
			bp = v.busyPoll.String()
		}
		env = []string{"RSOCK_TRANSPORTS=" + v.transports, "RSOCK_BUSY_POLL=" + bp}
	}
	h := startHelper(b, role, env...)
	if v.transports == "" {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			b.Fatal(err)
		}
		return twoProcConn{c, h.cmd.Process.Pid}
	}
	cfg := &Config{Transports: []string{v.transports}, BusyPoll: v.busyPoll}
	if v.busyPoll == 0 {
		cfg.BusyPoll = DefaultBusyPoll
	}
	d := Dialer{Config: cfg}
	c, err := d.Dial("tcp", h.addr)
	if err != nil {
		b.Fatal(err)
	}
	if TransportOf(c) != v.transports {
		b.Fatalf("transport %s, want %s", TransportOf(c), v.transports)
	}
	return twoProcConn{c, h.cmd.Process.Pid}
}

// procCPU is the CPU time the threads of process pid have used, from
// /proc/<pid>/task/*/schedstat (nanoseconds; threads that exited are not
// counted, and Go rarely ends threads).
func procCPU(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum time.Duration
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			sum += time.Duration(n)
		}
	}
	return sum
}

// cpuMeter reports the CPU both processes spent per operation.
type cpuMeter struct {
	pid        int
	here, peer time.Duration
}

func startCPU(pid int) *cpuMeter {
	return &cpuMeter{pid: pid, here: procCPU(os.Getpid()), peer: procCPU(pid)}
}

func (m *cpuMeter) report(b *testing.B, ops int) {
	here, peer := procCPU(os.Getpid())-m.here, procCPU(m.pid)-m.peer
	b.ReportMetric(float64(here.Microseconds())/float64(ops), "cpu-us/op")
	b.ReportMetric(float64(peer.Microseconds())/float64(ops), "helper-cpu-us/op")
}

// pingPong makes one 64-byte round trip per op after waiting gap (0: none),
// and reports the p50, p90 and p99 of the round trips and the CPU per op.
func pingPong(b *testing.B, v twoProcVariant, gap time.Duration) {
	c := v.dial(b, "echo")
	defer c.Close()
	buf := make([]byte, 64)
	for range 200 { // warm up
		_, _ = c.Write(buf)
		_, _ = io.ReadFull(c, buf)
	}
	rtts := make([]time.Duration, 0, b.N)
	cpu := startCPU(c.pid)
	b.ResetTimer()
	for b.Loop() {
		if gap > 0 {
			time.Sleep(gap)
		}
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
	cpu.report(b, len(rtts))
	slices.Sort(rtts)
	b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(rtts[len(rtts)*9/10].Nanoseconds()), "p90-ns")
	b.ReportMetric(float64(rtts[len(rtts)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkTwoProcessPingPong: one 64-byte round trip per op, back to back.
func BenchmarkTwoProcessPingPong(b *testing.B) {
	for _, v := range twoProcVariants {
		b.Run(v.name, func(b *testing.B) { pingPong(b, v, 0) })
	}
}

// BenchmarkTwoProcessPacedPingPong: a round trip every 200 us or so (the
// client sleeps in between), so every wait of the helper outlasts any
// busy-poll window: what spinning costs a connection that is not busy.
func BenchmarkTwoProcessPacedPingPong(b *testing.B) {
	for _, v := range mainVariants() {
		b.Run(v.name, func(b *testing.B) { pingPong(b, v, 200*time.Microsecond) })
	}
}

// BenchmarkTwoProcessOneWay: 1 MiB writes to a helper that reads and
// discards them (the sink role), then a half-close; the helper answers
// with the count it read. MB/s is the one-way throughput. The sink reads
// either with a 1 MiB buffer (read-1MiB: a Read loop, two copies on every
// transport) or with io.Copy to io.Discard (io.Copy: what Go code usually
// writes; TCP reads 8 KiB at a time into io.Discard's buffer, a ring hands
// its memory to io.Discard in place through WriteTo, so the sink copies
// nothing).
func BenchmarkTwoProcessOneWay(b *testing.B) {
	const size = 1 << 20
	for _, mode := range []struct {
		name string
		cmd  byte
	}{{"read-1MiB", sinkRead}, {"io.Copy", sinkCopy}} {
		for _, v := range mainVariants() {
			b.Run(mode.name+"/"+v.name, func(b *testing.B) {
				c := v.dial(b, "sink")
				defer c.Close()
				if _, err := c.Write([]byte{mode.cmd}); err != nil {
					b.Fatal(err)
				}
				buf := make([]byte, size)
				for i := range buf {
					buf[i] = byte(i)
				}
				b.SetBytes(size)
				cpu := startCPU(c.pid)
				b.ResetTimer()
				for range b.N { // not b.Loop: the count is checked after the loop
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				if err := c.Conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					b.Fatal(err)
				}
				var got [8]byte
				if _, err := io.ReadFull(c, got[:]); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				cpu.report(b, b.N)
				if n := binary.BigEndian.Uint64(got[:]); n != uint64(b.N)*size {
					b.Fatalf("the sink read %d bytes, want %d", n, uint64(b.N)*size)
				}
			})
		}
	}
}

// BenchmarkOneWayCeiling is what BenchmarkTwoProcessOneWay/read-1MiB
// can reach on this machine with a ring of the default size: the same two
// copies (1 MiB writes into a DefaultRingSize ring, reads out of it into a
// 1 MiB buffer) by two threads in one process, which publish their
// positions with atomics and spin instead of waiting, with no protocol,
// no credit messages and no system calls. Like rsock's writer, the writer
// copies a quarter of the ring at most before it publishes (one copy of a
// whole 1 MiB write before publishing halves the throughput: the reader
// waits meanwhile). The reader's copy pulls every line of the ring from
// the other core's cache, and that, not copy()'s speed on one core (about
// 38 GB/s here for 1 MiB in cache), bounds it.
func BenchmarkOneWayCeiling(b *testing.B) {
	const size = 1 << 20
	ring := make([]byte, DefaultRingSize)
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	type pos struct {
		n atomic.Int64
		_ [56]byte // a cache line of its own
	}
	var head, tail pos // bytes written into and read out of the ring
	total := int64(b.N) * size
	rs := int64(len(ring))
	// spin waits for a position to move, sharing a loaded core.
	spin := func(spins *int) {
		if *spins++; *spins%64 == 0 {
			runtime.Gosched()
		}
	}
	done := make(chan struct{})
	b.SetBytes(size)
	b.ResetTimer()
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		dst := make([]byte, size)
		for t, spins := int64(0), 0; t < total; {
			h := head.n.Load()
			if h == t {
				spin(&spins)
				continue
			}
			off := t % rs
			n := min(h-t, rs-off, size)
			copy(dst[:n], ring[off:off+n])
			t += n
			tail.n.Store(t)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for h, spins := int64(0), 0; h < total; {
		for w := int64(0); w < size; {
			free := rs - (h - tail.n.Load())
			if free == 0 {
				spin(&spins)
				continue
			}
			off := h % rs
			n := min(free, rs-off, size-w, rs/4)
			copy(ring[off:off+n], src[w:w+n])
			h += n
			w += n
			head.n.Store(h)
		}
	}
	<-done
}

// The first byte a client sends the sink: how it reads.
const (
	sinkRead = 'R' // Read into a 1 MiB buffer
	sinkCopy = 'C' // io.Copy to io.Discard
)

// sink reads c to EOF as its first byte says, then writes the byte count
// (8 bytes, big-endian) and closes.
func sink(c net.Conn) {
	defer c.Close()
	var mode [1]byte
	if _, err := io.ReadFull(c, mode[:]); err != nil {
		return
	}
	var n uint64
	switch mode[0] {
	case sinkRead:
		buf := make([]byte, 1<<20)
		for {
			k, err := c.Read(buf)
			n += uint64(k)
			if err == io.EOF {
				break
			}
			if err != nil {
				return
			}
		}
	case sinkCopy:
		k, err := io.Copy(io.Discard, c)
		if err != nil {
			return
		}
		n = uint64(k)
	default:
		return
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	_, _ = c.Write(b[:])
}

// BenchmarkTwoProcessEchoStream: 1 MiB writes echoed back by the helper
// while a reader drains them: every byte crosses the process boundary
// twice, so MB/s counts each direction once.
func BenchmarkTwoProcessEchoStream(b *testing.B) {
	const size = 1 << 20
	for _, v := range mainVariants() {
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
