// Package sysdep holds the system calls of rsock and its stream engine
// that differ by platform: reads of a socket that do not block (Reader),
// what the kernel still holds of a socket (Writer), descriptors that
// stand for a stream's readiness (ReadinessFD), and a spinner's yield.
// Linux has them all; other Unix systems lack SIOCOUTQ, SO_MEMINFO and a
// yield to another thread; Windows lacks socket pairs and non-blocking
// sockets under Go's poller.
package sysdep

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// ErrWouldBlock is a Reader's read with wait false that found nothing.
var ErrWouldBlock = errors.New("rsock: nothing to read now")

// Reader reads a socket through its RawConn (Init), at once or waiting as
// the socket's own reads do (its deadlines, its Close). One read's
// arguments and results live here, not in a closure, so that a read
// allocates nothing. Its caller serialises the reads.
type Reader struct {
	rc      syscall.RawConn
	rcErr   error                 // SyscallConn's
	fn      func(fd uintptr) bool // readFD, bound once
	peekFn  func(fd uintptr) bool // peekFD, bound once
	peekErr error                 // peekFD's: the socket's error, which a peek takes
	p       []byte
	n       int
	err     error
	wait    bool
	blocked bool
	sys     readerSys // the platform's
}

// Init makes r read through rc, a socket's SyscallConn (err: its error,
// which every read then returns).
func (r *Reader) Init(rc syscall.RawConn, err error) {
	r.rc, r.rcErr = rc, err
	r.fn, r.peekFn = r.readFD, r.peekFD
}

// Read reads into p at least one byte, or returns ErrWouldBlock (wait
// false), io.EOF at the socket's end, or the socket's error.
func (r *Reader) Read(p []byte, wait bool) (int, error) {
	if r.rcErr != nil {
		return 0, r.rcErr
	}
	r.p, r.wait, r.blocked, r.n, r.err = p, wait, false, 0, nil
	r.sys.begin()
	err := r.rc.Read(r.fn)
	n, rerr, blocked := r.n, r.err, r.blocked
	r.p, r.err = nil, nil
	switch {
	case err != nil:
		return 0, err
	case blocked:
		return 0, ErrWouldBlock
	case rerr != nil:
		return 0, os.NewSyscallError("read", rerr)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Await waits until a read would not block, or fails as a read would (a
// deadline, a close, the socket's error); it takes nothing.
func (r *Reader) Await() error {
	if r.rcErr != nil {
		return r.rcErr
	}
	r.peekErr = nil
	r.sys.begin()
	if err := r.rc.Read(r.peekFn); err != nil {
		return err
	}
	if r.peekErr != nil {
		return os.NewSyscallError("read", r.peekErr) // the peek took it: the next read would not see it
	}
	return nil
}

// Arrived reads into b what has arrived on raw, without waiting: 0 and
// no error if nothing has, io.EOF at the socket's end.
func Arrived(raw *net.TCPConn, b []byte) (int, error) {
	var r Reader
	r.Init(raw.SyscallConn())
	n, err := r.Read(b, false)
	if err == ErrWouldBlock {
		return 0, nil
	}
	return n, err
}

// Readiness is what a Read of a stream would find now (ReadinessFD).
type Readiness uint8

const (
	Waits Readiness = iota // nothing to read: a Read would block
	Data                   // bytes wait to be read
	End                    // a Read would return io.EOF or an error at once
)
