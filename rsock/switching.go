package rsock

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	pool "github.com/libp2p/go-buffer-pool"

	"github.com/rdmanet/rdmanet/internal/alarm"
	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/stream"
	"github.com/rdmanet/rdmanet/internal/sysdep"
)

// recvQueue bounds the Data queued for Read (docs/protocol.md §9.3): past
// it the reader stops reading the socket. Each frame counts entryCost
// bytes beyond its payload, so that tiny frames cannot pile up entries.
const (
	recvQueue = 256 << 10
	entryCost = 512
)

// swConn is a Conn on the switching protocol (docs/protocol.md §9). One
// reader at a time reads the socket (reading.go); a sender writes it.
type swConn struct {
	c      *Conn
	set    *settings
	raw    *net.TCPConn
	in     inbox         // the socket's frames; used by one reader at a time (reading.go)
	sock   sysdep.Reader // in's source
	client bool
	ln     *Listener // server: whose endpoint setups this counts against
	out    sender
	done   chan struct{} // closed by Close
	rdl    deadline.Deadline
	wdl    deadline.Deadline

	// Send direction: wmu is held by a Write on TCP for its whole call,
	// by CloseWrite and by the switch, and guards wring.
	wmu   sync.Mutex
	wring *stream.Conn // the ring our sending moved to, or nil

	// The fast paths, taken without wmu, rmu or mu (docs/protocol.md §4.2).
	// wfast is wring, published as wmu is released, so that a Write that
	// switched between its chunks ends before another goes to the ring; rfast
	// is published by a Read holding rmu once the peer switched and its Data
	// was read. A failover clears both.
	wfast, rfast atomic.Pointer[stream.Conn]

	// rmu is held by a Read for its whole call: one waits at a time.
	rmu   sync.Mutex
	rnote note // wakes the waiting Read
	wnote note // wakes a Write waiting for a failover (failover.go)
	space note // wakes the reader waiting for queue room

	transports []handshake.Transport    // client: what the server takes, in our order (set under mu while pending)
	peer       peerRing                 // what the peer said of rings (set as transports)
	upStarted  atomic.Bool              // the client's upgrade has begun (kick)
	parked     atomic.Bool              // the reader waits for the application to make room (tests)
	upTimer    interface{ Stop() bool } // the client's upgrade policy; the server's reader (start), then ringDue
	moved      atomic.Uint64            // bytes read and written on TCP, for the policy

	ringPaths []PathBytes // what the rings detached so far carried; guarded by mu

	mu       sync.Mutex // guards what follows
	rq       [][]byte   // Data payloads not yet read (pooled); rq[0] from roff
	roff     int
	rqLen    int      // bytes in rq
	rqCost   int      // rqLen plus entryCost per entry: what recvQueue bounds
	rcvd     uint64   // Data bytes received: the peer's stream cursor on TCP
	recv     recvPath // where the peer's bytes come from
	send     sendPath // where our bytes go
	gone     signal   // the peer's goodbye: writes fail, and an upgrade waiting for the peer's answer ends
	err      error    // the connection failed; set once
	rclosed  bool     // CloseRead
	closed   bool     // Close
	ring     *stream.Conn
	ringName string                 // ring's transport
	up       upPhase                // where the upgrade in progress is
	upDone   chan struct{}          // server: closed when the upgrade in progress ends
	answers  chan handshake.Message // the peer's Accept or Decline (client), Confirm (server) (upgradingLocked makes it)
	rdlT     time.Time              // the read deadline's time, for the socket (socketDeadlineLocked)
	linger   *int
	log      []SwitchEvent
	settled  signal // no direction will move any more (settleLocked), or an upgrade ended without a ring
	goodbye  sync.Once
	pending  *earlyHello // client: the answer to our early hello is still to come

	reader   readerState // who reads the socket (reading.go)
	socketDL time.Time   // the socket's read deadline (socketDeadlineLocked)

	// Failover (failover.go), guarded by mu.
	switchAt    uint64        // the stream cursor of our Switch (sendRing)
	moving      chan struct{} // a failover runs; closed when it ends
	awaitResume bool          // we sent Resume and the peer's has not come
	owe         *owed         // sendOwed: our ring's bytes to send again once the peer's Resume comes
	peerFinal   uint64        // the stream cursor of the peer's goodbye while on the ring
	setbacks    int           // failovers, and upgrades a busy server declined: the next upgrade's backoff
	offers      int           // server: the client's upgrade offers so far (maxOffers)
}

