package sysdep

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/windows"
)

// Go's sockets on Windows are overlapped and blocking: a receive that
// finds nothing waits, and RawConn's Read waits by a zero-byte receive,
// which ends when bytes, the end or an error have arrived. So readFD
// receives only what FIONREAD says has arrived or, once such a wait ended
// with nothing arrived, the end or the error, which a receive returns at
// once.
type readerSys struct {
	calls int  // f's calls in this RawConn call: after the first, a wait ended
	woke  bool // a wait ended, and nothing was received since
}

// begin starts a RawConn call.
func (s *readerSys) begin() { s.calls = 0 }

// next counts f's call, and reports whether a wait ended.
func (s *readerSys) next() bool {
	if s.calls++; s.calls > 1 {
		s.woke = true
	}
	return s.woke
}

const fionread = 0x4004667f // _IOR('f', 127, u_long)

// arrived returns the bytes a receive on fd takes at once (FIONREAD).
func arrived(fd uintptr) (int, error) {
	var n, size uint32
	err := windows.WSAIoctl(windows.Handle(fd), fionread, nil, 0, (*byte)(unsafe.Pointer(&n)), 4, &size, nil, 0)
	return int(n), err
}

func (r *Reader) readFD(fd uintptr) bool {
	woke := r.sys.next()
	n, err := arrived(fd)
	switch {
	case err != nil:
		r.err = err
		return true
	case n == 0 && !woke && r.wait:
		return false
	case n == 0 && !woke:
		r.blocked = true
		return true
	}
	p := r.p
	if n > 0 && n < len(p) {
		p = p[:n]
	}
	buf := windows.WSABuf{Len: uint32(len(p)), Buf: unsafe.SliceData(p)}
	var got, flags uint32
	r.err = windows.WSARecv(windows.Handle(fd), &buf, 1, &got, &flags, nil, nil)
	r.n = int(got)
	r.sys.woke = false
	return true
}

// peekFD is Await's: true once a read would not block.
func (r *Reader) peekFD(fd uintptr) bool {
	if r.sys.next() {
		return true
	}
	n, err := arrived(fd)
	if err != nil {
		r.peekErr = err
	}
	return n > 0 || err != nil
}

// ReadinessFD fails: Windows has no socket pairs to make such descriptors
// of.
func ReadinessFD(Readiness) (fd int, release func(), err error) {
	return -1, nil, fmt.Errorf("rsock: no descriptor can stand for the stream on windows: %w", errors.ErrUnsupported)
}
