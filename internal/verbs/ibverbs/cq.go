//go:build cgo && linux

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// pollBatch is how many completions one ibv_poll_cq call takes at most.
const pollBatch = 32

// ackBatch is how many completion events are acknowledged at once
// (ibv_ack_cq_events takes a lock; all are acknowledged before destroy).
const ackBatch = 64

// CQ is a completion queue. It implements verbs.CQ. Its events come
// through a completion channel it shares with other CQs of its device
// context (compChannel), so a CQ costs no file descriptor or goroutine of
// its own.
type CQ struct {
	dev    *Device
	cq     *C.struct_rs_cq
	cc     *compChannel
	vector int // completion vector (devCtx.channel)
	notify func()
	armed  atomic.Bool // an Arm in effect: the next event calls notify
	closed atomic.Bool
	failed atomic.Pointer[error] // set once the CQ or its channel failed (fail)

	// mu serialises Poll (the wc array) and Arm, and guards qps.
	mu  sync.Mutex
	wcs [pollBatch]C.struct_rs_wc
	qps map[uint32]*QP // by QP number: translates completions
	// dead counts the attached QPs known to be in the error state whose
	// work Poll may have to flush itself (flushDead).
	dead atomic.Int32

	unacked C.uint // events read and not acknowledged; guarded by cc.mu
}

// NewCQ creates a completion queue of at least depth entries whose
// notifications call notify (verbs.CQ). A depth beyond the device's
// max_cqe is refused, not shrunk (devLimits says why).
func (d *Device) NewCQ(depth int, notify func()) (verbs.CQ, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	if depth <= 0 {
		return nil, fmt.Errorf("ibverbs: CQ depth %d", depth)
	}
	if err := d.dc.limits.checkCQ(d.t.dev, depth); err != nil {
		return nil, err
	}
	cc, vector, err := d.dc.channel()
	if err != nil {
		return nil, err
	}
	q := &CQ{dev: d, cc: cc, vector: vector, notify: notify, qps: map[uint32]*QP{}}
	var e C.int
	q.cq = C.rs_create_cq(d.dc.ctx, C.int(depth), cc.ch, C.int(vector), &e)
	if q.cq == nil && outOfMemory(e) {
		DrainPools() // pooled regions count against RLIMIT_MEMLOCK
		q.cq = C.rs_create_cq(d.dc.ctx, C.int(depth), cc.ch, C.int(vector), &e)
	}
	if q.cq == nil {
		cc.done()
		return nil, errnoErr(fmt.Sprintf("create CQ of %d entries on completion vector %d", depth, vector), e)
	}
	if err := cc.add(q); err != nil {
		if C.rs_destroy_cq(q.cq) == 0 {
			cc.done()
		}
		return nil, err
	}
	d.dc.mu.Lock()
	d.dc.cqs[q.cq] = q
	d.dc.ncq++
	d.dc.mu.Unlock()
	return q, nil
}

// Poll moves up to len(wc) completions into wc.
func (q *CQ) Poll(wc []verbs.Completion) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed.Load() {
		return 0, verbs.ErrClosed
	}
	if err := q.failed.Load(); err != nil {
		return 0, *err
	}
	got := 0
	for got < len(wc) {
		want := min(len(wc)-got, pollBatch)
		r := int(C.rs_poll_cq(q.cq, C.int(want), &q.wcs[0]))
		if r < 0 {
			return got, fmt.Errorf("ibverbs: poll CQ: error %d", r)
		}
		for i := range r {
			if q.translate(&q.wcs[i], &wc[got]) {
				got++
			}
		}
		if r < want {
			break
		}
	}
	if got < len(wc) && q.dead.Load() > 0 {
		got += q.flushDead(wc[got:])
	}
	return got, nil
}

// flushDead completes, as flushed, the work still outstanding on QPs
// known to be in the error state (QP.markDead), once the device has no
// completion left to give. Some devices never complete work posted as the
// QP went to the error state (soft-iWARP takes such posts and drops
// them); RC promises that every request completes, so the provider keeps
// the promise. A completion the device still delivers later for a
// request completed here is recognised by its sequence number and
// dropped (translate).
func (q *CQ) flushDead(wc []verbs.Completion) int {
	n := 0
	for _, qp := range q.qps {
		if !qp.isDead() {
			continue
		}
		why := qp.why()
		qp.smu.Lock()
		for seq := qp.sqTail.Load(); seq < qp.sqHead && n < len(wc); seq++ {
			id, op := qp.retireSend(seq)
			wc[n] = verbs.Completion{ID: id, Op: op, Status: verbs.StatusFlushed, Why: why}
			n++
		}
		qp.smu.Unlock()
		qp.rmu.Lock()
		for seq := qp.rqTail.Load(); seq < qp.rqHead && n < len(wc); seq++ {
			id, op := qp.retireRecv(seq)
			wc[n] = verbs.Completion{ID: id, Op: op, Status: verbs.StatusFlushed, Why: why}
			n++
		}
		qp.rmu.Unlock()
	}
	return n
}

// wake calls an armed notification, so that a caller waiting for the CQ
// polls: a QP of it went to the error state (QP.markDead).
func (q *CQ) wake() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.armed.Swap(false) && !q.closed.Load() {
		q.notify()
	}
}