// recvPath is where the peer's bytes come from (§9.5, §9.10).
type recvPath uint8

const (
	recvTCP recvPath = iota // Data frames
	// recvStale: Data frames, after our failover; the peer's Switch sent
	// before it learnt of the failover may still come, and is ignored.
	recvStale
	recvRing // the peer's Switch came at rcvd: its bytes are in the ring
	recvEnd  // the peer's Fin, or its goodbye while sending on TCP
)

// sendPath is where our bytes go.
type sendPath uint8

const (
	sendTCP  sendPath = iota // Data frames
	sendRing                 // our Switch went at switchAt: the ring (wring)
	// sendOwed: a failover took the ring; owe's bytes go again as Data,
	// from where the peer's Resume says, before any other.
	sendOwed
	sendFin // CloseWrite on TCP: our Fin went
)

// upPhase is where a connection's upgrade is (docs/protocol.md §9.4).
type upPhase uint8

const (
	upIdle upPhase = iota // no upgrade runs
	// upOffered: the Offer was sent (client) or read (server), its answer
	// not yet read; the client sends no Data meanwhile (sender.offer).
	upOffered
	// upAnswered: the answer was read; the upgrade finishes and ends.
	upAnswered
	// upAgreed: a ring was agreed (the client's started, or the server read
	// Confirm{0}): the peer may switch; once the upgrade ends, ring says so.
	upAgreed
)

// SwitchEvent is one move of a direction of a connection between TCP and
// a ring, or an upgrade that did not happen (From == To).
type SwitchEvent struct {
	At        time.Time
	Direction string // "send" or "receive"; "" for an upgrade that failed
	From, To  string // transports
	Cause     string
}

func (w *swConn) init(c *Conn, s *settings, raw *net.TCPConn, client bool) {
	w.c, w.set, w.raw, w.client = c, s, raw, client
	w.done = make(chan struct{})
	w.rnote, w.wnote, w.space = newNote(), newNote(), newNote()
	rc, err := raw.SyscallConn()
	w.out.init(raw, rc)
	w.sock.Init(rc, err)
	w.in.src = &w.sock
}

// start arms the connection's first timed step (§9.8), at most helloHold
// from now: the client's upgrade policy, or the server's reader. That step,
// or start when there is none, turns keep-alive on (Conn.keepAlive).
func (w *swConn) start(transports []handshake.Transport) {
	w.transports = transports
	if len(transports) == 0 && w.pending == nil {
		w.c.keepAlive() // no timed step
		return          // no upgrade: only the application's reads read the socket
	}
	after, f := w.set.upgradeAfter, w.kick
	switch {
	case w.client && after < 0:
		w.kick() // at once, and Dial waits for it (dialWaits)
		return
	case !w.client:
		after, f = serverReaderAfter, w.serverReaderDue
	case after > helloHold:
		// At helloHold a held hello goes out; the policy's time runs on.
		rest := after - helloHold
		after, f = helloHold, func() {
			w.c.keepAlive()
			w.out.flush()
			w.mu.Lock()
			if !w.closed {
				w.upTimer = schedule(rest, w.kick)
			}
			w.mu.Unlock()
		}
	}
	w.mu.Lock()
	w.upTimer = schedule(after, f)
	w.mu.Unlock()
}

// schedule runs f once d has passed: off clock, or, below ownTimerBelow,
// on a runtime timer of its own (UpgradeAfter 1ns means at once).
func schedule(d time.Duration, f func()) interface{ Stop() bool } {
	if d < ownTimerBelow {
		return time.AfterFunc(d, f)
	}
	return clock.Set(d, f)
}

// clock runs the first timed step of every switching connection (start) on
// one runtime timer for the process, not one per connection (which a short
// connection would arm and stop for nothing), up to clockPeriod late (§9.8).
var clock = alarm.New(clockPeriod)

const clockPeriod = 10 * time.Millisecond

