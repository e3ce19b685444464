package stream

import (
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The backstop: a notification that never comes (a lost wake-up, a
// doorbell word overwritten from outside) must not stall a connection
// with bytes in flight for good. While bytes we placed in the peer's ring
// are not reported consumed, a timer runs, as TCP's retransmission timer
// does: when it fires it polls our completions, which finds what a lost
// notification of ours hid (the peer's credits), and, if the peer has
// consumed nothing since the last time, kicks the peer's queue
// (verbs.Kicker): if the peer has not taken every message we sent, it is
// made to act as if notified, and the timer backs off, doubling up to
// backstopMax; if it has, it knows what is in flight (a receiver reports
// what it consumed only past a threshold, or when asked: ring.State), and
// the timer stops until more bytes are placed or a Write stalls. It fires
// every backstopAfter while bytes move. A connection with nothing in
// flight has no timer, and an idle one at most one run after its last
// Write.
const (
	backstopAfter = 500 * time.Millisecond
	backstopMax   = 30 * time.Second
)

// backstop is the timer's state, guarded by Conn.mu.
type backstop struct {
	t    *time.Timer
	on   bool          // t is pending
	cons uint64        // the peer's consumer cursor when t was armed
	wait time.Duration // t's period
}

// armBackstopLocked starts the timer for bytes just placed, unless it
// runs.
func (c *Conn) armBackstopLocked() {
	if c.bs.on {
		return
	}
	c.bs.on, c.bs.cons, c.bs.wait = true, c.st.PeerCons(), backstopAfter
	if c.bs.t == nil {
		c.bs.t = time.AfterFunc(backstopAfter, c.backstopFired)
	} else {
		c.bs.t.Reset(backstopAfter)
	}
}

// stop stops the timer (Close, Detach).
func (b *backstop) stop() {
	if b.t != nil {
		b.t.Stop()
	}
}

// backstopFired is the timer's.
func (c *Conn) backstopFired() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bs.on = false
	if c.life >= lifeClosing || c.err != nil {
		return
	}
	c.progressLocked()
	cons := c.st.PeerCons()
	switch {
	case cons == c.st.Prod() && !c.wr.busy:
		return // nothing in flight: the next bytes placed arm it again
	case cons != c.bs.cons:
		c.bs.wait = backstopAfter
	default:
		if k, ok := c.ep.qp.(verbs.Kicker); ok && k.Kick() {
			c.stats.Backstops.Add(1)
		} else if !c.wr.busy {
			// The peer has taken every message: it knows what is in
			// flight, and says when it consumed it, as the ring's rules
			// ask. The next bytes placed arm the timer again. (A Write
			// that waits, for that answer or for message credits, keeps
			// it running: the answer's notification could be lost too.)
			return
		}
		c.bs.wait = min(2*c.bs.wait, backstopMax)
	}
	c.bs.on, c.bs.cons = true, cons
	c.bs.t.Reset(c.bs.wait)
}
