package stream

import (
	"fmt"
	"net"
	"time"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/handshake"
)

// Bounds on the orderly close.
const (
	// finalAckTimeout bounds how long Close waits for the final message to
	// be acknowledged before it says goodbye (an abort, then) on the
	// bootstrap connection. On RC hardware a lost packet is sent again
	// after the QP's ACK timeout (537 ms, internal/verbs/ibverbs), so a
	// final message behind a loss completes after that: the bound leaves
	// room for several retransmissions. A peer whose transport gives up
	// fails the send (an error completion ends the wait at once), and a
	// dead peer process is found by the bootstrap connection instead.
	finalAckTimeout = 4 * time.Second
	// goodbyeGrace bounds how long, after the peer's goodbye, we wait for
	// the ring messages it promised (its final producer cursor).
	goodbyeGrace = time.Second
)

// Owner is the connection a Conn carries the stream for: it holds the
// bootstrap TCP connection, reads what the peer says there (PeerGoodbye),
// and ends the connection. The Conn calls it without its lock.
type Owner interface {
	// Goodbye sends g (FinalProd: the ring's producer cursor) and then
	// closes the bootstrap connection, within a bounded time; calls after
	// the first do nothing. Close calls it.
	Goodbye(g *handshake.Goodbye)
	// Reset is called once when the Conn was reset (err is a
	// *ResetError) other than by Close: the owner tells the peer, with an
	// abort goodbye.
	Reset(c *Conn, err error)
	// TransportFailed is called once, with Options.Failover, when c's
	// transport failed and the stream can move on: c's calls return an
	// error wrapping ErrMoving, and the owner takes what the stream still
	// needs with Detach (detach.go).
	TransportFailed(c *Conn, cause error)
}

// PeerGoodbye handles the peer's goodbye on the bootstrap connection: an
// orderly one ends the connection in order (awaitFinal; its FinalProd is
// the peer's ring producer cursor), an abort resets it. It may wait up to
// goodbyeGrace; it returns at once after Close.
func (c *Conn) PeerGoodbye(g *handshake.Goodbye) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life >= lifeClosing {
		return
	}
	c.loops.Add(1) // release waits for it; Close has not started
	defer c.loops.Done()
	if g.Abort {
		c.failLocked(reset("peer aborted: "+g.Reason, nil))
		return
	}
	c.awaitFinal(g.FinalProd)
}

// awaitFinal handles the peer's orderly goodbye: it gives the ring
// messages the peer sent before it a bounded time to arrive (waiting as a
// call does, woken by what reads wait for), then marks the peer gone so
// reads end with EOF after the data and writes fail. mu is held on entry
// and on return, released while it waits.
func (c *Conn) awaitFinal(final uint64) {
	dl := deadline.New()
	dl.Set(time.Now().Add(goodbyeGrace))
	defer dl.Set(time.Time{})
	e := new(entry).init(evRead, c.done)
	for c.err == nil && c.life < lifeClosing {
		drain(e.ch)
		c.progressLocked()
		if c.st.PeerProd() >= final || c.err != nil || c.life >= lifeClosing || c.wait(e, dl, nil) != nil {
			break
		}
	}
	if c.life >= lifeClosing || c.err != nil {
		return
	}
	if c.st.PeerProd() != final {
		c.failLocked(reset("peer's goodbye does not match the data it sent", fmt.Errorf("have %d bytes, goodbye says %d", c.st.PeerProd(), final)))
		return
	}
	c.life = lifePeerGone
	c.wakeLocked(evRead | evWrite)
}

// life is where a Conn is in its lifecycle; docs/protocol.md §4 draws it.
// It only moves forward, under mu:
//
//	open ──the peer's goodbye──▶ peerGone
//	open, peerGone ──Close──▶ closing ──goodbye sent──▶ closed
//
// A transport failure (err, set once) is orthogonal: it ends the data
// path in any state, and Close then says goodbye with an abort. In closing,
// the final message goes out only if Close came from open with no failure.
// The memory is released after closed, by the last reference (release).
type life uint8

const (
	lifeOpen     life = iota
	lifePeerGone      // the peer said goodbye: reads end with EOF after the data, writes fail
	lifeClosing       // Close was called: calls fail with net.ErrClosed; the goodbye is on its way
	lifeClosed        // the goodbye was sent and the bootstrap connection closed
)

