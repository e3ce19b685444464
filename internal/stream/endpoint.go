// Package stream runs rsock's ring protocol (internal/ring) over a connected
// verbs queue pair and gives a byte stream with net.Conn semantics: blocking
// Read and Write with deadlines, half-close, close that unblocks everything,
// and teardown on any transport error or protocol violation.
//
// An Endpoint holds one side's resources before the handshake: the device,
// completion queue, queue pair, the receive ring the peer writes into, and
// the receive buffers for state messages, all posted before the Endpoint's
// description is sent. Start turns a connected Endpoint into a Conn.
package stream

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/verbs"
)

// slotSize is the size of one state-message buffer.
const slotSize = 64

// Options size an Endpoint and tune its Conn.
type Options struct {
	RingSize  int           // receive ring bytes: a power of two in [ring.MinRingSize, ring.MaxRingSize]
	Credits   int           // receive work requests for state messages: [ring.MinCredits, ring.MaxCredits]
	SendDepth int           // send queue depth; 0 means 4*Credits (at least 64)
	BusyPoll  time.Duration // how long a blocked Read or Write polls before it parks
	// Failover hands a transport failure to Owner.Failed as an error
	// wrapping ErrMoving, not a reset.
	Failover bool
	// GrowTo is the size the receive ring grows to, once, when the peer's
	// writer blocks (grow.go): a power of two above RingSize, or 0. Set it
	// only when the peer follows a ring move (the handshake says so). A
	// ring the peer maps (shm) starts at GrowTo instead.
	GrowTo int
	// PeerRingLimit is the largest ring a peer's GROW may offer (staging
	// of that size is registered for it); 0 means ring.MaxRingSize.
	PeerRingLimit uint64
}

// Ring describes a receive ring to the peer.
type Ring struct {
	Size    uint64
	Addr    uint64
	RKey    uint32
	Credits uint64
}

// Endpoint is one side's resources before the handshake completes.
type Endpoint struct {
	opts  Options
	dev   verbs.Device
	cq    verbs.CQ
	qp    verbs.QP
	ring  verbs.MR             // our receive ring: the peer writes into it
	slots verbs.MR             // receive buffers for state messages
	stage verbs.MR             // staging for WRITEs into the peer's ring (Prepare), unless the peer's memory is mapped
	owned bool                 // resources not yet handed to a Conn
	rwr   verbs.RecvWR         // reused by postSlot (callers serialise): no allocation per post
	conn  atomic.Pointer[Conn] // the Conn the CQ's notifications go to, once started

	// A ring move (grow.go): our new ring until the peer moves, the old one
	// until its bytes are consumed; the same for our staging, the old until
	// its bytes are acknowledged. Guarded by the Conn's mutex.
	nextRing, oldRing, nextStage, oldStage verbs.MR
}

// NewEndpoint opens a device from p and prepares a queue pair, the receive
// ring and the posted receive buffers.
func NewEndpoint(p verbs.Provider, oo verbs.OpenOptions, opts Options) (_ *Endpoint, err error) {
	if opts.SendDepth == 0 {
		opts.SendDepth = max(4*opts.Credits, 64)
	}
	if opts.Credits < ring.MinCredits || opts.Credits > ring.MaxCredits {
		return nil, fmt.Errorf("stream: %d credits not in [%d, %d]", opts.Credits, ring.MinCredits, ring.MaxCredits)
	}
	if rs := uint64(opts.RingSize); rs&(rs-1) != 0 || rs < ring.MinRingSize || rs > ring.MaxRingSize {
		return nil, fmt.Errorf("stream: ring size %d is not a power of two in [%d, %d]", opts.RingSize, ring.MinRingSize, ring.MaxRingSize)
	}
	if g := uint64(opts.GrowTo); g != 0 && (g&(g-1) != 0 || g <= uint64(opts.RingSize) || g > ring.MaxRingSize) {
		return nil, fmt.Errorf("stream: ring growth to %d is not a power of two in (%d, %d]", opts.GrowTo, opts.RingSize, ring.MaxRingSize)
	}
	e := &Endpoint{opts: opts, owned: true}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if e.dev, err = p.Open(oo); err != nil {
		return nil, err
	}
	// Send completions (at most SendDepth) and receive completions (at most
	// Credits) share the queue.
	if e.cq, err = e.dev.NewCQ(opts.SendDepth+opts.Credits, e.notify); err != nil {
		return nil, fmt.Errorf("stream: completion queue: %w", err)
	}
	if e.qp, err = e.dev.NewQP(verbs.QPAttr{CQ: e.cq, SendDepth: opts.SendDepth, RecvDepth: opts.Credits, MaxInline: ring.MsgLen}); err != nil {
		return nil, fmt.Errorf("stream: queue pair: %w", err)
	}
	if _, mapped := e.qp.(verbs.RemoteMapper); mapped && opts.GrowTo != 0 {
		// The peer maps our ring and cannot map one registered later:
		// it starts at the size it would grow to.
		e.opts.RingSize, e.opts.GrowTo = opts.GrowTo, 0
	}
	if e.ring, err = e.dev.AllocMR(e.opts.RingSize, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		return nil, fmt.Errorf("stream: receive ring: %w", err)
	}
	if e.slots, err = e.dev.AllocMR(opts.Credits*slotSize, verbs.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("stream: receive buffers: %w", err)
	}
	for i := range opts.Credits {
		if err = e.postSlot(i); err != nil {
			return nil, fmt.Errorf("stream: posting receive buffers: %w", err)
		}
	}
	return e, nil
}

