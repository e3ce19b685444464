//go:build unix

package rsock

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errUnexpectedRead = errors.New("unexpected read")

// liveness is the check that connection pools written for *net.TCPConn
// run on an idle pooled connection through SyscallConn: go-redis peeks one
// byte (MSG_PEEK|MSG_DONTWAIT), go-sql-driver/mysql reads one. nil: a
// Read would wait; errUnexpectedRead: bytes wait; io.EOF: the end.
func liveness(t *testing.T, c net.Conn, peek bool) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		rc, err := c.(syscall.Conn).SyscallConn()
		if err != nil {
			done <- err
			return
		}
		var sysErr error
		err = rc.Read(func(fd uintptr) bool {
			var buf [1]byte
			var n int
			var err error
			if peek {
				n, _, err = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			} else {
				n, err = syscall.Read(int(fd), buf[:])
			}
			switch {
			case n == 0 && err == nil:
				sysErr = io.EOF
			case n > 0:
				sysErr = errUnexpectedRead
			case err == syscall.EAGAIN:
				sysErr = nil
			default:
				sysErr = err
			}
			return true
		})
		if err != nil {
			done <- err
			return
		}
		done <- sysErr
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the liveness check blocked for 10 s")
		return nil
	}
}

// checkBoth runs both kinds of liveness check and requires want of each.
func checkBoth(t *testing.T, c net.Conn, want error, what string) {
	t.Helper()
	for _, peek := range []bool{true, false} {
		require.ErrorIs(t, liveness(t, c, peek), want, "%s (peek %v)", what, peek)
	}
}

// TestSyscallConnLiveness runs a pooled connection's liveness check, as
// go-redis and go-sql-driver/mysql write it for *net.TCPConn, through
// every kind of Conn: it must never block, must see the truth about the
// stream (nothing to read, bytes waiting, the peer's end), and must not
// take a byte of it.
func TestSyscallConnLiveness(t *testing.T) {
	registerSim(t)
	cases := []struct {
		name   string
		cfg    *Config
		settle bool
		want   string
	}{
		{"tcp", tcpOnly(), false, "tcp"},
		{"shm/dial-waits", &Config{Transports: []string{"shm", "tcp"}, UpgradeAfter: -1}, false, "shm"},
		{"shm/upgraded", swCfg("shm", time.Nanosecond), true, "shm"},
		{"sim/upgraded", swCfg("sim", time.Nanosecond), true, "sim"},
		{"shm/before-upgrade", swCfg("shm", time.Hour), false, "tcp"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln := listen(t, tc.cfg)
			c, s := dialAccept(t, ln, tc.cfg)
			defer c.Close()
			defer s.Close()
			if tc.settle {
				<-Settled(c)
				<-Settled(s)
			}
			// Settled on both sides: Info's transport is the receiving
			// one's on the client once the server switched.
			require.Equal(t, tc.want, TransportOf(c))

			checkBoth(t, c, nil, "idle")

			_, err := s.Write([]byte("ab"))
			require.NoError(t, err)
			b := make([]byte, 1)
			_, err = io.ReadFull(c, b)
			require.NoError(t, err)
			if tc.want == "tcp" {
				// The socket's own descriptor: a read would take the
				// byte, as it would from a *net.TCPConn.
				require.ErrorIs(t, liveness(t, c, true), errUnexpectedRead, "one byte waits")
			} else {
				checkBoth(t, c, errUnexpectedRead, "one byte waits")
			}
			_, err = io.ReadFull(c, b)
			require.NoError(t, err)
			require.Equal(t, "b", string(b), "the check took nothing of the stream")
			checkBoth(t, c, nil, "idle again")

			rc, err := c.SyscallConn()
			require.NoError(t, err)
			var typ int
			require.NoError(t, rc.Control(func(fd uintptr) {
				typ, err = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TYPE)
			}))
			require.NoError(t, err)
			assert.Equal(t, syscall.SOCK_STREAM, typ, "Control acts on the TCP socket")
			if tc.want != "tcp" {
				err = rc.Write(func(uintptr) bool { return true })
				assert.ErrorIs(t, err, errors.ErrUnsupported, "a ring's stream is not on a descriptor")
				err = rc.Read(func(uintptr) bool { return false })
				assert.ErrorIs(t, err, errors.ErrUnsupported, "a ring's Read cannot wait on a descriptor")
			}

			require.NoError(t, s.Close())
			require.Eventually(t, func() bool { return liveness(t, c, true) == io.EOF },
				10*time.Second, time.Millisecond, "the peer's close is seen")
			checkBoth(t, c, io.EOF, "closed by the peer")
			_, err = c.Read(b)
			require.ErrorIs(t, err, io.EOF, "and the Conn's Read agrees")

			require.NoError(t, c.Close())
			if rc, err := c.SyscallConn(); err == nil {
				assert.ErrorIs(t, rc.Read(func(uintptr) bool { return true }), net.ErrClosed)
			}
		})
	}
}

// TestSyscallConnLivenessInterrupted: readLoop is called for (here by hand,
// as the client's upgrade or Close would) while a liveness check reads the
// socket on a connection still on TCP: the check's turn ends, it reports
// what it saw, and the connection carries on.
func TestSyscallConnLivenessInterrupted(t *testing.T) {
	registerSim(t)
	cfg := swCfg("sim", time.Hour)
	ln := listen(t, cfg)
	c, s := dialAccept(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	require.NotNil(t, c.w)
	var once sync.Once
	testHookPollSocket.set(func(w *swConn) {
		once.Do(func() { w.mu.Lock(); w.needReaderLocked(); w.mu.Unlock() })
	})
	defer testHookPollSocket.set(nil)

	checkBoth(t, c, nil, "idle, with readLoop called for during the check")
	_, err := s.Write([]byte("x"))
	require.NoError(t, err)
	b := make([]byte, 1)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(c, b)
	require.NoError(t, err, "the connection carries on")
	require.Equal(t, "x", string(b))
}
