package rsock

import (
	"net"
	"net/netip"
	"sync"
)

// Admission: what a Listener bounds so that no client, however many
// connections it opens and stalls, keeps others waiting. The accept loop
// never stops accepting; a connection costs the listener, in each phase of
// its handshake:
//
//   - before its first bytes: SniffTimeout, then it is handed to Accept as
//     a plain client (the application's own limits apply to it);
//   - after the magic, until its hello is complete (within
//     HandshakeTimeout): a place among perSourceWaiting of its source
//     address; past them, a newer connection from the same address takes
//     the oldest one's place, which is closed (its client, if it was a
//     real one, dials again over plain TCP and says why);
//   - while an endpoint is prepared for it (memory registered, a queue pair
//     made): one of maxSetups places; past them, the hello is declined
//     (DeclineResources) and the client continues on TCP with that reason;
//   - on the switching protocol, per connection: maxOffers upgrade offers,
//     each of which may prepare an endpoint (an Offer, our Accept, the
//     client's Confirm{declined}, and again); past them, every offer is
//     declined (DeclinePolicy) at no cost, and the connection stays on TCP
//     with that reason. An honest client offers once, and again only after
//     a failover or a busy server's decline, with a backoff that doubles.
//
// A goroutine and a socket are all a stalled client costs until then, so
// the bounds are set for the host's descriptors, not for the clients that
// are served meanwhile: a plain client never takes a waiting place, and an
// rsock client takes one for the milliseconds it needs to send its hello.
const (
	perSourceWaiting = 1024
	maxSetups        = 256
	maxOffers        = 16
)

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

func sourceOf(c *net.TCPConn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}
