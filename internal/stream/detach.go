package stream

import (
	"errors"
	"fmt"
	"net"
)

// Failover: docs/protocol.md §9.10, and Owner.Failed.

// ErrMoving is wrapped by what a Conn's calls return once its transport
// failed and its stream moves to another path (Options.Failover), or
// once Detach was called. The caller carries on on that path.
var ErrMoving = errors.New("rsock: the ring's transport failed; the stream moves on")

// Moving reports whether the Conn's transport failed and its stream is to
// move on (Owner.Failed was or is about to be called), or Detach was
// called. It polls first and decides on a failure found at once (no
// suspectGrace): an Owner asks before it closes the Conn, so that a
// failure no call has seen yet moves the stream rather than aborting it.
func (c *Conn) Moving() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && c.life == lifeOpen {
		c.progressLocked()
		if c.suspect != nil {
			c.movingLocked(c.suspect)
		}
	}
	return errors.Is(c.err, ErrMoving)
}

// Leftover is what a detached Conn hands on: the stream bytes only it holds.
type Leftover struct {
	// Unread holds the bytes the peer announced that no Read took, in order.
	// Received is the ring's cursor after them: every byte the peer announced.
	Unread   []byte
	Received uint64
	// Unacked holds the bytes the peer has not reported consumed: ring
	// bytes [Sent-len(Unacked), Sent). Sent is our producer cursor, every
	// byte a Write placed (announced or not).
	Unacked []byte
	Sent    uint64
	// FIN reports that CloseWrite was called.
	FIN bool
}

// movingLocked starts a failover for err, if the Conn may, and reports whether.
func (c *Conn) movingLocked(err error) bool {
	if !c.opts.Failover || c.err != nil || c.life != lifeOpen || c.st.PeerClosed() {
		return false
	}
	c.err = fmt.Errorf("%w: %w", ErrMoving, err)
	c.wakeLocked(evRead | evWrite | evClose)
	c.tellOwnerLocked()
	return true
}

// transportFailedLocked fails over (movingLocked) if the Conn may, else resets.
func (c *Conn) transportFailedLocked(err error) {
	if !c.movingLocked(err) {
		c.failLocked(err)
	}
}

// Detach ends the Conn's use of its transport and returns what the stream still
// needs from it. Calls in progress return (an error wrapping ErrMoving) and
// later ones fail with net.ErrClosed; Detach waits until no Read or Write is
// inside the Conn, except a CopyTo blocked in its writer, whose piece counts as
// read. No final message and no goodbye are sent; the queue pair and memory are
// released in the background. It fails with the Conn's error if the Conn was
// reset, and with net.ErrClosed after Close or a first Detach.
func (c *Conn) Detach() (Leftover, error) {
	c.mu.Lock()
	switch {
	case c.life >= lifeClosing:
		c.mu.Unlock()
		return Leftover{}, net.ErrClosed
	case c.err == nil:
		c.err = ErrMoving // the peer saw the failure first
		c.wakeLocked(evRead | evWrite | evClose)
	case !errors.Is(c.err, ErrMoving):
		err := c.err
		c.mu.Unlock()
		return Leftover{}, err
	}
	c.rd.stop.Store(true) // no more Reads from a lease
	// A CopyTo in its writer can stay there. Any other reader leaves at
	// once (it checks c.err, or copies from a lease and sees rd.stop), and
	// a CopyTo hands its writer no new piece now.
	copying := c.rd.copying > 0
	c.mu.Unlock()
	c.wr.mu.Lock()
	defer c.wr.mu.Unlock()
	if !copying {
		c.rd.mu.Lock()
		defer c.rd.mu.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life >= lifeClosing {
		return Leftover{}, net.ErrClosed
	}
	c.progressLocked() // announcements that arrived before the failure
	lo := Leftover{Received: c.st.PeerProd(), Sent: c.st.Prod(), FIN: c.wr.shut}
	if from := c.st.Cons() + c.rd.taken + c.rd.copying; !c.rd.shut && from < lo.Received {
		lo.Unread = c.receivedLocked(from, lo.Received)
	}
	if from := c.st.PeerCons(); from < lo.Sent {
		lo.Unacked = c.sentLocked(from, lo.Sent)
	}
	c.life = lifeClosing
	close(c.done)
	c.bs.stop()
	c.release(c.done) // closed: no goodbye to wait for
	return lo, nil
}

// copyOut copies ring bytes [from, to) out of mem, a ring of len(mem)
// bytes (a power of two) with to-from at most len(mem).
func copyOut(mem []byte, from, to uint64) []byte {
	size := uint64(len(mem))
	b := make([]byte, to-from)
	off := from & (size - 1)
	k := copy(b, mem[off:])
	copy(b[k:], mem)
	return b
}
