package sysdep

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// peek peeks at one byte of fd without waiting (and without allocating,
// which unix.Recvfrom does).
func peek(fd uintptr, one *[1]byte) unix.Errno {
	_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&one[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return errno
}

// Yield gives this core to another runnable thread, often the peer a
// spinner waits for. (Not runtime.Gosched: it moves the spinner between
// threads.)
func Yield() { _, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// Writer makes a socket's calls for its writer (Init). Its caller
// serialises them. Each call's arguments live here, and its function is
// bound once (Init), so that a call allocates nothing.
type Writer struct {
	rc    syscall.RawConn
	iov   [3]unix.Iovec
	iovN  int
	nowN  int
	nowFn func(fd uintptr) bool
	mem   [unix.SK_MEMINFO_VARS]uint32
	memOK bool
	memFn func(fd uintptr)
}

// Init makes w call through rc, a socket's SyscallConn (nil: WriteNow
// writes nothing, Delivered and Quiet are false).
func (w *Writer) Init(rc syscall.RawConn) {
	w.rc, w.nowFn, w.memFn = rc, w.writeFD, w.memInfoFD
}

// WriteNow writes what of parts (at most three) the socket takes without
// blocking and returns how much (0 on any error, which a write that waits
// meets again).
func (w *Writer) WriteNow(parts ...[]byte) int {
	if w.rc == nil {
		return 0
	}
	w.iovN, w.nowN = 0, 0
	for _, p := range parts {
		if len(p) > 0 {
			w.iov[w.iovN].Base = &p[0]
			w.iov[w.iovN].SetLen(len(p))
			w.iovN++
		}
	}
	if w.iovN > 0 {
		_ = w.rc.Write(w.nowFn)
	}
	clear(w.iov[:w.iovN])
	return w.nowN
}

func (w *Writer) writeFD(fd uintptr) bool {
	k, _, errno := unix.Syscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[0])), uintptr(w.iovN))
	if errno == 0 {
		w.nowN = int(k)
	}
	return true // never wait: the rest is the caller's
}

// Delivered reports whether the peer's TCP has acknowledged every byte
// written to the socket (SIOCOUTQ).
func (w *Writer) Delivered() bool {
	left := -1
	if w.rc != nil {
		_ = w.rc.Control(func(fd uintptr) {
			if n, err := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ); err == nil {
				left = n
			}
		})
	}
	return left == 0
}

// Quiet is Delivered, and in the same system call (SO_MEMINFO) that the
// socket holds nothing the peer sent that is still to be read.
func (w *Writer) Quiet() bool {
	w.memOK = false
	if w.rc != nil {
		_ = w.rc.Control(w.memFn)
	}
	mi := &w.mem
	return w.memOK && mi[unix.SK_MEMINFO_RMEM_ALLOC] == 0 && mi[unix.SK_MEMINFO_BACKLOG] == 0 && mi[unix.SK_MEMINFO_WMEM_QUEUED] == 0
}

func (w *Writer) memInfoFD(fd uintptr) {
	l := uint32(len(w.mem) * 4)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&w.mem[0])), uintptr(unsafe.Pointer(&l)), 0)
	w.memOK = errno == 0 && l == uint32(len(w.mem)*4)
}
