package stream

import (
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Conn is a byte stream over a connected queue pair, with the bootstrap TCP
// connection kept open beside it for orderly close, abort and peer-death
// detection.
//
// Blocking: Read blocks until data, EOF, an error, Close or the read
// deadline; Write blocks until every byte is in the peer's ring (not until
// the peer read it), an error, Close or the write deadline. A blocked call
// may first poll for up to BusyPoll (adaptively, see spin.go), then parks
// its goroutine (no OS thread).
//
// Concurrency: all methods are safe for concurrent use. Concurrent Writes
// do not interleave their bytes; concurrent Reads each get a contiguous
// piece of the stream.
type Conn struct {
	ep   *Endpoint
	boot net.Conn
	peer Ring
	opts Options

	direct []byte   // the peer's ring mapped here (shm), or nil
	stage  verbs.MR // staging for WRITEs when direct is nil
	inline int      // QP's MaxInline

	rdMu, wrMu     sync.Mutex   // serialise Reads and Writes
	rdLease                     // bytes lent to Reads between calls (read.go); guarded by rdMu
	rdStop         atomic.Bool  // Close or CloseRead was called: no more Reads from a lease; set under mu
	spinners       atomic.Int32 // callers busy-polling (the CQ is disarmed meanwhile); changed under mu
	rdSpin, wrSpin spinCtl      // each direction's adaptive busy-poll window

	// A blocked call may wait on the completion queue itself (waitDirect)
	// when the queue has a second notification (verbs.DirectWaiter): the
	// notification then wakes it, not the event loop that would wake it.
	dw         verbs.DirectWaiter // nil if the queue has none
	peek       verbs.Peeker       // nil if the queue cannot tell cheaply whether a poll would find anything
	disarmable bool               // the queue is a verbs.Disarmer
	dirOwner   atomic.Int32       // dirRead or dirWrite while that call waits on the queue, else 0; changed under mu

	mu        sync.Mutex // protects everything below
	st        *ring.State
	err       error // terminal transport error; set once
	suspect   error // a transport failure awaiting its verdict (suspectLocked)
	closed    bool  // Close was called
	rdClosed  bool  // CloseRead was called
	lent      bool  // readable bytes are lent outside mu (a lease, a CopyTo piece): CloseRead leaves them to their holder
	wrClosed  bool  // CloseWrite was called
	peerGone  bool  // the peer said goodbye (orderly close) on the bootstrap
	sqPosted  uint64
	sqDone    uint64
	lastSig   uint64
	closeSig  uint64      // ID of the signaled final message, 0 if none
	polling   int32       // the direction whose direct waiter is in progressLocked, else 0
	sticky    bool        // the direct notification stays armed with no direct waiter (sticky.go)
	stuckAt   int64       // when sticky was last set (nanotime)
	inSweep   atomic.Bool // c is in the sweeper's set (set under mu)
	msgBuf    [ring.MsgLen]byte
	wr        verbs.SendWR // reused for every post (under mu): no allocation per post
	wcs       [32]verbs.Completion
	calls     sync.WaitGroup // in-flight Read, Write and friends
	loops     sync.WaitGroup // the event loop, the bootstrap watcher, abort notices
	done      chan struct{}  // closed by Close
	rdWake    chan struct{}
	wrWake    chan struct{}
	closeWake chan struct{}

	rdDeadline, wrDeadline *deadline

	stats Stats
}

// Stats are counters a user can read while the Conn runs.
type Stats struct {
	BytesRead    atomic.Uint64
	BytesWritten atomic.Uint64
	Writes       atomic.Uint64 // Write calls that moved data
	MsgsSent     atomic.Uint64 // state messages posted
	MsgsRecv     atomic.Uint64 // state messages received
	CreditStalls atomic.Uint64 // times a writer waited for ring space or credits
	Wakeups      atomic.Uint64 // times a blocked call parked and was woken
}

// Start turns a connected Endpoint into a Conn. peer is the peer's ring from
// the handshake; boot is the bootstrap connection, which the Conn now owns.
func (e *Endpoint) Start(peer Ring, boot net.Conn) (*Conn, error) {
	if err := validatePeer(peer); err != nil {
		return nil, err
	}
	if e.qp.MaxInline() < ring.MsgLen {
		return nil, fmt.Errorf("stream: queue pair carries %d bytes inline, state messages need %d", e.qp.MaxInline(), ring.MsgLen)
	}
	st, err := ring.New(ring.Params{
		LocalSize: uint64(e.opts.RingSize), LocalCredits: uint64(e.opts.Credits),
		PeerSize: peer.Size, PeerCredits: peer.Credits,
	})
	if err != nil {
		return nil, err
	}
	c := &Conn{
		ep: e, boot: boot, peer: peer, opts: e.opts, st: st,
		inline:    e.qp.MaxInline(),
		done:      make(chan struct{}),
		rdWake:    make(chan struct{}, 1),
		wrWake:    make(chan struct{}, 1),
		closeWake: make(chan struct{}, 1),
	}
	c.dw, _ = e.cq.(verbs.DirectWaiter)
	c.peek, _ = e.cq.(verbs.Peeker)
	_, c.disarmable = e.cq.(verbs.Disarmer)
	c.rdDeadline = newDeadline(func() { c.wakeDirect(dirRead) })
	c.wrDeadline = newDeadline(func() { c.wakeDirect(dirWrite) })
	if m, ok := e.qp.(verbs.RemoteMapper); ok {
		if c.direct, err = m.MapRemote(peer.Addr, peer.RKey, int(peer.Size)); err != nil {
			return nil, err
		}
	} else if c.stage, err = e.dev.AllocMR(int(peer.Size), verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	e.owned = false
	c.loops.Add(2)
	go c.eventLoop()
	go c.watchBootstrap()
	return c, nil
}

// Provider is the name of the verbs provider carrying the Conn.
func (c *Conn) Provider() string { return c.ep.Provider() }

// Stats returns the Conn's live counters.
func (c *Conn) Stats() *Stats { return &c.stats }

// LocalAddr and RemoteAddr are the bootstrap connection's addresses.
func (c *Conn) LocalAddr() net.Addr  { return c.boot.LocalAddr() }
func (c *Conn) RemoteAddr() net.Addr { return c.boot.RemoteAddr() }

// enter registers an in-flight call; it fails once Close has started.
func (c *Conn) enter() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.calls.Add(1)
	return nil
}

// Write writes all of b unless an error stops it first; it returns how many
// bytes were placed in the peer's ring. The bytes are copied before Write
// returns, so b may be reused at once. A deadline that passes mid-way
// leaves a whole prefix written and reports its length.
func (c *Conn) Write(b []byte) (int, error) {
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.calls.Done()
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	written := 0
	stalled := false
	for {
		// A write that placed every byte succeeded, whatever happened since
		// (the peer closing, a concurrent Close or CloseWrite, the deadline).
		if written == len(b) && written > 0 {
			c.stats.Writes.Add(1)
			return written, nil
		}
		c.mu.Lock()
		drain(c.wrWake) // as in Read
		if err := c.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return written, err
		}
		if len(b) == 0 {
			c.mu.Unlock()
			return 0, nil
		}
		space := c.st.Space()
		// A data chunk needs: ring space, a data credit, and send-queue room
		// for two WRITEs and the SEND (plus two slots kept for control).
		if space == 0 || !c.st.CanSendData() || c.sqFreeLocked() < 5 {
			if c.st.CanSendControl() && c.sqFreeLocked() > 0 && c.st.Block() {
				c.sendLocked(ring.FlagBlocked)
			}
			c.mu.Unlock()
			if !stalled {
				stalled = true
				c.stats.CreditStalls.Add(1)
			}
			if err := c.wait(dirWrite); err != nil {
				return written, err
			}
			continue
		}
		stalled = false
		// At most a quarter of the peer's ring at a time, announced before
		// the next: the peer can read the first piece while we copy the
		// next one.
		n := min(uint64(len(b)-written), space, max(c.peer.Size/4, 1))
		s1, s2 := c.st.WriteSegments(n)
		chunk := b[written : written+int(n)]
		c.mu.Unlock()
		// Copy outside the lock: only this writer moves the producer cursor,
		// and the peer has released this space.
		if c.direct != nil {
			copy(c.direct[s1.Off:s1.Off+s1.Len], chunk)
			copy(c.direct[s2.Off:s2.Off+s2.Len], chunk[s1.Len:])
		} else if n > uint64(c.inline) {
			st := c.stage.Bytes()
			copy(st[s1.Off:s1.Off+s1.Len], chunk)
			copy(st[s2.Off:s2.Off+s2.Len], chunk[s1.Len:])
		}
		c.mu.Lock()
		if err := c.writeErrLocked(); err != nil {
			c.mu.Unlock()
			return written, err
		}
		if err := c.postWritesLocked(chunk, s1, s2); err != nil {
			// The bytes did not go; whether that is the peer's orderly
			// close or a failure is decided shortly (suspectLocked).
			c.suspectLocked(reset("posting a write", err))
			c.mu.Unlock()
			if err := c.wait(dirWrite); err != nil {
				return written, err
			}
			continue
		}
		if err := c.st.Wrote(n); err != nil {
			c.failLocked(err)
			c.mu.Unlock()
			return written, c.err
		}
		written += int(n)
		c.stats.BytesWritten.Add(n)
		if c.st.CanSendData() {
			c.sendLocked(0)
		}
		c.mu.Unlock()
	}
}

