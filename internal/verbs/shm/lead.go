package shm

import (
	"errors"
	"os"
	"time"
)

// Who waits on a link's eventfds (leader/follower).
//
// The peer rings this side's CQs through the link's bell page and two
// eventfds, one per doorbell (bell.go): direct (WaitDirect: rsock's
// blocked Read or Write) and wait (Wait: rsock's event loops). Whoever
// waits on an eventfd drains that doorbell's bitmap and rings the CQs it
// names; a waiter rung by another goroutine pays a goroutine hand-off
// (eventfd, reader, channel, waiter). For the direct doorbell that costs a
// blocked call's latency, so its reader is chosen by what the link's CQs
// are armed for:
//
//   - One CQ armed for WaitDirect owns the link (rsock: the connection to
//     that peer process whose blocked call waits on the queue itself; any
//     number of others may be armed for their event loops or for
//     WaitDirect too): its WaitDirect waits on the direct eventfd (a
//     duplicate, lfile, so that it parks in the Go netpoller on a file of
//     its own) and returns from its own ring without a hand-off. A direct
//     ring it drains for another CQ (a stale one, see below) it rings on
//     that CQ's channel.
//   - Only the owner's rings go to the direct doorbell: another CQ arming
//     for WaitDirect asks its peer, in its inboxes, for the wait doorbell
//     (sleepValue), whose dispatcher rings WaitDirect of a CQ that wants
//     it (ringWanted). So the direct eventfd has nobody but the owner to
//     wake, and nobody needs to read it while the owner is busy elsewhere.
//   - While there is no owner, the link's direct dispatcher goroutine
//     waits on the direct eventfd (efile[bellDirect]) and rings the CQs'
//     channels. While there is one, it waits on resume instead, out of the
//     netpoller, and costs nothing.
//
// The wait doorbell always has its own dispatcher (efile[bellWait]): the
// event loops of idle connections (rsockperf's control connection, an
// HTTP server's idle keep-alive connections) are rung through it, and
// neither wake the owner nor are woken by the owner's rings. (With one
// eventfd for both, the dispatcher had to keep waiting beside an owner for
// the idle connections and woke with it for each of its rings: in
// rsockperf's event-only ping-pong that cost as much as the hand-off it
// saved.)
//
// Who owns the link. A CQ's arming counts for the link with the last value
// it armed (Disarm does not change it: a CQ that busy-polls keeps its
// place, so that a spinning call does not move the role back and forth on
// every round trip). The owner keeps the link while it counts as armed
// direct (retargetLocked); when it stops, a sole CQ armed direct takes it
// at once, else the first of several to arm again (tryTake). A CQ arming
// direct also takes the link from an owner whose WaitDirect has been
// parked on it for takeOver (1 ms): that owner is idle (a blocked Read on
// a quiet connection: rsockperf's control connection, an idle keep-alive),
// the arming CQ busy, and with the idle one owning the link every ring of
// the busy one cost a dispatcher hand-off (event-only ping-pong p99 1.2x
// TCP's against 1.0x with the takeover, in rsockperf). The replaced
// owner's WaitDirect is woken; its caller arms again as a non-owner and
// polls. Moving the role wakes the reader that loses it: the direct
// dispatcher parks on resume, an owner's leading WaitDirect goes back to
// its channel.
//
// Readers never read an eventfd's counter (commit 410c045 did the same
// for the per-CQ eventfd before links): the netpoller is edge-triggered and every write to an
// eventfd is an edge, so a reader parks on its file through the RawConn
// and makes no system call to wait or to wake; the counter only grows (it
// would take centuries of rings to fill), and since it never drops back
// to zero, epoll reports every write to every file of the eventfd (a
// reader that read the counter could make epoll report nothing to another
// file of the same eventfd: see TestLeadStress).
//
// No ring is lost. A doorbell's armed word starts set. Its reader stores
// it and drains each time its wait starts (after the runtime forgot
// earlier readiness) and each time it wakes. A producer sets its bit,
// then loads armed: if set, it clears it and writes the eventfd. So a bit
// set after a drain's scan is followed by an edge, which wakes a parked
// reader or is remembered for one about to park; an edge that came before
// a wait started belongs to a bit that the wait's first drain finds.
// While the owner's WaitDirect is not running nobody waits on the direct
// eventfd: only the owner's rings go there, and its next WaitDirect
// drains first. A direct ring of a CQ that has since armed for Wait,
// disarmed or lost the link may wait there too; it is stale: the producer
// swapped sleeping after it published the entry, so the poll that follows
// the CQ's next Arm (which stores sleeping after that swap) finds it. That
// is why a replaced owner is woken: its caller arms and polls. A CQ that
// arms direct moves the role before its Arm returns, and the new reader
// drains what was left.
//
// Kicking a reader out of the netpoller uses a read deadline in the past
// on its file (no system call); the flag that tells it why (the link's
// owner and disp, the CQ's woken and closed) is stored first, and a reader
// that times out resets the deadline before it looks at the flags, so a
// kick whose flag it misses sets its deadline after the reset and is seen
// on the next turn. A deadline left in the past by a kick that came too
// late costs the next reader one turn, never a spin
// (TestWaitDirectStaleDeadline).

