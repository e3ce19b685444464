package rsock

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// readyQueue is how many switched connections wait for Accept.
const readyQueue = 64

// ListenConfig holds options for listening.
type ListenConfig struct {
	// Config tunes the listener and its Conns; nil: the defaults (and RSOCK_*).
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
	nlc := net.ListenConfig{KeepAlive: noKeepAlive} // each Conn turns it on (keepAlive)
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
		room:     newNote(),
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
// port. A hello that came whole with its connection is answered at once;
// other handshakes run in goroutines of their own, off the Accept path: a
// slow, silent or hostile client never delays the others. While 64
// connections wait for Accept, or 4096 handshakes run, the listener
// accepts no more, and the kernel's backlog holds the next clients back,
// as for a net.Listener whose application stops calling Accept. Accept
// returns an error only once the listener is closed or its socket failed.
type Listener struct {
	network string
	ln      *net.TCPListener
	s       *settings
	ready   chan *Conn
	setups  chan struct{}   // places of the handshakes preparing an endpoint
	waiting waitingSet      // handshakes between the magic and a complete hello
	ctx     context.Context // cancelled by Close: ends the handshakes' I/O
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	closeOnce sync.Once
	err       error // the socket's fatal error, once the accept loop ended; read after ctx ends

	handedOff atomic.Uint64 // sockets whose handshake began (tests)
	// pending counts the handshakes handed off and not yet over (their
	// connection queued for Accept, or dropped); room wakes the accept
	// loop when it or the ready queue shrinks (acceptLoop).
	pending         atomic.Int64
	room            note
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
	// Busy counts upgrade offers declined because too many endpoints were
	// being prepared at once (their connections stay on TCP until the
	// client offers again).
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
		l.room.wake()
		return c, nil
	default:
	}
	select {
	case c := <-l.ready:
		l.room.wake()
		return c, nil
	case <-l.ctx.Done():
		err := l.err // written before the cancel
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
		l.err = cause
		l.cancel()
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
		// Backpressure (see Listener): nothing is accepted while the
		// ready queue is full or maxPending handshakes run.
		for len(l.ready) == cap(l.ready) || l.pending.Load() >= int64(maxPending) {
			testHookAcceptPaused.run(nil)
			select {
			case <-l.room:
			case <-l.ctx.Done():
				return
			}
		}
		raw, err := l.ln.AcceptTCP()
		if err != nil {
			if l.ctx.Err() != nil {
				return // Close
			}
			if isTimeout(err) || isTemporary(err) {
				// Out of descriptors and the like: back off, as net/http does.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(delay):
				case <-l.ctx.Done():
					return
				}
				continue
			}
			l.shutdown(err)
			return
		}
		delay = 0
		l.handshakeConn(raw)
	}
}

// testHookAcceptPaused runs when the accept loop pauses (backpressure; tests).
var testHookAcceptPaused hook

func isTemporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}
