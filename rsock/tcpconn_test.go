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

// keepAliveOf reads the keep-alive options of c's socket.
func keepAliveOf(t *testing.T, c *Conn) (on, idle, interval, count int) {
	t.Helper()
	rc, err := c.tcp.SyscallConn()
	require.NoError(t, err)
	return rawSockopt(t, rc, unix.SOL_SOCKET, unix.SO_KEEPALIVE),
		rawSockopt(t, rc, unix.IPPROTO_TCP, unix.TCP_KEEPIDLE),
		rawSockopt(t, rc, unix.IPPROTO_TCP, unix.TCP_KEEPINTVL),
		rawSockopt(t, rc, unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
}

// TestKeepAliveOn: every Conn's socket has the keep-alive net.Dial and
// net.Listen give theirs (on; 15 s, 15 s, 9 probes), on TCP, on a ring and
// on the switching protocol before its upgrade; what the application sets
// stays set.
func TestKeepAliveOn(t *testing.T) {
	for name, cfg := range map[string]*Config{
		"tcp":       tcpOnly(),
		"ring":      {Transports: []string{"shm"}},
		"switching": {Transports: []string{"shm", "tcp"}, UpgradeAfter: time.Hour, ProbeCacheTTL: -1},
	} {
		t.Run(name, func(t *testing.T) {
			c, s := dialAccept(t, listen(t, cfg), cfg)
			defer s.Close()
			defer c.Close()
			for who, x := range map[string]*Conn{"client": c, "server": s} {
				on, idle, interval, count := keepAliveOf(t, x)
				assert.Equal(t, []int{1, 15, 15, 9}, []int{on, idle, interval, count}, "%s: keep-alive on, idle, interval, count", who)
			}
			require.NoError(t, c.SetKeepAlivePeriod(7*time.Second))
			on, idle, _, _ := keepAliveOf(t, c)
			assert.Equal(t, []int{1, 7}, []int{on, idle}, "SetKeepAlivePeriod")
			require.NoError(t, c.SetKeepAlive(false))
			on, _, _, _ = keepAliveOf(t, c)
			assert.Equal(t, 0, on, "SetKeepAlive(false)")
		})
	}
}
