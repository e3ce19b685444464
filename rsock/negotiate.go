package rsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/stream"
	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs"
)

// errNotSameHost is the reason a same-host transport was not offered.
var errNotSameHost = errors.New("the peer is not on this host")

// aLongTimeAgo is a deadline in the past, used to unblock I/O at once.
var aLongTimeAgo = time.Unix(1, 0)

// ErrNoTransport is wrapped by the error Dial returns, and recorded for a
// connection a listener closes, when no transport could be agreed and TCP
// fallback is not allowed.
var ErrNoTransport = errors.New("rsock: no transport could be agreed and TCP fallback is not allowed")

// peerRing is what the peer said of rings in the handshake: whether it
// follows our move (FlagGrow, UpgradeGrow), and its ring limit (RingMax).
type peerRing struct {
	grows bool
	max   uint64
}

// streamOptions are the endpoint options for peer p: a ring of RingSize, or
// the largest p accepts if that is smaller (at least the smallest), from
// RingStart if p follows a move; a peer's ring at most our RingSize.
func (s *settings) streamOptions(p peerRing) stream.Options {
	size := s.ringSize
	for uint64(size) > p.max && size > handshake.MinRing {
		size /= 2
	}
	o := stream.Options{RingSize: size, Credits: s.credits, BusyPoll: s.busyPoll, Failover: s.failover, PeerRingLimit: uint64(s.ringSize)}
	if p.grows && s.ringStart < size {
		o.RingSize, o.GrowTo = s.ringStart, size
	}
	return o
}

func (s *settings) openOptions(raw net.Conn) verbs.OpenOptions {
	return verbs.OpenOptions{LocalAddr: raw.LocalAddr(), RemoteAddr: raw.RemoteAddr(), Device: s.device, Port: s.port, GIDIndex: s.gidIndex, ConnectionManager: s.viaCM,
		TrafficClass: s.tclass, ServiceLevel: s.sl, AckTimeout: s.ackTimeout, RetryCount: s.retries, Pool: s.pool, PoolIdle: s.poolIdle}
}

// newEndpoint prepares an endpoint of transport name for raw and peer p.
func (s *settings) newEndpoint(name string, raw net.Conn, p peerRing) (*stream.Endpoint, error) {
	prov, ok := transport.Lookup(name)
	if !ok {
		return nil, transport.Absent(name)
	}
	return stream.NewEndpoint(prov, s.openOptions(raw), s.streamOptions(p))
}

func ringOf(r stream.Ring) handshake.RingInfo {
	return handshake.RingInfo{Size: r.Size, Addr: r.Addr, RKey: r.RKey, Credits: uint16(r.Credits)}
}

func streamRing(r handshake.RingInfo) stream.Ring {
	return stream.Ring{Size: r.Size, Addr: r.Addr, RKey: r.RKey, Credits: uint64(r.Credits)}
}

// checkPeerRing validates the peer's ring, at most our RingSize (our RingMax):
// we allocate (on RDMA, pin) a staging buffer of its size.
func (s *settings) checkPeerRing(r handshake.RingInfo) error {
	if err := r.Validate(); err != nil {
		return err
	}
	if r.Size > uint64(s.ringSize) {
		return fmt.Errorf("peer ring of %d bytes is over the limit of %d", r.Size, s.ringSize)
	}
	return nil
}

// reasons collects why transports were passed over, for ConnInfo.Reason.
type reasons []string

func (r *reasons) add(name string, err error) { *r = append(*r, name+": "+err.Error()) }
func (r reasons) String() string              { return strings.Join(r, "; ") }

// plainConn wraps a TCP connection that stays on TCP.
// It clears the handshake's deadlines: from here on they are the user's.
func plainConn(network string, raw *net.TCPConn, prefix []byte, code string, fallback bool, reason string) *Conn {
	_ = raw.SetDeadline(time.Time{})
	c := &Conn{network: network, tcp: raw}
	c.label.Store(&label{transport: "tcp", code: code, reason: reason, fallback: fallback})
	c.keepAlive()
	c.setPrefixLocked(prefix) // c is not shared yet
	c.register()
	return c
}

