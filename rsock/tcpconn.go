package rsock

import (
	"net"
	"time"
)

// The methods of *net.TCPConn (README, "API"): on TCP the connection's own,
// on a ring the bootstrap connection's (each says what it does to the ring).
// After Close each returns an error wrapping net.ErrClosed, as TCPConn's do.

// Keep-alive (README, "API"): rsock dials and accepts with it off and turns
// it on (keepAlive) when a connection that stays on TCP is made, or at a
// switching connection's first timed step (swConn.start). The methods
// below, and SyscallConn, turn it on first, so what they set stays set.

// noKeepAlive as a Dialer's or ListenConfig's KeepAlive leaves keep-alive off.
const noKeepAlive = -1

// keepAlive turns Go's default keep-alive (net.Dialer's and
// net.ListenConfig's) on, the first time it is called.
func (c *Conn) keepAlive() {
	c.keepAliveOnce.Do(func() { _ = c.tcp.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true}) })
}

// SetKeepAlive turns TCP keep-alive probes on or off. On a ring they run on the
// bootstrap connection, where they detect a peer host that went away without a
// word (a dead process is detected anyway: its kernel closes the socket).
func (c *Conn) SetKeepAlive(keepalive bool) error {
	return c.onKeepAlive(func(t *net.TCPConn) error { return t.SetKeepAlive(keepalive) })
}

// SetKeepAlivePeriod sets the time between keep-alive probes, as
// *net.TCPConn's does; on a ring, of the bootstrap connection.
func (c *Conn) SetKeepAlivePeriod(d time.Duration) error {
	return c.onKeepAlive(func(t *net.TCPConn) error { return t.SetKeepAlivePeriod(d) })
}

// SetKeepAliveConfig configures keep-alive as *net.TCPConn's does; on a
// ring, of the bootstrap connection.
func (c *Conn) SetKeepAliveConfig(config net.KeepAliveConfig) error {
	return c.onKeepAlive(func(t *net.TCPConn) error { return t.SetKeepAliveConfig(config) })
}

// onKeepAlive applies f to the socket once keep-alive is on.
func (c *Conn) onKeepAlive(f func(*net.TCPConn) error) error {
	return c.onSocket(func(t *net.TCPConn) error {
		c.keepAlive()
		return f(t)
	})
}

// SetNoDelay controls Nagle's algorithm. A ring has none: each Write is
// posted to the peer at once, so on a ring this only sets the bootstrap
// socket's option.
func (c *Conn) SetNoDelay(noDelay bool) error {
	return c.onSocket(func(t *net.TCPConn) error { return t.SetNoDelay(noDelay) })
}

// SetReadBuffer sets the socket's receive buffer. On a ring the receive
// buffer is the ring, whose size the handshake fixed (Config.RingSize):
// this sets only the bootstrap socket's.
func (c *Conn) SetReadBuffer(bytes int) error {
	return c.onSocket(func(t *net.TCPConn) error { return t.SetReadBuffer(bytes) })
}

// SetWriteBuffer sets the socket's send buffer. On a ring a Write copies
// straight into the peer's ring (whose size the peer chose): this sets
// only the bootstrap socket's.
func (c *Conn) SetWriteBuffer(bytes int) error {
	return c.onSocket(func(t *net.TCPConn) error { return t.SetWriteBuffer(bytes) })
}

// SetLinger sets how Close behaves with data not yet delivered, as
// *net.TCPConn's does. On a ring: with sec < 0 (the default) Close waits
// at most 4 s for the peer to have the final message (its transport's
// acknowledgement, then the peer's end of the bootstrap connection), with
// sec > 0 at most sec seconds, and with sec == 0 Close aborts: the
// peer's calls fail with a reset (an error matching syscall.ECONNRESET),
// and bytes it has not read are lost.
func (c *Conn) SetLinger(sec int) error {
	if c.w != nil {
		return c.opError("set", c.w.setLinger(sec))
	}
	return c.tcp.SetLinger(sec)
}

// onSocket applies f to the TCP connection under c: its own or its
// bootstrap's. On a ring it fails once the Conn is closed.
func (c *Conn) onSocket(f func(*net.TCPConn) error) error {
	if c.w != nil && c.closed.Load() {
		return c.opError("set", net.ErrClosed)
	}
	return f(c.tcp)
}