// armChange moves one QP of cq from doorbell old to doorbell v (0: not
// counted) and moves the reader role if that changes who should read.
func (l *link) armChange(cq *CQ, old, v uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch old {
	case 0:
	case armDirect:
		if l.direct[cq]--; l.direct[cq] == 0 {
			delete(l.direct, cq)
		}
	default:
		l.nWait--
	}
	switch v {
	case 0:
	case armDirect:
		if l.direct == nil {
			l.direct = map[*CQ]int{}
		}
		l.direct[cq]++
	default:
		l.nWait++
	}
	l.retargetLocked()
}

// retargetLocked keeps the owner's role with the owner while it is armed
// direct; else gives it to the one CQ armed direct, if there is exactly
// one (with several, the first of them to arm again takes it: tryTake); it
// gives the dispatcher's role to the dispatcher if there is no owner, and
// wakes the readers whose role changed.
func (l *link) retargetLocked() {
	want := l.owner.Load()
	if want == nil || l.direct[want] == 0 || l.freed {
		want = nil
		if len(l.direct) == 1 && !l.freed {
			for c := range l.direct {
				want = c
			}
			// A CQ leads one link at a time; on its other links the
			// dispatcher waits.
			if !want.lead.CompareAndSwap(nil, l) && want.lead.Load() != l {
				want = nil
			}
		}
	}
	l.setOwnerLocked(want)
}

// setOwnerLocked makes want the owner (nil: the direct dispatcher reads).
func (l *link) setOwnerLocked(want *CQ) {
	if old := l.owner.Load(); want != old {
		if old != nil {
			old.lead.CompareAndSwap(l, nil)
		}
		l.owner.Store(want)
		l.moves.Add(1)
		if old != nil {
			kick(l.lfile) // its leading WaitDirect goes back to its channel
		}
		if want != nil {
			// A WaitDirect of want that parked on its channel (it did not
			// own the link then) must come and wait on the eventfd.
			select {
			case want.direct <- struct{}{}:
			default:
			}
		}
	}
	disp := want == nil && !l.freed
	if disp == l.disp.Load() {
		return
	}
	l.disp.Store(disp)
	if !disp {
		kick(l.efile[bellDirect]) // the direct dispatcher steps aside
		return
	}
	select {
	case l.resume <- struct{}{}:
	default:
	}
}

// takeOver is how long an owner's WaitDirect must have been parked before
// another CQ arming direct takes the link from it: an owner that waits
// longer is idle (a connection with nothing to read), and the arming one
// is busy; an owner parked for less is busy too, and the role would
// bounce between busy connections at every round trip. (A variable for
// TestLeadStress, which sets it to 0: every arm takes the link.)
var takeOver = time.Millisecond

// tryTake makes cq, armed direct, the owner of l if there is none, or if
// the owner's WaitDirect has been parked on the link for takeOver. The
// owner it replaces is woken (a spurious WakeDirect): its caller arms
// again, as a non-owner, and polls, so a ring of it that the peer sent to
// the direct doorbell before that (which the new owner's WaitDirect may
// not read for a while) is found by that poll, as a stale ring is. It
// reports whether cq owns l.
func (l *link) tryTake(cq *CQ) bool {
	idle := func(o *CQ) bool {
		return o.reading.Load() == l && monoNow()-l.leadSince.Load() >= int64(takeOver)
	}
	switch o := l.owner.Load(); {
	case o == cq:
		return true
	case o != nil && !idle(o):
		return false // the common case, decided without the lock
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.owner.Load()
	switch {
	case o == cq:
		return true
	case o != nil && !idle(o), l.freed, l.direct[cq] == 0:
		return false
	}
	if !cq.lead.CompareAndSwap(nil, l) && cq.lead.Load() != l {
		return false // it leads another link
	}
	l.setOwnerLocked(cq)
	l.takeovers.Add(1)
	if o != nil {
		o.WakeDirect()
	}
	return true
}

// resetLead is lead's answer to a kick (its read of lfile timed out): if
// cq still owns l and was neither woken nor closed, it clears lfile's
// deadline and reports true (lead reads again, and looks at the flags
// before it parks, so a kick that came after this check is not lost: its
// flag was stored before its deadline). Otherwise it leaves the deadline
// alone: another goroutine may be reading lfile already (the new owner
// takes the file's read lock as soon as this one's read returned), and a
// clear now could undo a kick meant for it after it parked, losing its
// wake-up. The check and the clear hold l.mu, under which the owner
// changes, so the owner cannot change in between. A deadline left in the
// past costs the next reader one turn.
func (l *link) resetLead(cq *CQ) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owner.Load() != cq || cq.woken.Load() || cq.closed.Load() {
		return false
	}
	_ = l.lfile.SetReadDeadline(time.Time{})
	return true
}