// Close closes the Conn: blocked calls return net.ErrClosed at once, and
// the peer reads EOF after everything written. It sends the final message
// and waits, woken by its acknowledgement, at most finalAckTimeout for it
// (or as SetLinger says), then says goodbye on the bootstrap connection. The queue pair and memory
// are released by the last reference: by Close if no call is in the Conn,
// else in the background once the last one has left (a Read copying out of
// the ring, a CopyTo whose writer blocks). A second Close returns
// net.ErrClosed.
// A transport failure that shows while Close waits (its final message
// fails) ends the wait at once, and the goodbye is an abort; a caller
// with Options.Failover asks Moving first, which finds a failure already there.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.life >= lifeClosing {
		c.mu.Unlock()
		return net.ErrClosed
	}
	if c.linger == 0 && c.err == nil {
		c.err = reset("closed with linger 0 (abort)", nil)
	}
	final := c.life == lifeOpen && c.err == nil
	c.life = lifeClosing
	c.rd.stop.Store(true)
	close(c.done)
	c.bs.stop()
	c.st.SetClose()
	c.sayGoodbye(final)
	c.life = lifeClosed
	c.mu.Unlock()
	if c.active.Load() == 0 && c.rd.mu.TryLock() {
		c.rd.mu.Unlock() // no Read is in the ring, and later ones see rd.stop
		c.release()
		return nil
	}
	go func() {
		c.calls.Wait()
		// A Read from a lease is not among the calls (recv.go): taking the
		// receive half's lock waits for one still copying out of the ring.
		c.rd.mu.Lock()
		//lint:ignore SA2001 the empty critical section is the barrier
		c.rd.mu.Unlock()
		c.release()
	}()
	return nil
}

// SetLinger sets how Close ends the connection, as SO_LINGER does for TCP:
// with sec < 0 (the default) Close waits at most finalAckTimeout for the
// final message to be acknowledged, with sec > 0 at most sec seconds, and
// with sec == 0 it aborts: it sends no final message, the peer's calls
// fail with a reset, and bytes it has not read are lost.
func (c *Conn) SetLinger(sec int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life >= lifeClosing {
		return net.ErrClosed
	}
	c.linger = sec
	return nil
}

// release frees what the Conn holds once nothing uses it: the QP first
// (outstanding work flushes), drained, then the completion queue, then
// the memory.
func (c *Conn) release() {
	c.ep.release(func() { c.drain(); c.loops.Wait() })
}

// sayGoodbye sends the final state message (FIN and CLOSE with our final
// producer cursor) if final, waits a bounded time for it to be
// acknowledged, so it is in the peer's memory before the peer reads our
// goodbye, then sends the goodbye on the bootstrap connection and closes
// it. mu is held on entry and on return, released while it waits and
// while it writes the goodbye.
func (c *Conn) sayGoodbye(final bool) {
	dl := deadline.New()
	wait := finalAckTimeout
	if c.linger > 0 {
		wait = time.Duration(c.linger) * time.Second
	}
	dl.Set(time.Now().Add(wait))
	defer dl.Set(time.Time{})
	e := new(entry).init(evClose, nil) // Close's own wait: nothing ends it but dl
	for final {
		drain(e.ch)
		if c.closeSig == 0 && c.err == nil {
			c.sendLocked(0, true)
		}
		c.progressLocked()
		if c.st.PeerClosed() || (c.closeSig != 0 && c.sqDone >= c.closeSig) {
			break
		}
		if c.suspect != nil {
			c.failLocked(c.suspect) // the final message failed: no ack will come
		}
		if c.err != nil {
			break
		}
		if err := c.wait(e, dl, nil); err != nil {
			// Say why, for the peer's log and ours: no credit to send it,
			// or sent and not acknowledged.
			polled := c.progressLocked()
			c.failLocked(reset("final message not acknowledged", fmt.Errorf("sent %v, credits %d, send queue free %d, done %d of %d, last poll found %v, notifications %d",
				c.closeSig != 0, c.st.Credits(), c.sqFreeLocked(), c.sqDone, c.closeSig, polled, c.stats.Notifications.Load())))
		}
	}
	gb := &handshake.Goodbye{FinalProd: c.st.Prod()}
	if c.err != nil {
		gb = &handshake.Goodbye{Abort: true, Reason: handshake.SanitizeReason(resetWhy(c.err))}
	}
	c.mu.Unlock()
	c.owner.Goodbye(gb)
	c.mu.Lock()
}

// drain polls flushed completions for a bounded time after the QP closed.
func (c *Conn) drain() {
	end := time.Now().Add(100 * time.Millisecond)
	for time.Now().Before(end) {
		c.mu.Lock()
		n, err := c.ep.cq.Poll(c.wcs[:])
		c.mu.Unlock()
		if err != nil || n == 0 {
			return
		}
	}
}
