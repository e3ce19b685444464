//go:build linux

package shm

import (
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// CQ is a completion queue. It implements verbs.CQ.
//
// Local completions (send completions, made at post time, and flushed or
// failed receives) wait in a bounded queue. Completions of incoming
// messages are not queued: Poll makes them from the inboxes of the attached
// QPs, matching each entry with the QP's oldest posted RECV. Notification:
// Sleeping in the package documentation.
type CQ struct {
	dev    *Device
	depth  int
	notify func()

	closed  atomic.Bool
	overrun atomic.Bool
	armed   atomic.Uint32 // 0, armAll or armSolicited: the inboxes' sleeping value too

	// mu serialises the consumers of the attached QPs' inboxes (Poll) and
	// guards qps. It is taken before a QP's rmu, never after.
	mu  sync.Mutex
	qps []*QP
	rr  int // round-robin start of the next Poll

	// lmu guards the local queue; nothing is locked under it.
	lmu    sync.Mutex
	local  []localEntry // ring buffer, grown up to depth
	lhead  int
	lcount atomic.Int32 // entries queued; written under lmu

	// peekMu lets Pending read qps without mu: qps changes with both held,
	// so a QP removed from it is no longer read once detach returns.
	peekMu sync.RWMutex
}

// localEntry is a queued local completion and the work-queue slots its
// polling frees.
type localEntry struct {
	c     verbs.Completion
	used  *atomic.Int32
	slots int32
}

var (
	_ verbs.CQ     = (*CQ)(nil)
	_ verbs.Peeker = (*CQ)(nil)
)

// eventOne is the value written to an eventfd to signal it.
var eventOne = func() (b [8]byte) {
	binary.NativeEndian.PutUint64(b[:], 1)
	return b
}()

func newCQ(d *Device, depth int, notify func()) *CQ {
	return &CQ{dev: d, depth: depth, notify: notify, local: make([]localEntry, min(depth, 64))}
}

// Poll moves up to len(wc) completions into wc and returns how many: queued
// local completions first, then the incoming messages of the attached QPs.
// It does not block, make a system call or allocate unless a QP fails (its
// completions are then queued, which may signal an armed CQ). A corrupt
// inbox moves its QP to the error state (its oldest RECV completes with
// verbs.StatusFatal, the others flushed). Errors: verbs.ErrClosed after
// Close, ErrCQOverrun after an overrun.
func (cq *CQ) Poll(wc []verbs.Completion) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return 0, verbs.ErrClosed
	}
	if cq.overrun.Load() {
		for _, q := range cq.qps { // their completions are lost with the CQ
			q.fail(verbs.StatusFlushed, false)
		}
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
// takes no lock a poster or Poll takes (verbs.Peeker), only peekMu for
// reading, and makes two loads of shared memory per QP.
func (cq *CQ) Pending() bool {
	if cq.lcount.Load() > 0 {
		return true
	}
	cq.peekMu.RLock()
	defer cq.peekMu.RUnlock()
	for _, q := range cq.qps {
		if q.in.ready(q.head.Load()) || q.in.hdr.fault.Load() != 0 {
			return true
		}
	}
	return false
}

// Arm requests one notification (verbs.CQ): for a local completion, or an
// entry a peer publishes in the inbox of an attached QP. Poll once more
// after Arm. It makes no system call. Errors: verbs.ErrClosed after Close,
// ErrCQOverrun after an overrun.
func (cq *CQ) Arm() error { return cq.arm(armAll) }

// ArmSolicited is Arm for solicited completions only (verbs.CQ): a SEND
// posted with SendWR.Solicited, or a failure.
func (cq *CQ) ArmSolicited() error { return cq.arm(armSolicited) }

// The values of CQ.armed and of an inbox's sleeping word.
const (
	armAll       = 1
	armSolicited = 2
)

func (cq *CQ) arm(v uint32) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return verbs.ErrClosed
	}
	if cq.overrun.Load() {
		return ErrCQOverrun
	}
	// Sequentially consistent stores, ordered before the loads of the Poll
	// that must follow (Sleeping in the package documentation).
	cq.armed.Store(v)
	for _, q := range cq.qps {
		if q.in.hdr.sleeping.Load() != v { // Sleeping in the package documentation
			q.in.hdr.sleeping.Store(v)
		}
	}
	return nil
}

// Disarm withdraws an Arm: peers stop ringing (verbs.CQ). rsock calls it
// while a blocked call busy-polls.
func (cq *CQ) Disarm() {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	cq.armed.Store(0)
	for _, q := range cq.qps {
		q.in.hdr.sleeping.Store(0)
	}
}

// fire calls notify, once per Arm, if the CQ is armed for a completion
// (sol: a solicited one) rung by a peer or made locally.
func (cq *CQ) fire(sol bool) {
	if v := cq.armed.Load(); (v == armAll || v == armSolicited && sol) && cq.armed.CompareAndSwap(v, 0) {
		cq.notify()
	}
}

// Close releases the CQ and drops its queued completions. Completions that
// QPs still using it generate later are discarded, and notify is not
// called once Close returned; close the QPs first. A second Close returns
// verbs.ErrClosed.
func (cq *CQ) Close() error {
	cq.mu.Lock()
	if cq.closed.Swap(true) {
		cq.mu.Unlock()
		return verbs.ErrClosed
	}
	cq.armed.Store(0)
	cq.peekMu.Lock()
	cq.qps = nil
	cq.peekMu.Unlock()
	cq.mu.Unlock()
	cq.lmu.Lock()
	cq.local, cq.lhead = nil, 0
	cq.lcount.Store(0)
	cq.lmu.Unlock()
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
	cq.peekMu.Lock()
	cq.qps = append(cq.qps, q)
	cq.peekMu.Unlock()
	q.in.hdr.sleeping.Store(cq.armed.Load())
	return true
}

// detach removes q. Once it returns, neither Poll nor Arm touches q's
// inbox.
func (cq *CQ) detach(q *QP) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if i := slices.Index(cq.qps, q); i >= 0 {
		cq.peekMu.Lock()
		cq.qps = slices.Delete(cq.qps, i, i+1)
		cq.peekMu.Unlock()
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
	n := int(cq.lcount.Load()) // written under lmu only
	if n == cq.depth {
		cq.overrun.Store(true)
		cq.local, cq.lhead = nil, 0
		cq.lcount.Store(0)
		cq.lmu.Unlock()
		cq.fire(true)
		return
	}
	if n == len(cq.local) {
		grown := make([]localEntry, min(2*len(cq.local), cq.depth))
		k := copy(grown, cq.local[cq.lhead:])
		copy(grown[k:], cq.local[:cq.lhead])
		cq.local, cq.lhead = grown, 0
	}
	cq.local[(cq.lhead+n)%len(cq.local)] = localEntry{c: c, used: used, slots: slots}
	cq.lcount.Add(1)
	cq.lmu.Unlock()
	cq.fire(c.Status != verbs.StatusSuccess)
}

// popLocal moves queued local completions into wc.
func (cq *CQ) popLocal(wc []verbs.Completion) int {
	cq.lmu.Lock()
	defer cq.lmu.Unlock()
	n := min(len(wc), int(cq.lcount.Load()))
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
	cq.lcount.Add(int32(-n))
	return n
}