// ownTimerBelow is the shortest step that clock runs.
const ownTimerBelow = time.Millisecond

// helloHold bounds how long an early dial holds its hello (§9.11): a
// server takes a client silent for SniffTimeout for a plain one.
var helloHold = DefaultUpgradeAfter

// kick turns keep-alive on and starts a client's upgrade, once. Before
// an early hello's answer, which names the transports, it only sends the
// hello and has the answer read; the upgrade begins on it (answered).
func (w *swConn) kick() {
	w.c.keepAlive()
	w.out.flush()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending != nil {
		w.pending.kicked = true
		w.needReaderLocked()
	} else if len(w.transports) > 0 && w.upStarted.CompareAndSwap(false, true) {
		w.needReaderLocked() // the server's answers come whether or not the application reads
		go w.clientUpgrade()
	}
}

// serverReaderDue is the server's reader timer (§9.8): it flushes a held
// answer, turns keep-alive on, starts readLoop and, without "tcp", ringDue.
func (w *swConn) serverReaderDue() {
	w.c.keepAlive()
	w.out.flush()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.needReaderLocked()
	if !w.set.fallback && !w.closed {
		w.upTimer = time.AfterFunc(w.set.handshake-serverReaderAfter, w.ringDue)
	}
}

// ringDue resets a server's connection that may not run on TCP if it has
// neither a ring nor an upgrade running (§9.1).
func (w *swConn) ringDue() {
	w.mu.Lock()
	due := w.ring == nil && w.up == upIdle
	w.mu.Unlock()
	if due {
		w.fail(&stream.ResetError{Reason: fmt.Sprintf("no ring within %v and TCP is not allowed here (%s)", w.set.handshake, w.set.transportList()), Err: ErrNoTransport})
	}
}

// counted counts n bytes moved on TCP in total and toward a client's
// UpgradeBytes.
func (w *swConn) counted(total *atomic.Uint64, n int) {
	total.Add(uint64(n))
	if w.client && n > 0 && w.moved.Add(uint64(n)) >= uint64(w.set.upgradeBytes) && !w.upStarted.Load() {
		w.kick()
	}
}

func (w *swConn) Read(b []byte) (int, error) {
	if r := w.rfast.Load(); r != nil {
		n, err := r.Read(b)
		if n > 0 || err == nil {
			return n, nil
		}
		if !moved(err) {
			return 0, err
		}
	}
	w.rmu.Lock()
	defer w.rmu.Unlock()
	for {
		w.mu.Lock()
		switch {
		case w.closed:
			w.mu.Unlock()
			return 0, net.ErrClosed
		case w.rqLen > 0 && !w.rclosed:
			n := w.takeLocked(b)
			w.mu.Unlock()
			w.counted(&w.c.bytesRead, n)
			return n, nil
		case w.rclosed || w.recv == recvEnd:
			w.mu.Unlock()
			return 0, io.EOF
		case w.recv == recvRing:
			r := w.ring
			if w.moving == nil {
				w.rfast.Store(r)
			}
			w.mu.Unlock()
			n, err := r.Read(b)
			if n > 0 || err == nil {
				return n, nil
			}
			if err = w.offRing(r, err, &w.rdl, w.rnote); err != nil {
				return 0, err
			}
			continue
		case w.err != nil:
			err := w.err
			w.mu.Unlock()
			return 0, err
		}
		w.mu.Unlock()
		if len(b) == 0 {
			return 0, nil
		}
		if w.rdl.Expired() {
			return 0, os.ErrDeadlineExceeded
		}
		if w.client {
			w.out.flush() // a held early hello: the server may wait for it to speak first
		}
		if n, took, err := w.readSocket(b); took {
			if n > 0 {
				w.counted(&w.c.bytesRead, n)
				return n, nil
			}
			if err != nil {
				return 0, err
			}
			continue // a frame changed the state, or the read was ended for a reason
		}
		w.awaitDL(w.rnote, &w.rdl)
	}
}

