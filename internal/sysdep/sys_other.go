//go:build !linux

package sysdep

import (
	"runtime"
	"syscall"
)

// Yield lets another goroutine run (Linux yields the thread instead).
func Yield() { runtime.Gosched() }

// Writer makes a socket's calls for its writer. Off Linux it knows none
// of them: WriteNow leaves every byte to a write that waits, and
// Delivered and Quiet are false (SIOCOUTQ and SO_MEMINFO are Linux's), so
// that a close reads on to the peer's end.
type Writer struct{}

// Init does nothing: there is no call to make.
func (*Writer) Init(syscall.RawConn) {}

// WriteNow writes nothing.
func (*Writer) WriteNow(...[]byte) int { return 0 }

// Delivered is false: this platform does not tell.
func (*Writer) Delivered() bool { return false }

// Quiet is false: this platform does not tell.
func (*Writer) Quiet() bool { return false }
