package rsock

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// hostLocal marks transports that work only between processes of one host:
// offered only if maybeSameHost, a cheap filter (the provider checks).
var hostLocal = map[string]bool{"shm": true}

// localAddrs caches the host's interface addresses for a few seconds.
var localAddrs struct {
	sync.Mutex
	at   time.Time
	addr map[netip.Addr]bool
}

// maybeSameHost reports whether the bootstrap connection's peer could be on
// this host: a loopback address, our own, or one of our interfaces'.
func maybeSameHost(raw net.Conn) bool {
	ra, ok1 := raw.RemoteAddr().(*net.TCPAddr)
	la, ok2 := raw.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return false
	}
	if ra.IP.IsLoopback() || ra.IP.Equal(la.IP) {
		return true
	}
	ip := ra.AddrPort().Addr()
	localAddrs.Lock()
	defer localAddrs.Unlock()
	if time.Since(localAddrs.at) > 5*time.Second {
		localAddrs.addr = map[netip.Addr]bool{}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if pfx, err := netip.ParsePrefix(a.String()); err == nil {
					localAddrs.addr[pfx.Addr().Unmap()] = true
				}
			}
		}
		localAddrs.at = time.Now()
	}
	return localAddrs.addr[ip.Unmap()]
}
