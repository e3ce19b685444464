package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

type qpState uint8

const (
	stateInit      qpState = iota // created, not connected
	stateConnected                // ready to send (RTS)
	stateError                    // everything flushes
	stateClosed                   // released
)

// QP is a simulated reliable-connected queue pair. It implements verbs.QP.
//
// Locking: a QP's mu guards its state, queues and wire. Work that touches
// both ends of a connection locks both QPs, the one with the lower id first;
// CQ, MR and Device locks are taken under QP locks, never the reverse.
type QP struct {
	id        uint64 // immutable after NewQP
	info      []byte
	dev       *Device
	cq        *CQ
	maxInline int
	sq, rq    workQueue

	connected chan struct{} // closed when Connect succeeds
	gone      chan struct{} // closed by Close

	mu        sync.Mutex
	state     qpState
	peer      *QP // set once by Connect, never changed
	stalled   bool
	recvs     fifo[recvWR]   // posted RECVs
	wire      fifo[transfer] // accepted sends not yet delivered
	unretired int32          // successful unsignaled sends not yet retired
	incoming  map[*QP]struct{}
	timer     *time.Timer // retransmission of the wire's head
	timerAt   time.Time
}

var (
	_ verbs.QP     = (*QP)(nil)
	_ verbs.Kicker = (*QP)(nil)
)

type recvWR struct {
	id     uint64
	mr     *MR // nil for a zero-length buffer
	off, n int
}

// transfer is an accepted send work request.
type transfer struct {
	id       uint64
	op       verbs.Opcode
	inline   []byte // private copy when isInline
	isInline bool
	mr       *MR // source when not inline; nil for zero length
	off, n   int
	raddr    uint64
	rkey     uint32
	signaled bool
	solicit  bool
	due      time.Time // earliest delivery (loss); zero for at once
	done     bool      // completed at post (Faults.LocalCompletion)
}

// Info returns this QP's description for the peer: a magic, a version, a
// process nonce and the QP's id. It is valid even after Close.
func (q *QP) Info() []byte { return append([]byte(nil), q.info...) }

// MaxInline returns the inline size granted: min(QPAttr.MaxInline, 256).
func (q *QP) MaxInline() int { return q.maxInline }

// Kick fires the peer QP's CQ, if it is armed, while it holds completions
// not polled yet (verbs.Kicker): sim's stand-in for the peer not having
// taken every SEND.
func (q *QP) Kick() bool {
	p := q.Peer()
	if p == nil {
		return false
	}
	p.cq.mu.Lock()
	defer p.cq.mu.Unlock()
	if p.cq.closed || len(p.cq.ready) == p.cq.head && len(p.cq.pending) == 0 {
		return false
	}
	if p.cq.armed != 0 {
		p.cq.armed = 0
		p.cq.notify()
	}
	return true
}

// Peer returns the QP this one is connected to, or nil before Connect.
func (q *QP) Peer() *QP {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.peer
}

