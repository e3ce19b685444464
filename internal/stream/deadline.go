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
type deadline struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel chan struct{} // closed when the deadline passes
	passed atomic.Bool   // cancel is closed: read without mu on every Read and Write
	expire func()        // called after cancel is closed, for waiters not on the channel
}

func newDeadline(expire func()) *deadline {
	return &deadline{cancel: make(chan struct{}), expire: expire}
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
			d.cancel = make(chan struct{})
			d.passed.Store(false)
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.cancel = make(chan struct{})
			d.passed.Store(false)
		}
		ch := d.cancel
		d.timer = time.AfterFunc(dur, func() {
			d.passed.Store(true)
			close(ch)
			d.expire()
		})
		return
	}
	if !closed {
		d.passed.Store(true)
		close(d.cancel)
		d.expire()
	}
}

// wait returns a channel that is closed when the deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cancel
}

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
