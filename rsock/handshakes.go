package rsock

// The listener's handshakes: the first read of each accepted socket, the
// goroutines that run the handshakes that must wait, and the sniff that
// tells an rsock client from a plain one (docs/protocol.md §2.1, §9).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// arrival is an accepted socket, and what was read of it so far.
type arrival struct {
	raw     *net.TCPConn
	buf     [128]byte
	n       int       // buf[:n] was read
	err     error     // with this error
	read    bool      // the first read was made (readArrived)
	timed   bool      // raw has a read deadline (awaitFirst), which the connection clears
	sniffBy time.Time // when the sniff for its first bytes ends, once one began (awaitFirst)
}

// acceptArrived runs a's handshake in Accept when it needs no waiting: a
// switching hello that has come whole with the magic is answered at
// once, and its connection returned, one goroutine hand-off fewer than
// through a handshaker. When nothing has arrived yet, Accept waits for the
// first bytes itself while nothing else needs it (awaitFirst), and takes
// on the accept loop's next socket if that ends the wait. Any other
// socket goes on to a handshaker, with what was read of it, and
// acceptArrived returns nil.
func (l *Listener) acceptArrived(a *arrival) *Conn {
	for a != nil {
		a.n, a.err = readArrived(a.raw, a.buf[:])
		a.read = true
		var next *arrival
		if a.err == nil && a.n == 0 {
			next = l.awaitFirst(a)
		}
		if c := l.serveArrived(a); c != nil {
			if next != nil {
				l.handOff(next)
			}
			return c
		}
		a = next
	}
	return nil
}

// serveArrived answers a's switching hello and returns its connection if
// a holds one whole; otherwise it hands a to a handshaker and returns nil.
func (l *Listener) serveArrived(a *arrival) *Conn {
	if a.err == nil {
		if hello, k := switchHelloIn(a.buf[:a.n]); hello != nil {
			peer := a.raw.RemoteAddr()
			c, err := l.s.serveSwitch(l, a.raw, hello, switchFrom{withMagic: true, timed: a.timed}, a.buf[k:a.n])
			if err != nil {
				l.dropped(err, peer)
				return nil
			}
			l.s.logConn(c, "server")
			select {
			case <-l.done:
				c.Close() // the listener closed under us
				return nil
			default:
				return c
			}
		}
	}
	l.handOff(a)
	return nil
}

// awaitFirst waits, in Accept, for a's first bytes (into a) until they
// come, its sniff ends, or something else needs Accept: the accept loop's
// next socket, which it returns for Accept to take on, a handshake that
// finished, or Close (interruptFirst). A client that writes just after it
// connects is then answered by Accept, as one whose bytes had come
// already, and a silent or slow one keeps no other connection waiting.
// It returns at once, with nothing read, if another Accept waits so, a
// connection is ready, or the listener is closed.
func (l *Listener) awaitFirst(a *arrival) *arrival {
	l.firstMu.Lock()
	busy := l.firstRaw != nil || len(l.ready) > 0 || receivable(l.done)
	if !busy {
		l.firstRaw, l.firstStop, l.firstNext = a.raw, false, nil
		// Under the lock, so that an interruptFirst's deadline comes after.
		a.sniffBy = time.Now().Add(l.s.sniffTimeout())
		a.timed = true
		_ = a.raw.SetReadDeadline(a.sniffBy)
	}
	l.firstMu.Unlock()
	if busy {
		return nil
	}
	a.n, a.err = a.raw.Read(a.buf[:])
	l.firstMu.Lock()
	stopped, next := l.firstStop, l.firstNext
	l.firstRaw, l.firstNext = nil, nil
	l.firstMu.Unlock()
	if stopped && isTimeout(a.err) {
		a.err = nil // ended early, not by the client: a handshaker waits on until sniffBy
	}
	return next
}

// interruptFirst ends the wait of an Accept in awaitFirst, if one waits
// and its wait has not been ended already, and hands it next (which may be
// nil); it reports whether it did.
func (l *Listener) interruptFirst(next *arrival) bool {
	l.firstMu.Lock()
	defer l.firstMu.Unlock()
	if l.firstRaw == nil || l.firstStop {
		return false
	}
	l.firstStop, l.firstNext = true, next
	_ = l.firstRaw.SetReadDeadline(aLongTimeAgo)
	return true
}

