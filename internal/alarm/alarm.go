// Package alarm runs callbacks after a delay, off one runtime timer for
// all of them.
//
// It serves steps that are set often and mostly stopped before they are
// due: a switching connection's first timed step, which most connections
// close before. A runtime timer per step costs a timer operation at each
// end, and often the wake-up of the thread that polls the network, which
// must learn of the earlier deadline. A timer that fires costs more: the
// thread that runs it wakes a second one to share the work it makes.
//
// A Clock fires an alarm once it is due, at whichever comes first: the
// next Set on the clock, or the clock's timer. The timer runs at most
// once a period, and is touched only for an alarm due before the time it
// is set for. A clock on which alarms are set often (a process that makes
// connections often) so runs its alarms about on time from Set, and its
// timer about once a period, however many alarms come and go; a quiet
// clock runs them on time from its timer. An alarm comes late only when
// it falls due within a period of the timer's last run and no Set
// follows: then by up to a period.
//
// A stopped alarm keeps its place in the list until the clock next runs,
// or until stopped alarms make up half of a list of sweepAt or more, when
// Set drops them: alarms set far ahead and stopped (a long UpgradeAfter,
// short connections) do not pile up while the clock waits.
package alarm

import (
	"sync"
	"sync/atomic"
	"time"
)

// Clock runs alarms, each callback on a goroutine of its own (as
// time.AfterFunc does): one that blocks delays no other. Use New.
type Clock struct {
	period time.Duration

	mu      sync.Mutex
	alarms  []*Alarm
	stopped atomic.Int64 // about how many of alarms were stopped: a hint for Set's sweep
	soonest time.Time    // no alarm of the list is due before; zero when the list is empty
	timer   *time.Timer
	next    time.Time // when the timer fires; zero when it is not set
	ran     time.Time // when the timer last ran
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

// New returns a Clock whose timer runs at most once every period.
func New(period time.Duration) *Clock {
	c := &Clock{period: period}
	c.timer = time.AfterFunc(time.Hour, c.fire)
	c.timer.Stop()
	return c
}

// Set sets an alarm that calls f once d has passed (see the package
// documentation for how much later), and fires the alarms that are due.
func (c *Clock) Set(d time.Duration, f func()) *Alarm {
	now := time.Now()
	a := &Alarm{due: now.Add(d), f: f, c: c}
	c.mu.Lock()
	var due []*Alarm
	if !c.soonest.IsZero() && !now.Before(c.soonest) {
		due = c.takeDueLocked(now)
	} else if n := len(c.alarms); n >= sweepAt && c.stopped.Load() >= int64(n/2) {
		c.dropStoppedLocked()
	}
	c.alarms = append(c.alarms, a)
	if c.soonest.IsZero() || a.due.Before(c.soonest) {
		c.soonest = a.due
	}
	if at := c.runAt(a.due); c.next.IsZero() || at.Before(c.next) {
		c.armLocked(now, at)
	}
	c.mu.Unlock()
	run(due)
	return a
}

// runAt is when the timer may run for an alarm due at due: then, or a
// period after its last run, whichever is later.
func (c *Clock) runAt(due time.Time) time.Time {
	if at := c.ran.Add(c.period); !c.ran.IsZero() && at.After(due) {
		return at
	}
	return due
}

// armLocked sets the timer for at.
func (c *Clock) armLocked(now, at time.Time) {
	c.next = at
	c.timer.Reset(max(at.Sub(now), 0))
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

// takeDueLocked removes from the list the alarms due at now, which it
// returns, and the stopped ones, and notes when the next one is due.
func (c *Clock) takeDueLocked(now time.Time) []*Alarm {
	var due []*Alarm
	kept := c.alarms[:0]
	c.soonest = time.Time{}
	for _, a := range c.alarms {
		switch {
		case a.stopped.Load():
		case !a.due.After(now):
			due = append(due, a)
		default:
			kept = append(kept, a)
			if c.soonest.IsZero() || a.due.Before(c.soonest) {
				c.soonest = a.due
			}
		}
	}
	clear(c.alarms[len(kept):])
	c.alarms = kept
	c.stopped.Store(0)
	if len(kept) == 0 && cap(c.alarms) > sweepAt {
		c.alarms = nil // let a burst's backing array go; keep a small one
	}
	return due
}

// fire is the timer's run: it fires the alarms that are due, drops the
// stopped ones, and sets the timer for the soonest of the others.
func (c *Clock) fire() {
	now := time.Now()
	c.mu.Lock()
	c.ran = now
	due := c.takeDueLocked(now)
	if c.soonest.IsZero() {
		c.next = time.Time{}
	} else {
		c.armLocked(now, c.runAt(c.soonest))
	}
	c.mu.Unlock()
	run(due)
}

// run calls the callbacks of the alarms taken from the list, each on its
// own goroutine, unless they were stopped meanwhile.
func run(due []*Alarm) {
	for _, a := range due {
		if a.stopped.CompareAndSwap(false, true) { // claimed: out of the list, not counted
			go a.f()
		}
	}
}
