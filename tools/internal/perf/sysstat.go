package perf

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
)

// ProcStats is a snapshot of one process's resource use.
type ProcStats struct {
	CPUUser    time.Duration `json:"cpu_user_ns"`
	CPUSys     time.Duration `json:"cpu_sys_ns"`
	RSS        int64         `json:"rss_bytes"`  // VmRSS
	VSZ        int64         `json:"vsz_bytes"`  // VmSize
	Threads    int           `json:"threads"`    // OS threads
	FDs        int           `json:"fds"`        // open file descriptors
	Goroutines int           `json:"goroutines"` // runtime.NumGoroutine
	// Server only: connections of the idle op now open, and connections
	// refused because their transport was not the server's.
	IdleConns  int64 `json:"idle_conns,omitempty"`
	Mismatches int64 `json:"mismatches,omitempty"`
}

// CPU is user plus system time.
func (s ProcStats) CPU() time.Duration { return s.CPUUser + s.CPUSys }

// SelfStats reads this process's ProcStats. With gc, it first collects
// garbage and returns freed memory to the OS, so RSS counts what is live.
func SelfStats(gc bool) ProcStats {
	if gc {
		runtime.GC()
		debug.FreeOSMemory()
	}
	var s ProcStats
	s.CPUUser, s.CPUSys = cpuTimes()
	if b, err := os.ReadFile("/proc/self/status"); err == nil { // Linux's; elsewhere these stay 0
		st := parseStatus(b)
		s.RSS = st["VmRSS"]
		s.VSZ = st["VmSize"]
		s.Threads = int(st["Threads"])
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		s.FDs = len(ents) - 1 // the directory being read
	}
	s.Goroutines = runtime.NumGoroutine()
	return s
}

// parseStatus reads /proc/PID/status: sizes in bytes (kB lines), counts
// as they are.
func parseStatus(b []byte) map[string]int64 {
	out := map[string]int64{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n <<= 10
		}
		out[k] = n
	}
	return out
}