func (w *swConn) takeLocked(b []byte) int {
	n := 0
	for n < len(b) && len(w.rq) > 0 {
		k := copy(b[n:], w.rq[0][w.roff:])
		n += k
		w.roff += k
		if w.roff == len(w.rq[0]) {
			w.rqCost -= len(w.rq[0]) + entryCost
			pool.Put(w.rq[0])
			w.rq[0] = nil
			w.rq = w.rq[1:]
			w.roff = 0
		}
	}
	w.rqLen -= n
	if w.rqCost < recvQueue {
		w.space.wake()
	}
	return n
}

// dropQueueLocked frees the queued Data (Close, CloseRead).
func (w *swConn) dropQueueLocked() {
	for _, b := range w.rq {
		pool.Put(b)
	}
	w.rq, w.roff, w.rqLen, w.rqCost = nil, 0, 0, 0
	w.space.wake()
}

// Write implements net.Conn.Write for a switching connection. On TCP it
// returns once b is queued (sender); it moves to the ring between chunks.
func (w *swConn) Write(b []byte) (int, error) {
	n := 0
	if r := w.wfast.Load(); r != nil {
		k, err := r.Write(b)
		if err == nil || !moved(err) {
			return k, err
		}
		n = k
	}
	w.wmu.Lock()
	defer w.wunlock()
	for {
		w.switchLocked()
		if r := w.wring; r != nil {
			k, err := r.Write(b[n:])
			n += k
			if err == nil {
				return n, nil
			}
			if err = w.offRing(r, err, &w.wdl, w.wnote); err != nil {
				return n, err
			}
			w.wring = nil
		}
		// Bytes a failover owes go first; a Write whose bytes the ring
		// took returns once they went again.
		if err := w.resendLocked(&w.wdl); err != nil {
			return n, err
		}
		if n == len(b) && n > 0 {
			return n, nil // written, whatever happened since
		}
		if err := w.writeErr(); err != nil || n == len(b) {
			return n, err // (an empty Write reports the connection's state)
		}
		if w.wdl.Expired() {
			return n, os.ErrDeadlineExceeded
		}
		// No new Data while a failover runs: the peer may be waiting for
		// our Resume behind it (resumeLag).
		w.awaitMove()
		// A chunk at a time, so that a long Write moves to a ready ring.
		end := min(len(b), n+handshake.MaxData)
		k, err := w.out.data(b[n:end], &w.wdl, w.done)
		n += k
		w.counted(&w.c.bytesWritten, k)
		if n == len(b) && k > 0 {
			w.c.writes.Add(1)
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) && !w.isClosed() {
				// The sender finished: a failure, or the ring's goodbye.
				if err = w.writeErr(); err == nil {
					err = &stream.ResetError{Reason: "the bootstrap connection was closed for a failure"}
				}
			}
			return n, err
		}
	}
}

// moved reports whether err, from a ring's call, may be a failover's
// (ErrMoving, then net.ErrClosed once detached): the slow path knows.
func moved(err error) bool {
	return errors.Is(err, stream.ErrMoving) || errors.Is(err, net.ErrClosed)
}

// wunlock releases wmu, publishing wring for the fast path.
func (w *swConn) wunlock() {
	w.wfast.Store(w.wring)
	w.wmu.Unlock()
}

func (w *swConn) writeErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.closed:
		return net.ErrClosed
	case w.err != nil:
		return w.err
	case w.send == sendFin || w.gone.set:
		return stream.ErrBrokenPipe
	}
	return nil
}

func (w *swConn) isClosed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.closed
}

// switchLocked moves the sending to the ring if it is ready: Switch goes
// behind the last Data frame, and later bytes into the ring. wmu is held.
func (w *swConn) switchLocked() {
	if w.wring != nil {
		return
	}
	// Under mu, so that a failover sees the Switch and sendRing together.
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.ring
	if r == nil || w.send != sendTCP || w.closed || w.err != nil || w.gone.set || w.moving != nil {
		return // (what a failover owes goes first, on TCP)
	}
	x, err := w.out.sendAt(func(x uint64) handshake.Message { return &handshake.Switch{Cursor: x} }, false)
	if err != nil {
		return // the socket failed: the Write reports it
	}
	w.wring = r
	w.switchAt = x
	w.send = sendRing
	w.noteLocked("send", "tcp", w.c.label.Load().transport, fmt.Sprintf("ring ready at stream byte %d", x))
	w.settleLocked()
}

