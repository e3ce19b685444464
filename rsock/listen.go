package rsock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// readyQueue is how many switched connections wait for Accept.
const readyQueue = 64

// ListenConfig holds options for listening.
type ListenConfig struct {
	// Config tunes the listener and its connections; nil means defaults
	// (and the RSOCK_* environment).
	Config *Config
}

// Listen announces on the local network address, as net.Listen does, and
// returns a Listener whose Accept returns *Conn. The network must be "tcp",
// "tcp4" or "tcp6".
func Listen(network, address string) (net.Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Listen announces on the local network address. ctx bounds only the
// setting up of the listening socket, as in net.ListenConfig.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, &net.OpError{Op: "listen", Net: network, Err: net.UnknownNetworkError(network)}
	}
	s, err := lc.Config.resolve()
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: network, Err: err}
	}
	var nlc net.ListenConfig
	ln, err := nlc.Listen(ctx, network, address)
	if err != nil {
		return nil, err
	}
	hctx, cancel := context.WithCancel(context.Background())
	l := &Listener{
		network:  network,
		ln:       ln.(*net.TCPListener),
		s:        s,
		ready:    make(chan *Conn, readyQueue),
		next:     make(chan *net.TCPConn),
		done:     make(chan struct{}),
		setups:   make(chan struct{}, maxSetups),
		waiting:  waitingSet{max: perSourceWaiting},
		logLimit: limiter{now: time.Now},
		ctx:      hctx,
		cancel:   cancel,
	}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Listener accepts rsock connections, and plain TCP clients on the same
// port. Handshakes run in their own goroutines, off the Accept path, and
// the listener never stops accepting: a slow, silent or hostile client
// never delays the others (admission.go bounds what each costs). Accept
// returns an error only once the listener is closed or its socket failed.
type Listener struct {
	network string
	ln      *net.TCPListener
	s       *settings
	ready   chan *Conn
	done    chan struct{}
	setups  chan struct{}     // places of the handshakes preparing an endpoint
	waiting waitingSet        // handshakes between the magic and a complete hello
	running inflight          // sockets whose handshake runs, for Close to end
	next    chan *net.TCPConn // unbuffered: to the handshaker waiting for one
	keeping atomic.Bool       // a handshaker waits on next
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	closeOnce sync.Once
	errMu     sync.Mutex
	err       error // the socket's fatal error, once the accept loop ended

	handshakeErrors atomic.Uint64
	busy            atomic.Uint64
	logLimit        limiter // of the failed handshakes' records
}

// ListenerStats counts what a Listener has seen.
type ListenerStats struct {
	// HandshakeErrors counts connections dropped during the handshake:
	// malformed or truncated hellos, timeouts, failed setups, and those
	// Evicted.
	HandshakeErrors uint64
	// Evicted counts connections closed because their source address had
	// too many others stalled between the magic and a complete hello.
	Evicted uint64
	// Busy counts hellos declined because too many endpoints were being
	// prepared at once (their clients continue on TCP).
	Busy uint64
}

// Stats returns the listener's counters.
func (l *Listener) Stats() ListenerStats {
	return ListenerStats{HandshakeErrors: l.handshakeErrors.Load(), Evicted: l.waiting.evictions(), Busy: l.busy.Load()}
}

// Accept waits for and returns the next connection: *Conn, on whichever
// transport the handshake agreed, or TCP. It blocks until a connection is
// ready or the listener is closed (an error wrapping net.ErrClosed).
func (l *Listener) Accept() (net.Conn, error) {
	// Prefer a ready connection over reporting the end.
	select {
	case c := <-l.ready:
		return c, nil
	default:
	}
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		l.errMu.Lock()
		err := l.err
		l.errMu.Unlock()
		if err == nil {
			err = net.ErrClosed
		}
		return nil, &net.OpError{Op: "accept", Net: l.network, Addr: l.ln.Addr(), Err: err}
	}
}

// Close stops listening, abandons handshakes in progress and closes the
// connections no Accept has taken. Accept calls blocked on it return.
func (l *Listener) Close() error {
	err := l.shutdown(nil)
	l.wg.Wait()
	for {
		select {
		case c := <-l.ready:
			c.Close()
		default:
			return err
		}
	}
}

