package stream

import (
	"net"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/sysdep"
)

// Waiting: docs/protocol.md §4.1. A call registers its entry and checks
// its condition, both under mu; whoever changes the state under mu signals
// the entries concerned (wakeLocked), and an entry's channel (capacity 1)
// keeps a signal sent before its call parks: no wake-up is lost. The
// poller arms the queue, then polls once more (a completion before the Arm
// is found by that poll, one after it fires notify), and hands the role on
// when it leaves: while any call is parked, the queue is armed for one.

// Test hooks: a call about to park (after it became the poller or found
// one, with mu released), a poller that has let go of the role and not
// yet polled (mu held), and a spinner about to hand its P on.
var testHookParking, testHookLeaving, testHookYield atomic.Pointer[func(*Conn)]

// How the queue is armed (Conn.armed).
const (
	armNone = iota
	armSolicited
	armAll
)

// event is what a blocked call waits for.
type event uint8

const (
	evRead  event = 1 << iota // bytes readable, EOF, the read side or the peer gone
	evWrite                   // ring space, credits, send-queue room, the write side ended
	evClose                   // the final message acknowledged
)

// entry is one waiting call's place: its events, its channel (capacity 1),
// and the channel that ends its waits (the Conn's close; nil for Close's).
type entry struct {
	ev     event
	ch     chan struct{}
	stop   <-chan struct{}
	parked atomic.Bool  // the call is parked; whoever clears it first, signal or the call, counts the wake-up
	sigAt  atomic.Int64 // when signal woke the parked call (monotonic), for parkCost; 0: it did not
}

// signal wakes e's call; a parked one counts as woken until it runs.
func (e *entry) signal() {
	if e.parked.CompareAndSwap(true, false) {
		woken.Add(1)
		e.sigAt.Store(monotonic())
	}
	select {
	case e.ch <- struct{}{}:
	default:
	}
}

// init sets e up in place (an entry holds an atomic: it is not copied).
func (e *entry) init(ev event, stop <-chan struct{}) *entry {
	e.ev, e.ch, e.stop = ev, make(chan struct{}, 1), stop
	return e
}

func (c *Conn) wakeLocked(ev event) {
	for _, e := range c.waiting {
		if e.ev&ev != 0 {
			e.signal()
		}
	}
}

// wait blocks the calling goroutine on e until one of e's events, dl or
// Close. The caller holds mu, has drained e.ch and then checked its
// condition under it; mu is released while the call spins or parks, and
// held again on return. It returns nil when woken (the caller checks
// again: spurious wake-ups happen), os.ErrDeadlineExceeded or
// net.ErrClosed. With poll (a wait for the peer) it may busy-poll first.
func (c *Conn) wait(e *entry, dl *deadline.Deadline, poll bool) error {
	c.waiting = append(c.waiting, e)
	defer c.leaveLocked(e)
	if poll {
		if w := spinWindow(c.opts.BusyPoll); w > 0 && takeSpinSlot() {
			done, err := c.spin(e, dl, w)
			spinning.Add(-1)
			if done {
				return err
			}
		}
	}
	if c.poller.Load() == nil {
		c.pollFor(e)
	}
	e.parked.Store(true)
	c.mu.Unlock()
	if h := testHookParking.Load(); h != nil {
		(*h)(c)
	}
	var err error
	select {
	case <-e.ch:
		c.stats.Wakeups.Add(1)
	case <-dl.Wait():
		err = os.ErrDeadlineExceeded
	case <-e.stop:
		err = net.ErrClosed
	}
	if !e.parked.CompareAndSwap(true, false) {
		woken.Add(-1) // signal counted this call as woken
	}
	if at := e.sigAt.Swap(0); at != 0 {
		recordWake(monotonic() - at)
	}
	c.mu.Lock()
	return err
}

// pollFor makes e the poller: the queue's notification goes to e (armed
// unless the Conn failed; Close's own wait arms it too), and completions
// that came before are handled now. mu is held.
func (c *Conn) pollFor(e *entry) {
	c.poller.Store(e)
	if c.err != nil {
		return
	}
	c.armed.Store(armAll) // before the Arm: a notification after it clears it
	if err := c.ep.cq.Arm(); err != nil {
		c.transportFailedLocked(reset("arming the completion queue", err))
		return
	}
	c.progressLocked()
}

// leaveLocked removes e from the waiting entries; a poller handles what woke
// it and hands the role on, or arms for background progress if it was last.
func (c *Conn) leaveLocked(e *entry) {
	if i := slices.Index(c.waiting, e); i >= 0 {
		c.waiting = slices.Delete(c.waiting, i, i+1)
	}
	if c.poller.Load() != e {
		return
	}
	c.poller.Store(nil)
	if h := testHookLeaving.Load(); h != nil {
		(*h)(c)
	}
	c.progressLocked()
	if len(c.waiting) > 0 {
		c.pollFor(c.waiting[0])
		return
	}
	c.idleLocked()
}