// handOff gives a's handshake to the handshaker waiting for one, or to a
// new one, unless the listener has closed.
func (l *Listener) handOff(a *arrival) {
	l.handedOff.Add(1)
	l.pending.Add(1)
	select {
	case l.next <- a: // the goroutine kept from the last handshake
		return
	default:
	}
	// Counted in wg under running's lock, which Close takes before it
	// waits for wg: an Accept may get here as the listener closes.
	l.running.mu.Lock()
	defer l.running.mu.Unlock()
	if l.running.ended {
		a.raw.Close()
		l.handshakeOver()
		return
	}
	l.wg.Add(1)
	go l.handshaker(a)
}

// handshaker runs a's handshake, then the next one the accept loop hands
// it while no other waits for one. A goroutine that has run a handshake
// has the stack the next one needs; a fresh one starts with too small a
// stack and grows it, a copy per connection.
func (l *Listener) handshaker(a *arrival) {
	defer l.wg.Done()
	for {
		l.serveConn(a)
		l.handshakeOver()
		if !l.keeping.CompareAndSwap(false, true) {
			return // another waits
		}
		select {
		case a = <-l.next:
			l.keeping.Store(false)
		case <-l.done:
			return
		}
	}
}

// handshakeOver counts a handed-off handshake over, and wakes the accept
// loop if it waits for one (acceptLoop).
func (l *Listener) handshakeOver() {
	if l.pending.Add(-1) == int64(maxPending)-1 {
		l.room.wake()
	}
}

// inflight is the set of sockets whose handshake runs. Once ended (the
// listener closed) it interrupts each, and takes no more.
type inflight struct {
	mu    sync.Mutex
	m     map[*net.TCPConn]struct{}
	ended bool
}

// add puts raw in the set: false if the set has ended.
func (f *inflight) add(raw *net.TCPConn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		return false
	}
	if f.m == nil {
		f.m = make(map[*net.TCPConn]struct{})
	}
	f.m[raw] = struct{}{}
	return true
}

// remove takes raw out of the set: false if the set ended while raw was
// in it (and its I/O was interrupted).
func (f *inflight) remove(raw *net.TCPConn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, raw)
	return !f.ended
}

// setDeadline sets raw's read deadline (both, if both) to t, unless the
// set has ended: then its deadlines stay in the past, where end put them,
// and Close does not wait for t.
func (f *inflight) setDeadline(raw *net.TCPConn, t time.Time, both bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended {
		t = aLongTimeAgo
	}
	if both {
		_ = raw.SetDeadline(t)
	} else {
		_ = raw.SetReadDeadline(t)
	}
}

// end interrupts the I/O of every socket in the set, now and after.
func (f *inflight) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = true
	for raw := range f.m {
		_ = raw.SetDeadline(aLongTimeAgo)
	}
}

// serveConn sniffs raw's first bytes and runs the handshake, then hands the
// result to Accept.
func (l *Listener) serveConn(a *arrival) {
	raw := a.raw
	if !l.running.add(raw) {
		raw.Close() // the listener closed under us
		return
	}
	peer := raw.RemoteAddr() // before the handshake, which may close raw
	c, err := l.handshake(a)
	ended := !l.running.remove(raw)
	if err != nil {
		l.dropped(err, peer)
		return
	}
	l.s.logConn(c, "server")
	if ended {
		c.Close() // the listener closed under us
		return
	}
	select {
	case l.ready <- c:
		if len(l.ready) > 0 { // no Accept has taken it: the one waiting for a first read does
			l.interruptFirst(nil)
		}
	case <-l.done:
		c.Close()
	}
}

// dropped counts and logs a handshake that failed.
func (l *Listener) dropped(err error, peer net.Addr) {
	l.handshakeErrors.Add(1)
	failed(err)
	logLimited(l.s.log, &l.logLimit, slog.LevelWarn, "rsock: handshake dropped",
		slog.String("reason", err.Error()), slog.String("peer", fmt.Sprint(peer)))
}

func (l *Listener) handshake(a *arrival) (*Conn, error) {
	s := l.s
	raw := a.raw
	// The first read takes whatever has arrived: a switching client sends
	// its magic and hello at once, and is answered in one write. Most
	// often they are there already, and the sniff needs no deadline.
	if !a.read {
		a.n, a.err = readArrived(raw, a.buf[:])
	}
	first, n, err := a.buf[:], a.n, a.err
	timed := a.timed
	if err == nil && n < len(handshake.Magic) && handshake.MatchesMagicPrefix(first[:n]) {
		// The sniff may have begun in Accept (awaitFirst).
		if a.sniffBy.IsZero() {
			a.sniffBy = time.Now().Add(s.sniffTimeout())
		}
		testHookSniff.run(nil)
		l.running.setDeadline(raw, a.sniffBy, false)
		timed = true
		n, err = sniffMagic(raw, first, n)
	}
	head := first[:n]
	if n < len(handshake.Magic) || !handshake.MatchesMagicPrefix(head) {
		return l.plainClient(raw, head, err)
	}
	if err != nil {
		raw.Close()
		return nil, err
	}
	// A switching hello that came whole with the magic is answered now:
	// nothing is left to wait for.
	if hello, k := switchHelloIn(head); hello != nil {
		return s.serveSwitch(l, raw, hello, switchFrom{withMagic: true, timed: timed}, head[k:])
	}
	return l.awaitHello(raw, head[len(handshake.Magic):])
}

