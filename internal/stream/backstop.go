package stream

import (
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The backstop (docs/protocol.md §4.1): while bytes we placed in the
// peer's ring are not reported consumed, a timer, like TCP's
// retransmission timer, polls our completions every backstopAfter and,
// if the peer consumed nothing since, kicks its queue (verbs.Kicker),
// backing off up to backstopMax. It stops when nothing is in flight, or
// when the peer has taken every message and no Write waits.
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

// armBackstopLocked starts the timer for bytes just placed, unless it runs.
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
			// flight and reports what it consumes. A waiting Write keeps
			// the timer running: its answer's notification could be lost.
			return
		}
		c.bs.wait = min(2*c.bs.wait, backstopMax)
	}
	c.bs.on, c.bs.cons = true, cons
	c.bs.t.Reset(c.bs.wait)
}
