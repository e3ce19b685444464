package stream

import (
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The backstop timer: first period, longest backoff (docs/protocol.md §4.1).
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

func (b *backstop) stop() {
	if b.t != nil {
		b.t.Stop()
	}
}

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
			// The peer has every message and reports what it consumes; only
			// a waiting Write (its answer's notification may be lost) keeps it.
			return
		}
		c.bs.wait = min(2*c.bs.wait, backstopMax)
	}
	c.bs.on, c.bs.cons = true, cons
	c.bs.t.Reset(c.bs.wait)
}
