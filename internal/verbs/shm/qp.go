//go:build linux

package shm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// QP states. The state is atomic: posts and polls read it without locks.
// Moves to stateError and stateClosed happen with rmu held (and smu too for
// stateClosed); the others are compare-and-swaps under cmu or with all
// three locks held.
const (
	stateInit       int32 = iota // created: RECVs may be posted
	stateConnecting              // passive: registered; active: exchange in flight
	stateConnected               // peer resources mapped: sends work
	stateError                   // everything flushes; posts fail
	stateClosed                  // released
)

// QP is a reliable-connected queue pair between two processes of one host.
// It implements verbs.QP and verbs.RemoteMapper.
//
// Locking: smu guards the send side (the peer's inbox and regions mapped
// here), rmu the receive side (posted RECVs, consumption of this QP's own
// inbox), cmu (a leaf lock) the connection's bookkeeping. Order: smu, then
// rmu, then cmu; CQ.mu is taken before rmu (Poll) and after smu (Close).
type QP struct {
	dev       *Device
	cq        *CQ
	maxInline int
	secret    [secretLen]byte
	state     atomic.Int32
	in        inbox // this QP's inbox, mapped from NewQP to Close

	// Send side, guarded by smu.
	smu       sync.Mutex
	out       inbox  // the peer's inbox
	tail      uint64 // entries published into out
	credit    uint64 // the peer's posted count, last seen
	peerHead  uint64 // the peer's head, last seen
	link      *link  // the link to the peer's process (also under cmu)
	id        uint32 // this QP's link id (also under cmu)
	peerID    uint32 // the peer QP's link id (also under cmu)
	peerMRs   map[uint32]*peerMR
	lastMR    *peerMR // the region of the previous WRITE
	sqDepth   int32
	sqUsed    atomic.Int32 // slots held until a retiring completion is polled
	unretired int32        // successful unsignaled sends since the last completion

	// Receive side, guarded by rmu.
	rmu    sync.Mutex
	recvs  []recvWR // ring of posted RECVs, len RecvDepth
	rfirst int
	rcount int
	rqUsed atomic.Int32
	posted uint64        // RECVs ever posted (published in the inbox)
	head   atomic.Uint64 // inbox entries consumed; written under rmu

	peerGone atomic.Bool // the peer QP closed or its link ended

	// Connection bookkeeping, guarded by cmu.
	cmu       sync.Mutex
	inFD      int // this QP's inbox memfd, until the exchange is done
	lnName    string
	lnRef     bool
	passive   bool
	rvLinked  bool // a link was set up with secret (guarded by rv.mu)
	isClosing bool
	closing   chan struct{} // closed when Close starts
	estDone   chan struct{} // closed when the passive exchange has finished
	estErr    error
	peerPID   int32
	peerUID   uint32
}

var (
	_ verbs.QP           = (*QP)(nil)
	_ verbs.RemoteMapper = (*QP)(nil)
)

type recvWR struct {
	id     uint64
	mr     *MR // nil for a zero-length buffer
	off, n int
}

func newQP(d *Device, cq *CQ, attr verbs.QPAttr) (*QP, error) {
	q := &QP{
		dev:       d,
		cq:        cq,
		maxInline: min(attr.MaxInline, MaxInline),
		recvs:     make([]recvWR, attr.RecvDepth),
		sqDepth:   int32(attr.SendDepth),
		closing:   make(chan struct{}),
		estDone:   make(chan struct{}),
	}
	_, _ = rand.Read(q.secret[:]) // it never fails (crypto/rand, Go 1.24)
	fd, in, err := newInbox(attr.RecvDepth)
	if err != nil {
		return nil, err
	}
	q.inFD, q.in = fd, in
	return q, nil
}

// Info describes this end: host identity, this QP's secret and the name of
// this process's rendezvous listener, which it starts if needed (Connection
// and trust model in the package documentation); without one (it could not
// start) the name is empty and a peer cannot connect actively to this QP.
func (q *QP) Info() []byte {
	h, _ := localHost() // the device could not have been opened otherwise
	q.cmu.Lock()
	if !q.lnRef && !q.isClosing {
		if name, err := acquireListener(); err == nil {
			q.lnRef, q.lnName = true, name
		}
	}
	name := q.lnName
	q.cmu.Unlock()
	return encodeInfo(h, &q.secret, name)
}

// MaxInline returns the inline size granted: min(QPAttr.MaxInline, MaxInline).
func (q *QP) MaxInline() int { return q.maxInline }

