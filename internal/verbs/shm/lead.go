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
//   - When exactly one CQ of the link is armed for WaitDirect (rsock: the
//     one connection to that peer process whose blocked call waits on the
//     queue itself; any number of others may be armed for their event
//     loops), that CQ owns the link: its WaitDirect waits on the direct
//     eventfd (a duplicate, lfile, so that it parks in the Go netpoller on
//     a file of its own) and returns from its own ring without a hand-off.
//     A direct ring it drains for another CQ (one that armed direct
//     before, whose ring was on its way) it rings on that CQ's channel.
//   - Otherwise the link's direct dispatcher goroutine waits on the direct
//     eventfd (efile[bellDirect]) and rings the CQs' channels. While there
//     is an owner, it waits on resume instead, out of the netpoller, and
//     costs nothing.
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
// A CQ's arming counts for the link with the last value it armed
// (Disarm does not change it: a CQ that busy-polls keeps its place, so
// that a spinning call does not move the role back and forth on every
// round trip). The role moves (retarget, under the link's mu) only when a
// CQ arms for another doorbell than it last did, or a QP joins or leaves
// the link: rsock's steady states move it never. Moving it wakes the
// reader that loses it: the direct dispatcher parks on resume, an owner's
// leading WaitDirect goes back to its channel.
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
// eventfd: only the owner is armed direct then, and its next WaitDirect
// drains first. A direct ring of a CQ that has since armed for Wait or
// disarmed may wait there too; it is stale: the producer published the
// entry before it loaded sleeping, so the poll that follows the CQ's new
// Arm finds it. A CQ that arms direct moves the role before its Arm
// returns, and the new reader drains what was left.
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

// retargetLocked gives the owner's role to the one CQ armed direct, if
// there is one, and the dispatcher's to the dispatcher if it is needed,
// and wakes the readers whose role changed.
func (l *link) retargetLocked() {
	var want *CQ
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
		default:
			if q.cq == owner && v == armDirect {
				l.handoffs.Add(1) // the owner's ring, taken by another
			}
			q.cq.ring(v)
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
func (l *link) lead(cq *CQ) bool {
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
			_ = l.lfile.SetReadDeadline(time.Time{}) // then look at the flags again
		case err != nil:
			cq.lead.CompareAndSwap(l, nil) // released: never wait on it again
			return false
		default:
			return false
		}
	}
}
