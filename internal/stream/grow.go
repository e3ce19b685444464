package stream

import (
	"fmt"

	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Growing rings: docs/protocol.md §3.11. A lease never spans two rings
// (ring.State.ReadableHere); we move only while wr.chunk is false.

// growth is a Conn's state of both rings' growth; guarded by Conn.mu.
type growth struct {
	asked   bool // our ring's growth started (its allocFor ran or runs)
	offered bool // our GROW went out
	// peer is the ring the peer's GROW offered; staging for it is
	// registered (Endpoint.nextStage) before we move.
	peer Ring
}

// maybeGrowLocked starts our ring's growth; called when a BLOCKED arrives.
func (c *Conn) maybeGrowLocked() {
	if c.opts.GrowTo == 0 || c.grow.asked || c.life != lifeOpen || c.err != nil || c.rd.shut {
		return
	}
	c.grow.asked = true
	c.loops.Add(1) // release waits for it
	go c.allocFor(c.opts.GrowTo, verbs.AccessLocalWrite|verbs.AccessRemoteWrite, func(mr verbs.MR) { c.ep.nextRing = mr })
}

// allocFor registers size bytes with access off the callers' path and
// hands the region to install under mu, unless the Conn stopped meanwhile;
// a registration the host refuses leaves the rings as they are.
func (c *Conn) allocFor(size int, access verbs.Access, install func(verbs.MR)) {
	defer c.loops.Done()
	mr, err := c.ep.dev.AllocMR(size, access)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.stats.GrowFailures.Add(1)
		return
	}
	if c.life != lifeOpen || c.err != nil {
		_ = mr.Close()
		return
	}
	install(mr)
	c.countRegisteredLocked()
	c.growLocked()
}

// peerMovedLocked handles the peer's MOVED, accepted by ring.State: its
// bytes from the message's cursor on are in the ring our GROW offered.
func (c *Conn) peerMovedLocked() {
	c.ep.oldRing, c.ep.ring, c.ep.nextRing = c.ep.ring, c.ep.nextRing, nil
	c.ringSize.Store(int64(c.st.Params().LocalSize))
	c.countRegisteredLocked()
	c.stats.RingGrows.Add(1)
}

// peerGrowLocked handles the peer's GROW, accepted by ring.State.
func (c *Conn) peerGrowLocked(m ring.Msg) {
	size := c.st.PeerGrowing()
	limit := c.opts.PeerRingLimit
	if limit == 0 {
		limit = ring.MaxRingSize
	}
	if c.direct != nil || size > limit {
		c.transportFailedLocked(reset("peer broke the protocol", fmt.Errorf("%w: a GROW to %d bytes (mapped ring: %v, limit %d)", ring.ErrProtocol, size, c.direct != nil, limit)))
		return
	}
	c.grow.peer = Ring{Size: size, Addr: m.Addr, RKey: m.RKey, Credits: c.peer.Credits}
	c.loops.Add(1)
	go c.allocFor(int(size), verbs.AccessLocalWrite, func(mr verbs.MR) { c.ep.nextStage = mr })
}

// growLocked offers our new ring once registered, moves our writing once
// the peer's has staging, and releases an old ring or staging not needed.
func (c *Conn) growLocked() {
	e := c.ep
	if e.nextRing == nil && e.nextStage == nil && e.oldRing == nil && e.oldStage == nil {
		return
	}
	defer c.countRegisteredLocked()
	if e.nextRing != nil && !c.grow.offered && c.rd.shut {
		// Nobody reads: the larger ring would go unused.
		_ = e.nextRing.Close()
		e.nextRing = nil
	}
	ok := c.err == nil && c.life == lifeOpen && !c.st.PeerClosed() && c.sqFreeLocked() > 0
	if e.nextRing != nil && !c.grow.offered && ok && c.st.CanSendControl() {
		if m, err := c.st.Grow(uint64(c.opts.GrowTo), e.nextRing.Addr(), e.nextRing.RKey()); err == nil {
			c.grow.offered = true
			c.postMsgLocked(&m, false, false)
		}
	}
	if e.nextStage != nil && !c.wr.chunk && ok && c.st.CanSendControl() {
		if m, err := c.st.Next(ring.FlagMoved); err == nil {
			e.oldStage, e.stage, e.nextStage = e.stage, e.nextStage, nil
			c.peer = c.grow.peer
			c.stats.RingGrows.Add(1)
			c.postMsgLocked(&m, false, false)
			c.wakeLocked(evWrite) // a writer waiting for space has more now
		}
	}
	if at, _, moved := c.st.Moved(); moved && e.oldRing != nil && c.st.Cons() >= at {
		_ = e.oldRing.Close()
		e.oldRing = nil
	}
	if at, _, moved := c.st.PeerMoved(); moved && e.oldStage != nil && c.st.PeerCons() >= at {
		_ = e.oldStage.Close()
		e.oldStage = nil
	}
}

// ringMemLocked is our ring that holds the consumer cursor: the old one
// of a move (old, from ring.State.ReadableHere) or the current one.
func (c *Conn) ringMemLocked(old bool) []byte {
	if old {
		return c.ep.oldRing.Bytes()
	}
	return c.ep.ring.Bytes()
}

// receivedLocked copies the peer's bytes [from, to) out of our ring(s).
func (c *Conn) receivedLocked(from, to uint64) []byte {
	at, _, moved := c.st.Moved()
	var old []byte
	if c.ep.oldRing != nil {
		old = c.ep.oldRing.Bytes()
	}
	return copyAcross(old, c.ep.ring.Bytes(), moved, at, from, to)
}

// copyAcross copies ring bytes [from, to) out of cur, or, after a move at
// cursor at (moved), those before at out of old (kept while wanted).
func copyAcross(old, cur []byte, moved bool, at, from, to uint64) []byte {
	if !moved || from >= at {
		return copyOut(cur, from, to)
	}
	b := copyOut(old, from, min(to, at))
	if to > at {
		b = append(b, copyOut(cur, at, to)...)
	}
	return b
}

// sentLocked copies our bytes [from, to) out of what holds them: the
// peer's mapped ring, or the staging (both stagings of a move).
func (c *Conn) sentLocked(from, to uint64) []byte {
	if c.direct != nil {
		return copyOut(c.direct, from, to)
	}
	at, oldSize, moved := c.st.PeerMoved()
	var old []byte
	if c.ep.oldStage != nil {
		old = c.ep.oldStage.Bytes()[:oldSize]
	}
	return copyAcross(old, c.ep.stage.Bytes()[:c.peer.Size], moved, at, from, to)
}
