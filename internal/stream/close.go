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
	// finalAckTimeout bounds Close's wait for the final message's ack before
	// its goodbye (an abort, then): room for several RC retransmissions (the
	// QP's ACK timeout, internal/verbs/ibverbs). A failed send ends it at once.
	finalAckTimeout = 4 * time.Second
	// goodbyeGrace bounds the wait for the ring messages a goodbye promised.
	goodbyeGrace = time.Second
)

// Owner is the connection a Conn carries the stream for: it holds the
// bootstrap TCP connection, reads what the peer says there (PeerGoodbye),
// and ends the connection. The Conn calls it without its lock.
type Owner interface {
	// Goodbye sends g (FinalProd: the ring's producer cursor) and then
	// closes the bootstrap connection, within a bounded time; calls after
	// the first do nothing. Its channel is closed with the connection: at
	// the peer's end, which comes once the peer has what the ring carried
	// (a send completion does not say so on iWARP), or at the bound. Close
	// releases the queue pair only then.
	Goodbye(g *handshake.Goodbye) <-chan struct{}
	// Failed is called once when c failed other than by Close or Detach,
	// with the error c's calls return. Either err is a *ResetError, and the
	// owner tells the peer with an abort goodbye; or, with
	// Options.Failover, err wraps ErrMoving: c's transport failed, and the
	// owner takes what the stream still needs with Detach.
	Failed(c *Conn, err error)
}

// PeerGoodbye handles the peer's goodbye on the bootstrap connection: an
// abort resets the connection; after an orderly one it waits up to
// goodbyeGrace for the ring messages sent before it (its FinalProd is the
// peer's ring producer cursor), then marks the peer gone: reads end with
// EOF after the data. It returns at once after Close. It reports whether
// the peer is gone in order: the ring has every message the goodbye promised.
func (c *Conn) PeerGoodbye(g *handshake.Goodbye) (gone bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life >= lifeClosing {
		return false
	}
	c.loops.Add(1) // release waits for it; Close has not started
	defer c.loops.Done()
	if g.Abort {
		c.failLocked(reset("peer aborted: "+g.Reason, nil))
		return false
	}
	dl := deadline.New()
	dl.Set(time.Now().Add(goodbyeGrace))
	defer dl.Set(time.Time{})
	e := new(entry).init(evRead, c.done)
	for c.err == nil && c.life < lifeClosing {
		drain(e.ch)
		c.progressLocked()
		if c.st.PeerProd() >= g.FinalProd || c.err != nil || c.life >= lifeClosing || c.wait(e, dl, false) != nil {
			break
		}
	}
	if c.life >= lifeClosing || c.err != nil {
		return false
	}
	if c.st.PeerProd() != g.FinalProd {
		c.failLocked(reset("peer's goodbye does not match the data it sent", fmt.Errorf("have %d bytes, goodbye says %d", c.st.PeerProd(), g.FinalProd)))
		return false
	}
	c.life = lifePeerGone
	c.wakeLocked(evRead | evWrite)
	return true
}

// Fail resets c with err, its owner's failure of the whole connection:
// c's calls return err (a *ResetError). It does nothing once c has failed
// or Close has begun.
func (c *Conn) Fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life < lifeClosing {
		c.failLocked(err)
	}
}

// life is where a Conn is in its lifecycle (docs/protocol.md §4); it only
// moves forward, under mu. A transport failure (err) is orthogonal to it.
type life uint8

const (
	lifeOpen     life = iota
	lifePeerGone      // the peer said goodbye: reads end with EOF after the data, writes fail
	lifeClosing       // Close or Detach was called: calls fail with net.ErrClosed
)

// Close closes the Conn: blocked calls return net.ErrClosed at once, and
// the peer reads EOF after everything written. If the Conn is open and has
// not failed, it sends the final message and waits for its acknowledgement;
// then it says goodbye on the bootstrap connection, an abort if a failure
// showed, and after an orderly goodbye it waits for the peer's end of the
// bootstrap (Owner.Goodbye). linger bounds that as SO_LINGER does for TCP:
// with linger < 0 Close waits at most finalAckTimeout, with linger > 0 at
// most linger seconds, and with linger == 0 it aborts: it sends no final
// message, the peer's calls fail with a reset, and bytes it has not read
// are lost. The queue pair and memory are released once the bootstrap has
// ended and the last call has left (a Read copying out of the ring, a
// CopyTo whose writer blocks). A second Close returns net.ErrClosed.
func (c *Conn) Close(linger int) error {
	c.mu.Lock()
	if c.life >= lifeClosing {
		c.mu.Unlock()
		return net.ErrClosed
	}
	if linger == 0 && c.err == nil {
		c.err = reset("closed with linger 0 (abort)", nil)
	}
	final := c.life == lifeOpen && c.err == nil
	c.life = lifeClosing
	c.rd.stop.Store(true)
	close(c.done)
	c.bs.stop()
	c.st.SetClose()
	ended := c.sayGoodbye(final, linger)
	c.mu.Unlock()
	c.release(ended) // once the peer has what we sent (Owner.Goodbye)
	return nil
}

// release frees what the Conn holds (Endpoint.release) in the background,
// once ended is closed and the last call has left, and polls for a bounded
// time the completions the closed QP flushed.
func (c *Conn) release(ended <-chan struct{}) {
	go func() {
		c.calls.Wait()
		// A Read from a lease is not among the calls (recv.go): taking the
		// receive half's lock waits for one still copying out of the ring.
		c.rd.mu.Lock()
		//lint:ignore SA2001 the empty critical section is the barrier
		c.rd.mu.Unlock()
		<-ended
		c.ep.release(func() {
			end := time.Now().Add(100 * time.Millisecond)
			for time.Now().Before(end) {
				c.mu.Lock()
				n, err := c.ep.cq.Poll(c.wcs[:])
				c.mu.Unlock()
				if err != nil || n == 0 {
					break
				}
			}
			c.loops.Wait()
		})
	}()
}

// sayGoodbye sends the final FIN|CLOSE message if final and waits a bounded
// time for its ack, so that it is on its way before the peer reads our
// goodbye; then it says goodbye, ending the bootstrap, and after an orderly
// one waits, within the same bound (as Close's linger says), for the peer's
// end. It returns Owner.Goodbye's channel. mu is held on entry and on
// return, released while it waits and while it writes the goodbye.
func (c *Conn) sayGoodbye(final bool, linger int) <-chan struct{} {
	dl := deadline.New()
	wait := finalAckTimeout
	if linger > 0 {
		wait = time.Duration(linger) * time.Second
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
		if err := c.wait(e, dl, false); err != nil {
			// Say why, for both logs: no credit to send it, or no ack.
			polled := c.progressLocked()
			c.failLocked(reset("final message not acknowledged", fmt.Errorf("sent %v, credits %d, send queue free %d, done %d of %d, last poll found %v, notifications %d",
				c.closeSig != 0, c.st.Credits(), c.sqFreeLocked(), c.sqDone, c.closeSig, polled, c.stats.Notifications.Load())))
		}
	}
	gb := &handshake.Goodbye{FinalProd: c.st.Prod()}
	if c.err != nil {
		gb = &handshake.Goodbye{Abort: true, Reason: handshake.SanitizeReason(Why(c.err))}
	}
	c.mu.Unlock()
	ended := c.owner.Goodbye(gb)
	if final && !gb.Abort {
		// The acknowledgement that counts: the peer has what we sent.
		select {
		case <-ended:
		case <-dl.Wait():
		}
	}
	c.mu.Lock()
	return ended
}