// localFirst returns names, the host-local ones first, each group in order.
func localFirst(names []string) []string {
	order := make([]string, 0, len(names))
	for _, local := range []bool{true, false} {
		for _, name := range names {
			if hostLocal[name] == local {
				order = append(order, name)
			}
		}
	}
	return order
}

// taken returns the transports of an Upgrade that we offered.
func taken(offers []handshake.Offer, ts []handshake.Transport) []handshake.Transport {
	var out []handshake.Transport
	for _, t := range ts {
		if offered(offers, t) {
			out = append(out, t)
		}
	}
	return out
}

func offered(offers []handshake.Offer, t handshake.Transport) bool {
	return slices.ContainsFunc(offers, func(o handshake.Offer) bool { return o.Transport == t })
}

func mustTransport(name string) handshake.Transport {
	t, ok := handshake.TransportByName(name)
	if !ok {
		panic("rsock: unknown transport " + name)
	}
	return t
}

// redialError says the handshake left the connection unusable: the caller
// closes it and dials again plainly. With CodePlainServer the server
// answered, and not like an rsock server: the only evidence that it is a
// plain one, which the caller remembers (an overloaded rsock server may be
// silent or close too). Any other code (silence, a close, a malformed or
// unexpected answer, a version the server declined) is no verdict.
type redialError struct{ code, why string }

func (e *redialError) Error() string { return e.why }

// offerable returns the configured transports that raw's connection may
// offer, in order, and why the others may not.
func (s *settings) offerable(raw *net.TCPConn) ([]string, reasons) {
	var why reasons
	var names []string
	for _, name := range s.transports {
		switch _, ok := transport.Lookup(name); {
		case !ok:
			why.add(name, transport.Absent(name))
		case hostLocal[name] && !maybeSameHost(raw):
			why.add(name, errNotSameHost)
		default:
			names = append(names, name)
		}
	}
	return names, why
}

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

// dialEarly makes the connection of an early dial (docs/protocol.md §9.11)
// on raw if a dial to key is one, else nil. The hello is queued as the
// connection's first frame, so the dial needs no deadline.
func (s *settings) dialEarly(network, key string, raw *net.TCPConn) *Conn {
	if !s.earlyDial || s.dialWaits() || s.probeCacheTTL <= 0 || !earlyServers.known(key) {
		return nil
	}
	names, _ := s.offerable(raw)
	if len(names) == 0 {
		return nil
	}
	hello := s.switchHello(names)
	hello.Flags |= handshake.FlagEarly
	frame, err := handshake.Append(nil, hello)
	if err != nil {
		return nil
	}
	return s.switchConn(network, raw, nil, switchStart{reason: s.upgradeReason, early: true, key: key, offers: hello.Offers, held: frame, untimed: true})
}

// readAnswer reads the server's answer to the hello: the magic within
// ProbeTimeout, the rest of the frame within ctx's deadline. On an error raw
// is closed, and a *redialError says whether the server answered as a
// plain server or not usefully.
func (s *settings) readAnswer(ctx context.Context, raw *net.TCPConn) (handshake.Message, error) {
	end, bounded := ctx.Deadline()
	probeEnd := time.Now().Add(s.probe)
	if bounded && end.Before(probeEnd) {
		probeEnd = end
	}
	_ = raw.SetReadDeadline(probeEnd)
	// Judged at each read: a plain server's short reply ("+OK\r\n") is
	// known for what it is at once, not at ProbeTimeout.
	var head [len(handshake.Magic)]byte
	n, err := sniffMagic(raw, head[:], 0)
	if err != nil || !handshake.MatchesMagicPrefix(head[:n]) {
		raw.Close()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case n > 0 && !handshake.MatchesMagicPrefix(head[:n]):
			return nil, &redialError{CodePlainServer, "server does not speak rsock: its reply does not start with the rsock magic"}
		case isTimeout(err):
			return nil, &redialError{CodeNoAnswer, fmt.Sprintf("server did not answer within %v", s.probe)}
		default:
			return nil, &redialError{CodeNoAnswer, fmt.Sprintf("connection ended before the server answered: %v", err)}
		}
	}
	_ = raw.SetReadDeadline(end) // zero (none) if ctx has no deadline
	msg, err := handshake.ReadAfterMagic(raw)
	if err != nil {
		raw.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if isTimeout(err) {
			return nil, fmt.Errorf("rsock: the server's answer did not arrive within the handshake timeout: %w", os.ErrDeadlineExceeded)
		}
		return nil, &redialError{CodeNoAnswer, fmt.Sprintf("the server's answer did not parse: %v", err)}
	}
	return msg, nil
}

