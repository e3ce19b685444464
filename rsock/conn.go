package rsock

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/rdmanet/internal/stream"
)

// Conn is a connection from Dial or Accept. It implements net.Conn, plus
// CloseWrite and CloseRead like *net.TCPConn. Underneath is a ring (verbs
// or shm: the peer writes into this side's receive ring) or the bootstrap
// TCP connection; Info says which, and why.
//
// The net.Conn contract holds on every transport: Read blocks until data,
// io.EOF (the peer closed its writing side and all data was read), an
// error, Close, or the read deadline; Write blocks until all bytes are sent
// (copied out of b) or an error. Deadlines apply to pending and future
// calls, can be moved while a call blocks, and time out with an error that
// wraps os.ErrDeadlineExceeded and has Timeout() true; the Conn stays usable
// afterwards. Close unblocks every call; later calls fail with an error
// wrapping net.ErrClosed. Errors are *net.OpError. All methods are safe for
// concurrent use, and concurrent Writes do not interleave.
type Conn struct {
	network string
	label   atomic.Pointer[label] // transport and why; replaced once by a late-hello rescue

	w   *swConn      // the switching protocol (switching.go), or nil: plain TCP
	tcp *net.TCPConn // the TCP connection: the transport without w, else the bootstrap

	prefixMu  sync.Mutex
	prefix    []byte      // bytes sniffed by the listener, replayed before tcp's
	hasPrefix atomic.Bool // len(prefix) > 0
	// late marks a connection handed over after a sniff timeout with at
	// most part of the magic read: its first Read runs rescueLateHello.
	late atomic.Bool

	// Counters of the bytes on TCP (a ring keeps its own).
	bytesRead, bytesWritten, writes atomic.Uint64

	keepAliveOnce sync.Once // keep-alive was turned on (keepAlive)

	born   time.Time   // when it was made (registry.go)
	shard  uint8       // its registry shard
	closed atomic.Bool // Close was called: it left the registry
	// Its place in its shard's list while registered, under its lock.
	prev, next *Conn
	listed     bool
}

// label says which transport carries a Conn and why.
type label struct {
	transport string // "verbs", "shm", "sim" or "tcp"
	code      string // why, as a reason code (registry.go)
	reason    string // why this transport (for tcp: why not another)
	fallback  bool   // an accelerated transport was possible but TCP is used
}

// ring is the stream carrying c on a ring since an upgrade, or nil.
func (c *Conn) ring() *stream.Conn {
	if c.w == nil {
		return nil
	}
	c.w.mu.Lock()
	defer c.w.mu.Unlock()
	return c.w.ring
}

// ConnInfo describes a Conn: which transport carries it, why, what it did.
type ConnInfo struct {
	// Transport is "verbs", "shm" or "tcp" ("sim" in tests).
	Transport string
	// Fallback is true when the Conn runs over TCP although an accelerated
	// transport was allowed; Reason says why.
	Fallback bool
	// Reason says why this transport was chosen, for example the server's
	// decline, a missing device, or "server does not speak rsock"; Code
	// says it as one of the Code* constants.
	Reason string
	Code   string

	// BytesRead and BytesWritten count the bytes Read returned and Write took,
	// over every path; Paths splits them: TCP first, then each ring used, in
	// order (a failover ends one, an upgrade starts the next). Each only grows.
	BytesRead    uint64
	BytesWritten uint64
	Paths        []PathBytes
	Writes       uint64 // Write calls that moved data
	// The following count only on accelerated transports.
	MsgsSent uint64 // ring state messages posted
	// Posts counts the send queue's posts (on verbs one ibv_post_send,
	// one doorbell each): a state message goes out in one post with the
	// WRITEs of the bytes it announces.
	Posts        uint64
	MsgsRecv     uint64 // ring state messages received
	CreditStalls uint64 // times a Write waited for ring space or credits
	Wakeups      uint64 // times a blocked call parked and was woken
	SpinHits     uint64 // times a busy-polling call found what it waited for before parking
	// Notifications counts the completion queue's notifications; Background
	// those that came while no call waited and started background progress.
	Notifications uint64
	Background    uint64
	// Registered is the memory the connection holds registered with its
	// device now (receive ring, state-message buffers, and on verbs the
	// staging buffer of the peer's ring size): pinned on verbs; 0 on TCP.
	// Rings that start at Config.RingStart hold that size until they grow.
	Registered int64
	// RingGrows counts moves to a larger ring (Config.RingStart), the peer's
	// into ours and ours into the peer's, at most one each; RingGrowFailures
	// the registrations for one the host refused (RLIMIT_MEMLOCK).
	RingGrows        uint64
	RingGrowFailures uint64
	// Backstops counts kicks of the peer's ring, against a lost notification,
	// after it consumed nothing in flight for a while (docs/protocol.md §4.1).
	Backstops uint64
	// Switches lists, on the switching protocol, when each direction
	// moved between TCP and a ring and why, and upgrades that did not
	// happen (From == To), oldest first (at most 16).
	Switches []SwitchEvent
}