// writeErrLocked says why no more can be written, or nil.
func (c *Conn) writeErrLocked() error {
	switch {
	case c.closed:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case c.wrClosed, c.st.PeerClosed(), c.peerGone:
		return ErrBrokenPipe
	case c.wrDeadline.expired():
		return os.ErrDeadlineExceeded
	}
	return nil
}

// postWritesLocked posts the WRITEs for a chunk already copied to the peer's
// mapping or to the staging buffer (or small enough to go inline).
func (c *Conn) postWritesLocked(chunk []byte, s1, s2 ring.Seg) error {
	if c.direct != nil {
		return nil
	}
	inline := len(chunk) <= c.inline // as Write decided when it copied
	for _, s := range []ring.Seg{s1, s2} {
		if s.Len == 0 {
			continue
		}
		c.wr = verbs.SendWR{Op: verbs.OpWrite, RemoteAddr: c.peer.Addr + s.Off, RKey: c.peer.RKey}
		if inline {
			c.wr.Inline = chunk[:s.Len]
		} else {
			c.wr.Local = verbs.SGE{MR: c.stage, Offset: int(s.Off), Length: int(s.Len)}
		}
		chunk = chunk[s.Len:]
		err := c.postLocked(&c.wr, false)
		c.wr = verbs.SendWR{} // drop the reference to the caller's buffer
		if err != nil {
			return err
		}
	}
	return nil
}

