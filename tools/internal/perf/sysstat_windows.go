package perf

import (
	"time"

	"golang.org/x/sys/windows"
)

// cpuTimes returns this process's user and system (kernel) CPU time.
func cpuTimes() (user, sys time.Duration) {
	var created, exited, kernel, usr windows.Filetime
	if windows.GetProcessTimes(windows.CurrentProcess(), &created, &exited, &kernel, &usr) != nil {
		return 0, 0
	}
	ticks := func(t windows.Filetime) time.Duration { // 100 ns each
		return time.Duration(int64(t.HighDateTime)<<32|int64(t.LowDateTime)) * 100
	}
	return ticks(usr), ticks(kernel)
}

// RaiseNoFile returns 0: Windows has no RLIMIT_NOFILE.
func RaiseNoFile() uint64 { return 0 }
