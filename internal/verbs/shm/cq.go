package shm

import (
	"encoding/binary"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// CQ is a completion queue. It implements verbs.CQ.
//
// It holds two kinds of completions. Local ones (send completions, made at
// post time by this process, and flushed or failed receives) wait in a
// bounded queue. Completions of incoming messages are not queued at all:
// Poll makes them from the inboxes of the attached QPs, matching each entry
// with the QP's oldest posted RECV. So a busy CQ costs one mutex and, per
// attached QP, two loads of shared memory when nothing arrived.
//
// Notification has two doorbells, so that a caller waiting on the CQ itself
// (WaitDirect) is woken by the notification, not by the goroutine that
// Wait parks (rsock's event loop). They cost no file descriptor: a peer
// rings them through its link's bell page and eventfd, whose reader
// signals the channel named; a CQ that owns its link (lead.go) has its
// WaitDirect read the link's eventfd itself. Arm (or
// ArmDirect) sets the CQ's local armed value and the sleeping value in the
// inbox of every attached QP to the doorbell wanted; a peer that publishes
// an entry and finds the value set clears it and rings that doorbell, as
// does a local completion finding the CQ armed. A busy CQ (not armed)
// costs its peers no system call.
type CQ struct {
	dev   *Device
	depth int

	direct  chan struct{} // WaitDirect's doorbell, capacity 1
	bell    chan struct{} // Wait's doorbell, capacity 1
	done    chan struct{} // closed by Close: unblocks Wait and WaitDirect
	closed  atomic.Bool
	overrun atomic.Bool
	armed   atomic.Uint32 // 0, armWait or armDirect (the inboxes' sleeping values too)

	// mu serialises the consumers of the attached QPs' inboxes (Poll) and
	// guards qps. It is taken before a QP's rmu, never after.
	mu  sync.Mutex
	qps []*QP
	rr  int // round-robin start of the next Poll

	// lmu guards the local queue; nothing is locked under it.
	lmu    sync.Mutex
	local  []localEntry // ring buffer, grown up to depth
	lhead  int
	ln     int
	lcount atomic.Int32 // ln, readable without lmu

	// Direct waits (lead.go). intent (stored under mu) is the last non-zero value
	// armed: what the attached QPs count for on their links. lead is the
	// link this CQ owns (its WaitDirect reads that link's eventfd),
	// reading the link whose eventfd WaitDirect reads right now.
	intent  atomic.Uint32 // written under mu; ringWanted reads it without
	lead    atomic.Pointer[link]
	reading atomic.Pointer[link]
	woken   atomic.Bool // WakeDirect was called; WaitDirect clears it

	// Pending's view of qps, read without mu: a copy, replaced under mu,
	// and two reader counts by parity of peekEpoch, so that detach can
	// wait until no Pending still reads the inbox of a QP it removed.
	peekQPs   atomic.Pointer[[]*QP]
	peekEpoch atomic.Uint32
	peekers   [2]atomic.Int32
}

// The values of CQ.armed and of an inbox's sleeping field: which doorbell
// the next entry rings. A peer treats any other non-zero value as armWait.
const (
	armWait   = 1 // Wait returns
	armDirect = 2 // WaitDirect returns
)

// localEntry is a queued local completion and the work-queue slots its
// polling frees.
type localEntry struct {
	c     verbs.Completion
	used  *atomic.Int32
	slots int32
}

var (
	_ verbs.CQ           = (*CQ)(nil)
	_ verbs.Disarmer     = (*CQ)(nil)
	_ verbs.DirectWaiter = (*CQ)(nil)
	_ verbs.Peeker       = (*CQ)(nil)
)

// eventOne is the value written to an eventfd to signal it.
var eventOne = func() (b [8]byte) {
	binary.NativeEndian.PutUint64(b[:], 1)
	return b
}()

func newCQ(d *Device, depth int) (*CQ, error) {
	return &CQ{
		dev:    d,
		depth:  depth,
		direct: make(chan struct{}, 1),
		bell:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		local:  make([]localEntry, min(depth, 64)),
	}, nil
}

// Poll moves up to len(wc) completions into wc without blocking and returns
// how many: queued local completions first, then the incoming messages of
// the attached QPs. It does not block; it makes no system call and does
// not allocate unless a QP fails (its completions are then queued, which may
// signal an armed CQ). An inbox whose shared state is corrupt moves its QP
// to the error state (its oldest RECV completes with verbs.StatusFatal, the
// others flushed). Errors: verbs.ErrClosed after Close, ErrCQOverrun after
// an overrun.
func (cq *CQ) Poll(wc []verbs.Completion) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return 0, verbs.ErrClosed
	}
	if cq.overrun.Load() {
		cq.breakQPsLocked()
		return 0, ErrCQOverrun
	}
	n := 0
	if cq.lcount.Load() > 0 {
		n = cq.popLocal(wc)
	}
	if k := len(cq.qps); k > 0 {
		cq.rr++
		for i := 0; i < k && n < len(wc); i++ {
			n += cq.qps[(cq.rr+i)%k].pollInbox(wc[n:])
		}
	}
	// Failures found in an inbox queue their completions locally.
	if n < len(wc) && cq.lcount.Load() > 0 {
		n += cq.popLocal(wc[n:])
	}
	return n, nil
}

