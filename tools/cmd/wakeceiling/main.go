//go:build linux

// Command wakeceiling measures what a 64-byte round trip between two Go
// processes costs by how the waiting side sleeps, with no rsock code: the
// ceilings that BENCHMARKS.md quotes for rsock's event-only and busy-polled
// round trips.
//
//	tcp      TCP loopback, the waiter parked in the Go netpoller
//	unix     a Unix stream socket, parked in the netpoller
//	eventfd  an eventfd each way, parked in the netpoller
//	futex    a word in shared memory, the waiter's thread blocked in
//	         FUTEX_WAIT (no timeout; -timed gives it one)
//	spin     the same word, polled by the waiter, which never sleeps: the
//	         floor of a busy-polled round trip, set by how fast the host
//	         moves cache lines between the two processes' cores
//
// Each round runs every mode for -duration, interleaved, and prints each
// mode's p50 and its ratio to TCP's in the same round, and the CPU both
// processes spent per round trip.
//
//	go run ./cmd/wakeceiling [-rounds 5] [-duration 300ms] [-timed]
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	rounds   = flag.Int("rounds", 5, "rounds, each running every mode once")
	duration = flag.Duration("duration", 300*time.Millisecond, "time per mode and round")
	timed    = flag.Bool("timed", false, "give the futex wait a 1 ms timeout (an hrtimer armed per wait)")
)

const msgSize = 64

func main() {
	if len(os.Args) > 2 && os.Args[1] == "-child" {
		child(os.Args[2], os.Args[3:])
		return
	}
	flag.Parse()
	modes := []struct {
		name string
		run  func() ([]time.Duration, *exec.Cmd)
	}{
		{"tcp", func() ([]time.Duration, *exec.Cmd) { return streamRun("tcp") }},
		{"unix", func() ([]time.Duration, *exec.Cmd) { return streamRun("unix") }},
		{"eventfd", eventfdRun},
		{"futex", func() ([]time.Duration, *exec.Cmd) { return sharedRun("futex") }},
		{"spin", func() ([]time.Duration, *exec.Cmd) { return sharedRun("spin") }},
	}
	for r := range *rounds {
		line := fmt.Sprintf("round %d:", r)
		var tcp time.Duration
		for _, m := range modes {
			c0 := cpuOf(os.Getpid())
			lat, cmd := m.run()
			used := cpuOf(os.Getpid()) - c0 + cpuOf(cmd.Process.Pid)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			slices.Sort(lat)
			p50 := lat[len(lat)/2]
			if m.name == "tcp" {
				tcp = p50
			}
			line += fmt.Sprintf("  %s %.1fus (%.2fx, CPU %.1fus)", m.name, us(p50), float64(p50)/float64(tcp), us(used)/float64(len(lat)))
		}
		fmt.Println(line)
	}
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// start re-executes this program as the peer of mode.
func start(mode string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], append([]string{"-child", mode}, args...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

func child(mode string, args []string) {
	switch mode {
	case "stream":
		c, err := net.Dial(args[0], args[1])
		if err != nil {
			panic(err)
		}
		buf := make([]byte, msgSize)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			_, _ = c.Write(buf)
		}
	case "eventfd":
		// fd 3 is the parent's eventfd (written), fd 4 ours (read).
		_ = unix.SetNonblock(3, true)
		_ = unix.SetNonblock(4, true)
		theirs, ours := os.NewFile(3, "theirs"), os.NewFile(4, "ours")
		one, buf := []byte{1, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 8)
		for {
			if _, err := ours.Read(buf); err != nil {
				return
			}
			_, _ = theirs.Write(one)
		}
	case "futex", "spin":
		m := mapShared(args[0])
		var seen uint32
		for {
			m.ping.wait(seen, mode == "spin")
			seen = m.ping.seq.Load()
			copy(m.pong.msg[:], m.ping.msg[:])
			m.pong.post()
		}
	}
}

func streamRun(network string) ([]time.Duration, *exec.Cmd) {
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(os.TempDir(), fmt.Sprintf("wakeceiling-%d.sock", os.Getpid()))
		_ = os.Remove(addr)
		defer os.Remove(addr)
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		panic(err)
	}
	cmd := start("stream", network, ln.Addr().String())
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	c, err := ln.Accept()
	_ = ln.Close()
	if err != nil {
		panic(err)
	}
	defer c.Close()
	buf := make([]byte, msgSize)
	return loop(func() {
		_, _ = c.Write(buf)
		_, _ = io.ReadFull(c, buf)
	}), cmd
}

func eventfdRun() ([]time.Duration, *exec.Cmd) {
	a, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		panic(err)
	}
	b, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		panic(err)
	}
	ours, theirs := os.NewFile(uintptr(a), "ours"), os.NewFile(uintptr(b), "theirs")
	defer ours.Close()
	defer theirs.Close()
	cmd := start("eventfd")
	cmd.ExtraFiles = []*os.File{ours, theirs}
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	one, buf := []byte{1, 0, 0, 0, 0, 0, 0, 0}, make([]byte, 8)
	return loop(func() {
		_, _ = theirs.Write(one)
		_, _ = ours.Read(buf)
	}), cmd
}

// mailbox is one direction in shared memory: the message, a sequence
// number (the futex word) and whether its reader waits.
type mailbox struct {
	seq     atomic.Uint32
	waiting atomic.Uint32
	_       [56]byte
	msg     [msgSize]byte
}

// wait returns once seq differs from old, its thread blocked in the kernel
// meanwhile, or, with spin, polling seq.
func (m *mailbox) wait(old uint32, spin bool) {
	for m.seq.Load() == old {
		if spin {
			continue
		}
		m.waiting.Store(1)
		if m.seq.Load() != old {
			break
		}
		var ts *unix.Timespec
		if *timed {
			t := unix.NsecToTimespec(int64(time.Millisecond))
			ts = &t
		}
		_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&m.seq)), 0 /* FUTEX_WAIT */, uintptr(old), uintptr(unsafe.Pointer(ts)), 0, 0)
	}
	m.waiting.Store(0)
}

// post publishes the message and wakes the reader if it waits.
func (m *mailbox) post() {
	m.seq.Add(1)
	if m.waiting.Load() != 0 {
		_, _, _ = unix.Syscall(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&m.seq)), 1 /* FUTEX_WAKE */, 1)
	}
}

type shared struct{ ping, pong mailbox }

func mapShared(path string) *shared {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		panic(err)
	}
	defer f.Close()
	if err := f.Truncate(4096); err != nil {
		panic(err)
	}
	b, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		panic(err)
	}
	return (*shared)(unsafe.Pointer(&b[0]))
}

// sharedRun runs the futex or spin mode.
func sharedRun(mode string) ([]time.Duration, *exec.Cmd) {
	path := fmt.Sprintf("/dev/shm/wakeceiling-%d", os.Getpid())
	_ = os.Remove(path)
	m := mapShared(path)
	defer os.Remove(path)
	cmd := start(mode, path)
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	return loop(func() {
		old := m.pong.seq.Load()
		m.ping.post()
		m.pong.wait(old, mode == "spin")
	}), cmd
}

// loop times round trips of rt for -duration, after a short warm-up.
func loop(rt func()) []time.Duration {
	for range 100 {
		rt()
	}
	var lat []time.Duration
	for end := time.Now().Add(*duration); time.Now().Before(end); {
		t0 := time.Now()
		rt()
		lat = append(lat, time.Since(t0))
	}
	return lat
}

// cpuOf is the user and system time pid has used.
func cpuOf(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ 100
}