// MaxSend returns MaxSend, the largest SEND payload (one inbox entry).
func (q *QP) MaxSend() int { return MaxSend }

// PeerCred returns the process id and user id the kernel reported
// (SO_PEERCRED) for the peer's end of the rendezvous, zero before the
// exchange.
func (q *QP) PeerCred() (pid int, uid int) {
	q.cmu.Lock()
	defer q.cmu.Unlock()
	return int(q.peerPID), int(q.peerUID)
}

// Connect connects this QP to the peer whose Info is peer. Both sides first
// check that the peer shares this host and network namespace (else an error
// wrapping verbs.ErrUnavailable: "peer is on another host", "peer is in
// another network namespace").
//
// Passive (active false): registers this QP's secret with the process's
// rendezvous listener and returns at once; Established waits for the
// active side's exchange.
//
// Active: sends the peer's secret and this side's fds (inbox,
// remote-writable regions) on the link to the peer's process, setting the
// link up if there is none, and maps the peer's. It blocks until then or
// until ctx is done (ctx's error).
//
// Errors: verbs.ErrClosed after Close; verbs.ErrQPState if Connect already
// ran; an error wrapping verbs.ErrPeerInfo if peer does not parse, or the
// peer cannot be reached or refused the exchange. A failed active Connect
// leaves the QP as it was, so it may be retried.
func (q *QP) Connect(ctx context.Context, peer []byte, active bool) error {
	if q.state.Load() == stateClosed {
		return verbs.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := decodeInfo(peer)
	if err != nil {
		return err
	}
	local, _ := localHost() // the device could not have been opened otherwise
	if err := checkSameHost(local, p.host); err != nil {
		return err
	}
	if active {
		return q.connectActive(ctx, &p)
	}
	return q.connectPassive()
}

func (q *QP) connectPassive() error {
	q.cmu.Lock()
	defer q.cmu.Unlock()
	if q.isClosing {
		return verbs.ErrClosed
	}
	if !q.lnRef {
		name, err := acquireListener()
		if err != nil {
			return err
		}
		q.lnRef, q.lnName = true, name
	}
	if !q.state.CompareAndSwap(stateInit, stateConnecting) {
		return fmt.Errorf("%w: shm: Connect on a queue pair already connected or in the error state", verbs.ErrQPState)
	}
	q.passive = true
	register(q)
	return nil
}

// Established returns nil once the passive side's exchange has completed:
// it blocks until then, until ctx is done (ctx's error) or until Close
// (verbs.ErrClosed). If the exchange failed after the active side presented
// the right secret, it returns that failure. On the active side it returns
// nil once Connect succeeded. Before Connect: verbs.ErrQPState.
func (q *QP) Established(ctx context.Context) error {
	q.cmu.Lock()
	passive, closing := q.passive, q.isClosing
	q.cmu.Unlock()
	st := q.state.Load()
	switch {
	case closing || st == stateClosed:
		return verbs.ErrClosed
	case !passive && st == stateConnected:
		return nil
	case !passive:
		return fmt.Errorf("%w: shm: not connected", verbs.ErrQPState)
	}
	select {
	case <-q.estDone:
		q.cmu.Lock()
		defer q.cmu.Unlock()
		return q.estErr
	case <-q.closing:
		return verbs.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// setEstablished records the outcome of the passive exchange (first call
// wins) and wakes Established.
func (q *QP) setEstablished(err error) {
	q.cmu.Lock()
	defer q.cmu.Unlock()
	select {
	case <-q.estDone:
	default:
		q.estErr = err
		close(q.estDone)
	}
}

// peerSide is what an exchange maps of the peer.
type peerSide struct {
	in  inbox
	mrs map[uint32]*peerMR
}

func (p *peerSide) release() {
	p.in.release()
	for _, m := range p.mrs {
		_ = unmap(m.mem)
	}
	p.mrs = nil
}

// install makes p the peer and binds q to link id (the peer's QP is
// peerID), moving the QP from connecting to connected. It fails
// (releasing p, telling the peer QP and unbinding id) if the QP was closed
// or failed meanwhile.
func (q *QP) install(p *peerSide, l *link, id, peerID uint32) error {
	q.smu.Lock()
	q.rmu.Lock()
	q.cmu.Lock()
	if q.isClosing || !q.state.CompareAndSwap(stateConnecting, stateConnected) {
		closing := q.isClosing
		q.cmu.Unlock()
		q.rmu.Unlock()
		q.smu.Unlock()
		p.release()
		_ = l.write(appendID(appendHeader(nil, msgGone), peerID), nil)
		l.unbind(id)
		if closing {
			return verbs.ErrClosed
		}
		return fmt.Errorf("%w: shm: queue pair failed while connecting", verbs.ErrQPState)
	}
	q.out, q.peerMRs = p.in, p.mrs
	q.peerPID, q.peerUID = l.cred.Pid, l.cred.Uid
	q.link, q.id, q.peerID = l, id, peerID
	inFD := q.inFD // the peer has its own copy now
	q.inFD = -1
	q.cmu.Unlock()
	q.rmu.Unlock()
	q.smu.Unlock()
	closeFD(inFD)
	q.dev.settle()
	return nil
}

// usable is why the QP cannot take a post now, or nil: a RECV from its
// creation on, anything else (connected) only once connected.
func (q *QP) usable(connected bool) error {
	switch s := q.state.Load(); {
	case s == stateClosed:
		return verbs.ErrClosed
	case s == stateError:
		return fmt.Errorf("%w: shm: queue pair in the error state", verbs.ErrQPState)
	case connected && s != stateConnected:
		return fmt.Errorf("%w: shm: not connected", verbs.ErrQPState)
	}
	return nil
}

// Close moves the QP to the error state and releases it. Messages that had
// arrived in the inbox complete first, then the posted RECVs complete as
// flushed (into the CQ, unless it is closed). The peer learns it only as
// RC would: its later sends fail with StatusRetryExceeded (a gone message
// on the link tells it). An exchange in flight is aborted. Close unmaps the
// peer's memory: slices from MapRemote must not be used afterwards. A
// second Close returns verbs.ErrClosed.
func (q *QP) Close() error {
	q.cmu.Lock()
	if q.isClosing {
		q.cmu.Unlock()
		return verbs.ErrClosed
	}
	q.isClosing = true
	close(q.closing) // aborts an exchange in flight
	q.cmu.Unlock()
	unregister(q)

	q.smu.Lock()
	q.rmu.Lock()
	q.failLocked(verbs.StatusFlushed, true)
	q.state.Store(stateClosed)
	q.rmu.Unlock()

	q.cmu.Lock()
	l, id, peerID, inFD, lnRef := q.link, q.id, q.peerID, q.inFD, q.lnRef
	q.link, q.inFD, q.lnRef = nil, -1, false
	q.cmu.Unlock()
	peer := peerSide{in: q.out, mrs: q.peerMRs}
	peer.release()
	q.out, q.peerMRs, q.lastMR = inbox{}, nil, nil
	q.smu.Unlock()

	if l != nil {
		_ = l.write(appendID(appendHeader(nil, msgGone), peerID), nil)
	}
	q.cq.detach(q) // from here on, neither Poll nor Arm reads q.in
	q.in.release()
	closeFD(inFD)
	q.dev.forgetQP(q)
	if lnRef {
		releaseListener()
	}
	q.setEstablished(verbs.ErrClosed)
	if l != nil {
		l.unbind(id)
	}
	return nil
}

var errNilWR = errors.New("shm: nil work request")

// localSGE validates a local scatter/gather entry; it returns a nil MR for
// an empty SGE without one.
func (q *QP) localSGE(s *verbs.SGE) (*MR, error) {
	if s.MR == nil {
		if s.Offset != 0 || s.Length != 0 {
			return nil, fmt.Errorf("%w: shm: %d bytes at %d without a memory region", verbs.ErrBounds, s.Length, s.Offset)
		}
		return nil, nil
	}
	mr, ok := s.MR.(*MR)
	switch {
	case !ok || mr == nil:
		return nil, fmt.Errorf("%w: shm: %T is not a shm memory region", verbs.ErrBounds, s.MR)
	case mr.dev != q.dev:
		return nil, fmt.Errorf("%w: shm: memory region of another device", verbs.ErrBounds)
	case !sgeIn(s.Offset, s.Length, len(mr.buf)):
		return nil, fmt.Errorf("%w: shm: %d bytes at %d in a region of %d", verbs.ErrBounds, s.Length, s.Offset, len(mr.buf))
	case mr.pins.Load()&mrClosed != 0:
		return nil, fmt.Errorf("%w: shm: memory region closed (%w)", verbs.ErrBounds, verbs.ErrClosed)
	}
	return mr, nil
}
