package rsock

import (
	"errors"
	"expvar"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
)

// The process's view of its connections (Connections, Totals): every Conn
// from Dial or Accept is in a shard's list from its creation to its Close;
// the data path never touches the registry.

// Reason codes: why a connection is on its transport, stable for tools
// and metrics (ConnInfo.Code; ConnInfo.Reason has the details).
const (
	CodeAgreed       = "agreed"         // an accelerated transport was agreed
	CodeTCPOnly      = "tcp-only"       // tcp is the only transport configured
	CodePlainServer  = "plain-server"   // the server answered as a plain server does, or was remembered as one
	CodeNoAnswer     = "no-answer"      // the server gave no usable answer to the probe (silence, a close, a malformed reply)
	CodeNothingHere  = "nothing-here"   // no transport could be prepared on this side
	CodeDeclined     = "declined"       // the other side declined (Reason says its code and why)
	CodeConnectFail  = "connect-failed" // the agreed transport could not be connected
	CodeLocalLimit   = "local-limit"    // a limit of this host (memory, file descriptors, memory mappings) kept the agreed transport from connecting
	CodePlainClient  = "plain-client"   // listener: the client does not speak rsock
	CodeClientGaveUp = "client-gave-up" // listener: the client could not connect the accepted transport
	CodeUpgrading    = "upgrading"      // on TCP until the ring is set up (switching protocol); then CodeAgreed
	CodeFailedOver   = "failed-over"    // the ring's transport failed and the connection moved to TCP (switching protocol)
)

// codes lists every code, for Totals.
var codes = []string{CodeAgreed, CodeTCPOnly, CodePlainServer, CodeNoAnswer, CodeNothingHere, CodeDeclined, CodeConnectFail, CodeLocalLimit, CodePlainClient, CodeClientGaveUp, CodeUpgrading, CodeFailedOver}

// transports lists the transports Totals counts.
var transports = []string{"verbs", "shm", "tcp", "sim"}

const registryShards = 32

var registry struct {
	shards [registryShards]struct {
		mu   sync.Mutex
		head *Conn // a list through Conn.prev and next: no hashing per connection
	}
	next atomic.Uint32

	open, opened   map[string]*atomic.Int64 // by transport: open now (a gauge), made
	upgraded       map[string]*atomic.Int64 // moves onto a ring after a connection was made, by transport
	closedBytes    map[string]*atomic.Int64 // bytes read and written by closed connections, by transport
	byCode         map[string]*atomic.Int64 // labels ever taken, by code
	fallbacks      atomic.Int64
	handshakeFails atomic.Int64
	failCauses     map[string]*atomic.Int64 // failed handshakes by cause
	probes         atomic.Int64
}

// Causes of a listener's failed handshake (TotalStats.HandshakeFailuresBy).
const (
	CauseTimeout     = "timeout"      // the client stalled past a deadline
	CauseVersion     = "version"      // a protocol version the listener does not speak
	CauseMalformed   = "malformed"    // a frame or message that breaks the format
	CauseClosed      = "closed"       // the client closed or reset the connection, or it was evicted
	CauseNoTransport = "no-transport" // no transport agreed and TCP not allowed
	CauseSetup       = "setup"        // the transport failed after the switch, or anything else
)

var causes = []string{CauseTimeout, CauseVersion, CauseMalformed, CauseClosed, CauseNoTransport, CauseSetup}

// failed counts a listener's failed handshake under its cause.
func failed(err error) {
	registry.handshakeFails.Add(1)
	cause := CauseSetup
	switch {
	case isTimeout(err):
		cause = CauseTimeout
	case errors.Is(err, handshake.ErrVersion):
		cause = CauseVersion
	case errors.Is(err, handshake.ErrMalformed), errors.Is(err, handshake.ErrBadMagic):
		cause = CauseMalformed
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		cause = CauseClosed
	case errors.Is(err, ErrNoTransport):
		cause = CauseNoTransport
	}
	registry.failCauses[cause].Add(1)
}

func init() {
	registry.open, registry.opened, registry.byCode = counters(transports), counters(transports), counters(codes)
	registry.upgraded = counters(transports)
	registry.closedBytes = counters(transports)
	registry.failCauses = counters(causes)
}

func counters(keys []string) map[string]*atomic.Int64 {
	m := make(map[string]*atomic.Int64, len(keys))
	for _, k := range keys {
		m[k] = new(atomic.Int64)
	}
	return m
}

// register adds c, once it is complete.
func (c *Conn) register() {
	l := c.label.Load()
	c.born = time.Now()
	c.shard = uint8(registry.next.Add(1) % registryShards)
	sh := &registry.shards[c.shard]
	sh.mu.Lock()
	c.next, c.listed = sh.head, true
	if c.next != nil {
		c.next.prev = c
	}
	sh.head = c
	sh.mu.Unlock()
	if n := registry.opened[l.transport]; n != nil {
		n.Add(1)
		registry.open[l.transport].Add(1)
	}
	if n := registry.byCode[l.code]; n != nil {
		n.Add(1)
	}
	if l.fallback {
		registry.fallbacks.Add(1)
	}
}

// unregister removes c (at its first Close). The shard's lock orders it
// with relabel: c's open count leaves the transport it is counted under.
func (c *Conn) unregister() {
	sh := &registry.shards[c.shard]
	sh.mu.Lock()
	ok := c.listed
	if ok {
		if c.prev != nil {
			c.prev.next = c.next
		} else {
			sh.head = c.next
		}
		if c.next != nil {
			c.next.prev = c.prev
		}
		c.prev, c.next, c.listed = nil, nil, false
	}
	if n := registry.open[c.label.Load().transport]; ok && n != nil {
		n.Add(-1)
	}
	sh.mu.Unlock()
	if ok {
		for _, p := range c.Info().Paths {
			if n := registry.closedBytes[p.Transport]; n != nil {
				n.Add(int64(p.BytesRead + p.BytesWritten))
			}
		}
	}
}

