package rsock

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Admission bounds (docs/protocol.md §2.1, §9.4 step 2): a source's waiting
// places, the endpoints prepared at once, the offers answered on their merits
// per connection; set for the host's descriptors, since a stalled client
// costs a goroutine and a socket.
const (
	perSourceWaiting = 1024
	maxSetups        = 256
	maxOffers        = 16
	// maxClientSetups bounds clients' endpoint setups at once (clientSetups).
	maxClientSetups = 128
)

// maxPending bounds the handshakes a listener runs at once: past it, the
// accept loop accepts nothing until one ends. A variable for tests.
var maxPending = 4096

// waitingSet holds, per source address, the connections that sent the
// magic and not yet a complete hello, oldest first: at most max each.
type waitingSet struct {
	max     int
	mu      sync.Mutex
	bySrc   map[netip.Addr][]*net.TCPConn
	evicted atomic.Uint64
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
		w.evicted.Add(1)
	}
	w.bySrc[src] = append(q, c)
	return src
}

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

func (w *waitingSet) evictions() uint64 { return w.evicted.Load() }

// sourceOf is the source that c's waiting place counts against
// (sourceGroup): a host is commonly given a whole IPv6 /64.
func sourceOf(c *net.TCPConn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return sourceGroup(a.AddrPort().Addr())
	}
	return netip.Addr{}
}

// sourceGroup is ip's source group: IPv4 (also mapped) itself, IPv6 its /64.
func sourceGroup(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	if ip.Is4() {
		return ip
	}
	p, _ := ip.Prefix(64)
	return p.Addr()
}
