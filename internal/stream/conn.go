package stream

import (
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

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
// its goroutine (no OS thread) until the completion queue's notification
// or another call wakes it (waiter.go).
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
	rdSpin, wrSpin spinCtl      // each direction's adaptive busy-poll window
	peek           verbs.Peeker // nil if the queue cannot tell cheaply whether a poll would find anything

	// Waiting (waiter.go). The entries of Read and CopyTo, Write, Close's
	// final message and the peer's goodbye; poller is the one the queue's
	// notification wakes (changed under mu), bgRun whether a background
	// progress goroutine is on its way.
	rdE, wrE, clE, finE *entry
	poller              atomic.Pointer[entry]
	bgRun               atomic.Bool

	mu       sync.Mutex // protects everything below
	st       *ring.State
	err      error // terminal transport error; set once
	suspect  error // a transport failure awaiting its verdict (suspectLocked)
	closed   bool  // Close was called
	rdClosed bool  // CloseRead was called
	lent     bool  // readable bytes are lent outside mu (a lease, a CopyTo piece): CloseRead leaves them to their holder
	wrClosed bool  // CloseWrite was called
	peerGone bool  // the peer said goodbye (orderly close) on the bootstrap
	sqPosted uint64
	sqDone   uint64
	lastSig  uint64
	closeSig uint64       // ID of the signaled final message, 0 if none
	waiting  []*entry     // entries of the calls waiting now
	active   atomic.Int32 // calls in the Conn (enterLocked); changed under mu
	msgBuf   [ring.MsgLen]byte
	wr       verbs.SendWR // reused for every post (under mu): no allocation per post
	wcs      [32]verbs.Completion
	calls    sync.WaitGroup // in-flight Read, Write and friends
	loops    sync.WaitGroup // the bootstrap watcher, abort notices, suspect verdicts
	done     chan struct{}  // closed by Close

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
	Wakeups      atomic.Uint64 // times a blocked call parked and was woken by its event or a notification
	SpinHits     atomic.Uint64 // times a busy-polling call found its event before parking
	// Notifications counts the completion queue's notifications, and
	// Background those that found no call waiting and started background
	// progress.
	Notifications atomic.Uint64
	Background    atomic.Uint64
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
		inline:     e.qp.MaxInline(),
		done:       make(chan struct{}),
		rdDeadline: newDeadline(),
		wrDeadline: newDeadline(),
	}
	c.rdE, c.wrE, c.finE = newEntry(evRead, c.done), newEntry(evWrite, c.done), newEntry(evRead, c.done)
	c.clE = newEntry(evClose, nil) // Close's own wait
	c.peek, _ = e.cq.(verbs.Peeker)
	if m, ok := e.qp.(verbs.RemoteMapper); ok {
		if c.direct, err = m.MapRemote(peer.Addr, peer.RKey, int(peer.Size)); err != nil {
			return nil, err
		}
	} else if c.stage, err = e.dev.AllocMR(int(peer.Size), verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	e.owned = false
	e.conn.Store(c)
	c.mu.Lock()
	c.idleLocked() // for what arrived already, and background progress
	c.mu.Unlock()
	c.loops.Add(1)
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

// enter registers an in-flight call (enterLocked); it fails once Close has
// started.
func (c *Conn) enter() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.enterLocked()
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
	defer c.exit()
	c.wrMu.Lock()
	defer c.wrMu.Unlock()
	written := 0
	stalled := false
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		// A write that placed every byte succeeded, whatever happened since
		// (the peer closing, a concurrent Close or CloseWrite, the deadline).
		if written == len(b) && written > 0 {
			c.stats.Writes.Add(1)
			return written, nil
		}
		drain(c.wrE.ch) // what follows answers any wake-up sent so far
		if err := c.writeErrLocked(); err != nil {
			return written, err
		}
		if len(b) == 0 {
			return 0, nil
		}
		space := c.st.Space()
		// A data chunk needs: ring space, a data credit, and send-queue room
		// for two WRITEs and the SEND (plus two slots kept for control).
		if space == 0 || !c.st.CanSendData() || c.sqFreeLocked() < 5 {
			if c.st.CanSendControl() && c.sqFreeLocked() > 0 && c.st.Block() {
				c.sendLocked(ring.FlagBlocked)
			}
			if !stalled {
				stalled = true
				c.stats.CreditStalls.Add(1)
			}
			if err := c.wait(c.wrE, c.wrDeadline, &c.wrSpin); err != nil {
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
			return written, err
		}
		if err := c.postWritesLocked(chunk, s1, s2); err != nil {
			// The bytes did not go; whether that is the peer's orderly
			// close or a failure is decided shortly (suspectLocked).
			c.suspectLocked(reset("posting a write", err))
			if err := c.wait(c.wrE, c.wrDeadline, nil); err != nil {
				return written, err
			}
			continue
		}
		if err := c.st.Wrote(n); err != nil {
			c.failLocked(err)
			return written, c.err
		}
		written += int(n)
		c.stats.BytesWritten.Add(n)
		if c.st.CanSendData() {
			c.sendLocked(0)
		}
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
	return fmt.Sprintf("%v sq{posted %d done %d} err=%v closed=%v peerGone=%v waiting=%d poller=%v active=%d", c.st, c.sqPosted, c.sqDone, c.err, c.closed, c.peerGone, len(c.waiting), c.poller.Load() != nil, c.active.Load())
}
