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
// Every Read and Write checks its deadline (expired), often many times per
// millisecond on a busy stream, so the check is one atomic load and no
// lock, and so is wait: mu serialises only the setters. cur always holds
// the current cancel channel; passed is set just before it is closed.
type Deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes; replaced under mu
	cur    atomic.Value  // cancel's current value (a chan struct{}), for the lock-free readers
	passed atomic.Bool   // cancel is closed (or about to be)
}

// New returns a disarmed Deadline.
func New() *Deadline {
	d := &Deadline{}
	d.Init()
	return d
}

// Init makes a zero Deadline usable (disarmed); call it before d is shared.
func (d *Deadline) Init() { d.replace() }

// replace installs a fresh cancel channel; called under mu (or by Init).
func (d *Deadline) replace() {
	d.cancel = make(chan struct{})
	d.passed.Store(false)
	d.cur.Store(d.cancel)
}

// Set arms the deadline for t; the zero time disarms it. A t in the past
// expires it at once.
func (d *Deadline) Set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.cancel // the timer fired (or is firing): wait until it closed cancel
	}
	d.timer = nil
	closed := isClosed(d.cancel)
	if t.IsZero() {
		if closed {
			d.replace()
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.replace()
		}
		ch := d.cancel
		d.timer = time.AfterFunc(dur, func() {
			d.passed.Store(true)
			close(ch)
		})
		return
	}
	if !closed {
		d.passed.Store(true)
		close(d.cancel)
	}
}

// Wait returns a channel that is closed when the deadline passes. A later
// Set may replace it: wait on a fresh one each time.
func (d *Deadline) Wait() <-chan struct{} { return d.cur.Load().(chan struct{}) }

// Expired reports whether the deadline has passed.
func (d *Deadline) Expired() bool { return d.passed.Load() }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