// Pending reports whether Poll would find a completion now: a queued
// local one, or an entry (or a fault) in the inbox of an attached QP. It
// takes no lock (verbs.Peeker): it reads a copy of the attached QPs,
// counted as a reader of it (peekers), and makes two loads of shared
// memory per QP.
func (cq *CQ) Pending() bool {
	if cq.lcount.Load() > 0 {
		return true
	}
	e := cq.peekEpoch.Load()
	for {
		cq.peekers[e&1].Add(1)
		e2 := cq.peekEpoch.Load()
		if e2 == e {
			break
		}
		cq.peekers[e&1].Add(-1) // a publish went by: count with the new parity
		e = e2
	}
	pending := false
	if qs := cq.peekQPs.Load(); qs != nil {
		for _, q := range *qs {
			if q.in.hdr.tail.Load() != q.head.Load() || q.in.hdr.fault.Load() != 0 {
				pending = true
				break
			}
		}
	}
	cq.peekers[e&1].Add(-1)
	return pending
}

// publishLocked gives Pending the current qps and waits until no Pending
// reads the previous copy: a QP removed from qps may be unmapped once it
// returns. A Pending that counted itself with the old parity and then saw
// the epoch unchanged did so before the epoch moved (the atomics are
// sequentially consistent), so the wait sees it; one that saw it move
// counts itself again with the new parity and loads the new copy.
func (cq *CQ) publishLocked() {
	qs := slices.Clone(cq.qps)
	cq.peekQPs.Store(&qs)
	old := cq.peekEpoch.Add(1) - 1
	for cq.peekers[old&1].Load() != 0 {
		runtime.Gosched() // a Pending is a few loads: it leaves soon
	}
}

// Arm requests a notification for the next completion: a local one, or an
// entry a peer publishes in the inbox of an attached QP; it makes Wait
// return. Poll once more after Arm before Wait. It makes no system call.
// Errors: verbs.ErrClosed after Close, ErrCQOverrun after an overrun.
func (cq *CQ) Arm() error { return cq.arm(armWait) }

// ArmDirect is Arm for WaitDirect (verbs.DirectWaiter); it replaces an Arm,
// as Arm replaces it.
func (cq *CQ) ArmDirect() error { return cq.arm(armDirect) }

func (cq *CQ) arm(v uint32) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return verbs.ErrClosed
	}
	if cq.overrun.Load() {
		return ErrCQOverrun
	}
	if v != cq.intent.Load() {
		cq.setIntentLocked(v) // a reader for the new doorbell first
	}
	// Each store is sequentially consistent: it is ordered before the loads
	// of the Poll that must follow (see the package documentation).
	cq.armed.Store(v)
	for _, q := range cq.qps {
		q.in.hdr.sleeping.Store(sleepValue(q, v))
	}
	return nil
}

// sleepValue is what q's inbox asks the peer to ring when the CQ arms v:
// WaitDirect of a CQ that does not own q's link is rung through the wait
// doorbell, whose dispatcher always reads (and rings WaitDirect: the CQ
// wants it, ringWanted), so that only the owner's rings go to the direct
// doorbell, which nobody else reads while the owner is busy (lead.go). An
// arm for WaitDirect first tries to take the link (tryTake).
func sleepValue(q *QP, v uint32) uint32 {
	if v != armDirect || q.clink == nil || q.clink.tryTake(q.cq) {
		return v
	}
	return armWait
}