// Connect links this QP to the QP whose Info is peer. It does not block and
// needs no cooperation from the peer: transfers to a peer that has not
// connected yet are held until it does. Errors: ctx's error if it is done,
// verbs.ErrClosed after Close, verbs.ErrQPState if already connected or in
// the error state, and an error wrapping verbs.ErrPeerInfo if peer does not
// parse, names no open QP of this process or names a QP connected to another.
func (q *QP) Connect(ctx context.Context, peer []byte, active bool) error {
	q.mu.Lock()
	closed := q.state == stateClosed
	q.mu.Unlock()
	if closed {
		return verbs.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	id, err := decodeInfo(peer)
	if err != nil {
		return err
	}
	p := lookupQP(id)
	if p == nil {
		return fmt.Errorf("%w: sim: no open queue pair %d", verbs.ErrPeerInfo, id)
	}
	lockPair(q, p)
	err = q.connectLocked(p)
	incoming := slices.Collect(maps.Keys(q.incoming))
	unlockPair(q, p)
	if err != nil {
		return err
	}
	// Release whatever the peer sent before this side connected.
	for _, x := range incoming {
		x.pump()
	}
	return nil
}

func (q *QP) connectLocked(p *QP) error {
	switch {
	case q.state == stateClosed:
		return verbs.ErrClosed
	case q.state != stateInit:
		return fmt.Errorf("%w: sim: Connect on a queue pair already connected or in the error state", verbs.ErrQPState)
	case p.state == stateClosed:
		return fmt.Errorf("%w: sim: queue pair %d is closed", verbs.ErrPeerInfo, p.id)
	case p.peer != nil && p.peer != q:
		return fmt.Errorf("%w: sim: queue pair %d is connected to another", verbs.ErrPeerInfo, p.id)
	}
	q.peer = p
	q.state = stateConnected
	close(q.connected)
	p.incoming[q] = struct{}{}
	return nil
}

// Established waits until the peer has connected back to this QP, ctx is
// done, or the peer is closed. It returns nil once both sides are connected,
// verbs.ErrClosed after Close, verbs.ErrQPState before Connect, and an error
// wrapping verbs.ErrPeerInfo if the peer is gone before it connected, or
// connected to another QP. A peer that connected and has closed since is
// established, as on RC hardware, where the passive side's move to RTS
// does not involve the peer: what it sent before is in this QP's queues,
// and its end shows on the data path.
func (q *QP) Established(ctx context.Context) error {
	q.mu.Lock()
	state, p := q.state, q.peer
	q.mu.Unlock()
	switch {
	case state == stateClosed:
		return verbs.ErrClosed
	case p == nil:
		return fmt.Errorf("%w: sim: not connected", verbs.ErrQPState)
	}
	select {
	case <-p.connected:
	case <-p.gone:
		select {
		case <-p.connected: // connected, then closed
		default:
			return fmt.Errorf("%w: sim: peer queue pair closed", verbs.ErrPeerInfo)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.Peer() != q {
		return fmt.Errorf("%w: sim: peer is connected to another queue pair", verbs.ErrPeerInfo)
	}
	return nil
}

var errNilWR = errors.New("sim: nil work request")

// PostSend accepts a send work request and those chained to it and, unless
// something holds the wire, executes them before returning (see the package
// documentation). Inline data is copied before it returns. It does not
// block. Errors (the request, and those after it, then have no effect):
// verbs.ErrClosed after Close; verbs.ErrQPState before Connect or in the
// error state (unless Faults.FlushPostsInError); verbs.ErrInlineTooLong;
// verbs.ErrBounds for a local SGE outside its MR, of another device or of a
// closed MR; verbs.ErrQueueFull when SendDepth requests are outstanding.
func (q *QP) PostSend(wr *verbs.SendWR) error {
	if wr == nil {
		return errNilWR
	}
	p := q.lockWithPeer()
	defer unlockPair(q, p)
	for ; wr != nil; wr = wr.Next {
		if err := q.postLocked(p, wr); err != nil {
			return err
		}
	}
	return nil
}

// postLocked accepts one send work request; q and its peer p are locked.
func (q *QP) postLocked(p *QP, wr *verbs.SendWR) error {
	f := q.dev.prov.currentFaults()
	if err := q.postableLocked(&f); err != nil {
		return err
	}
	t, err := q.prepareSend(wr)
	if err != nil {
		return err
	}
	if q.sq.used.Load() >= q.sq.depth {
		return verbs.ErrQueueFull
	}
	q.sq.used.Add(1)
	if q.state == stateError {
		q.completeSendLocked(&t, verbs.StatusFlushed, &f)
		return nil
	}
	if d := f.lossDelay(); d > 0 {
		t.due = time.Now().Add(d)
	}
	if f.LocalCompletion {
		q.completeSendLocked(&t, verbs.StatusSuccess, &f)
		t.done = true
	}
	q.wire.push(t)
	q.pumpLocked(p)
	return nil
}

// PostRecv posts a buffer for one incoming SEND (or a WRITE with immediate,
// which does not use the buffer). It works from the QP's creation on (the
// INIT state), so buffers can be posted before Info goes to the peer. A
// zero-length buffer may leave Local.MR nil. It does not block. Errors are
// those of PostSend, except that there is no ErrQPState before Connect, a
// non-empty buffer must also be in an MR with verbs.AccessLocalWrite
// (verbs.ErrBounds otherwise), and the depth is RecvDepth.
func (q *QP) PostRecv(wr *verbs.RecvWR) error {
	if wr == nil {
		return errNilWR
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	f := q.dev.prov.currentFaults()
	if q.state != stateInit { // INIT accepts receives
		if err := q.postableLocked(&f); err != nil {
			return err
		}
	}
	mr, err := q.localSGE(&wr.Local)
	if err != nil {
		return err
	}
	if mr != nil && mr.access&verbs.AccessLocalWrite == 0 {
		return fmt.Errorf("%w: sim: receive buffer in a region without local write access", verbs.ErrBounds)
	}
	if q.rq.used.Load() >= q.rq.depth {
		return verbs.ErrQueueFull
	}
	q.rq.used.Add(1)
	r := recvWR{id: wr.ID, mr: mr, off: wr.Local.Offset, n: wr.Local.Length}
	if q.state == stateError {
		q.cq.push(recvFlush(r.id), &q.rq, 1, &f, false)
		return nil
	}
	q.recvs.push(r)
	return nil
}

// postableLocked checks the state for a post.
func (q *QP) postableLocked(f *Faults) error {
	switch q.state {
	case stateClosed:
		return verbs.ErrClosed
	case stateInit:
		return fmt.Errorf("%w: sim: not connected", verbs.ErrQPState)
	case stateError:
		if !f.FlushPostsInError {
			return fmt.Errorf("%w: sim: queue pair in the error state", verbs.ErrQPState)
		}
	}
	return nil
}

// prepareSend validates wr and turns it into a transfer.
func (q *QP) prepareSend(wr *verbs.SendWR) (transfer, error) {
	t := transfer{
		id:       wr.ID,
		op:       wr.Op,
		raddr:    wr.RemoteAddr,
		rkey:     wr.RKey,
		signaled: wr.Signaled,
		solicit:  wr.Solicited,
	}
	switch wr.Op {
	case verbs.OpWrite, verbs.OpSend:
	default:
		return t, fmt.Errorf("sim: send work request with opcode %v", wr.Op)
	}
	if wr.Inline != nil {
		if len(wr.Inline) > q.maxInline {
			return t, fmt.Errorf("%w: %d bytes, at most %d", verbs.ErrInlineTooLong, len(wr.Inline), q.maxInline)
		}
		t.isInline = true
		t.inline = append(make([]byte, 0, len(wr.Inline)), wr.Inline...)
		t.n = len(wr.Inline)
		return t, nil
	}
	mr, err := q.localSGE(&wr.Local)
	if err != nil {
		return t, err
	}
	t.mr, t.off, t.n = mr, wr.Local.Offset, wr.Local.Length
	return t, nil
}

// localSGE validates a local scatter/gather entry; it returns a nil MR for an
// empty SGE without one.
func (q *QP) localSGE(s *verbs.SGE) (*MR, error) {
	if s.MR == nil {
		if s.Offset != 0 || s.Length != 0 {
			return nil, fmt.Errorf("%w: sim: %d bytes at %d without a memory region", verbs.ErrBounds, s.Length, s.Offset)
		}
		return nil, nil
	}
	mr, ok := s.MR.(*MR)
	switch {
	case !ok || mr == nil:
		return nil, fmt.Errorf("%w: sim: %T is not a sim memory region", verbs.ErrBounds, s.MR)
	case mr.dev != q.dev:
		return nil, fmt.Errorf("%w: sim: memory region of another device", verbs.ErrBounds)
	case !sgeIn(s.Offset, s.Length, len(mr.buf)):
		return nil, fmt.Errorf("%w: sim: %d bytes at %d in a region of %d", verbs.ErrBounds, s.Length, s.Offset, len(mr.buf))
	case mr.isClosed():
		return nil, fmt.Errorf("%w: sim: memory region closed (%w)", verbs.ErrBounds, verbs.ErrClosed)
	}
	return mr, nil
}

// Close moves the QP to the error state, so that everything outstanding
// completes as flushed (into its CQ, unless that is closed), and releases
// it. The peer is not told; its next transfer fails with
// StatusRetryExceeded, as do transfers it has in flight. With
// Faults.LocalCompletion the peer is moved to the error state too, as the
// end of an iWARP connection's TCP stream does. A second Close returns
// verbs.ErrClosed.
func (q *QP) Close() error {
	p := q.lockWithPeer()
	if q.state == stateClosed {
		unlockPair(q, p)
		return verbs.ErrClosed
	}
	f := q.dev.prov.currentFaults()
	q.flushLocked(&f)
	if f.LocalCompletion && p != nil && p.peer == q {
		fp := p.dev.prov.currentFaults()
		p.flushLocked(&fp)
	}
	q.state = stateClosed
	q.stalled = false
	close(q.gone)
	incoming := slices.Collect(maps.Keys(q.incoming))
	if p != nil {
		delete(p.incoming, q)
	}
	unlockPair(q, p)

	unregisterQP(q)
	q.dev.forgetQP(q)
	q.cq.detach(q)
	for _, x := range incoming {
		x.pump()
	}
	return nil
}

// ForceError moves the QP to the error state now: its posted RECVs and
// undelivered sends complete as flushed, and later posts fail with
// verbs.ErrQPState (or flush, with Faults.FlushPostsInError). The peer is not
// told; it learns when it next sends (StatusRetryExceeded), like real RC.
// ForceError does nothing on a QP already in the error state or closed.
func (q *QP) ForceError() {
	p := q.lockWithPeer()
	if q.state == stateError || q.state == stateClosed {
		unlockPair(q, p)
		return
	}
	f := q.dev.prov.currentFaults()
	q.flushLocked(&f)
	incoming := slices.Collect(maps.Keys(q.incoming))
	unlockPair(q, p)
	for _, x := range incoming {
		x.pump()
	}
}

// Stall makes this QP a stalled peer. While on, transfers to it are held at
// the sender: no data reaches its memory and neither side gets a completion.
// Turning it off delivers the held transfers in order (before Stall returns,
// unless something else holds them). Closing the QP ends the stall; its held
// transfers then fail with StatusRetryExceeded.
func (q *QP) Stall(on bool) {
	q.mu.Lock()
	if q.state == stateClosed {
		q.mu.Unlock()
		return
	}
	q.stalled = on
	incoming := slices.Collect(maps.Keys(q.incoming))
	q.mu.Unlock()
	if !on {
		for _, x := range incoming {
			x.pump()
		}
	}
}

// lockWithPeer locks q and, if connected, its peer, in id order, and returns
// the peer (nil if none). Release with unlockPair(q, peer).
func (q *QP) lockWithPeer() *QP {
	q.mu.Lock()
	p := q.peer
	if p == nil || p == q || q.id < p.id {
		if p != nil && p != q {
			p.mu.Lock()
		}
		return p
	}
	q.mu.Unlock()
	p.mu.Lock()
	q.mu.Lock() // q.peer is set only once, so it is still p
	return p
}

// lockPair locks a and b (b may be nil or a) in id order.
func lockPair(a, b *QP) {
	switch {
	case b == nil || b == a:
		a.mu.Lock()
	case a.id < b.id:
		a.mu.Lock()
		b.mu.Lock()
	default:
		b.mu.Lock()
		a.mu.Lock()
	}
}

func unlockPair(a, b *QP) {
	if b != nil && b != a {
		b.mu.Unlock()
	}
	a.mu.Unlock()
}

func (q *QP) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state == stateClosed
}