// settleLocked fires settled once nothing will move any more (§9.1).
func (w *swConn) settleLocked() {
	send := w.send == sendRing || w.send == sendFin
	recv := w.recv == recvRing || w.recv == recvEnd
	// The peer's end settles the connection once no upgrade runs (one
	// that runs ends on it, and says how).
	gone := w.gone.set && w.up == upIdle
	if w.closed || w.err != nil || gone || (send && recv) {
		w.settled.fire()
	}
}

// upgradingLocked marks an upgrade begun and returns its upDone; it makes
// answers and gone's channel once (a connection that never upgrades has none).
func (w *swConn) upgradingLocked() chan struct{} {
	w.up = upOffered
	if w.answers == nil {
		w.answers = make(chan handshake.Message, 1)
	}
	w.gone.channel()
	w.upDone = make(chan struct{})
	return w.upDone
}

func (w *swConn) settledChan() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.settled.channel()
}

// await waits for ch, or Close: false after Close.
func (w *swConn) await(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-w.done:
		return false
	}
}

// awaitDL waits for ch, the deadline dl, or Close.
func (w *swConn) awaitDL(ch <-chan struct{}, dl *deadline.Deadline) {
	select {
	case <-ch:
	case <-dl.Wait():
	case <-w.done:
	}
}

// signal is a one-time event, guarded by its owner's lock. Its channel is
// made only for a caller that waits, and never replaced: a goroutine that
// made it, or saw under the lock that it exists, may read ch after.
type signal struct {
	set bool
	ch  chan struct{}
}

func (s *signal) fire() {
	if !s.set {
		s.set = true
		if s.ch != nil {
			close(s.ch)
		}
	}
}

func (s *signal) channel() chan struct{} {
	if s.ch == nil {
		s.ch = make(chan struct{})
		if s.set {
			close(s.ch)
		}
	}
	return s.ch
}

func (w *swConn) noteLocked(dir, from, to, cause string) {
	if len(w.log) < maxSwitchLog {
		w.log = append(w.log, SwitchEvent{At: time.Now(), Direction: dir, From: from, To: to, Cause: cause})
	}
}

const maxSwitchLog = 16

// CloseWrite ends the sending: a Fin on TCP, the ring's FIN on the ring.
func (w *swConn) CloseWrite() error {
	w.wmu.Lock()
	defer w.wunlock()
	if r := w.wring; r != nil {
		err := r.CloseWrite()
		if err == nil {
			return nil
		}
		if err = w.offRing(r, err, &w.wdl, w.wnote); err != nil {
			return err
		}
		w.wring = nil
	}
	if w.isClosed() {
		return net.ErrClosed
	}
	if err := w.resendLocked(&w.wdl); err != nil {
		return err
	}
	w.mu.Lock()
	again, gone := w.send == sendFin, w.gone.set
	w.send = sendFin
	w.settleLocked()
	w.mu.Unlock()
	if again || gone {
		return nil // (gone: the peer said goodbye, it reads nothing more)
	}
	_, err := w.out.sendAt(func(x uint64) handshake.Message { return &handshake.Fin{Cursor: x} }, false)
	return err
}

// CloseRead ends the reading: Reads return io.EOF, and Data is dropped.
func (w *swConn) CloseRead() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return net.ErrClosed
	}
	w.rclosed = true
	w.dropQueueLocked()
	w.needReaderLocked() // Data that comes is dropped, and control frames acted on
	r := w.ring
	w.mu.Unlock()
	w.rnote.wake()
	if r != nil {
		return r.CloseRead()
	}
	return nil
}

