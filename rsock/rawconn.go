package rsock

import (
	"errors"
	"fmt"
	"net"
	"syscall"

	"github.com/rdmanet/rdmanet/internal/sysdep"
)

// SyscallConn returns a syscall.RawConn for code written for *net.TCPConn.
// On the TCP transport it is the TCP connection's own. On a ring, or on the
// switching protocol before its upgrade, the stream's bytes are on no
// descriptor, and the RawConn says so:
//
//   - Control runs f on the bootstrap TCP socket: TCP_USER_TIMEOUT (as
//     grpc-go sets it) bounds, with keep-alive, how long a dead peer host
//     goes unnoticed; options about the flow of data do not touch the ring.
//   - Read runs f once, on a descriptor that stands for what a Read of the
//     Conn would find now, so that a liveness check written for TCP (a
//     non-blocking read or MSG_PEEK of one byte, as go-redis and
//     go-sql-driver/mysql do) tells the truth about the stream: reading it
//     fails with EAGAIN when a Read would block, returns a byte (not the
//     stream's) when bytes wait, and returns 0 (end of file) when a Read
//     would return io.EOF or an error. Nothing of the stream is taken. If
//     f returns false, asking to wait, Read returns an error wrapping
//     errors.ErrUnsupported rather than wait on a descriptor no data will
//     reach. (Such descriptors are Unix socket pairs: elsewhere Read fails
//     so, at once.)
//   - Write fails with an error wrapping errors.ErrUnsupported: bytes
//     written to a descriptor would bypass the stream.
//
// Neither Read nor Write blocks. After Close each method fails with an
// error wrapping net.ErrClosed.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	var rc syscall.RawConn
	err := c.onKeepAlive(func(t *net.TCPConn) (err error) {
		rc, err = t.SyscallConn()
		return err
	})
	if err != nil {
		return nil, err
	}
	return &rawConn{c: c, boot: rc}, nil
}

// rawConn is SyscallConn's answer. On TCP it is the socket's own, but
// while bytes the listener sniffed wait to be read (Conn.prefix).
type rawConn struct {
	c    *Conn
	boot syscall.RawConn // the socket's: the stream's on TCP, else the bootstrap's
}

// errRawUnsupported fails rawConn's Write and a Read whose f asks to wait.
var errRawUnsupported = fmt.Errorf("rsock: the stream is not on a descriptor (use the Conn's Read and Write): %w", errors.ErrUnsupported)

func (r *rawConn) Control(f func(fd uintptr)) error {
	if r.c.closed.Load() {
		return r.c.opError("raw-control", net.ErrClosed)
	}
	return r.boot.Control(f)
}

func (r *rawConn) Read(f func(fd uintptr) bool) error {
	if r.c.w == nil && !r.c.hasPrefix.Load() {
		return r.boot.Read(f) // the stream's next bytes are the socket's
	}
	if r.c.closed.Load() {
		return r.c.opError("raw-read", net.ErrClosed)
	}
	now := sysdep.Data // TCP: sniffed bytes wait
	if r.c.w != nil {
		now = r.c.w.poll()
	}
	fd, release, err := sysdep.ReadinessFD(now)
	if err != nil {
		return r.c.opError("raw-read", err)
	}
	defer release()
	if !f(uintptr(fd)) {
		return r.c.opError("raw-read", errRawUnsupported)
	}
	return nil
}

func (r *rawConn) Write(f func(fd uintptr) bool) error {
	if r.c.w == nil {
		return r.boot.Write(f)
	}
	if r.c.closed.Load() {
		return r.c.opError("raw-write", net.ErrClosed)
	}
	return r.c.opError("raw-write", errRawUnsupported)
}

// poll is what a Read would find now. On TCP, when no one reads the
// socket, it handles what has arrived without waiting (pollSocket).
func (w *swConn) poll() sysdep.Readiness {
	for tries := 0; ; tries++ {
		w.mu.Lock()
		switch {
		case w.closed || w.rclosed:
			w.mu.Unlock()
			return sysdep.End
		case w.rqLen > 0:
			w.mu.Unlock()
			return sysdep.Data
		case w.recv == recvRing:
			r := w.ring
			w.mu.Unlock()
			switch ok, err := r.Poll(); {
			case ok:
				return sysdep.Data
			case err == nil:
				return sysdep.Waits
			case !moved(err):
				return sysdep.End
			}
			// The ring is left for TCP (offRing): what the failover
			// leaves is what a Read finds next.
			w.mu.Lock()
			end := w.closed || w.err != nil
			w.mu.Unlock()
			if end {
				return sysdep.End
			}
			return sysdep.Waits
		case w.recv == recvEnd, w.err != nil:
			w.mu.Unlock()
			return sysdep.End
		}
		w.mu.Unlock()
		if tries > 0 {
			return sysdep.Waits
		}
		switch took, data := w.pollSocket(); {
		case !took:
			return sysdep.Waits
		case data:
			return sysdep.Data
		}
	}
}

// pollSocket is poll's turn at the socket (socketTurn): it handles what has
// arrived, without waiting, up to the next Data payload (left for a Read:
// in.data) or the socket's end. It reports whether it took the turn and
// whether a Data payload is next; else poll looks again.
func (w *swConn) pollSocket() (took, data bool) {
	took, _ = w.socketTurn(true, func() {
		// It stops at errWouldBlock; or at the deadline by which
		// needReaderLocked ends its turn, readLoop taking over after it.
		data = w.in.data > 0
		var over bool
		var err error
		for !data && !over && err == nil {
			testHookPollSocket.run(w)
			data, over, err = w.frame(false)
		}
	})
	return took, data
}

// testHookPollSocket runs before each frame pollSocket reads.
var testHookPollSocket hook
