// Package deadline is a settable point in time that blocked calls wait on,
// for net.Conn deadlines.
package deadline

import (
	"sync"
	"sync/atomic"
	"time"
)

// Deadline is a settable point in time at which waiters give up. It keeps a
// channel that is closed once the deadline has passed; setting a new
// deadline replaces the channel, so a waiter re-reads it on every wait. The
// design follows the net package's pipe: moving a deadline while an
// operation blocks takes effect at once.
//
// Every Read and Write checks its deadline (Expired), often many times per
// millisecond on a busy stream, so the check is atomic loads (and a read of
// the monotonic clock while a deadline is set) and no lock; Wait takes the
// lock once per Deadline, and mu serialises the setters.
//
// A Deadline arms no timer, and makes no channel, until someone waits on
// it: until then, Expired compares the clock with the time set. Most
// deadlines are set and moved without anyone blocking past them (a
// connection that sets one for each request and is answered in time), and
// they cost no timer at all. Once Wait has been called, a timer runs
// while a deadline is set; a deadline moved later keeps it, and when it
// fires early it arms itself for the rest (fire), so that a connection
// that pushes its deadline forward at each request re-arms a timer about
// once per deadline's length, not once per request. The zero Deadline is
// disarmed and ready to use.
type Deadline struct {
	mu      sync.Mutex
	timer   *time.Timer   // runs fire at timerAt; nil if none is pending; set under mu
	timerAt int64         // when timer fires (clock)
	gen     uint64        // armings so far: the pending timer is of the last
	waited  atomic.Bool   // Wait has been called: deadlines arm timer; set under mu
	at      atomic.Int64  // when the deadline passes (clock), 0 if none; set under mu
	cancel  chan struct{} // closed when the deadline passes; replaced under mu; nil until waited
	cur     atomic.Value  // cancel's current value (a chan struct{}), for the lock-free readers
	passed  atomic.Bool   // the deadline has passed: cancel, if any, is closed
	watch   atomic.Pointer[func()]
}

// epoch anchors clock: time.Since reads the monotonic clock.
var epoch = time.Now()

// clock is the monotonic time in nanoseconds since epoch, plus one, so
// that it is never zero.
func clock() int64 { return int64(time.Since(epoch)) + 1 }

// New returns a disarmed Deadline.
func New() *Deadline { return &Deadline{} }

// replace installs a fresh cancel channel, or none until Wait asks for
// one; called under mu.
func (d *Deadline) replace() {
	d.passed.Store(false)
	d.cancel = nil
	if d.waited.Load() {
		d.cancel = make(chan struct{})
		d.cur.Store(d.cancel)
	}
}

// Set arms the deadline for t; the zero time disarms it. A t in the past
// expires it at once.
func (d *Deadline) Set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.notify()
	d.at.Store(0) // a pending timer finds no deadline, or the new one
	if t.IsZero() {
		if d.passed.Load() {
			d.replace()
		}
		return
	}
	dur := time.Until(t)
	if dur <= 0 {
		d.expireLocked()
		return
	}
	if d.passed.Load() {
		d.replace()
	}
	d.at.Store(clock() + int64(dur))
	if d.waited.Load() {
		d.armLocked()
	}
}

// armLocked makes sure a timer fires at the deadline or before it: one
// pending for no later is kept (fire arms again for the rest).
func (d *Deadline) armLocked() {
	at := d.at.Load()
	if d.timer != nil && d.timerAt <= at {
		return
	}
	if d.timer != nil {
		d.timer.Stop() // if it runs already, fire finds it stale
	}
	d.gen++
	gen := d.gen
	d.timerAt = at
	d.timer = time.AfterFunc(time.Duration(at-clock()), func() { d.fire(gen) })
}

// fire is the timer of arming gen: unless a later arming replaced it, it
// expires the deadline if it has passed, and otherwise, if one is set
// (moved later since), arms a timer for it.
func (d *Deadline) fire(gen uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if gen != d.gen {
		return
	}
	d.timer = nil
	switch at := d.at.Load(); {
	case at == 0 || d.passed.Load():
	case at <= clock():
		d.expireLocked()
	default:
		d.armLocked()
	}
}

// expireLocked closes cancel now, unless it is closed.
func (d *Deadline) expireLocked() {
	if !d.passed.Load() {
		d.passed.Store(true)
		if d.cancel != nil {
			close(d.cancel)
		}
		d.notify()
	}
}

// Watch makes fn be called, until Watch(nil), whenever the deadline is
// set and when it passes (the latter only once Wait has been called): for
// a waiter blocked somewhere other than on Wait's channel, which fn wakes
// to look again. fn runs with the Deadline's lock held: it must not block
// or call the Deadline. One watcher at a time.
func (d *Deadline) Watch(fn *func()) { d.watch.Store(fn) }

func (d *Deadline) notify() {
	if fn := d.watch.Load(); fn != nil {
		(*fn)()
	}
}

// Wait returns a channel that is closed when the deadline passes. A later
// Set may replace it: wait on a fresh one each time.
func (d *Deadline) Wait() <-chan struct{} {
	if !d.waited.Load() {
		d.mu.Lock()
		if !d.waited.Load() {
			d.cancel = make(chan struct{})
			if d.passed.Load() {
				close(d.cancel)
			}
			d.cur.Store(d.cancel) // before waited: the lock-free path loads it
			d.waited.Store(true)
			if at := d.at.Load(); at != 0 && !d.passed.Load() {
				if at > clock() {
					d.armLocked()
				} else {
					d.expireLocked()
				}
			}
		}
		d.mu.Unlock()
	}
	return d.cur.Load().(chan struct{})
}

// Expired reports whether the deadline has passed.
func (d *Deadline) Expired() bool {
	if d.passed.Load() {
		return true
	}
	at := d.at.Load()
	return at != 0 && clock() >= at
}
