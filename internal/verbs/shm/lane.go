//go:build linux

package shm

import "time"

// The lane: one parked caller per link and side waits on the lane eventfd
// itself (verbs.Laner; Sleeping in the package documentation).

// TakeLane (verbs.Laner) takes the link of the CQ's one QP, whose peer
// then writes the lane where it would ring the bell.
func (cq *CQ) TakeLane(kickAfter time.Duration) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() || cq.overrun.Load() || len(cq.qps) != 1 {
		return false
	}
	q := cq.qps[0]
	q.cmu.Lock()
	l := q.link
	q.cmu.Unlock()
	if l == nil {
		return false
	}
	now := time.Since(laneEpoch)
	if !l.laneHolder.CompareAndSwap(nil, cq) {
		if h := l.laneHolder.Load(); h != nil && now-time.Duration(l.laneSince.Load()) > kickAfter {
			h.InterruptLane()
		}
		return false
	}
	l.laneSince.Store(int64(now))
	if l.laneCut.Swap(false) {
		_ = l.lane.SetReadDeadline(time.Time{})
	}
	cq.armed.Store(armAll) // a local completion or a kick still notifies
	q.in.hdr.sleeping.Store(armLane)
	cq.laneLink.Store(l)
	cq.lane.Store(q)
	return true
}

var laneEpoch = time.Now()

// WaitLane (verbs.Laner) waits in the Go netpoller for an edge of the
// lane; it never reads the counter.
func (cq *CQ) WaitLane() bool {
	q := cq.lane.Load()
	if q == nil {
		return false
	}
	woke := false
	_ = cq.laneLink.Load().laneRaw.Read(func(uintptr) bool {
		// The peer swaps the word before it writes: Read forgets an edge
		// that came before it started, but this load then sees the swap.
		woke = q.in.hdr.sleeping.Load() != armLane
		return woke
	})
	return woke
}

// InterruptLane (verbs.Laner) moves the read deadline of the lane the CQ
// took last into the past, until the next TakeLane. (It may end the wait
// of a CQ that took the lane after this one, spuriously.)
func (cq *CQ) InterruptLane() {
	if l := cq.laneLink.Load(); l != nil {
		_ = l.lane.SetReadDeadline(time.Unix(1, 0)) // a closed lane returns an error
		l.laneCut.Store(true)                       // after the deadline: TakeLane clears both
	}
}

// ReleaseLane (verbs.Laner) turns the QP's armLane back into armAll, or
// finds it swapped by the peer: then the Arm's one notification was the
// lane's.
func (cq *CQ) ReleaseLane() bool {
	q := cq.lane.Swap(nil)
	if q == nil {
		return false
	}
	took := !q.in.hdr.sleeping.CompareAndSwap(armLane, armAll)
	if took {
		cq.armed.CompareAndSwap(armAll, 0)
	}
	cq.laneLink.Load().laneHolder.Store(nil)
	return took
}
