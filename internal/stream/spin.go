package stream

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Adaptive busy-polling. A blocked call may poll the completion queue
// itself for up to Options.BusyPoll before it parks: that saves the wake-up
// (the peer's notification, the netpoller, the scheduler) when the answer
// comes within the window, and wastes the window when it does not. Each
// direction of a Conn keeps the window open or closed by what its recent
// waits found, in the manner of KVM's halt-polling:
//
//   - a wait that spun and was over only after more than missSlack
//     windows (it parked, or yielding the core held it up) is a miss, and
//     spinLimit misses in a row close the window: the calls that follow
//     park at once;
//   - with the window closed, a wait now and then spins anyway (a probe):
//     the first comes firstProbe waits after the window closed, and each
//     probe that misses doubles the gap, up to probeEvery; a probe that
//     ends within the window reopens it.
//
// A wait that ends after the window but within missSlack windows is
// neither: it is what a spinner sees when its peer parks (the peer's
// wake-up is slower than the window but not by much), and counting it as a
// miss would let two peers close each other's windows for good, each
// seeing the other's parked latency.
//
// So a connection whose answers come within the window keeps polling; one
// whose answers come later stops after spinLimit waits and soon spends at
// most one window per probeEvery waits; and an idle connection spends at
// most spinLimit windows and then nothing: a parked call costs no CPU.
const (
	spinLimit  = 2   // misses in a row that close the window
	missSlack  = 2   // a wait over within missSlack windows is no miss
	firstProbe = 8   // waits from the window closing to the first probe
	probeEvery = 256 // the longest gap between probes
)

// spinCtl is one direction's adaptive window. Waits of one direction are
// serialised (the halves' mu), which guards it.
type spinCtl struct {
	closed bool // spinLimit misses in a row, and no hit since
	misses int  // misses in a row
	gap    int  // waits between probes while closed
	n      int  // waits since the window closed or the last probe
}

// window returns how long the next wait should spin: max, or 0 to park at
// once.
func (s *spinCtl) window(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	if !s.closed {
		return max
	}
	if s.n++; s.n >= s.gap {
		s.n = 0
		return max // a probe
	}
	return 0
}

// record records a wait that spun for spun (0: none), possibly parked, and
// was over after took.
func (s *spinCtl) record(spun, took, max time.Duration) {
	switch {
	case max <= 0 || spun == 0:
	case took <= max:
		s.misses, s.closed = 0, false
	case took > missSlack*max:
		s.misses++
		switch {
		case s.closed: // a probe missed
			s.gap = min(2*s.gap, probeEvery)
		case s.misses >= spinLimit:
			s.closed, s.gap, s.n = true, firstProbe, 0
		}
	}
}

// At most spinSlots calls of the whole process busy-poll at once; the
// others park at once. A spinner holds its core, and more spinners than
// half the cores starve the goroutines (and the peer process) whose work
// they wait for. For the same reason no call starts spinning while a call
// of the process that was woken from parking has not run yet (woken): the
// cores are busy then, and a spinner would hold that call up
// (BENCHMARKS.md has both effects on 64 connections).
var (
	spinning  atomic.Int32
	woken     atomic.Int32 // calls signalled while parked that have not run since
	spinSlots = int32(max(runtime.GOMAXPROCS(0)/2, 1))
)

// takeSpinSlot takes a spinning slot if one is free and no woken call
// waits for a core; the caller gives it back (spinning.Add(-1)) when it
// stops polling.
func takeSpinSlot() bool {
	if woken.Load() > 0 {
		return false
	}
	if spinning.Add(1) <= spinSlots {
		return true
	}
	spinning.Add(-1)
	return false
}