// wrRecv marks a receive work request's ID (send IDs have it clear).
const wrRecv = 1 << 63

// translate turns a device completion into a verbs.Completion, from the
// QP's record of what it posted (the device's opcode is undefined on
// errors). It reports false for a completion of a QP this CQ does not
// know, which is dropped.
func (q *CQ) translate(w *C.struct_rs_wc, c *verbs.Completion) bool {
	qp := q.qps[uint32(w.qp_num)]
	if qp == nil {
		return false
	}
	id := uint64(w.wr_id)
	*c = verbs.Completion{Status: status(w.status)}
	if c.Status != verbs.StatusSuccess {
		// The NIC's syndrome, for the error text (Completion.Err): on
		// hardware it tells apart the causes one status lumps together.
		c.Vendor = uint32(w.vendor_err)
		c.Why = qp.why()
	}
	if id&wrRecv != 0 {
		if id&^wrRecv < qp.rqTail.Load() {
			return false // completed already (flushDead)
		}
		c.ID, c.Op = qp.retireRecv(id &^ wrRecv)
		if c.Status == verbs.StatusSuccess {
			c.Len = int(w.byte_len)
		}
		return true
	}
	if id < qp.sqTail.Load() {
		return false // completed already (flushDead)
	}
	c.ID, c.Op = qp.retireSend(id)
	return true
}

// status maps enum ibv_wc_status.
func status(s C.uint32_t) verbs.Status {
	switch s {
	case C.RS_WC_SUCCESS:
		return verbs.StatusSuccess
	case C.RS_WC_WR_FLUSH_ERR:
		return verbs.StatusFlushed
	case C.RS_WC_REM_ACCESS_ERR:
		return verbs.StatusRemoteAccess
	case C.RS_WC_LOC_LEN_ERR:
		return verbs.StatusLocalLength
	case C.RS_WC_RNR_RETRY_EXC_ERR:
		return verbs.StatusRNR
	case C.RS_WC_RETRY_EXC_ERR:
		return verbs.StatusRetryExceeded
	}
	return verbs.StatusFatal
}

// Arm requests one notification (verbs.CQ): the armed flag first, then
// the device's arming, so that the event it causes finds the flag set.
func (q *CQ) Arm() error { return q.arm(0) }

// ArmSolicited is Arm for solicited completions only (verbs.CQ): the
// device's solicited_only arming.
// On iWARP devices it is a full Arm: soft-iWARP never reports a receive
// completion as solicited, so a solicited-only Arm would never fire there
// (verbs.CQ allows notifying for more than asked).
func (q *CQ) ArmSolicited() error {
	if q.dev.t.iwarp {
		return q.arm(0)
	}
	return q.arm(1)
}

func (q *CQ) arm(solicitedOnly C.int) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed.Load() {
		return verbs.ErrClosed
	}
	if err := q.failed.Load(); err != nil {
		return *err
	}
	q.armed.Store(true)
	if e := C.rs_req_notify_cq(q.cq, solicitedOnly); e != 0 {
		q.armed.Store(false)
		return errnoErr("arm CQ", e)
	}
	return nil
}

// Disarm withdraws an Arm (verbs.CQ). The device's arming cannot be
// withdrawn: its event, if it comes, is dropped.
func (q *CQ) Disarm() { q.armed.Store(false) }

// fail records a failure of the CQ (an overrun, its channel unreadable):
// Poll and Arm return err from now on, and an armed notification fires,
// so that the waiting caller polls and learns it (verbs.CQ). Taking mu
// orders it before Close's return.
func (q *CQ) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.failed.CompareAndSwap(nil, &err)
	if q.armed.Swap(false) && !q.closed.Load() {
		q.notify()
	}
}

// Close destroys the CQ. Close the QPs first. notify is not called once
// it returned.
func (q *CQ) Close() error {
	if q.closed.Swap(true) {
		return nil
	}
	q.dev.dc.mu.Lock()
	delete(q.dev.dc.cqs, q.cq)
	q.dev.dc.mu.Unlock()
	n := q.cc.remove(q) // waits out a notify in progress
	q.mu.Lock()         // waits out a Poll or Arm in progress; later ones see closed
	if n > 0 {
		C.rs_ack_cq_events(q.cq, n)
	}
	q.mu.Unlock()
	// ibv_destroy_cq waits until every event read for this CQ is
	// acknowledged: a completion event the channel's reader took and the
	// asynchronous event of an overrun (devCtx.handle calls fail, which
	// takes mu, before it acknowledges). So no lock of ours is held here.
	if e := C.rs_destroy_cq(q.cq); e != 0 {
		return errnoErr("destroy CQ", e) // it keeps its hold on the channel
	}
	q.cc.done()
	q.dev.dc.mu.Lock()
	q.dev.dc.ncq--
	q.dev.dc.mu.Unlock()
	q.dev.dc.releaseIfDead()
	return nil
}

func (q *CQ) attach(qp *QP) {
	q.mu.Lock()
	q.qps[qp.qpn] = qp
	q.mu.Unlock()
}
