//go:build linux

package rsock

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// transportPipes makes a connected pair on each transport this host has.
var transportPipes = []struct {
	name string
	make func(t *testing.T) (client, server *Conn)
}{
	{"tcp", func(t *testing.T) (*Conn, *Conn) { return pipe(t, listen(t, tcpOnly()), tcpOnly()) }},
	{"shm", func(t *testing.T) (*Conn, *Conn) {
		cfg := &Config{Transports: []string{"shm"}}
		return pipe(t, listen(t, cfg), cfg)
	}},
	{"sim", func(t *testing.T) (*Conn, *Conn) { return simPipe(t, nil) }},
}

// sockopt reads an integer socket option of c's TCP socket, through c's
// SyscallConn.
func sockopt(t *testing.T, c *Conn, level, opt int) int {
	t.Helper()
	rc, err := c.SyscallConn()
	require.NoError(t, err)
	return rawSockopt(t, rc, level, opt)
}

// rawSockopt reads an integer socket option of rc's socket.
func rawSockopt(t *testing.T, rc syscall.RawConn, level, opt int) int {
	t.Helper()
	var v int
	var gerr error
	require.NoError(t, rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }))
	require.NoError(t, gerr)
	return v
}

// TestTCPConnMethods: each *net.TCPConn method rsock's Conn has sets its
// option on the socket underneath (the connection's own, or the bootstrap
// of a ring), read back with getsockopt, and fails with net.ErrClosed after
// Close.
func TestTCPConnMethods(t *testing.T) {
	for _, tp := range transportPipes {
		t.Run(tp.name, func(t *testing.T) {
			c, s := tp.make(t)
			defer s.Close()
			require.Equal(t, tp.name, TransportOf(c))

			require.NoError(t, c.SetKeepAlive(true))
			assert.Equal(t, 1, sockopt(t, c, unix.SOL_SOCKET, unix.SO_KEEPALIVE))
			require.NoError(t, c.SetKeepAlivePeriod(7*time.Second))
			assert.Equal(t, 7, sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE))
			require.NoError(t, c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 9 * time.Second, Interval: 3 * time.Second, Count: 4}))
			assert.Equal(t, 9, sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE))
			assert.Equal(t, 3, sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL))
			assert.Equal(t, 4, sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_KEEPCNT))
			require.NoError(t, c.SetKeepAlive(false))
			assert.Equal(t, 0, sockopt(t, c, unix.SOL_SOCKET, unix.SO_KEEPALIVE))

			require.NoError(t, c.SetNoDelay(false))
			assert.Equal(t, 0, sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_NODELAY))
			require.NoError(t, c.SetNoDelay(true))
			assert.Equal(t, 1, sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_NODELAY))

			require.NoError(t, c.SetReadBuffer(96<<10))
			assert.GreaterOrEqual(t, sockopt(t, c, unix.SOL_SOCKET, unix.SO_RCVBUF), 96<<10)
			require.NoError(t, c.SetWriteBuffer(80<<10))
			assert.GreaterOrEqual(t, sockopt(t, c, unix.SOL_SOCKET, unix.SO_SNDBUF), 80<<10)

			// grpc-go sets TCP_USER_TIMEOUT through syscall.Conn.
			var nc net.Conn = c
			sc, ok := nc.(syscall.Conn)
			require.True(t, ok, "rsock's Conn is a syscall.Conn")
			rc, err := sc.SyscallConn()
			require.NoError(t, err)
			var serr error
			require.NoError(t, rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 20000)
			}))
			require.NoError(t, serr)
			assert.Equal(t, 20000, sockopt(t, c, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT))

			// The data still flows.
			go func() { _, _ = io.Copy(s, s) }()
			echoTrip(t, c, "options set")

			require.NoError(t, c.Close())
			for name, err := range map[string]error{
				"SetKeepAlive":       c.SetKeepAlive(true),
				"SetKeepAlivePeriod": c.SetKeepAlivePeriod(time.Second),
				"SetKeepAliveConfig": c.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true}),
				"SetNoDelay":         c.SetNoDelay(true),
				"SetReadBuffer":      c.SetReadBuffer(4096),
				"SetWriteBuffer":     c.SetWriteBuffer(4096),
				"SetLinger":          c.SetLinger(1),
			} {
				assert.ErrorIs(t, err, net.ErrClosed, "%s after Close", name)
				var oe *net.OpError
				assert.True(t, errors.As(err, &oe), "%s after Close: %T", name, err)
			}
			_, err = c.SyscallConn()
			if tp.name != "tcp" { // *net.TCPConn's own still answers after Close
				assert.ErrorIs(t, err, net.ErrClosed, "SyscallConn after Close")
			}
		})
	}
}

