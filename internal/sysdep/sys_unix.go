//go:build unix

package sysdep

import (
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Unix sockets under Go's poller are non-blocking: a read that finds
// nothing fails with EAGAIN, and RawConn's Read then waits.
type readerSys struct {
	one [1]byte // peekFD's
}

func (*readerSys) begin() {}

func (r *Reader) readFD(fd uintptr) bool {
	r.n, r.err = unix.Read(int(fd), r.p)
	switch {
	case r.err == unix.EINTR:
		return false
	case r.err == unix.EAGAIN && r.wait:
		return false
	case r.err == unix.EAGAIN:
		r.blocked = true
	}
	return true
}

// peekFD is Await's: a peek that does not block, true once a read would
// not block (bytes, the end, or an error, which it keeps in peekErr).
func (r *Reader) peekFD(fd uintptr) bool {
	for {
		switch errno := peek(fd, &r.sys.one); errno {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
		default:
			r.peekErr = errno
		}
		return true
	}
}

// The descriptors ReadinessFD hands out, made once per process and never
// closed: reads of waitFD fail with EAGAIN, reads of endFD return 0. Both
// refuse writes (EPIPE).
var (
	waitFD, endFD int
	fdsErr        error
	fdsOnce       sync.Once
)

// ReadinessFD returns a descriptor that reads as st, and what to call
// once done with it: for Data a new socket holding one byte, which
// release closes.
func ReadinessFD(st Readiness) (fd int, release func(), err error) {
	fdsOnce.Do(func() {
		var wp, ep [2]int
		if wp, fdsErr = socketPair(); fdsErr != nil {
			return
		}
		if ep, fdsErr = socketPair(); fdsErr != nil {
			syscall.Close(wp[0])
			syscall.Close(wp[1])
			return
		}
		syscall.Close(ep[1])
		_ = syscall.Shutdown(wp[0], syscall.SHUT_WR)
		_ = syscall.Shutdown(ep[0], syscall.SHUT_WR)
		waitFD, endFD = wp[0], ep[0] // wp[1] stays open, silent
	})
	if fdsErr != nil {
		return -1, nil, fdsErr
	}
	switch st {
	case Waits:
		return waitFD, func() {}, nil
	case End:
		return endFD, func() {}, nil
	}
	p, err := socketPair()
	if err != nil {
		return -1, nil, err
	}
	defer syscall.Close(p[1])
	if _, err := syscall.Write(p[1], []byte{0}); err != nil {
		syscall.Close(p[0])
		return -1, nil, os.NewSyscallError("write", err)
	}
	_ = syscall.Shutdown(p[0], syscall.SHUT_WR)
	return p[0], func() { syscall.Close(p[0]) }, nil
}

// socketPair makes a pair of connected Unix sockets, non-blocking and
// closed on exec.
func socketPair() ([2]int, error) {
	syscall.ForkLock.RLock()
	p, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(p[0])
		syscall.CloseOnExec(p[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return p, os.NewSyscallError("socketpair", err)
	}
	for _, fd := range p {
		if err := syscall.SetNonblock(fd, true); err != nil {
			syscall.Close(p[0])
			syscall.Close(p[1])
			return p, os.NewSyscallError("setnonblock", err)
		}
	}
	return p, nil
}
