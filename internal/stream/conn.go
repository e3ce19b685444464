package stream

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Conn is a byte stream over a connected queue pair, with the bootstrap TCP
// connection kept open beside it for orderly close, abort and peer-death
// detection. Read blocks until data, EOF, an error, Close or the read
// deadline; Write until every byte is in the peer's ring (not until the
// peer read it), an error, Close or the write deadline. A blocked call may
// busy-poll first (spin.go), then parks its goroutine (waiter.go). All
// methods are safe for concurrent use: concurrent Writes do not interleave
// their bytes, and concurrent Reads each get a contiguous piece.
type Conn struct {
	ep    *Endpoint
	owner Owner
	peer  Ring
	opts  Options

	direct []byte       // the peer's ring mapped here (shm), or nil
	inline int          // QP's MaxInline
	peek   verbs.Peeker // nil if the queue cannot tell cheaply whether a poll would find anything

	rd   recvHalf // Read, CopyTo, CloseRead (recv.go)
	wr   sendHalf // Write, CloseWrite (send.go)
	grow growth   // ring growth (grow.go); guarded by mu
	bs   backstop // the lost-notification backstop (backstop.go); guarded by mu
	// ringSize is our receive ring's size now (it changes when it grows);
	// registered the bytes of the regions the Conn holds (Registered).
	ringSize   atomic.Int64
	registered atomic.Int64

	// Waiting (waiter.go): poller, the entry notify wakes, and active, the
	// calls in the Conn, change under mu; bgRun: a background run is coming.
	poller atomic.Pointer[entry]
	bgRun  atomic.Bool
	active atomic.Int32
	calls  sync.WaitGroup // the same calls, for the teardown
	loops  sync.WaitGroup // goodbye handling, reset and failure notices, suspect verdicts
	done   chan struct{}  // closed by Close

	mu       sync.Mutex // protects everything below, and the halves' fields so marked
	life     life       // where the Conn is in its lifecycle (close.go)
	st       *ring.State
	err      error // terminal transport error; set once
	suspect  error // a transport failure awaiting its verdict (suspectLocked)
	sqPosted uint64
	sqDone   uint64
	lastSig  uint64
	closeSig uint64   // ID of the signaled final message, 0 if none
	waiting  []*entry // entries of the calls waiting now
	// armed is how the queue is armed and has not notified since (notify
	// clears it): idleLocked skips an Arm that would change nothing, and
	// the poll after it when the queue holds nothing (Peeker). Written
	// under mu, but for notify's clear.
	armed  atomic.Uint32
	msgBuf [ring.MsgLen]byte
	chain  [4]verbs.SendWR // the requests of the next post (ringLocked)
	nchain int
	wcs    [32]verbs.Completion

	stats Stats
}

// Stats are counters a user can read while the Conn runs.
type Stats struct {
	BytesRead    atomic.Uint64
	BytesWritten atomic.Uint64
	Writes       atomic.Uint64 // Write calls that moved data
	MsgsSent     atomic.Uint64 // state messages posted
	Posts        atomic.Uint64 // send-queue posts (doorbells): a message and the WRITEs it announces
	MsgsRecv     atomic.Uint64 // state messages received
	CreditStalls atomic.Uint64 // times a writer waited for ring space or credits
	Wakeups      atomic.Uint64 // times a blocked call parked and was woken by its event or a notification
	SpinHits     atomic.Uint64 // times a busy-polling call found its event before parking
	// Notifications counts the completion queue's notifications;
	// Background those that started background progress.
	Notifications atomic.Uint64
	Background    atomic.Uint64
	// RingGrows counts ring moves (grow.go), the peer's and ours;
	// GrowFailures the registrations for a move that failed.
	RingGrows    atomic.Uint64
	GrowFailures atomic.Uint64
	// Backstops counts the kicks of a peer that consumed nothing for the
	// backstop's period with bytes in flight (backstop.go).
	Backstops atomic.Uint64
}

// Start turns a connected Endpoint into a Conn. peer is the peer's ring
// from the handshake; owner is the connection the Conn carries the stream
// for. Reads and Writes end at rdl and wdl, the caller's deadlines: a Set
// on them reaches a call that waits in the Conn at once.
func (e *Endpoint) Start(peer Ring, owner Owner, rdl, wdl *deadline.Deadline) (*Conn, error) {
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
		ep: e, owner: owner, peer: peer, opts: e.opts, st: st,
		inline: e.qp.MaxInline(),
		done:   make(chan struct{}),
	}
	c.rd.dl, c.wr.dl = rdl, wdl
	c.ringSize.Store(int64(e.opts.RingSize))
	c.rd.e.init(evRead, c.done)
	c.wr.e.init(evWrite, c.done)
	c.peek, _ = e.cq.(verbs.Peeker)
	if m, ok := e.qp.(verbs.RemoteMapper); ok {
		if c.direct, err = m.MapRemote(peer.Addr, peer.RKey, int(peer.Size)); err != nil {
			return nil, err
		}
	} else if err = e.Prepare(peer); err != nil {
		return nil, err
	} else if len(e.stage.Bytes()) < int(peer.Size) {
		return nil, fmt.Errorf("stream: prepared staging of %d bytes for a peer ring of %d", len(e.stage.Bytes()), peer.Size)
	}
	e.owned = false
	e.conn.Store(c)
	c.mu.Lock()
	c.countRegisteredLocked()
	c.idleLocked() // for what arrived already, and background progress
	c.mu.Unlock()
	return c, nil
}

// Stats returns the Conn's live counters.
func (c *Conn) Stats() *Stats { return &c.stats }

// enter is enterLocked for a call that does not hold mu.
func (c *Conn) enter() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.enterLocked()
}

func drain(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// QP returns the queue pair carrying the Conn, for tests that inject faults
// or hostile messages underneath the protocol.
func (c *Conn) QP() verbs.QP { return c.ep.qp }

// Registered reports the bytes of memory the Conn holds registered with its
// device now (pinned on RDMA devices): the receive ring, the state-message
// buffers, the staging for WRITEs unless the peer's ring is mapped here, and
// a growing ring's other ring or staging. It does not wait for the lock.
func (c *Conn) Registered() int64 { return c.registered.Load() }

func (c *Conn) countRegisteredLocked() {
	var n int64
	for _, mr := range c.ep.regions() {
		n += int64(len(mr.Bytes()))
	}
	c.registered.Store(n)
}

// Occupancy reports the bytes waiting in the receive ring (announced by
// the peer, not yet consumed) and the ring's size. It does not wait for
// the connection's lock: readable is -1 when a call holds it.
func (c *Conn) Occupancy() (readable, size int64) {
	size = c.ringSize.Load()
	if !c.mu.TryLock() {
		return -1, size
	}
	defer c.mu.Unlock()
	return int64(c.st.Readable()), size
}

// Waiting reports how many calls wait in the Conn now (parked or
// busy-polling), for tests that must act while a call blocks.
func (c *Conn) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiting)
}

// DebugState describes the protocol state and send queue, for debugging.
func (c *Conn) DebugState() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("%v sq{posted %d done %d} err=%v closed=%v peerGone=%v waiting=%d poller=%v active=%d", c.st, c.sqPosted, c.sqDone, c.err, c.life >= lifeClosing, c.life == lifePeerGone, len(c.waiting), c.poller.Load() != nil, c.active.Load())
}