// Bytes returns the bytes read and written by the process's connections,
// open and closed, by the path that carried them (ConnInfo.Paths), for
// rates: it grows, except that a connection closing while it counts may
// be missed until the next call.
func Bytes() map[string]int64 {
	out := snapshot(registry.closedBytes)
	for _, st := range Connections() {
		for _, p := range st.Paths {
			out[p.Transport] += int64(p.BytesRead + p.BytesWritten)
		}
	}
	return out
}

// relabel gives c, registered, the label to (a late hello's rescue, an
// upgrade or one that did not happen, a failover): the open gauge moves to
// the new transport. Under the shard's lock, as unregister: a connection
// unregistered meanwhile keeps its open count where unregister took it from.
func (c *Conn) relabel(to *label) {
	sh := &registry.shards[c.shard]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	from := c.label.Swap(to)
	if a, b := registry.open[from.transport], registry.open[to.transport]; c.listed && a != nil && b != nil && a != b {
		a.Add(-1)
		b.Add(1)
	}
	if n := registry.byCode[to.code]; n != nil {
		n.Add(1)
	}
	if n := registry.upgraded[to.transport]; n != nil && to.transport != "tcp" && from.transport != to.transport {
		n.Add(1)
	}
	if to.fallback && !from.fallback {
		registry.fallbacks.Add(1)
	}
}

// ConnState is one connection in Connections' snapshot.
type ConnState struct {
	ConnInfo
	LocalAddr, RemoteAddr string    // the bootstrap connection's addresses
	Since                 time.Time // when the connection was made
	// RingReadable and RingSize are the bytes waiting in the receive ring
	// and its size (accelerated transports; zero on TCP). RingReadable is
	// -1 when reading it would have made the connection wait.
	RingReadable int64
	RingSize     int64
}

// Connections returns the process's open connections (made by Dial or
// Accept and not yet closed), in no particular order. It does not stop
// their data paths.
func Connections() []ConnState {
	var all []*Conn
	for i := range registry.shards {
		sh := &registry.shards[i]
		sh.mu.Lock()
		for c := sh.head; c != nil; c = c.next {
			all = append(all, c)
		}
		sh.mu.Unlock()
	}
	out := make([]ConnState, 0, len(all))
	for _, c := range all {
		st := ConnState{ConnInfo: c.Info(), LocalAddr: c.LocalAddr().String(), RemoteAddr: c.RemoteAddr().String(), Since: c.born}
		if r := c.ring(); r != nil {
			st.RingReadable, st.RingSize = r.Occupancy()
		}
		out = append(out, st)
	}
	return out
}

// TotalStats are the process's totals since it started. Open is a gauge;
// every other count only grows, so that a monitoring system may read
// them as counters.
type TotalStats struct {
	Open map[string]int64 // open connections now, by their transport now
	// Opened counts the connections made, by the transport each was made
	// on: a switching connection is made on "tcp", and Upgraded counts
	// its move onto a ring.
	Opened map[string]int64
	// Upgraded counts moves of a connection onto a ring after it was
	// made, by transport: upgrades (again after a failover, too), and
	// late hellos rescued onto a ring.
	Upgraded map[string]int64
	// ByCode counts the labels connections took, by reason code (the Code*
	// constants): each connection's first when it is made, and one more at each
	// change (an upgrade, an upgrade that did not happen, a failover).
	ByCode map[string]int64
	// Fallbacks counts the times a connection was made on, or moved to,
	// TCP although an accelerated transport was allowed.
	Fallbacks int64
	// HandshakeFailures counts the connections listeners dropped during
	// the handshake (Listener.Stats, summed over every listener), and
	// HandshakeFailuresBy the same by cause (the Cause* constants).
	HandshakeFailures   int64
	HandshakeFailuresBy map[string]int64
	// Probes counts the dials that asked a server whether it speaks rsock.
	Probes int64
	// CMRejected counts the rdma_cm connect requests refused for want of
	// a valid ticket (iWARP devices; docs/protocol.md §6).
	CMRejected int64
}

// Totals returns the process's totals.
func Totals() TotalStats {
	return TotalStats{Open: snapshot(registry.open), Opened: snapshot(registry.opened), Upgraded: snapshot(registry.upgraded), ByCode: snapshot(registry.byCode),
		Fallbacks: registry.fallbacks.Load(), HandshakeFailures: registry.handshakeFails.Load(),
		HandshakeFailuresBy: snapshot(registry.failCauses), Probes: registry.probes.Load(),
		CMRejected: int64(ibverbs.CMRejected())}
}

var publishOnce sync.Once

// PublishExpvar publishes the process's totals (Totals) as the expvar
// variable "rsock", served with the others at /debug/vars by the expvar
// package's handler. Calling it again does nothing.
func PublishExpvar() {
	publishOnce.Do(func() {
		expvar.Publish("rsock", expvar.Func(func() any { return Totals() }))
	})
}

func snapshot(m map[string]*atomic.Int64) map[string]int64 {
	out := make(map[string]int64, len(m))
	for k, v := range m {
		if n := v.Load(); n != 0 {
			out[k] = n
		}
	}
	return out
}
