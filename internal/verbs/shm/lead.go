package shm

import (
	"errors"
	"os"
	"time"
)

// Who reads a link's eventfd (leader/follower).
//
// The peer rings this side's CQs through the link's bell page and eventfd
// (bell.go). Whoever waits on the eventfd drains the page and rings the CQs it
// names; a CQ's waiter that is rung by another goroutine pays a goroutine
// hand-off (eventfd, reader, channel, waiter). That is the cost only when
// the reader is not the waiter itself, so the reader is chosen by what the
// link's CQs are armed for:
//
//   - When every QP of the link that is armed belongs to one CQ, armed for
//     WaitDirect (rsock: one connection to that peer process, its blocked
//     call waiting on the queue itself), that CQ owns the link: its
//     WaitDirect waits on the eventfd (a duplicate, lfile, so that it parks in
//     the Go netpoller independently of the dispatcher) and returns from
//     its own ring without a hand-off. Rings for other CQs that it drains
//     meanwhile it rings on their channels.
//   - Otherwise the link's dispatcher goroutine waits on the eventfd (efile)
//     and rings every CQ through its channels.
//
// A CQ's arming counts for the link with the last value it armed
// (Disarm does not change it: a CQ that busy-polls keeps its place, so
// that a spinning call does not move the role back and forth on every
// round trip). The role moves (retarget, under the link's mu) only when
// a CQ arms for another doorbell than it last did, or a QP joins or leaves
// the link: rsock's steady states (event loops armed, or one connection's
// calls armed direct) move it never. Moving it wakes the reader that
// loses it: the dispatcher parks on the resume channel (not in the
// netpoller, so it costs nothing while an owner leads), an owner's leading
// WaitDirect goes back to its channel.
//
// Readers never read the eventfd's counter (as main's 410c045 did for a
// CQ's own eventfd): the netpoller is edge-triggered and every write to an
// eventfd is an edge, so a reader parks on its file through the RawConn
// and makes no system call to wait or to wake; the counter only grows (it
// would take centuries of rings to fill), and since it never drops back
// to zero, epoll reports every write to every file of the eventfd (a
// reader that read the counter could make epoll report nothing to
// another: see TestLeadStress).
//
// No ring is lost. The page's armed word starts set. A reader stores it
// and drains each time its wait starts (after the runtime forgot earlier
// readiness) and each time it wakes. A producer sets its bit, then loads
// armed: if set, it clears it and writes the eventfd. So a bit set after
// a drain's scan is followed by an edge, which wakes a parked reader or
// is remembered for one about to park; an edge that came before a wait
// started belongs to a bit that the wait's first drain finds. While the
// owner's WaitDirect is not running nobody waits: only rings of the owner
// itself can come then (no other CQ is armed), and its next WaitDirect
// drains them first. A CQ that arms moves the role before its Arm
// returns, and the new reader drains what was left.
//
// Kicking a reader out of the netpoller uses a read deadline in the past
// on its file (no system call); the flag that tells it why (the link's
// owner, the CQ's woken and closed) is stored first, and a reader that
// times out resets the deadline before it looks at the flags, so a kick
// whose flag it misses sets its deadline after the reset and is seen on
// the next turn. A deadline left in the past by a kick that came too late
// costs the next reader one turn, never a spin (TestLeadStaleDeadline).

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

// retargetLocked gives the reader role to the CQ that should own the link,
// or to the dispatcher, and wakes the reader that loses it.
func (l *link) retargetLocked() {
	var want *CQ
	if l.nWait == 0 && len(l.direct) == 1 && !l.freed {
		for c := range l.direct {
			want = c
		}
		// A CQ leads one link at a time; on its other links the
		// dispatcher reads.
		if !want.lead.CompareAndSwap(nil, l) && want.lead.Load() != l {
			want = nil
		}
	}
	old := l.owner.Load()
	if want == old {
		return
	}
	l.owner.Store(want)
	l.moves.Add(1)
	if old != nil {
		old.lead.CompareAndSwap(l, nil)
		kick(l.lfile) // its leading WaitDirect goes back to its channel
	}
	if want != nil {
		kick(l.efile) // the dispatcher steps aside
		// A WaitDirect of want that parked on its channel (it did not own
		// the link then) must come and read: nobody else will.
		select {
		case want.direct <- struct{}{}:
		default:
		}
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

// drainLocked stores the bell page's armed word, then rings the CQ of
// every QP the peer rang (bits set before the store; a later one is
// followed by an eventfd write). A direct ring of self (the leading CQ, or nil)
// is not rung but reported.
func (l *link) drainLocked(self *CQ) (own bool) {
	l.own.hdr.armed.Store(1)
	l.own.drain(func(slot, v uint32) {
		if int(slot) >= len(l.slots) {
			return
		}
		q := l.slots[slot].q
		switch {
		case q == nil:
		case q.cq == self && v == armDirect:
			own = true
		default:
			q.cq.ring(v)
		}
	})
	return own
}

// dispatch waits on the eventfd while no CQ owns the link, and waits on
// resume while one does.
func (l *link) dispatch() {
	defer close(l.dispDone)
	for {
		for l.owner.Load() != nil {
			select {
			case <-l.resume:
			case <-l.stop:
				return
			}
		}
		woke := false
		err := l.eraw.Read(func(uintptr) bool {
			if woke {
				l.wakeups.Add(1)
			}
			woke = true
			if l.owner.Load() != nil {
				return true // an owner took over
			}
			l.mu.Lock()
			l.drainLocked(nil)
			l.mu.Unlock()
			return false // park until the next edge
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			_ = l.efile.SetReadDeadline(time.Time{}) // then look at owner again
		case err != nil:
			return // released
		}
	}
}

// lead is WaitDirect of cq while cq owns l: it waits on the link's
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
			own = l.drainLocked(cq)
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