// Disarm withdraws an Arm: peers stop ringing (verbs.Disarmer). rsock calls
// it while a blocked call busy-polls, and arms again after.
func (cq *CQ) Disarm() {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	cq.armed.Store(0)
	for _, q := range cq.qps {
		q.in.hdr.sleeping.Store(0)
	}
}

// Wait blocks until the doorbell Arm asks for rings (an armed notification
// fired, possibly an earlier one: spurious wake-ups happen) and returns nil.
// It parks the goroutine on a channel. It returns verbs.ErrClosed once the
// CQ is closed (Close unblocks it) and ErrCQOverrun after an overrun.
func (cq *CQ) Wait() error {
	if err := cq.waitErr(); err != nil {
		return err
	}
	select {
	case <-cq.bell:
	case <-cq.done:
	}
	return cq.waitErr()
}

// WaitDirect blocks until its doorbell rings (a notification ArmDirect
// asked for, WakeDirect, or spuriously) and returns nil. If the CQ owns
// the link of its QPs (lead.go), it reads that link's eventfd itself,
// parked in the Go netpoller, and returns from its own ring without a
// goroutine hand-off; otherwise it parks on a channel that the link's
// reader signals. One WaitDirect at a time. Errors as Wait's.
func (cq *CQ) WaitDirect() error {
	for {
		if err := cq.waitErr(); err != nil {
			return err
		}
		if cq.woken.Swap(false) {
			return cq.waitErr()
		}
		if l := cq.lead.Load(); l != nil {
			if l.lead(cq) {
				return cq.waitErr()
			}
			continue // woken, closed or no longer the owner: see which
		}
		select {
		case <-cq.direct: // woken, or the CQ became an owner (or stale)
		case <-cq.done:
		}
	}
}

// WakeDirect makes the WaitDirect in progress, or the next one, return. It
// makes no system call: it sets woken, then signals the channel, or, if
// WaitDirect is reading a link's eventfd, sets a read deadline in the past
// on that file, which the Go runtime delivers to the parked goroutine at
// once (as it does net.Conn deadlines). WaitDirect looks at woken after
// each such wake-up, and resets the deadline before it looks, so neither a
// wake-up nor a stale deadline is missed (lead.go).
func (cq *CQ) WakeDirect() {
	cq.woken.Store(true)
	if l := cq.reading.Load(); l != nil {
		kick(l.lfile)
		return
	}
	select {
	case cq.direct <- struct{}{}:
	default:
	}
}

func (cq *CQ) waitErr() error {
	switch {
	case cq.closed.Load():
		return verbs.ErrClosed
	case cq.overrun.Load():
		return ErrCQOverrun
	}
	return nil
}

// ringBell rings Wait's doorbell.
func (cq *CQ) ringBell() {
	select {
	case cq.bell <- struct{}{}:
	default:
	}
}

// ringWanted rings the doorbell the CQ last armed for: a ring through the
// wait doorbell of a CQ that armed direct without owning its link (or a
// stale one, which costs a spurious wake-up).
func (cq *CQ) ringWanted() {
	if cq.intent.Load() == armDirect {
		cq.WakeDirect()
		return
	}
	cq.ringBell()
}

// ring rings the doorbell that the armed value v names.
func (cq *CQ) ring(v uint32) {
	switch v {
	case 0:
	case armDirect:
		cq.WakeDirect()
	default:
		cq.ringBell()
	}
}

// Close releases the CQ, drops its queued completions and unblocks Wait.
// Completions that QPs still using it generate later are discarded; close
// the QPs first. A second Close returns verbs.ErrClosed.
func (cq *CQ) Close() error {
	cq.mu.Lock()
	if cq.closed.Swap(true) {
		cq.mu.Unlock()
		return verbs.ErrClosed
	}
	cq.setIntentLocked(0) // gives up the links it owns
	for _, q := range cq.qps {
		q.clink = nil
	}
	cq.qps = nil
	cq.publishLocked()
	cq.mu.Unlock()
	cq.lmu.Lock()
	cq.local, cq.lhead, cq.ln = nil, 0, 0
	cq.lcount.Store(0)
	cq.lmu.Unlock()
	close(cq.done)
	if l := cq.reading.Load(); l != nil {
		kick(l.lfile) // a leading WaitDirect sees closed
	}
	cq.dev.forgetCQ(cq)
	return nil
}

