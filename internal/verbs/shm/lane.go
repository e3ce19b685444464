//go:build linux

package shm

import (
	"time"

	"golang.org/x/sys/unix"
)

// EXPERIMENT: one parked waiter per link waits on a lane eventfd of its
// own, which the peer writes instead of the bell when the QP's sleeping
// word is armLane: the netpoller wakes that waiter directly.

var aLongTimeAgo = time.Unix(1, 0)

func (cq *CQ) laneLink() *link {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if len(cq.qps) != 1 || cq.closed.Load() || cq.overrun.Load() {
		return nil
	}
	q := cq.qps[0]
	if q.link == nil || q.link.lane == nil {
		return nil
	}
	return q.link
}

// ArmLane arms the CQ as Arm does, but the QP's peer writes the lane, if
// this CQ gets its link's lane; false (nothing armed) if not.
func (cq *CQ) ArmLane() bool {
	l := cq.laneLink()
	if l == nil || !l.laneBusy.CompareAndSwap(false, true) {
		return false
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if len(cq.qps) != 1 || cq.qps[0].link != l {
		l.laneBusy.Store(false)
		return false
	}
	cq.armed.Store(armAll)
	cq.qps[0].in.hdr.sleeping.Store(armLane)
	cq.lane.Store(l)
	return true
}

// LaneDeadline sets the lane wait's deadline: call it before the last
// check for a wake-up, which InterruptLane turns into a past deadline.
func (cq *CQ) LaneDeadline(t time.Time) {
	if l := cq.lane.Load(); l != nil {
		_ = l.lane.SetReadDeadline(t)
	}
}

// WaitLane waits for an edge of the lane, until its deadline at the
// latest, and returns the time from the peer's lane write to now (ns; 0 if
// not known).
func (cq *CQ) WaitLane() int64 {
	l := cq.lane.Load()
	if l == nil {
		return 0
	}
	first := true
	_ = l.laneRaw.Read(func(uintptr) bool {
		if first {
			first = false
			return false
		}
		return true
	})
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if len(cq.qps) != 1 {
		return 0
	}
	if at := cq.qps[0].in.hdr.laneAt.Swap(0); at != 0 {
		return monoNow() - at
	}
	return 0
}

func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// InterruptLane ends a WaitLane now.
func (cq *CQ) InterruptLane() {
	if l := cq.lane.Load(); l != nil {
		_ = l.lane.SetReadDeadline(aLongTimeAgo)
	}
}

// ReleaseLane gives the lane back.
func (cq *CQ) ReleaseLane() {
	if l := cq.lane.Swap(nil); l != nil {
		cq.armed.CompareAndSwap(armAll, 0) // the lane's Arm is spent
		cq.mu.Lock()
		for _, q := range cq.qps {
			q.in.hdr.sleeping.CompareAndSwap(armLane, 0) // the next arm decides
		}
		cq.mu.Unlock()
		l.laneBusy.Store(false)
	}
}