// notify goes to the Conn once started (nothing arms the CQ before).
func (e *Endpoint) notify() {
	if c := e.conn.Load(); c != nil {
		c.notify()
	}
}

// postSlot posts receive buffer i. Callers serialise: setup, then Conn.mu.
func (e *Endpoint) postSlot(i int) error {
	e.rwr = verbs.RecvWR{ID: uint64(i), Local: verbs.SGE{MR: e.slots, Offset: i * slotSize, Length: slotSize}}
	return e.qp.PostRecv(&e.rwr)
}

// Ring describes our receive ring for the peer.
func (e *Endpoint) Ring() Ring {
	return Ring{Size: uint64(e.opts.RingSize), Addr: e.ring.Addr(), RKey: e.ring.RKey(), Credits: uint64(e.opts.Credits)}
}

// Info is the queue pair's description for the peer.
func (e *Endpoint) Info() []byte { return e.qp.Info() }

// Connect connects the queue pair to the peer's description (verbs.QP.Connect).
func (e *Endpoint) Connect(ctx context.Context, peer []byte, active bool) error {
	return e.qp.Connect(ctx, peer, active)
}

// Prepare allocates the staging the WRITEs into the peer's ring are copied
// from, as large as that ring, unless the provider maps the peer's memory.
// rsock calls it before either side switches, so that a registration the
// host refuses (RLIMIT_MEMLOCK) costs only the ring, not the connection.
// Start calls it if nobody did.
func (e *Endpoint) Prepare(peer Ring) error {
	if err := validatePeer(peer); err != nil {
		return err
	}
	if _, mapped := e.qp.(verbs.RemoteMapper); mapped || e.stage != nil {
		return nil
	}
	m, err := e.dev.AllocMR(int(peer.Size), verbs.AccessLocalWrite)
	if err != nil {
		return fmt.Errorf("stream: staging for the peer's ring: %w", err)
	}
	e.stage = m
	return nil
}

// Established waits, on the passive side, for the connection's side
// exchanges to finish; see verbs.QP.Established.
func (e *Endpoint) Established(ctx context.Context) error { return e.qp.Established(ctx) }

// Close releases the resources of an Endpoint not started; a no-op after Start.
func (e *Endpoint) Close() {
	if !e.owned {
		return
	}
	e.owned = false
	e.release(nil)
}

// release frees everything, QP first so outstanding work is flushed, then
// the memory the provider could have written into.
func (e *Endpoint) release(drain func()) {
	if e.qp != nil {
		_ = e.qp.Close()
	}
	if drain != nil {
		drain()
	}
	if e.cq != nil {
		_ = e.cq.Close()
	}
	for _, mr := range e.regions() {
		_ = mr.Close()
	}
	if e.dev != nil {
		_ = e.dev.Close()
	}
}

// regions are the memory regions held now, a ring move's included.
func (e *Endpoint) regions() []verbs.MR {
	all := []verbs.MR{e.ring, e.slots, e.stage, e.nextRing, e.oldRing, e.nextStage, e.oldStage}
	held := all[:0]
	for _, mr := range all {
		if mr != nil {
			held = append(held, mr)
		}
	}
	return held
}

// validatePeer checks the peer's ring description against the protocol's
// bounds before anything is sized from it.
func validatePeer(r Ring) error {
	if r.Size&(r.Size-1) != 0 || r.Size < ring.MinRingSize || r.Size > ring.MaxRingSize {
		return fmt.Errorf("stream: peer ring size %d is not a power of two in [%d, %d]", r.Size, ring.MinRingSize, ring.MaxRingSize)
	}
	if r.Credits < ring.MinCredits || r.Credits > ring.MaxCredits {
		return fmt.Errorf("stream: peer credits %d not in [%d, %d]", r.Credits, ring.MinCredits, ring.MaxCredits)
	}
	if r.Addr+r.Size < r.Addr {
		return errors.New("stream: peer ring address overflows")
	}
	return nil
}