// Close closes the connection: the ring's orderly close if there is one,
// then the goodbye on the bootstrap, which carries the stream cursor.
func (w *swConn) Close() error {
	var resent bool
	for {
		if w.isClosed() {
			return net.ErrClosed
		}
		resent = w.resendDone(closeAckTimeout)
		w.mu.Lock()
		r := w.ring
		switch {
		case w.closed:
			w.mu.Unlock()
			return net.ErrClosed
		case w.moving != nil:
			w.mu.Unlock()
			w.awaitMove()
			continue
		case r != nil && w.err == nil && r.Moving():
			// Its failover has not started yet: run it, so that the
			// stream ends on TCP in order, not with the ring's abort.
			w.mu.Unlock()
			_ = w.failover("the ring failed")
			continue
		}
		break
	}
	w.closed = true
	close(w.done)
	w.dropQueueLocked()
	w.settleLocked()
	if w.upTimer != nil {
		w.upTimer.Stop()
	}
	r := w.ring
	failed := w.err
	linger := -1 // SetLinger's, if called: no later setLinger (closed)
	if w.linger != nil {
		linger = *w.linger
	}
	ending := r == nil && w.claimReaderLocked()
	w.mu.Unlock()
	if r != nil {
		return r.Close(linger)
	}
	// Without a ring the socket's end is the goodbye, but for an abort.
	var g *handshake.Goodbye
	switch {
	case failed != nil:
		g = &handshake.Goodbye{Abort: true, Reason: handshake.SanitizeReason(failed.Error())}
	case !resent:
		g = &handshake.Goodbye{Abort: true, Reason: "closed before the failover sent its bytes again"}
	case linger == 0:
		g = &handshake.Goodbye{Abort: true, Reason: "closed with linger 0 (abort)"}
	}
	if ending {
		w.closeReading(g == nil)
	}
	w.Goodbye(g)
	return nil
}

// Goodbye (stream.Owner) queues g, if not nil, behind the frames queued
// before it, and ends the bootstrap once they are written, at most
// closeAckTimeout later; once, without blocking. The channel returned is
// closed with the socket, at the peer's end or lingerTimeout later. An
// orderly g's FinalProd, a ring's producer cursor, becomes a stream cursor.
// A server that refused our early hello gets no frame: it does not speak rsock.
func (w *swConn) Goodbye(g *handshake.Goodbye) <-chan struct{} {
	w.goodbye.Do(func() {
		w.mu.Lock()
		refused := errors.Is(w.err, ErrEarlyRefused)
		w.mu.Unlock()
		if g != nil && !refused {
			gb := *g
			_, _ = w.out.sendAt(func(x uint64) handshake.Message {
				if !gb.Abort {
					gb.FinalProd += x // no Data can follow: last
				}
				return &gb
			}, true)
		}
		w.out.finish(closeAckTimeout)
	})
	return w.out.ended
}

// closeAckTimeout bounds the writing of the frames queued at Close (§9.6).
const closeAckTimeout = time.Second

// setDeadline sets the read and/or write deadline, here and on the ring.
func (w *swConn) setDeadline(t time.Time, read, write bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return net.ErrClosed
	}
	if read {
		w.rdlT = t
		w.rdl.Set(t)
		if w.reader == readerApp {
			w.socketDeadlineLocked(t)
		}
	}
	if write {
		w.wdl.Set(t)
		if w.owe != nil && w.owe.known {
			go w.resendBg() // it may have stopped at the old deadline
		}
	}
	w.rnote.wake()
	return nil
}

// setLinger applies SetLinger to the socket, or, with a ring, to the
// ring's Close (Close reads w.linger).
func (w *swConn) setLinger(sec int) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return net.ErrClosed
	}
	w.linger = &sec
	if w.ring != nil {
		return nil
	}
	return w.raw.SetLinger(sec)
}

// setRing installs the started ring r, relabels the connection and moves
// our sending to r; r is closed if the connection closed or failed meanwhile.
func (w *swConn) setRing(r *stream.Conn, name string) {
	w.mu.Lock()
	if w.closed || w.err != nil {
		w.mu.Unlock()
		dropRing(r)
		return
	}
	if w.rclosed {
		_ = r.CloseRead()
	}
	gone := w.gone.set
	w.ring, w.ringName = r, name
	// Counted before a call can move bytes on r (lock order: mu, then the
	// registry's shard lock).
	w.c.relabel(&label{transport: name, code: CodeAgreed, reason: name + " agreed (upgraded from TCP)"})
	w.mu.Unlock()
	testHookRingSet.run(w)
	if r.Moving() {
		// It failed before it was installed (Failed).
		go func() { _ = w.failover("the ring failed as it started") }()
	}
	if gone {
		// The peer ended first: it sent nothing on the ring.
		r.PeerGoodbye(&handshake.Goodbye{})
	}
	w.rnote.wake()
	// Not here: a Write in progress holds wmu until the ring has room,
	// which may take the peer's Switch, which the reader handles only
	// once this upgrade has ended (peerSwitched).
	go func() {
		w.wmu.Lock()
		w.switchLocked()
		w.wunlock()
	}()
}

