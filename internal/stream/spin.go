package stream

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Busy-polling before a park: docs/protocol.md §4.1.

// spinPerPark is the window in wake-ups of a parked call (parkCost): a
// park costs more than the wake-up parkCost samples.
const spinPerPark = 10

// parkCost is the wake-up latency of a parked call, in nanoseconds: an
// average (weight 1/8) of samples, each at most maxParkSample.
var parkCost atomic.Int64

const (
	initialParkCost = int64(5 * time.Microsecond)
	maxParkSample   = int64(time.Millisecond) // a descheduled process is not the host's park cost
)

func init() { parkCost.Store(initialParkCost) }

// spinWindow is how long a wait polls before it parks: spinPerPark parks,
// at most max; 0 with max <= 0 or without canSpin.
func spinWindow(max time.Duration) time.Duration {
	if max <= 0 || !canSpin {
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

func monotonic() int64 { return int64(time.Since(clockBase)) }

var clockBase = time.Now()

// The runtime's count of goroutines that wait for a P (Go 1.26). One spinner
// at a time reads it (runnableMu), the others use the last value
// (runnableSeen): a read takes the runtime's metrics and scheduler locks.
const runnableMetric = "/sched/goroutines/runnable:goroutines"

var (
	runnableMu     sync.Mutex
	runnableSample = []metrics.Sample{{Name: runnableMetric}}
	runnableSeen   atomic.Uint64
)

// pWanted reports whether a goroutine of this process waits for a P.
func pWanted() bool {
	if runnableMu.TryLock() {
		metrics.Read(runnableSample)
		runnableSeen.Store(runnableSample[0].Value.Uint64())
		runnableMu.Unlock()
	}
	return runnableSeen.Load() > 0
}

// canSpin is whether the runtime counts runnable goroutines: without it a
// spinner could not hand its P on, so nothing busy-polls.
var canSpin = func() bool {
	metrics.Read(runnableSample)
	return runnableSample[0].Value.Kind() == metrics.KindUint64
}()

// At most spinSlots calls of the process busy-poll at once, and none starts
// while a woken call has not run yet (woken): a spinner holds its core from
// the goroutines and the peer process it waits for (docs/protocol.md §4.1).
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