// TestLingerZeroAborts: SetLinger(0) makes Close an abort, as with TCP's
// reset: the peer's Read fails with an error matching ECONNRESET instead
// of reading io.EOF. A positive linger still closes in order.
func TestLingerZeroAborts(t *testing.T) {
	for _, tp := range transportPipes {
		t.Run(tp.name, func(t *testing.T) {
			c, s := tp.make(t)
			defer s.Close()
			require.NoError(t, c.SetLinger(0))
			require.NoError(t, c.Close())
			require.NoError(t, s.SetReadDeadline(time.Now().Add(10*time.Second)))
			_, err := s.Read(make([]byte, 1))
			assert.ErrorIs(t, err, syscall.ECONNRESET, "%v", err)

			c2, s2 := tp.make(t)
			defer s2.Close()
			_, err = c2.Write([]byte("last words"))
			require.NoError(t, err)
			require.NoError(t, c2.SetLinger(2))
			require.NoError(t, c2.Close())
			require.NoError(t, s2.SetReadDeadline(time.Now().Add(10*time.Second)))
			got, err := io.ReadAll(s2)
			require.NoError(t, err)
			assert.Equal(t, "last words", string(got))
		})
	}
}

// keepAliveOf reads the keep-alive options of c's socket itself, not
// through c.SyscallConn (which turns keep-alive on).
func keepAliveOf(t *testing.T, c *Conn) (on, idle, interval, count int) {
	t.Helper()
	rc, err := c.tcp.SyscallConn()
	require.NoError(t, err)
	return rawSockopt(t, rc, unix.SOL_SOCKET, unix.SO_KEEPALIVE),
		rawSockopt(t, rc, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE),
		rawSockopt(t, rc, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL),
		rawSockopt(t, rc, unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
}

// TestKeepAliveOn: every Conn's socket gets the keep-alive net.Dial and
// net.Listen give theirs (on; 15 s, 15 s, 9 probes): a Conn on TCP
// when it is made, a switching one at its first timed step and not
// before; and what the application sets before that step
// stays set.
func TestKeepAliveOn(t *testing.T) {
	defaults := func(t *testing.T, c *Conn, who string) {
		t.Helper()
		on, idle, interval, count := keepAliveOf(t, c)
		assert.Equal(t, []int{1, 15, 15, 9}, []int{on, idle, interval, count}, "%s: keep-alive on, idle, interval, count", who)
	}
	t.Run("at once", func(t *testing.T) {
		for name, cfg := range map[string]*Config{
			"tcp":     tcpOnly(),
			"v1-ring": {Transports: []string{"shm"}},
		} {
			c, s := pipe(t, listen(t, cfg), cfg)
			defaults(t, c, name+" client")
			defaults(t, s, name+" server")
			c.Close()
			s.Close()
		}
	})
	t.Run("switching", func(t *testing.T) {
		defer func(d time.Duration) { helloHold = d }(helloHold)
		helloHold = time.Hour
		cfg := &Config{Transports: []string{"shm", "tcp"}, UpgradeAfter: time.Hour, ProbeCacheTTL: -1}
		ln := listen(t, cfg)
		c, s := dialAccept(t, ln, cfg) // not pipe: it waits for the upgrade
		defer s.Close()
		defer c.Close()
		require.NotNil(t, c.w)
		require.NotNil(t, s.w)
		on, _, _, _ := keepAliveOf(t, c)
		assert.Equal(t, 0, on, "the client's, before its first step")
		c.w.kick() // the client's first step, an hour early
		defaults(t, c, "client after its first step")
		// The server's first step (serverReaderAfter) is its reader's.
		require.Eventually(t, func() bool { on, _, _, _ := keepAliveOf(t, s); return on == 1 }, 10*time.Second, time.Millisecond, "the server's, after its first step")
		defaults(t, s, "server after its first step")

		// The application's settings before the first step stay.
		c2, s2 := dialAccept(t, ln, cfg)
		defer s2.Close()
		defer c2.Close()
		require.NoError(t, c2.SetKeepAlivePeriod(7*time.Second))
		c2.w.kick()
		on, idle, _, _ := keepAliveOf(t, c2)
		assert.Equal(t, []int{1, 7}, []int{on, idle}, "SetKeepAlivePeriod before the first step: on, as on a *net.TCPConn, with its period")
		c3, s3 := dialAccept(t, ln, cfg)
		defer s3.Close()
		defer c3.Close()
		require.NoError(t, c3.SetKeepAlive(false))
		c3.w.kick()
		on, _, _, _ = keepAliveOf(t, c3)
		assert.Equal(t, 0, on, "SetKeepAlive(false) before the first step")
	})
}