// attach adds q to the QPs whose inboxes Poll reads; it fails once closed.
func (cq *CQ) attach(q *QP) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return false
	}
	cq.qps = append(cq.qps, q)
	cq.publishLocked()
	return true
}

// linked counts q, connected on link l, for the CQ's doorbell on l (its
// armed intent), unless q was detached meanwhile.
func (cq *CQ) linked(q *QP, l *link) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if q.clink != nil || !slices.Contains(cq.qps, q) {
		return
	}
	q.clink = l
	if in := cq.intent.Load(); in != 0 {
		l.armChange(cq, 0, in)
	}
	// Armed direct before it was linked, without owning the link now: its
	// peer must ring the wait doorbell. If the peer has taken the value
	// already (or the CQ is disarmed), wake WaitDirect: it arms again and
	// polls (a spurious wake-up at worst).
	if cq.armed.Load() == armDirect && !l.tryTake(cq) && !q.in.hdr.sleeping.CompareAndSwap(armDirect, armWait) {
		cq.WakeDirect()
	}
}

// setIntentLocked moves the count of every linked QP from the CQ's intent
// to v (0 when the CQ closes).
func (cq *CQ) setIntentLocked(v uint32) {
	for _, q := range cq.qps {
		if q.clink != nil {
			q.clink.armChange(cq, cq.intent.Load(), v)
		}
	}
	cq.intent.Store(v)
}

// detach removes q. Once it returns, neither Poll nor Arm touches q's
// inbox.
func (cq *CQ) detach(q *QP) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if i := slices.Index(cq.qps, q); i >= 0 {
		if q.clink != nil {
			q.clink.armChange(cq, cq.intent.Load(), 0)
			q.clink = nil
		}
		cq.qps = slices.Delete(cq.qps, i, i+1)
		cq.publishLocked()
	}
}

// push queues a local completion whose polling frees slots of used. The
// caller may hold QP locks. A full queue is an overrun: everything queued
// is dropped and Poll fails from then on.
func (cq *CQ) push(c verbs.Completion, used *atomic.Int32, slots int32) {
	cq.lmu.Lock()
	if cq.closed.Load() || cq.overrun.Load() {
		cq.lmu.Unlock()
		return
	}
	if cq.ln == cq.depth {
		cq.overrun.Store(true)
		cq.local, cq.lhead, cq.ln = nil, 0, 0
		cq.lcount.Store(0)
		cq.lmu.Unlock()
		cq.ringBell()
		cq.WakeDirect()
		return
	}
	if cq.ln == len(cq.local) {
		grown := make([]localEntry, min(2*len(cq.local), cq.depth))
		k := copy(grown, cq.local[cq.lhead:])
		copy(grown[k:], cq.local[:cq.lhead])
		cq.local, cq.lhead = grown, 0
	}
	cq.local[(cq.lhead+cq.ln)%len(cq.local)] = localEntry{c: c, used: used, slots: slots}
	cq.ln++
	cq.lcount.Add(1)
	cq.lmu.Unlock()
	if cq.armed.Load() != 0 {
		cq.ring(cq.armed.Swap(0))
	}
}

// popLocal moves queued local completions into wc.
func (cq *CQ) popLocal(wc []verbs.Completion) int {
	cq.lmu.Lock()
	defer cq.lmu.Unlock()
	n := min(len(wc), cq.ln)
	for i := range n {
		e := &cq.local[cq.lhead]
		wc[i] = e.c
		e.used.Add(-e.slots)
		*e = localEntry{}
		cq.lhead++
		if cq.lhead == len(cq.local) {
			cq.lhead = 0
		}
	}
	cq.ln -= n
	cq.lcount.Add(int32(-n))
	return n
}

// breakQPsLocked moves every attached QP to the error state after an
// overrun; their completions are lost with the CQ.
func (cq *CQ) breakQPsLocked() {
	for _, q := range cq.qps {
		q.fail(verbs.StatusFlushed, false)
	}
}