// testHookRingSet runs as soon as calls can use the ring setRing installed (tests).
var testHookRingSet hook

// dropRing ends a started ring that was never installed: nothing was
// sent on it, so there is no final message to wait for, and it sends no
// goodbye of its own, which could overtake the connection's.
func dropRing(r *stream.Conn) { _, _ = r.Detach() }

// fail resets the connection: calls return err, and the peer is told.
func (w *swConn) fail(err error) {
	w.mu.Lock()
	if w.err != nil || w.closed {
		w.mu.Unlock()
		return
	}
	var re *stream.ResetError
	if !errors.As(err, &re) {
		re = &stream.ResetError{Reason: err.Error()}
		err = re
	}
	w.err = err
	w.settleLocked()
	w.needReaderLocked() // a Read reading the socket returns err; readLoop reads to the end
	r := w.ring
	w.mu.Unlock()
	w.rnote.wake()
	w.wnote.wake()
	if r != nil {
		r.Fail(err) // its calls return err too (the fast paths)
	}
	w.set.logReset(w.c, err)
	w.Goodbye(&handshake.Goodbye{Abort: true, Reason: handshake.SanitizeReason(re.Why())})
}

// Failed (stream.Owner) is the ring's failure: a ring that moves fails
// over to TCP, in the background (one not yet installed does once it is:
// setRing), and a reset fails the connection.
func (w *swConn) Failed(r *stream.Conn, err error) {
	if !errors.Is(err, stream.ErrMoving) {
		w.fail(err)
		return
	}
	w.mu.Lock()
	installed := w.ring == r
	w.mu.Unlock()
	if installed {
		go func() { _ = w.failover("the ring failed: " + stream.Why(err)) }()
	}
}

// Test hooks: run where a race with a failover is widest.
var testHookGoodbye, testHookDetached, testHookServeStart hook

// testServeExchangeErr, if set, is the error of the server's side exchange
// when the provider's succeeded (tests: a start that fails).
var testServeExchangeErr atomic.Pointer[error]

// hook is a function tests set to run at a point of the code.
type hook struct{ f atomic.Pointer[func(*swConn)] }

func (h *hook) set(f func(*swConn)) { h.f.Store(&f) }

func (h *hook) run(w *swConn) {
	if f := h.f.Load(); f != nil && *f != nil {
		(*f)(w)
	}
}

// info fills in ci's switch log and detached rings' bytes and returns the
// ring and its transport, in one snapshot under mu: ring bytes count once.
func (w *swConn) info(ci *ConnInfo) (*stream.Conn, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ci.Switches = append([]SwitchEvent(nil), w.log...)
	ci.Paths = append(ci.Paths, w.ringPaths...)
	ci.Writes = w.c.writes.Load()
	return w.ring, w.ringName
}

// writeTo is Conn.WriteTo: Data through a buffer while on TCP, then the
// ring's CopyTo, which hands w the bytes where they lie.
func (w *swConn) writeTo(dst io.Writer) (n int64, rerr, werr error) {
	buf := pool.Get(32 << 10)
	defer pool.Put(buf)
	for {
		w.mu.Lock()
		r := w.ring
		onRing := w.recv == recvRing && w.rqLen == 0 && !w.rclosed && !w.closed
		w.mu.Unlock()
		if onRing {
			k, rerr, werr := r.CopyTo(dst)
			n += k
			if werr != nil || rerr == nil {
				return n, rerr, werr
			}
			if rerr = w.offRing(r, rerr, &w.rdl, w.rnote); rerr != nil {
				return n, rerr, nil
			}
			continue
		}
		k, err := w.Read(buf)
		if k > 0 {
			m, err := dst.Write(buf[:k])
			n += int64(m)
			if err != nil {
				return n, nil, err
			}
		}
		if err == io.EOF {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}