// monoNow is a monotonic clock in nanoseconds.
func monoNow() int64 { return int64(time.Since(monoStart)) }

var monoStart = time.Now()

// kick makes the goroutine parked reading f (if any) return with
// os.ErrDeadlineExceeded, without a system call.
func kick(f *os.File) {
	if f != nil && f.SetReadDeadline(aLongTimeAgo) != nil {
		_, _ = f.Write(eventOne[:]) // not pollable after all: a spurious event
	}
}

// aLongTimeAgo is a deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)

// drainLocked drains doorbell k of the bell page (storing its armed word
// first) and rings the CQ of every QP the peer rang. A direct ring of self
// (the leading CQ, or nil) is not rung but reported.
func (l *link) drainLocked(k int, self *CQ) (own bool) {
	owner := l.owner.Load()
	l.own.drain(k, func(slot, v uint32) {
		if int(slot) >= len(l.slots) {
			return
		}
		q := l.slots[slot].q
		switch {
		case q == nil:
		case q.cq == self && v == armDirect:
			own = true
		case v == armDirect:
			if q.cq == owner {
				l.handoffs.Add(1) // the owner's ring, taken by another
			}
			q.cq.WakeDirect()
		default:
			q.cq.ringWanted()
		}
	})
	return own
}

// dispatch waits on doorbell k's eventfd: always for the wait doorbell,
// while there is no owner for the direct one (and on resume while there
// is).
func (l *link) dispatch(k int) {
	defer l.dispWG.Done()
	needed := func() bool { return k == bellWait || l.disp.Load() }
	for {
		for !needed() {
			select {
			case <-l.resume:
			case <-l.stop:
				return
			}
		}
		woke := false
		err := l.eraw[k].Read(func(uintptr) bool {
			if woke {
				l.wakeups.Add(1)
			}
			woke = true
			if !needed() {
				return true // an owner took over
			}
			l.mu.Lock()
			l.drainLocked(k, nil)
			l.mu.Unlock()
			return false // park until the next edge
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			_ = l.efile[k].SetReadDeadline(time.Time{}) // then look at disp again
		case err != nil:
			return // released
		}
	}
}

// lead is WaitDirect of cq while cq owns l: it waits on the link's direct
// eventfd itself until cq's own direct doorbell rings (true), or until it
// is woken (WakeDirect), cq closes or cq no longer owns l (false: the
// caller looks at why).
//
// One WaitDirect at a time reads lfile (l.leader). An owner that finds the
// previous one still there (replaced, it has been kicked and is on its way
// out) waits on its channel, where the one leaving signals the owner: a
// WaitDirect waiting for the file's read lock instead could not be woken,
// since a kick on the file is taken by the goroutine that holds the lock,
// which as owner clears it and parks again (seen under load as a request
// that never reached its handler).
func (l *link) lead(cq *CQ) bool {
	if !l.leader.CompareAndSwap(nil, cq) {
		select {
		case <-cq.direct:
		case <-cq.done:
		}
		return false // the caller looks at why, and leads again if it still owns l
	}
	defer func() {
		l.leader.Store(nil)
		if o := l.owner.Load(); o != nil && o != cq {
			select {
			case o.direct <- struct{}{}: // the owner may wait for the file
			default:
			}
		}
	}()
	l.leadSince.Store(monoNow())
	cq.reading.Store(l)
	defer cq.reading.Store(nil)
	own, woke := false, false
	for {
		err := l.lraw.Read(func(uintptr) bool {
			if woke {
				l.wakeups.Add(1)
				l.leadWakeups.Add(1)
			}
			woke = true
			if cq.woken.Load() || cq.closed.Load() || l.owner.Load() != cq {
				return true
			}
			l.mu.Lock()
			own = l.drainLocked(bellDirect, cq)
			l.mu.Unlock()
			return own // else park until the next edge
		})
		switch {
		case own:
			return true
		case errors.Is(err, os.ErrDeadlineExceeded):
			if !l.resetLead(cq) {
				return false // woken, closed or no longer the owner
			}
		case err != nil:
			cq.lead.CompareAndSwap(l, nil) // released: never wait on it again
			return false
		default:
			return false
		}
	}
}
