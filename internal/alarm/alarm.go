// Package alarm runs callbacks after a delay, off one runtime timer for
// all of them.
//
// It serves steps that are set often and mostly stopped before they are
// due: a switching connection's first timed step, which most connections
// close before. A runtime timer per step costs a timer operation at each
// end, and often the wake-up of the thread that polls the network, which
// must learn of the earlier deadline. A Clock touches its timer only for
// an alarm due before the time the timer is set for, and runs at most once
// a tick: an alarm fires when it is due or up to one tick later. A stopped
// alarm keeps its place in the list until the clock next runs, or until
// stopped alarms make up half of a list of sweepAt or more, when Set drops
// them: alarms set far ahead and stopped (a long UpgradeAfter, short
// connections) do not pile up while the clock waits.
package alarm

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock runs alarms, each callback on a goroutine of its own (as
// time.AfterFunc does): one that blocks delays no other. Use New.
type Clock struct {
	tick time.Duration

	mu      sync.Mutex
	alarms  []*Alarm
	stopped atomic.Int64 // about how many of alarms were stopped: a hint for Set's sweep
	timer   *time.Timer
	next    time.Time // when the timer fires; zero when it is not set
}

// sweepAt is the length from which Set drops stopped alarms from the
// list, once they are half of it: the list stays within about twice the
// live alarms or 2*sweepAt, at a cost per Stop that stays constant.
const sweepAt = 256

// Alarm is a callback set on a Clock.
type Alarm struct {
	due     time.Time
	f       func()
	c       *Clock
	stopped atomic.Bool // stopped or claimed to fire
}

// New returns a Clock that runs at most once every tick.
func New(tick time.Duration) *Clock {
	c := &Clock{tick: tick}
	c.timer = time.AfterFunc(time.Hour, c.fire)
	c.timer.Stop()
	return c
}

// Tick is the clock's tick: how late an alarm may fire.
func (c *Clock) Tick() time.Duration { return c.tick }

// Set sets an alarm that calls f once d has passed, or up to a tick later
// (a d shorter than the tick waits a tick). Only an alarm that needs the
// clock to run sooner than it is set to touches its timer.
func (c *Clock) Set(d time.Duration, f func()) *Alarm {
	now := time.Now()
	a := &Alarm{due: now.Add(d), f: f, c: c}
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := len(c.alarms); n >= sweepAt && c.stopped.Load() >= int64(n/2) {
		c.dropStoppedLocked()
	}
	c.alarms = append(c.alarms, a)
	if at := now.Add(max(d, c.tick)); c.next.IsZero() || at.Before(c.next) {
		c.armLocked(now, a.due) // for at
	}
	return a
}

// armLocked sets the timer for due, or one tick from now if that is
// later: the clock runs at most once a tick.
func (c *Clock) armLocked(now, due time.Time) {
	at := max(due.Sub(now), c.tick)
	c.next = now.Add(at)
	c.timer.Reset(at)
}

// Stop keeps the alarm from firing, and reports whether it had neither
// fired nor been stopped yet.
func (a *Alarm) Stop() bool {
	if !a.stopped.CompareAndSwap(false, true) {
		return false
	}
	a.c.stopped.Add(1)
	return true
}

// dropStoppedLocked removes the stopped alarms from the list. A Stop
// running meanwhile may go uncounted: its alarm goes at the next sweep.
func (c *Clock) dropStoppedLocked() {
	kept := c.alarms[:0]
	for _, a := range c.alarms {
		if !a.stopped.Load() {
			kept = append(kept, a)
		}
	}
	clear(c.alarms[len(kept):])
	c.alarms = kept
	c.stopped.Store(0)
}

// fire runs the alarms that are due, drops the stopped ones, and sets the
// timer for the soonest of the others.
func (c *Clock) fire() {
	now := time.Now()
	var due []*Alarm
	var soonest time.Time
	c.mu.Lock()
	kept := c.alarms[:0]
	for _, a := range c.alarms {
		switch {
		case a.stopped.Load():
		case !a.due.After(now):
			due = append(due, a)
		default:
			kept = append(kept, a)
			if soonest.IsZero() || a.due.Before(soonest) {
				soonest = a.due
			}
		}
	}
	clear(c.alarms[len(kept):])
	c.alarms = kept
	c.stopped.Store(0)
	if len(kept) == 0 {
		c.alarms = nil // let a burst's backing array go
		c.next = time.Time{}
	} else {
		c.armLocked(now, soonest)
	}
	c.mu.Unlock()
	for _, a := range due {
		if a.stopped.CompareAndSwap(false, true) { // claimed: out of the list, not counted
			go a.f()
		}
	}
}
