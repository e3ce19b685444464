package sim

import (
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// workQueue is the accounting of one send or receive queue.
type workQueue struct {
	depth int32
	// used counts slots held by requests whose completion has not been
	// polled yet. The owning QP increments it when posting (under its lock);
	// CQ.Poll decrements it.
	used atomic.Int32
	// lastVisible is the visibility time of the queue's latest completion,
	// guarded by the mutex of the queue's CQ.
	lastVisible time.Time
}

// entry is a completion on its way through a CQ.
type entry struct {
	c     verbs.Completion
	wq    *workQueue
	slots int32     // work-queue slots freed when polled
	at    time.Time // when it becomes visible
	sol   bool      // solicited: the receive of a solicited SEND, or a failure
}

// CQ is a simulated completion queue. It implements verbs.CQ.
type CQ struct {
	dev   *Device
	depth int

	notify func() // called once per Arm, for the first completion made visible after it

	// mu is taken while QP locks are held; nothing is locked under it.
	mu          sync.Mutex
	closed      bool
	overrun     bool
	armed       byte    // 0, armAll or armSolicited
	ready       []entry // visible, in order, from head on
	head        int
	pending     []entry // delayed, in generation order
	lastVisible time.Time
	timer       *time.Timer
	timerAt     time.Time
	qps         map[*QP]struct{} // attached QPs, moved to error on overrun
}

var _ verbs.CQ = (*CQ)(nil)

// Poll moves up to len(wc) visible completions into wc without blocking and
// returns how many. Polling a completion frees the work-queue slots it
// retires. It fails with verbs.ErrClosed after Close and with ErrCQOverrun
// after an overrun.
func (cq *CQ) Poll(wc []verbs.Completion) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if err := cq.errLocked(); err != nil {
		return 0, err
	}
	if len(cq.pending) > 0 {
		cq.promoteLocked(time.Now())
	}
	n := min(len(wc), len(cq.ready)-cq.head)
	for i := range n {
		e := &cq.ready[cq.head+i]
		wc[i] = e.c
		e.wq.used.Add(-e.slots)
		*e = entry{}
	}
	cq.head += n
	switch {
	case cq.head == len(cq.ready):
		cq.ready, cq.head = cq.ready[:0], 0
	case cq.head > 1024 && cq.head > len(cq.ready)/2:
		k := copy(cq.ready, cq.ready[cq.head:])
		clear(cq.ready[k:])
		cq.ready, cq.head = cq.ready[:k], 0
	}
	return n, nil
}

// Arm requests one notification: notify is called once the next completion
// becomes visible after the call. It fails with verbs.ErrClosed after Close
// and with ErrCQOverrun after an overrun.
func (cq *CQ) Arm() error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if err := cq.errLocked(); err != nil {
		return err
	}
	cq.armed = armAll
	return nil
}

// ArmSolicited is Arm for solicited completions only (verbs.CQ).
func (cq *CQ) ArmSolicited() error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if err := cq.errLocked(); err != nil {
		return err
	}
	cq.armed = armSolicited
	return nil
}

// Values of CQ.armed.
const (
	armAll       = 1
	armSolicited = 2
)

// Disarm withdraws an Arm that has not fired.
func (cq *CQ) Disarm() {
	cq.mu.Lock()
	cq.armed = 0
	cq.mu.Unlock()
}

// Close releases the CQ and drops the completions it holds.
// Completions generated later by QPs still using it are discarded. A second
// Close returns verbs.ErrClosed.
func (cq *CQ) Close() error {
	cq.mu.Lock()
	if cq.closed {
		cq.mu.Unlock()
		return verbs.ErrClosed
	}
	cq.closed = true
	cq.armed = 0
	cq.dropLocked()
	clear(cq.qps)
	cq.mu.Unlock()
	cq.dev.forgetCQ(cq)
	return nil
}

func (cq *CQ) errLocked() error {
	switch {
	case cq.closed:
		return verbs.ErrClosed
	case cq.overrun:
		return ErrCQOverrun
	}
	return nil
}

