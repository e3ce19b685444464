package rsock

// The listener's handshakes: docs/protocol.md §2.1, §9.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/sysdep"
)

// handshakeConn answers raw's hello on the accept loop when it came whole
// with the connection (docs/protocol.md §2.1): nothing in that waits but
// for room in the ready queue, as the loop would anyway (the answer is the
// fresh socket's first write). Any other handshake gets a goroutine.
func (l *Listener) handshakeConn(raw *net.TCPConn) {
	l.handedOff.Add(1)
	var buf [128]byte
	n, err := sysdep.Arrived(raw, buf[:])
	if hello, k := switchHelloIn(buf[:n]); err == nil && hello != nil {
		c, err := l.s.serveSwitch(l, raw, hello, switchFrom{withMagic: true}, buf[k:n])
		l.deliver(raw, c, err)
		return
	}
	first := bytes.Clone(buf[:n])
	l.pending.Add(1)
	l.wg.Add(1) // the loop's own count orders this before Close's Wait
	go func() {
		defer l.wg.Done()
		l.serveConn(raw, first, err)
		if l.pending.Add(-1) == int64(maxPending)-1 {
			l.room.wake() // the accept loop may wait for this one
		}
	}()
}

// setDeadline sets raw's read deadline (both, if both) to t, unless the
// listener has closed: its deadlines then stay in the past, where Close
// put them (serveConn), and Close does not wait for t.
func (l *Listener) setDeadline(raw *net.TCPConn, t time.Time, both bool) {
	if both {
		_ = raw.SetDeadline(t)
	} else {
		_ = raw.SetReadDeadline(t)
	}
	if l.ctx.Err() != nil {
		_ = raw.SetDeadline(aLongTimeAgo)
	}
}

// serveConn runs the handshake of raw, whose first bytes (read with
// err) are first, then hands the result to Accept.
func (l *Listener) serveConn(raw *net.TCPConn, first []byte, err error) {
	if l.ctx.Err() != nil {
		raw.Close() // the listener closed under us
		return
	}
	// Close ends the handshake's I/O.
	stop := context.AfterFunc(l.ctx, func() { _ = raw.SetDeadline(aLongTimeAgo) })
	c, err := l.handshake(raw, first, err)
	stop()
	if l.ctx.Err() != nil && err == nil {
		c.Close() // the listener closed under us
		return
	}
	l.deliver(raw, c, err)
}

// deliver counts and logs the outcome of raw's handshake, and waits until
// c is queued for Accept, or the listener closes. On an error it closes raw.
func (l *Listener) deliver(raw *net.TCPConn, c *Conn, err error) {
	if err != nil {
		raw.Close()
		l.dropped(err, raw.RemoteAddr())
		return
	}
	l.s.logConn(c, "server")
	select {
	case l.ready <- c:
	case <-l.ctx.Done():
		c.Close()
	}
}

// dropped counts and logs a handshake that failed, rate-limited (logBurst).
func (l *Listener) dropped(err error, peer net.Addr) {
	l.handshakeErrors.Add(1)
	failed(err)
	if !l.s.log.Enabled(context.Background(), slog.LevelWarn) {
		return
	}
	ok, n := l.logLimit.allow()
	if !ok {
		return
	}
	attrs := []slog.Attr{slog.String("reason", err.Error()), slog.String("peer", fmt.Sprint(peer))}
	if n > 0 {
		attrs = append(attrs, slog.Int("suppressed", n))
	}
	l.s.log.LogAttrs(context.Background(), slog.LevelWarn, "rsock: handshake dropped", attrs...)
}

// handshake runs raw's handshake, its first bytes (read with err) being
// first: the sniff of the magic, then the hello. On an error the caller
// closes raw (deliver), as for plainClient, awaitHello and serveSwitch.
func (l *Listener) handshake(raw *net.TCPConn, arrived []byte, err error) (*Conn, error) {
	s := l.s
	var buf [128]byte
	first := buf[:]
	n := copy(first, arrived)
	timed := false
	if err == nil && n < len(handshake.Magic) && handshake.MatchesMagicPrefix(first[:n]) {
		testHookSniff.run(nil)
		l.setDeadline(raw, time.Now().Add(s.sniff), false)
		timed = true
		n, err = sniffMagic(raw, first, n)
	}
	head := first[:n]
	if n < len(handshake.Magic) || !handshake.MatchesMagicPrefix(head) {
		return l.plainClient(raw, head, err)
	}
	if err != nil {
		return nil, err
	}
	// A whole switching hello came with the magic: answer it now.
	if hello, k := switchHelloIn(head); hello != nil {
		return s.serveSwitch(l, raw, hello, switchFrom{withMagic: true, timed: timed}, head[k:])
	}
	return l.awaitHello(raw, head[len(handshake.Magic):])
}

