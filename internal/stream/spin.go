package stream

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Adaptive busy-polling: a blocked call may poll the completion queue for
// a window before it parks, which saves the wake-up when the answer comes
// within the window. The window is spinPerPark times parkCost, at most
// Options.BusyPoll; each direction closes it after spinLimit misses in a
// row and reopens it by a probe that hits (docs/protocol.md §4.1).
const (
	spinLimit  = 2   // misses in a row that close the window
	firstProbe = 8   // waits from the window closing to the first probe
	probeEvery = 256 // the longest gap between probes
)

// spinPerPark is the window in wake-ups of a parked call (parkCost): a
// parked ring wait costs about two, and a spinner may wait through its
// peer's park too.
const spinPerPark = 3

// parkCost is the average wake-up latency of a parked call, in
// nanoseconds: an exponentially weighted average (weight 1/8) of
// samples, each at most maxParkSample. It starts at initialParkCost.
var parkCost atomic.Int64

const (
	initialParkCost = int64(5 * time.Microsecond)
	maxParkSample   = int64(time.Millisecond) // a descheduled process is not the host's park cost
)

func init() { parkCost.Store(initialParkCost) }

// spinWindow is how long a wait polls before it parks, with the window
// open: spinPerPark parks, at most max; 0 with busy-polling off (max <= 0).
func spinWindow(max time.Duration) time.Duration {
	if max <= 0 {
		return 0
	}
	return min(max, time.Duration(spinPerPark*parkCost.Load()))
}

// SetParkCost sets the measured park cost to d, until restore is called:
// for tests that need a window of a known size (the window is then
// min(BusyPoll, spinPerPark·d)), whatever the host measures meanwhile.
func SetParkCost(d time.Duration) (restore func()) {
	old := parkCost.Load()
	parkPinned.Store(true)
	parkCost.Store(int64(d))
	return func() {
		parkCost.Store(old)
		parkPinned.Store(false)
	}
}

// parkPinned makes recordWake drop its samples (SetParkCost).
var parkPinned atomic.Bool

// recordWake adds a parked call's wake-up latency to parkCost. Two
// samples at once may lose one: an average can afford that.
func recordWake(ns int64) {
	if parkPinned.Load() {
		return
	}
	ns = min(max(ns, 0), maxParkSample)
	old := parkCost.Load()
	parkCost.Store(old + (ns-old)/8)
}

// monotonic is nanoseconds on the monotonic clock, for wake-up latency.
func monotonic() int64 { return int64(time.Since(clockBase)) }

var clockBase = time.Now()

// spinCtl is one direction's adaptive window. Waits of one direction are
// serialised (the halves' mu), which guards it.
type spinCtl struct {
	closed bool // spinLimit misses in a row, and no hit since
	misses int  // misses in a row
	gap    int  // waits between probes while closed
	n      int  // waits since the window closed or the last probe
}

// window returns how long the next wait should spin: w (spinWindow's), or
// 0 to park at once.
func (s *spinCtl) window(w time.Duration) time.Duration {
	if w <= 0 {
		return 0
	}
	if !s.closed {
		return w
	}
	if s.n++; s.n >= s.gap {
		s.n = 0
		return w // a probe
	}
	return 0
}

// record records a wait that spun for spun (0: none), possibly parked, and
// was over after took; w is the window it spun for.
func (s *spinCtl) record(spun, took, w time.Duration) {
	switch {
	case w <= 0 || spun == 0:
	case took <= w:
		s.misses, s.closed = 0, false
	default:
		s.misses++
		switch {
		case s.closed: // a probe missed
			s.gap = min(2*s.gap, probeEvery)
		case s.misses >= spinLimit:
			s.closed, s.gap, s.n = true, firstProbe, 0
		}
	}
}

// At most spinSlots calls of the process busy-poll at once, and none
// starts while a call woken from parking has not run yet (woken): a
// spinner holds its core, and too many hold up the goroutines and the
// peer process whose work they wait for (docs/protocol.md §4.1).
var (
	spinning  atomic.Int32
	woken     atomic.Int32 // calls signalled while parked that have not run since
	spinSlots = int32(max(runtime.GOMAXPROCS(0)/2, 1))
)

// takeSpinSlot takes a spinning slot if one is free and no woken call
// waits; the caller gives it back (spinning.Add(-1)) when it stops.
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
