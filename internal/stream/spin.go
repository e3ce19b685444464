package stream

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Adaptive busy-polling. A blocked call may poll the completion queue
// itself for a window before it parks: that saves the wake-up (the peer's
// notification, the netpoller, the scheduler) when the answer comes within
// the window, and wastes the window when it does not.
//
// The window is what parking costs in this process now, as the
// competitive spin-then-park rule asks (Karlin et al.: poll for about the
// cost of a park, then park, and a wait costs at most about twice what it
// would have cost with foresight): spinPerPark times parkCost, the time
// from a parked call's wake-up signal to the call running again, averaged
// over the parked waits of every connection, so that it follows the host
// as it gets busier or quieter. A park of a ring wait costs about two such
// wake-ups (the provider's reader woken by the notification, then the
// call), and a spinner waits through the peer's park too when the peer
// had parked: spinPerPark covers both. Options.BusyPoll bounds it.
//
// Each direction of a Conn keeps polling or stops by what its recent
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
// wake-up, two of this process's), and counting it as a miss would let
// two peers close each other's windows for good, each seeing the other's
// parked latency. Because the window is measured, that holds on a slow
// host too: a fixed window (this package's first design, 20 us) closed
// for good where a peer's parked answer took over two windows.
//
// So a connection whose answers come within the window keeps polling; one
// whose answers come later (a server that works on each request for
// longer than a park) stops after spinLimit waits and soon spends at most
// one window per probeEvery waits, leaving the core to the peer; and an
// idle connection spends at most spinLimit windows and then nothing: a
// parked call costs no CPU.
const (
	spinLimit  = 2   // misses in a row that close the window
	missSlack  = 2   // a wait over within missSlack windows is no miss
	firstProbe = 8   // waits from the window closing to the first probe
	probeEvery = 256 // the longest gap between probes
)

// spinPerPark is the window in wake-ups of a parked call (parkCost).
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
	case took > missSlack*w:
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