func (l *Listener) shutdown(cause error) error {
	err := error(&net.OpError{Op: "close", Net: l.network, Addr: l.ln.Addr(), Err: net.ErrClosed})
	l.closeOnce.Do(func() {
		l.errMu.Lock()
		l.err = cause
		l.errMu.Unlock()
		close(l.done)
		l.cancel()
		l.running.end()
		err = l.ln.Close()
	})
	return err
}

// Addr returns the listener's network address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		raw, err := l.ln.AcceptTCP()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporary(err) {
				// Out of file descriptors and the like: back off, as
				// net/http does, and keep serving.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(delay):
				case <-l.done:
					return
				}
				continue
			}
			l.shutdown(err)
			return
		}
		delay = 0
		select {
		case l.next <- raw: // the goroutine kept from the last handshake
		default:
			l.wg.Add(1)
			go l.handshaker(raw)
		}
	}
}

// handshaker runs raw's handshake, then the next one the accept loop hands
// it while no other waits for one. A goroutine that has run a handshake
// has the stack the next one needs; a fresh one starts with too small a
// stack and grows it, a copy per connection.
func (l *Listener) handshaker(raw *net.TCPConn) {
	defer l.wg.Done()
	for {
		l.serveConn(raw)
		if !l.keeping.CompareAndSwap(false, true) {
			return // another waits
		}
		select {
		case raw = <-l.next:
			l.keeping.Store(false)
		case <-l.done:
			return
		}
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

// end interrupts the I/O of every socket in the set, now and after.
func (f *inflight) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ended = true
	for raw := range f.m {
		_ = raw.SetDeadline(aLongTimeAgo)
	}
}

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// serveConn sniffs raw's first bytes and runs the handshake, then hands the
// result to Accept.
func (l *Listener) serveConn(raw *net.TCPConn) {
	if !l.running.add(raw) {
		raw.Close() // the listener closed under us
		return
	}
	peer := raw.RemoteAddr() // before the handshake, which may close raw
	c, err := l.handshake(raw)
	ended := !l.running.remove(raw)
	if err != nil {
		l.handshakeErrors.Add(1)
		failed(err)
		logLimited(l.s.log, &l.logLimit, slog.LevelWarn, "rsock: handshake dropped",
			slog.String("reason", err.Error()), slog.String("peer", fmt.Sprint(peer)))
		return
	}
	l.s.logConn(c, "server")
	if ended {
		c.Close() // the listener closed under us
		return
	}
	select {
	case l.ready <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *Listener) handshake(raw *net.TCPConn) (*Conn, error) {
	s := l.s
	// The first read takes whatever has arrived: a switching client sends
	// its magic and hello at once, and is answered in one write. Most
	// often they are there already, and the sniff needs no deadline.
	var first [128]byte
	n, err := readArrived(raw, first[:])
	timed := false
	if err == nil && n < len(handshake.Magic) && handshake.MatchesMagicPrefix(first[:n]) {
		// A listener that may hand plain clients over classifies a silent
		// one after SniffTimeout; one that allows no TCP gains nothing
		// from that and waits the whole handshake for the magic.
		sniff := s.sniff
		if !s.fallback {
			sniff = s.handshake
		}
		_ = raw.SetReadDeadline(time.Now().Add(sniff))
		timed = true
		n, err = sniffMagic(raw, first[:], n)
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
	if hello, k := switchHelloIn(head); hello != nil && !s.noSwitch {
		return s.serveSwitch(l, raw, hello, switchFrom{withMagic: true, timed: timed}, head[k:])
	}
	return l.awaitHello(raw, head[len(handshake.Magic):])
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
	_ = raw.SetDeadline(time.Now().Add(s.handshake))
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
	if hello.Flags&handshake.FlagSwitch != 0 && !s.noSwitch {
		// An early client's frames may have come with its hello.
		return s.serveSwitch(l, raw, hello, switchFrom{timed: true}, rest[len(rest)-hr.Len():])
	}
	select {
	case l.setups <- struct{}{}:
		defer func() { <-l.setups }()
	default:
		l.busy.Add(1)
		return s.decline(l.network, raw, handshake.DeclineResources, fmt.Sprintf("server busy: %d handshakes preparing an endpoint", maxSetups))
	}
	ctx, cancel := context.WithTimeout(l.ctx, s.handshake)
	defer cancel()
	return s.serve(ctx, l.network, raw, hello)
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