// testHookSniff runs as a handshake begins its sniff (tests; no Conn yet).
var testHookSniff hook

// plainClient is the Conn of a client whose first bytes, head (read with
// err), are not the magic.
func (l *Listener) plainClient(raw *net.TCPConn, head []byte, err error) (*Conn, error) {
	// A plain client: what it sent, if anything, is its own.
	if err != nil && len(head) == 0 && !isTimeout(err) && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if !l.s.fallback {
		return nil, fmt.Errorf("%w: plain TCP client", ErrNoTransport)
	}
	c := plainConn(l.network, raw, bytes.Clone(head), CodePlainClient, false, "client does not speak rsock")
	// A timeout with nothing or only part of the magic read may be an
	// rsock client that was slow to start: watch its first bytes.
	c.late.Store(isTimeout(err) && handshake.MatchesMagicPrefix(head))
	return c, nil
}

// awaitHello runs the handshake of an rsock client whose hello did not
// come whole with the magic; rest is what came after the magic.
func (l *Listener) awaitHello(raw *net.TCPConn, rest []byte) (*Conn, error) {
	s := l.s
	// An rsock client: the whole handshake is bounded from here, and until
	// its hello is complete it holds one of its source's waiting places.
	l.setDeadline(raw, time.Now().Add(s.handshake), true)
	src := l.waiting.add(raw)
	// The magic at once, before the hello is read (docs/protocol.md §2.1);
	// the next frame leaves it out (handshake.WriteAfterMagic).
	if _, err := raw.Write([]byte(handshake.Magic)); err != nil {
		l.waiting.remove(src, raw)
		return nil, err
	}
	hr := bytes.NewReader(rest)
	msg, err := handshake.ReadAfterMagic(io.MultiReader(hr, raw))
	l.waiting.remove(src, raw)
	if err != nil {
		if errors.Is(err, handshake.ErrVersion) {
			_ = handshake.WriteAfterMagic(raw, &handshake.Decline{Code: handshake.DeclineVersion, Reason: fmt.Sprintf("server speaks version %d", handshake.Version)})
		}
		return nil, err
	}
	hello, ok := msg.(*handshake.Hello)
	if !ok {
		return nil, fmt.Errorf("rsock: client opened with %v, want hello", msg.Type())
	}
	if hello.Flags&handshake.FlagSwitch == 0 {
		// Version 2 has no other handshake.
		return nil, errors.New("rsock: a hello without FlagSwitch")
	}
	// An early client's frames may have come with its hello.
	return s.serveSwitch(l, raw, hello, switchFrom{timed: true}, rest[len(rest)-hr.Len():])
}

// sniffMagic reads into b, whose first n bytes are read already, until it
// holds the magic's length, stops matching the magic, or fails; it returns
// how many bytes b holds (maybe more than the magic: whatever had arrived).
func sniffMagic(c net.Conn, b []byte, n int) (int, error) {
	for n < len(handshake.Magic) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil || !handshake.MatchesMagicPrefix(b[:n]) {
			return n, err
		}
	}
	return n, nil
}

// switchHelloIn returns the switching Hello that b (from its magic on) starts
// with and the frame's length, or nil; an early client's frames follow it.
func switchHelloIn(b []byte) (*handshake.Hello, int) {
	if len(b) < handshake.HeaderLen {
		return nil, 0 // not whole: no error to build
	}
	h, err := handshake.ParseHeader(b)
	end := handshake.HeaderLen + int(h.Length)
	if err != nil || h.Type != handshake.TypeHello || len(b) < end {
		return nil, 0
	}
	m, err := handshake.Decode(h, b[handshake.HeaderLen:end])
	if hello, ok := m.(*handshake.Hello); ok && err == nil && hello.Flags&handshake.FlagSwitch != 0 {
		return hello, end
	}
	return nil, 0
}
