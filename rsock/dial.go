package rsock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Dialer holds options for dialing, like net.Dialer.
type Dialer struct {
	// Timeout bounds the whole dial: TCP connect and handshake (and a
	// plain redial, if the server turns out not to speak rsock). Zero
	// means no timeout beyond the handshake's own bounds.
	Timeout time.Duration
	// LocalAddr is the bootstrap connection's local address; nil: automatic.
	LocalAddr net.Addr
	// Config tunes the connection; nil: the defaults (and RSOCK_* variables).
	Config *Config
}

// Dial connects to the address on the named network, as net.Dial does. The
// network must be "tcp", "tcp4" or "tcp6". The result is a *Conn. By default it
// returns once the server has answered the hello (one round trip), with the
// connection carrying data over TCP; its ring (verbs or shm, when the server
// agrees) is set up in the background by the upgrade policy, and Settled says
// when that is done. With UpgradeAfter negative, or no "tcp" in Transports, it
// returns once the upgrade has run its course (see Config.UpgradeAfter). Where
// no ring can be had the connection stays on TCP (unless the Config forbids
// it), with the reason in its ConnInfo. A server that does not speak rsock is
// detected and dialled again with plain TCP.
func Dial(network, address string) (net.Conn, error) {
	var d Dialer
	return d.DialContext(context.Background(), network, address)
}

// Dial connects to the address on the named network.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to the address on the named network using ctx. A
// ctx cancelled or expired before the connection is established aborts the
// dial; once it is established, ctx no longer matters.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "dial", Net: network, Err: net.UnknownNetworkError(network)}
	}
	s, err := d.Config.resolve()
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	c, err := d.dial(ctx, s, network, address)
	if rc, ok := c.(*Conn); ok && rc != nil {
		s.logConn(rc, "client")
	}
	return c, err
}

func (d *Dialer) dial(ctx context.Context, s *settings, network, address string) (net.Conn, error) {
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	nd := &net.Dialer{LocalAddr: d.LocalAddr, KeepAlive: noKeepAlive} // the Conn turns it on (keepAlive)
	var addr net.Addr                                                 // the server's, once a probe reached it
	// plain dials again with plain TCP, if the Config allows that.
	plain := func(code string, why error) (net.Conn, error) {
		if code != CodeTCPOnly && !s.fallback {
			return nil, &net.OpError{Op: "dial", Net: network, Addr: addr, Err: noTransport(why)}
		}
		raw, err := nd.DialContext(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return plainConn(network, raw.(*net.TCPConn), nil, code, code != CodeTCPOnly, why.Error()), nil
	}
	if len(s.transports) == 0 {
		return plain(CodeTCPOnly, errors.New("tcp is the only transport configured"))
	}
	key := network + " " + address
	if s.probeCacheTTL > 0 && plainServers.known(key) {
		return plain(CodePlainServer, errors.New("server does not speak rsock (remembered)"))
	}
	raw, err := nd.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	tc := raw.(*net.TCPConn)
	addr = tc.RemoteAddr()
	if c := s.dialEarly(network, key, tc); c != nil {
		return c, nil
	}
	// HandshakeTimeout bounds everything from here to the switch.
	hctx, cancel := context.WithTimeout(ctx, s.handshake)
	defer cancel()
	_ = tc.SetDeadline(time.Now().Add(s.handshake))
	stop := context.AfterFunc(hctx, func() { _ = tc.SetDeadline(aLongTimeAgo) })
	c, err := s.dialHandshake(hctx, network, key, tc)
	if !stop() || err != nil && hctx.Err() != nil {
		// The context ended while the handshake ran: what it produced is
		// void. A failed handshake counts so even when stop won: hctx
		// reports its end before the AfterFunc starts, and the handshake
		// may have returned hctx's own error.
		if c != nil {
			c.Close()
		}
		cause := ctx.Err()
		if cause == nil {
			cause = fmt.Errorf("rsock: handshake not done within %v: %w", s.handshake, os.ErrDeadlineExceeded)
		}
		return nil, &net.OpError{Op: "dial", Net: network, Source: tc.LocalAddr(), Addr: tc.RemoteAddr(), Err: cause}
	}
	var redial *redialError
	if errors.As(err, &redial) {
		if redial.code == CodePlainServer && s.probeCacheTTL > 0 && plainServers.add(key, s.probeCacheTTL) {
			s.log.LogAttrs(ctx, slog.LevelInfo, "rsock: remembering a server that does not speak rsock",
				slog.String("code", CodePlainServer), slog.String("peer", address), slog.String("reason", err.Error()), slog.Duration("for", s.probeCacheTTL))
		}
		return plain(redial.code, err)
	}
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Source: tc.LocalAddr(), Addr: tc.RemoteAddr(), Err: err}
	}
	if s.probeCacheTTL > 0 {
		plainServers.forget(key) // an rsock server answered: no strike stands
	}
	return c, nil
}

// probeCache remembers addresses whose servers do not speak rsock. A
// verdict takes two probes in a row: one answer that was not rsock's may
// come from an rsock server that misread a slow client.
type probeCache struct {
	mu      sync.Mutex
	entries map[string]probeEntry
	size    atomic.Int32 // len(entries), for known's lock-free miss when it is empty
	need    int          // probes in a row that make a verdict
}

type probeEntry struct {
	strikes int
	expires time.Time
}

// maxProbeCache bounds the cache; past it, expired entries are dropped and
// then the whole cache is cleared (a miss only costs one probe).
const maxProbeCache = 4096

var plainServers = &probeCache{entries: map[string]probeEntry{}, need: 2}

// known reports whether key is a remembered plain server.
func (p *probeCache) known(key string) bool {
	if p.size.Load() == 0 {
		return false // the common case: no lock, no hash
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[key]
	if ok && time.Now().After(e.expires) {
		p.deleteLocked(key)
		return false
	}
	return ok && e.strikes >= p.need
}

// add records one probe that found a plain server at key, and reports
// whether that made a verdict.
func (p *probeCache) add(key string, ttl time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if len(p.entries) >= maxProbeCache {
		for k, e := range p.entries {
			if now.After(e.expires) {
				delete(p.entries, k)
			}
		}
		if len(p.entries) >= maxProbeCache {
			clear(p.entries)
		}
	}
	e := p.entries[key]
	if now.After(e.expires) {
		e.strikes = 0
	}
	e.strikes++
	e.expires = now.Add(ttl)
	p.entries[key] = e
	p.size.Store(int32(len(p.entries)))
	return e.strikes == p.need
}

// forget drops what is known about key (a handshake there succeeded).
func (p *probeCache) forget(key string) {
	if p.size.Load() == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deleteLocked(key)
}

func (p *probeCache) deleteLocked(key string) {
	delete(p.entries, key)
	p.size.Store(int32(len(p.entries)))
}

// noTransport wraps why no transport was agreed in ErrNoTransport, on one
// line (errors.Join would put a newline in the message).
func noTransport(why error) error {
	return fmt.Errorf("%w: %w", ErrNoTransport, why)
}