// The directions of blocked calls.
const (
	dirRead  = 1
	dirWrite = 2
)

// wait blocks the call of direction dir until it is woken, its deadline
// passes or the Conn is closed. With BusyPoll set it may first poll the
// completion queue itself, for as long as the direction's adaptive window
// says; then it waits on the queue itself if it can (waitDirect), else on
// its channel, which the event loop or another call signals.
func (c *Conn) wait(dir int32) error {
	wake, dl, sc := c.rdWake, c.rdDeadline, &c.rdSpin
	if dir == dirWrite {
		wake, dl, sc = c.wrWake, c.wrDeadline, &c.wrSpin
	}
	var start time.Time
	var spun time.Duration
	if max := c.opts.BusyPoll; max > 0 {
		start = time.Now()
		if w := sc.window(max); w > 0 {
			done, err := c.spin(wake, dl, w)
			if done {
				if err == nil {
					// Found within the window, or after a yield that let
					// others run long: only the first is a hit.
					sc.record(w, time.Since(start), max)
				}
				return err
			}
			spun = w
		}
	}
	err, ok := c.waitDirect(wake, dl, dir)
	if !ok {
		select {
		case <-wake:
			c.stats.Wakeups.Add(1)
		case <-dl.wait():
			err = os.ErrDeadlineExceeded
		case <-c.done:
			err = net.ErrClosed
		}
	}
	if err == nil && !start.IsZero() {
		sc.record(spun, time.Since(start), c.opts.BusyPoll)
	}
	return err
}

// waitDirect waits on the completion queue itself (verbs.DirectWaiter) if
// the queue allows it and no other call does: it arms the queue's direct
// notification, polls, and parks in WaitDirect until its direction is
// woken, its deadline passes or the Conn closes. Whatever wakes a direction
// without a completion (another goroutine's progress, a failure, the
// deadline, Close) also calls WakeDirect for its direct waiter (wakeLocked,
// wakeDirect). When it stops, the direct notification stays armed for a
// while (sticky.go), and the queue is polled once more. ok is false if it
// did not wait (no direct notification, another call waits on the queue, or
// the queue failed): the caller then waits on its channel.
func (c *Conn) waitDirect(wake chan struct{}, dl *deadline, dir int32) (err error, ok bool) {
	if c.dw == nil {
		return nil, false
	}
	c.mu.Lock()
	if c.dirOwner.Load() != 0 {
		c.mu.Unlock()
		return nil, false
	}
	c.dirOwner.Store(dir)
	c.sticky = false
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.dirOwner.Store(0)
		c.stickLocked()
		if c.armLocked() == nil {
			c.progressLocked()
		}
		c.mu.Unlock()
	}()
	for {
		select {
		case <-wake:
			return nil, true
		default:
		}
		if dl.expired() {
			return os.ErrDeadlineExceeded, true
		}
		if isClosed(c.done) {
			return net.ErrClosed, true
		}
		c.mu.Lock()
		aerr := c.armLocked()
		moved := false
		if aerr == nil {
			c.polling = dir
			moved = c.progressLocked()
			c.polling = 0
		}
		c.mu.Unlock()
		if aerr != nil {
			return nil, false
		}
		if moved {
			continue // perhaps for us: look at wake again
		}
		if err := c.dw.WaitDirect(); err != nil {
			return nil, false
		}
		c.stats.Wakeups.Add(1)
	}
}

