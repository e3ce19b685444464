package stream

import (
	"sync"
	"sync/atomic"
	"time"
)

// deadline is a settable point in time at which waiters give up. It keeps a
// channel that is closed once the deadline has passed; setting a new
// deadline replaces the channel, so a waiter re-reads it on every wait. The
// design follows the net package's pipe: moving a deadline while an
// operation blocks takes effect at once.
//
// Every Read and Write checks its deadline (expired), often many times per
// millisecond on a busy stream, so the check is one atomic load and no
// lock, and so is wait: mu serialises only the setters. cur always holds
// the current cancel channel; passed is set just before it is closed.
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes; replaced under mu
	cur    atomic.Value  // cancel's current value (a chan struct{}), for the lock-free readers
	passed atomic.Bool   // cancel is closed (or about to be)
}

func newDeadline() *deadline {
	d := &deadline{}
	d.replace()
	return d
}

// replace installs a fresh cancel channel; called under mu (or before d is
// shared). A deadline is usable once replace has run.
func (d *deadline) replace() {
	d.cancel = make(chan struct{})
	d.passed.Store(false)
	d.cur.Store(d.cancel)
}

// set arms the deadline for t; the zero time disarms it. A t in the past
// expires it at once.
func (d *deadline) set(t time.Time) {
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

// wait returns a channel that is closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} { return d.cur.Load().(chan struct{}) }

// expired reports whether the deadline has passed.
func (d *deadline) expired() bool { return d.passed.Load() }

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
