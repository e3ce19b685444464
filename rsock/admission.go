package rsock

import (
	"net"
	"net/netip"
	"sync"
)

// Admission: what a Listener bounds so that no client, however many
// connections it opens and stalls, keeps others waiting or costs the
// server without bound (docs/protocol.md §2.1, §9.4). Besides the accept
// loop's backpressure (maxPending, the ready queue), a connection costs,
// in each phase of its handshake:
//
//   - before its first bytes: SniffTimeout, then it goes to Accept as a
//     plain client;
//   - after the magic, until its hello is complete (within
//     HandshakeTimeout): one of perSourceWaiting places of its source
//     (sourceOf); past them, a newer connection takes the oldest one's
//     place, which is closed;
//   - while an endpoint is prepared for its upgrade offer: one of
//     maxSetups places; past them, the offer is declined
//     (DeclineResources), and the client offers again after a backoff;
//   - per connection: maxOffers upgrade offers, each of which may prepare
//     an endpoint; past them, every offer is declined (DeclinePolicy) at no
//     cost. An honest client offers again only after a failover or a busy
//     server's decline.
//
// A stalled client costs a goroutine and a socket, so the bounds are set
// for the host's descriptors: a plain client never takes a waiting place,
// and an rsock client holds one only until its hello has come.
const (
	perSourceWaiting = 1024
	maxSetups        = 256
	maxOffers        = 16
	// maxClientSetups bounds the upgrades a process's clients set up at
	// once (clientSetups); the others wait for a place.
	maxClientSetups = 128
)

// maxPending bounds the handshakes a listener runs at once, over all
// sources: past it, the accept loop accepts nothing more until one ends
// (acceptLoop), and the kernel's backlog holds the next clients. A
// variable for tests.
var maxPending = 4096

// waitingSet holds, per source address, the connections that sent the
// magic and not yet a complete hello, oldest first: at most max each.
type waitingSet struct {
	max     int
	mu      sync.Mutex
	bySrc   map[netip.Addr][]*net.TCPConn
	evicted uint64
}

// add registers c; if its source already has max, the oldest is closed
// (its handshake fails) and removed. It returns c's source for remove.
func (w *waitingSet) add(c *net.TCPConn) netip.Addr {
	src := sourceOf(c)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bySrc == nil {
		w.bySrc = map[netip.Addr][]*net.TCPConn{}
	}
	q := w.bySrc[src]
	if len(q) >= w.max {
		_ = q[0].Close()
		q[0] = nil
		q = q[1:]
		w.evicted++
	}
	w.bySrc[src] = append(q, c)
	return src
}

// remove unregisters c, if it is still there.
func (w *waitingSet) remove(src netip.Addr, c *net.TCPConn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.bySrc[src]
	for i, x := range q {
		if x == c {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(w.bySrc, src)
	} else {
		w.bySrc[src] = q
	}
}

// evictions reports how many connections add closed.
func (w *waitingSet) evictions() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.evicted
}

// sourceOf is the source that c's waiting place counts against: its
// IPv4 address, or the /64 of its IPv6 address (a host is commonly given
// a whole /64, and could otherwise take a waiting place set per address).
func sourceOf(c *net.TCPConn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return sourceGroup(ip)
		}
	}
	return netip.Addr{}
}

// sourceGroup is ip's source group: the address itself for IPv4 (also
// IPv4-mapped), its /64 for IPv6.
func sourceGroup(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is4() {
		return ip
	}
	p, _ := ip.Prefix(64)
	return p.Addr()
}