// armLocked asks for the notification of the next completion, for whoever
// waits: nobody while calls busy-poll a queue that can be disarmed (they
// poll, and the last one arms again), the call waiting on the queue itself
// if there is one or one has just stopped (sticky, see sticky.go; nobody
// if the queue can be disarmed), else the event loop. Arming decisions and the state
// they depend on (spinners, dirOwner) change only under mu, so the latest
// decision is always the right one.
func (c *Conn) armLocked() error {
	switch {
	case c.disarmable && c.spinners.Load() > 0:
		return nil
	case c.disarmable && c.sticky && c.dirOwner.Load() == 0:
		// Sticky on a queue that can be disarmed: nobody is notified, and
		// the next call polls before it waits (sticky.go).
		c.ep.cq.(verbs.Disarmer).Disarm()
		return nil
	case c.dw != nil && (c.dirOwner.Load() != 0 || c.sticky):
		return c.dw.ArmDirect()
	}
	return c.ep.cq.Arm()
}

// wakeLocked wakes the blocked call of direction dir: through its channel,
// and through the queue if it waits there, unless it is the one polling.
func (c *Conn) wakeLocked(dir int32) {
	if dir == dirRead {
		wake(c.rdWake)
	} else {
		wake(c.wrWake)
	}
	if c.polling != dir {
		c.wakeDirect(dir)
	}
}

// wakeDirect makes the call of direction dir return from WaitDirect, if it
// is waiting on the queue itself.
func (c *Conn) wakeDirect(dir int32) {
	if c.dw != nil && c.dirOwner.Load() == dir {
		c.dw.WakeDirect()
	}
}

// spin polls the completion queue for up to w. It reports done when
// something happened (or the deadline passed, or the Conn closed). While
// any caller spins, the queue is disarmed where the provider allows it
// (verbs.Disarmer), so the peer pays no notification (shm: no eventfd
// write) and the event loop stays parked; the last spinner to stop arms it
// again and polls once more, so a completion that raced the arm is seen.
func (c *Conn) spin(wake chan struct{}, dl *deadline, w time.Duration) (done bool, err error) {
	c.mu.Lock()
	if c.spinners.Add(1) == 1 && c.disarmable {
		c.ep.cq.(verbs.Disarmer).Disarm()
	}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.spinners.Add(-1) == 0 && c.disarmable {
			c.stickLocked()
			if c.armLocked() == nil && c.progressLocked() {
				done, err = true, nil
			}
		}
		c.mu.Unlock()
	}()
	end := time.Now().Add(w)
	for i := 1; ; i++ {
		select {
		case <-wake:
			return true, nil
		default:
		}
		// Ask the queue before taking mu: a spinner that took it on every
		// turn would contend with the goroutine writing on this Conn
		// (measured: a quarter of a net/http server's transport time in
		// mutex hand-offs).
		if (c.peek == nil || c.peek.Pending()) && c.progress() {
			return true, nil
		}
		if i%64 != 0 { // the clock and the deadline cost more than a poll
			continue
		}
		// Let another runnable thread (often the peer process we wait for)
		// have this core: spinning on an oversubscribed machine otherwise
		// holds up the very peer it waits for. (Alone on its core, the call
		// returns at once. runtime.Gosched here, for goroutines queued on
		// this P, measured twice the round trip: it moves the spinner
		// between threads.)
		_, _, _ = unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		if dl.expired() {
			return true, os.ErrDeadlineExceeded
		}
		if isClosed(c.done) {
			return true, net.ErrClosed
		}
		if time.Now().After(end) {
			return false, nil
		}
	}
}

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	c.rdDeadline.set(t)
	c.wrDeadline.set(t)
	return nil
}

// SetReadDeadline sets the deadline for pending and future Reads.
func (c *Conn) SetReadDeadline(t time.Time) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	c.rdDeadline.set(t)
	return nil
}

// SetWriteDeadline sets the deadline for pending and future Writes.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if err := c.checkOpen(); err != nil {
		return err
	}
	c.wrDeadline.set(t)
	return nil
}

func (c *Conn) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	return nil
}

// drain takes a pending wake-up out of ch.
func drain(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// QP returns the queue pair carrying the Conn, for tests that inject faults
// or hostile messages underneath the protocol.
func (c *Conn) QP() verbs.QP { return c.ep.qp }

// Bootstrap returns the bootstrap TCP connection, for tests that simulate a
// peer process dying.
func (c *Conn) Bootstrap() net.Conn { return c.boot }

// DebugState describes the protocol state and send queue, for debugging.
func (c *Conn) DebugState() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%v sq{posted %d done %d} err=%v closed=%v peerGone=%v", c.st, c.sqPosted, c.sqDone, c.err, c.closed, c.peerGone)
}