// PathBytes is what one path of a connection carried.
type PathBytes struct {
	Transport               string // "tcp", or a ring's: "verbs", "shm"
	BytesRead, BytesWritten uint64
}

// Info returns the Conn's transport, the reason for it, and its counters.
func (c *Conn) Info() ConnInfo {
	l := c.label.Load()
	ci := ConnInfo{Transport: l.transport, Fallback: l.fallback, Reason: l.reason, Code: l.code, Writes: c.writes.Load(),
		Paths: []PathBytes{{Transport: "tcp", BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load()}}}
	var s *stream.Conn
	var name string
	if c.w != nil {
		s, name = c.w.info(&ci)
	}
	if s != nil {
		st := s.Stats()
		ci.Paths = append(ci.Paths, PathBytes{Transport: name, BytesRead: st.BytesRead.Load(), BytesWritten: st.BytesWritten.Load()})
		ci.Writes += st.Writes.Load()
		ci.MsgsSent = st.MsgsSent.Load()
		ci.Posts = st.Posts.Load()
		ci.MsgsRecv = st.MsgsRecv.Load()
		ci.CreditStalls = st.CreditStalls.Load()
		ci.Wakeups = st.Wakeups.Load()
		ci.SpinHits = st.SpinHits.Load()
		ci.Notifications = st.Notifications.Load()
		ci.Background = st.Background.Load()
		ci.Registered = s.Registered()
		ci.RingGrows = st.RingGrows.Load()
		ci.RingGrowFailures = st.GrowFailures.Load()
		ci.Backstops = st.Backstops.Load()
	}
	for _, p := range ci.Paths {
		ci.BytesRead += p.BytesRead
		ci.BytesWritten += p.BytesWritten
	}
	return ci
}

// TransportOf returns the transport carrying c: "verbs", "shm" or "tcp" for a
// Conn from rsock's Dial or Accept, looking through wrappers with a NetConn
// method (such as *tls.Conn); "" for a connection rsock did not make.
func TransportOf(c net.Conn) string {
	if rc := unwrap(c); rc != nil {
		return rc.label.Load().transport
	}
	return ""
}

// InfoOf returns c's ConnInfo if c (or the conn it wraps) is an rsock Conn.
func InfoOf(c net.Conn) (ConnInfo, bool) {
	if rc := unwrap(c); rc != nil {
		return rc.Info(), true
	}
	return ConnInfo{}, false
}

// Settled returns a channel that is closed once c's transport has settled (c,
// or the conn it wraps, see TransportOf): at once for a connection that cannot
// change transport (plain TCP, a fallback, one rsock did not make); on the
// switching protocol once the first upgrade has run its course (both directions
// on the ring, the upgrade declined or failed, Info says why, or the connection
// ended). A listener's end waits for its client's upgrade, and stays open while
// a client that never upgrades lives. The upgrade's frames travel behind the
// data: an end that does not read (past 256 KiB queued) holds its own upgrade
// back, so where the final transport matters wait for Settled before asking the
// peer to send. A failover, an upgrade offered again after a busy server's
// decline, and their ring do not reopen it.
func Settled(c net.Conn) <-chan struct{} {
	if rc := unwrap(c); rc != nil && rc.w != nil {
		return rc.w.settledChan()
	}
	return closedChan
}

// WaitSettled waits until c's transport has settled (Settled) or ctx is
// done, and returns TransportOf(c) then. The error is nil once c has
// settled, even if ctx is done too; otherwise it is ctx.Err(), with the
// transport c is on meanwhile. A connection that cannot change transport
// returns at once: plain TCP, a fallback, or one rsock did not make ("").
func WaitSettled(ctx context.Context, c net.Conn) (transport string, err error) {
	select {
	case <-Settled(c):
	case <-ctx.Done():
		select {
		case <-Settled(c):
		default:
			err = ctx.Err()
		}
	}
	return TransportOf(c), err
}

var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