// testHookSniff runs as a handshaker begins its sniff of a socket's first
// bytes (tests; no connection yet).
var testHookSniff hook

// sniffTimeout bounds the wait for a new connection's first bytes. A
// listener that may hand plain clients over classifies a silent one after
// SniffTimeout; one that allows no TCP gains nothing from that and waits
// the whole handshake for the magic.
func (s *settings) sniffTimeout() time.Duration {
	if !s.fallback {
		return s.handshake
	}
	return s.sniff
}

// plainClient is the Conn of a client whose first bytes, head (read with
// err), are not the magic.
func (l *Listener) plainClient(raw *net.TCPConn, head []byte, err error) (*Conn, error) {
	// A plain client: the bytes it sent (if any) are its own, or it
	// waits for the server to speak first.
	if err != nil && len(head) == 0 && !isTimeout(err) && !errors.Is(err, io.EOF) {
		raw.Close()
		return nil, err
	}
	if !l.s.fallback {
		raw.Close()
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
	l.running.setDeadline(raw, time.Now().Add(s.handshake), true)
	src := l.waiting.add(raw)
	waiting := true
	defer func() {
		if waiting {
			l.waiting.remove(src, raw)
		}
	}()
	// Answer with the magic at once, before reading the hello and
	// preparing anything: the client's ProbeTimeout then measures whether
	// an rsock server is there, not how long this one takes to prepare an
	// endpoint (a burst of dials to a host that registers memory slowly
	// would otherwise be taken for a plain server, and remembered as one).
	// The first frame that follows leaves its magic out (handshake.WriteAfterMagic).
	if _, err := raw.Write([]byte(handshake.Magic)); err != nil {
		raw.Close()
		return nil, err
	}
	hr := bytes.NewReader(rest)
	msg, err := handshake.ReadAfterMagic(io.MultiReader(hr, raw))
	if err != nil {
		if errors.Is(err, handshake.ErrVersion) {
			_ = handshake.WriteAfterMagic(raw, &handshake.Decline{Code: handshake.DeclineVersion, Reason: fmt.Sprintf("server speaks version %d", handshake.Version)})
		}
		raw.Close()
		return nil, err
	}
	l.waiting.remove(src, raw)
	waiting = false
	hello, ok := msg.(*handshake.Hello)
	if !ok {
		raw.Close()
		return nil, fmt.Errorf("rsock: client opened with %v, want hello", msg.Type())
	}
	if hello.Flags&handshake.FlagSwitch == 0 {
		// Version 2 has no other handshake: a hello without the flag is
		// malformed.
		raw.Close()
		return nil, errors.New("rsock: a hello without FlagSwitch")
	}
	// An early client's frames may have come with its hello.
	return s.serveSwitch(l, raw, hello, switchFrom{timed: true}, rest[len(rest)-hr.Len():])
}

// sniffMagic reads into b, whose first n bytes are read already, until it
// holds at least the magic's length, its bytes stop matching the magic, or
// an error; it returns how many bytes b holds (possibly more than the
// magic: whatever had arrived).
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

// switchHelloIn returns the switching Hello that b (from its magic on)
// starts with, and the frame's length; nil if b holds no complete one.
// What follows it is an early client's frames.
func switchHelloIn(b []byte) (*handshake.Hello, int) {
	if len(b) < handshake.HeaderLen {
		return nil, 0 // not whole: no error to build
	}
	h, err := handshake.ParseHeader(b)
	if err != nil || h.Type != handshake.TypeHello {
		return nil, 0
	}
	end := handshake.HeaderLen + int(h.Length)
	if len(b) < end {
		return nil, 0
	}
	m, err := handshake.Decode(h, b[handshake.HeaderLen:end])
	if err != nil {
		return nil, 0
	}
	if hello, ok := m.(*handshake.Hello); ok && hello.Flags&handshake.FlagSwitch != 0 {
		return hello, end
	}
	return nil, 0
}