func (cq *CQ) dropLocked() {
	cq.ready, cq.head = nil, 0
	cq.pending = nil
	if cq.timer != nil {
		cq.timer.Stop()
		cq.timer = nil
	}
}

func (cq *CQ) attach(q *QP) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return false
	}
	cq.qps[q] = struct{}{}
	return true
}

func (cq *CQ) detach(q *QP) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	delete(cq.qps, q)
}

// push adds a completion generated now, delayed according to f; sol marks
// the receive of a solicited SEND. The caller may hold QP locks.
func (cq *CQ) push(c verbs.Completion, wq *workQueue, slots int32, f *Faults, sol bool) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed || cq.overrun {
		return
	}
	if len(cq.ready)-cq.head+len(cq.pending) >= cq.depth {
		cq.overrunLocked()
		return
	}
	now := time.Now()
	if len(cq.pending) > 0 {
		cq.promoteLocked(now)
	}
	at := now.Add(f.completionDelay())
	if at.Before(wq.lastVisible) {
		at = wq.lastVisible
	}
	if !f.Reorder && at.Before(cq.lastVisible) {
		at = cq.lastVisible
	}
	wq.lastVisible = at
	if at.After(cq.lastVisible) {
		cq.lastVisible = at
	}
	e := entry{c: c, wq: wq, slots: slots, at: at, sol: sol || c.Status != verbs.StatusSuccess}
	if !at.After(now) {
		// Nothing of this queue (or, without Reorder, of this CQ) is still
		// pending: everything that was due has just been promoted.
		cq.ready = append(cq.ready, e)
		cq.notifyLocked(e.sol)
		return
	}
	cq.pending = append(cq.pending, e)
	cq.scheduleLocked(at, now)
}

// promoteLocked makes the pending completions that are due visible. As the
// visibility times of one work queue never decrease, taking every due entry
// in generation order keeps the per-queue order.
func (cq *CQ) promoteLocked(now time.Time) {
	kept := cq.pending[:0]
	moved, sol := false, false
	var next time.Time
	for _, e := range cq.pending {
		if e.at.After(now) {
			kept = append(kept, e)
			if next.IsZero() || e.at.Before(next) {
				next = e.at
			}
			continue
		}
		cq.ready = append(cq.ready, e)
		moved, sol = true, sol || e.sol
	}
	clear(cq.pending[len(kept):])
	cq.pending = kept
	if moved {
		cq.notifyLocked(sol)
	}
	if !next.IsZero() {
		cq.scheduleLocked(next, now)
	}
}

// scheduleLocked makes sure a timer promotes pending entries at or before at.
func (cq *CQ) scheduleLocked(at, now time.Time) {
	if cq.timer != nil && !cq.timerAt.After(at) {
		return
	}
	if cq.timer != nil {
		cq.timer.Stop()
	}
	cq.timerAt = at
	cq.timer = time.AfterFunc(at.Sub(now), cq.onTimer)
}

func (cq *CQ) onTimer() {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed || cq.overrun {
		return
	}
	// A stopped timer may still fire; promoteLocked reschedules if needed.
	cq.timer = nil
	if len(cq.pending) > 0 {
		cq.promoteLocked(time.Now())
	}
}

// notifyLocked fires an armed notification for completions just made
// visible, sol if one of them is solicited. notify is called under mu: it
// does not block and does not call the CQ (verbs.CQ).
func (cq *CQ) notifyLocked(sol bool) {
	if cq.armed == armAll || cq.armed == armSolicited && sol {
		if f := cq.dev.prov.currentFaults(); f.LoseWakes > 0 && rand.Float64() < f.LoseWakes {
			return
		}
		cq.armed = 0
		cq.notify()
	}
}

// overrunLocked breaks the CQ: completions are dropped, Poll fails with
// ErrCQOverrun, an armed notification fires, and the attached QPs move to the error state (from
// another goroutine, as QP locks may be held here).
func (cq *CQ) overrunLocked() {
	cq.overrun = true
	cq.dropLocked()
	cq.notifyLocked(true)
	qps := slices.Collect(maps.Keys(cq.qps))
	go func() {
		for _, q := range qps {
			q.ForceError()
		}
	}()
}