func unwrap(c net.Conn) *Conn {
	for range 8 {
		switch v := c.(type) {
		case *Conn:
			return v
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil
		}
	}
	return nil
}

func (c *Conn) opError(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return err
	}
	return &net.OpError{Op: op, Net: c.network, Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// Read implements net.Conn.
func (c *Conn) Read(b []byte) (int, error) {
	if c.w != nil {
		n, err := c.w.Read(b)
		return n, c.opError("read", err)
	}
	if c.late.Load() {
		if err := c.rescueLateHello(); err != nil {
			return 0, c.opError("read", err)
		}
	}
	if c.hasPrefix.Load() {
		c.prefixMu.Lock()
		if len(c.prefix) > 0 && len(b) > 0 {
			n := copy(b, c.prefix)
			c.prefix = c.prefix[n:]
			c.hasPrefix.Store(len(c.prefix) > 0)
			c.prefixMu.Unlock()
			c.bytesRead.Add(uint64(n))
			return n, nil
		}
		c.prefixMu.Unlock()
	}
	n, err := c.tcp.Read(b)
	c.bytesRead.Add(uint64(n))
	return n, err
}

// Write implements net.Conn.
func (c *Conn) Write(b []byte) (int, error) {
	if c.w != nil {
		n, err := c.w.Write(b)
		return n, c.opError("write", err)
	}
	n, err := c.tcp.Write(b)
	c.bytesWritten.Add(uint64(n))
	if n > 0 {
		c.writes.Add(1)
	}
	return n, err
}

// Close closes the connection; see the type's documentation.
func (c *Conn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.unregister()
	}
	if c.w != nil {
		return c.opError("close", c.w.Close())
	}
	return c.tcp.Close()
}

// CloseWrite shuts down the writing side: the peer reads io.EOF after the
// data already written. Later Writes fail.
func (c *Conn) CloseWrite() error {
	if c.w != nil {
		return c.opError("close", c.w.CloseWrite())
	}
	return c.tcp.CloseWrite()
}

// CloseRead shuts down the reading side: later Reads return io.EOF.
func (c *Conn) CloseRead() error {
	if c.w != nil {
		return c.opError("close", c.w.CloseRead())
	}
	return c.tcp.CloseRead()
}

// LocalAddr returns the local address of the bootstrap TCP connection.
func (c *Conn) LocalAddr() net.Addr {
	return c.tcp.LocalAddr()
}

// RemoteAddr returns the remote address of the bootstrap TCP connection.
func (c *Conn) RemoteAddr() net.Addr {
	return c.tcp.RemoteAddr()
}

// SetDeadline, SetReadDeadline and SetWriteDeadline implement net.Conn.
func (c *Conn) SetDeadline(t time.Time) error      { return c.setDeadline(t, true, true) }
func (c *Conn) SetReadDeadline(t time.Time) error  { return c.setDeadline(t, true, false) }
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.setDeadline(t, false, true) }

func (c *Conn) setDeadline(t time.Time, r, w bool) error {
	switch {
	case c.w != nil:
		return c.opError("set", c.w.setDeadline(t, r, w))
	case r && w:
		return c.tcp.SetDeadline(t)
	case r:
		return c.tcp.SetReadDeadline(t)
	}
	return c.tcp.SetWriteDeadline(t)
}

// ReadFrom implements io.ReaderFrom. On the TCP transport it uses the
// kernel's splice and sendfile paths, as *net.TCPConn does.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if c.w == nil {
		n, err := c.tcp.ReadFrom(r)
		c.bytesWritten.Add(uint64(n))
		if n > 0 {
			c.writes.Add(1)
		}
		return n, err
	}
	return io.Copy(writerOnly{c}, r)
}

// WriteTo implements io.WriterTo. On the TCP transport it uses the kernel's
// splice path, as *net.TCPConn does. On a ring it hands w the received bytes
// where they lie in the receive ring, with no copy in between; as with any
// io.Writer, w must not keep the slices it is given.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	if c.w != nil {
		n, rerr, werr := c.w.writeTo(w)
		if werr != nil {
			return n, werr
		}
		return n, c.opError("read", rerr)
	}
	if !c.hasPrefix.Load() && !c.late.Load() {
		n, err := c.tcp.WriteTo(w)
		c.bytesRead.Add(uint64(n))
		return n, err
	}
	return io.Copy(w, readerOnly{c})
}

// writerOnly and readerOnly hide ReadFrom, WriteTo: io.Copy would call them.
type writerOnly struct{ io.Writer }
type readerOnly struct{ io.Reader }