// idleLocked arms the queue for background progress once no call is in
// the Conn and no entry waits, then polls for what came before the arm: a
// queue armed so already, which has not notified since, is not armed
// again, and polled only if it may hold something (Peeker). Which
// completions it arms for, if any: docs/protocol.md §4.1.
func (c *Conn) idleLocked() {
	if c.active.Load() > 0 || len(c.waiting) > 0 || c.life >= lifeClosing || c.err != nil {
		return
	}
	want := uint32(armNone)
	switch {
	case c.st.Unannounced() > 0 || c.st.FINPending() || c.st.NeedUpdate() || c.rd.shut:
		want = armAll // we owe the peer something, or discard what comes
	case !c.lentLocked():
		want = armSolicited
	}
	if want != armNone {
		if c.armed.Load() == want {
			if c.peek == nil || c.peek.Pending() {
				c.progressLocked() // credits and space a Write that never waits needs
			}
			return
		}
		c.armed.Store(want) // before the Arm: a notification after it clears it
		var err error
		if want == armAll {
			err = c.ep.cq.Arm()
		} else {
			err = c.ep.cq.ArmSolicited()
		}
		if err != nil {
			c.transportFailedLocked(reset("arming the completion queue", err))
			return
		}
	}
	c.progressLocked()
}

// notify is the CQ's notification (verbs.CQ): it wakes the poller, or, with
// none and no call in the Conn, starts background progress (a call polls
// when it parks or leaves). It does not block and takes no lock.
func (c *Conn) notify() {
	c.armed.Store(armNone) // a notification ends an Arm
	c.stats.Notifications.Add(1)
	if e := c.poller.Load(); e != nil {
		e.signal()
		return
	}
	if c.active.Load() == 0 && c.bgRun.CompareAndSwap(false, true) {
		c.stats.Background.Add(1)
		go c.background()
	}
}

// background makes the progress a notification asked for while no call
// waited, and arms the queue again if the Conn is still idle.
func (c *Conn) background() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bgRun.Store(false) // before the poll: a later notification starts another
	if c.life >= lifeClosing || c.poller.Load() != nil {
		return // the poller handles it (leaveLocked polls)
	}
	c.progressLocked()
	c.idleLocked()
}

// enterLocked counts a call in the Conn, unless Close or Detach started;
// exit uncounts it, and arms for background progress when it was the last.
func (c *Conn) enterLocked() error {
	if c.life >= lifeClosing {
		return net.ErrClosed
	}
	c.active.Add(1)
	c.calls.Add(1)
	return nil
}

func (c *Conn) exit() {
	c.mu.Lock()
	c.exitLocked()
	c.mu.Unlock()
}

func (c *Conn) exitLocked() {
	c.active.Add(-1)
	c.idleLocked()
	c.calls.Done()
}

// spin polls the completion queue for up to w while e waits, and reports
// done when e was signalled, the deadline passed or the Conn closed. With
// no poller it disarms a queue armed for every completion, not one armed
// for solicited ones (§4.1); whoever parks or leaves next arms it again.
// mu is held on entry and on return, not while polling. It yields its
// core as spinAlone says, and its P while another goroutine waits for one.
func (c *Conn) spin(e *entry, dl *deadline.Deadline, w time.Duration) (done bool, err error) {
	if c.poller.Load() == nil && c.armed.Load() == armAll {
		c.armed.Store(armNone)
		c.ep.cq.Disarm()
	}
	// A Read's spin also loads the word of our ring where the peer's next
	// bytes land, when the peer writes it from another process (shm): the
	// line then comes over with the inbox entry that announces it, not
	// after it. The ring stays mapped while a call is in the Conn (close.go).
	var next *uint32
	if c.direct != nil && e.ev&evRead != 0 && c.ep.oldRing == nil {
		mem := c.ep.ring.Bytes()
		next = (*uint32)(unsafe.Pointer(&mem[c.st.PeerProd()&uint64(len(mem)-1)&^3]))
	}
	c.mu.Unlock()
	defer c.mu.Lock()
	end := time.Now().Add(w)
	crowded := false // the last yield ran another thread
	for i := 1; ; i++ {
		select {
		case <-e.ch:
			c.stats.SpinHits.Add(1)
			return true, nil
		default:
		}
		if next != nil {
			atomic.LoadUint32(next)
		}
		// Ask the queue before taking mu: a spinner that took it on every
		// turn would contend with the goroutine writing on this Conn.
		if c.peek == nil || c.peek.Pending() {
			c.mu.Lock()
			c.progressLocked()
			c.mu.Unlock()
		}
		if i < spinAlone {
			continue
		}
		if crowded || i%spinAlone == 0 {
			t := monotonic()
			sysdep.Yield() // a system call; the core goes only to a thread runnable on it
			crowded = monotonic()-t >= yieldRan
		}
		if pWanted() {
			if h := testHookYield.Load(); h != nil {
				(*h)(c)
			}
			runtime.Gosched() // the P goes to the goroutine that waits for it
		}
		if i%64 != 0 { // the clock and the deadline cost more than a poll
			continue
		}
		if dl.Expired() {
			return true, os.ErrDeadlineExceeded
		}
		select {
		case <-e.stop:
			return true, net.ErrClosed
		default:
		}
		if time.Now().After(end) {
			return false, nil
		}
	}
}

// spinAlone is how many polls a spinner makes before it yields its core, and
// between yields while the last ran no other thread (took under yieldRan);
// once one did, it yields at every poll, so a waiting thread runs at once.
const spinAlone = 64

// yieldRan is how long a yield that ran no other thread takes at most.
const yieldRan = int64(2 * time.Microsecond)