// dialHandshake runs the client side on raw: magic and Hello in one
// write; the server's Upgrade makes a Conn on TCP that upgrades later, or
// before it is returned (dialWaits). On an error raw is closed; a
// *redialError tells the caller to dial again plainly.
func (s *settings) dialHandshake(ctx context.Context, network, key string, raw *net.TCPConn) (*Conn, error) {
	names, why := s.offerable(raw)
	if len(names) == 0 { // nothing sent yet: plain TCP, if allowed
		reason := "no transport available here: " + why.String()
		if !s.fallback {
			raw.Close()
			return nil, fmt.Errorf("%w: %s", ErrNoTransport, reason)
		}
		return plainConn(network, raw, nil, CodeNothingHere, true, reason), nil
	}
	hello := s.switchHello(names)
	frame, err := handshake.Append(nil, hello)
	if err == nil {
		_, err = raw.Write(frame)
	}
	if err != nil {
		// A reset on the first bytes may come from a plain server or a
		// shedding rsock server; only an answer tells.
		raw.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &redialError{CodeNoAnswer, fmt.Sprintf("connection ended while sending the hello: %v", err)}
	}
	registry.probes.Add(1)
	msg, err := s.readAnswer(ctx, raw)
	if err != nil {
		return nil, err
	}
	switch m := msg.(type) {
	case *handshake.Upgrade:
		ts := taken(hello.Offers, m.Transports)
		reason := s.upgradeReason
		if m.Flags&handshake.UpgradeEarly != 0 && s.earlyDial && s.probeCacheTTL > 0 {
			earlyServers.add(key, s.probeCacheTTL)
		}
		if len(ts) == 0 {
			reason = "the server takes none of the transports offered here"
			if !s.fallback {
				raw.Close()
				return nil, fmt.Errorf("%w: %s", ErrNoTransport, reason)
			}
		}
		c := s.switchConn(network, raw, nil, switchStart{transports: ts, peer: peerRing{grows: m.Flags&handshake.UpgradeGrow != 0, max: m.RingMax}, reason: reason})
		if s.dialWaits() {
			if err := c.w.awaitUpgrade(ctx); err != nil {
				c.Close()
				return nil, err
			}
		}
		return c, nil
	case *handshake.Decline:
		// After a version it does not speak (the caller redials plainly) or
		// no common transport (code 1) the server closes the connection; any
		// other (a late hello, code 5) leaves it to carry on as plain TCP, if
		// this side allows that.
		reason := fmt.Sprintf("server declined: %v: %s", m.Code, m.Reason)
		switch {
		case m.Code == handshake.DeclineVersion:
			err = &redialError{CodeDeclined, reason}
		case m.Code == handshake.DeclineNoCommonTransport || !s.fallback:
			err = fmt.Errorf("%w: %s", ErrNoTransport, reason)
		default:
			return plainConn(network, raw, nil, CodeDeclined, true, reason), nil
		}
	case *handshake.Hello:
		err = &redialError{CodePlainServer, "server does not speak rsock: it echoed the hello"}
	case *handshake.Accept:
		err = &redialError{CodeNoAnswer, "the server accepted an offer without a ring"}
	default:
		err = &redialError{CodePlainServer, fmt.Sprintf("server does not speak rsock: it answered with %v", msg.Type())}
	}
	raw.Close()
	return nil, err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
