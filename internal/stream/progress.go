package stream

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/verbs"
)

// progressLocked handles every completion in the queue, sends what we owe
// the peer (flushLocked) and wakes the calls concerned; it reports whether
// it found any, or the poll failed. mu is held.
func (c *Conn) progressLocked() bool {
	// Drain the queue: a waiter arms before it polls, and an armed
	// notification fires only for completions added after Arm, so any left
	// behind here would wait for the next one.
	var ev event
	total := 0
	for {
		n, err := c.ep.cq.Poll(c.wcs[:])
		if err != nil {
			if c.life < lifeClosing {
				c.transportFailedLocked(reset("polling completions", err))
			}
			return true
		}
		total += n
		for i := range c.wcs[:n] {
			wc := &c.wcs[i]
			if wc.Op == verbs.OpRecv {
				ev |= c.handleRecvLocked(wc)
			} else {
				c.handleSendLocked(wc)
				ev |= evWrite
			}
		}
		if n < len(c.wcs) {
			break
		}
	}
	if total > 0 {
		c.flushLocked()
	}
	c.wakeLocked(ev)
	return total > 0
}

// handleRecvLocked handles a receive completion and returns the events it
// caused (a message that only returns credits wakes no Read).
func (c *Conn) handleRecvLocked(wc *verbs.Completion) event {
	if err := wc.Err(); err != nil {
		if c.life < lifeClosing {
			c.suspectLocked(reset("receive failed", err))
		}
		return evRead | evWrite
	}
	slot := int(wc.ID)
	if slot < 0 || slot >= c.opts.Credits || wc.Len != ring.MsgLen {
		c.transportFailedLocked(reset("bad state message", fmt.Errorf("%w: slot %d, %d bytes", ring.ErrMsgFormat, wc.ID, wc.Len)))
		return evRead | evWrite
	}
	buf := c.ep.slots.Bytes()[slot*slotSize : slot*slotSize+ring.MsgLen]
	prod, fin, closed := c.st.PeerProd(), c.st.PeerFIN(), c.st.PeerClosed()
	space, credits := c.st.Space(), c.st.Credits()
	m, err := ring.Unmarshal(buf)
	if err == nil {
		err = c.st.Receive(m)
	}
	if err != nil {
		c.transportFailedLocked(reset("peer broke the protocol", err))
		return evRead | evWrite
	}
	c.stats.MsgsRecv.Add(1)
	if m.Flags&ring.FlagMoved != 0 {
		c.peerMovedLocked() // whatever else happens: the state says so
	}
	if c.life >= lifeClosing || c.err != nil {
		return evRead | evWrite
	}
	if err := c.ep.postSlot(slot); err != nil {
		c.suspectLocked(reset("reposting a receive", err))
		return evRead | evWrite
	}
	if err := c.st.Reposted(); err != nil {
		c.failLocked(err)
	}
	switch {
	case m.Flags&ring.FlagGrow != 0:
		c.peerGrowLocked(m)
	case m.Flags&ring.FlagBlocked != 0:
		c.maybeGrowLocked()
	}
	if c.rd.shut && !c.lentLocked() {
		// Nobody will read: consume and discard so the peer is not stalled
		// (bytes lent to a Read or CopyTo are discarded when it is done).
		_ = c.st.Consumed(c.st.Readable())
	}
	peerClosed := c.st.PeerClosed() != closed
	var ev event
	if c.st.PeerProd() != prod || c.st.PeerFIN() != fin || peerClosed {
		ev |= evRead
	}
	if c.st.Space() != space || c.st.Credits() != credits || peerClosed {
		ev |= evWrite
	}
	return ev
}

func (c *Conn) handleSendLocked(wc *verbs.Completion) {
	// Any completion, failed or not, retires its request and those before
	// it (RC executes in order; after a failure the rest flush).
	if wc.ID > c.sqDone {
		c.sqDone = wc.ID
	}
	if c.closeSig != 0 && c.sqDone >= c.closeSig {
		c.wakeLocked(evClose)
	}
	// After the peer's CLOSE it tears its queue pair down: our requests
	// may fail, and that is its goodbye, not a fault.
	if err := wc.Err(); err != nil {
		c.suspectLocked(reset("send failed", err))
	}
}

func (c *Conn) sqFreeLocked() int { return c.opts.SendDepth - int(c.sqPosted-c.sqDone) }

// queueLocked adds wr to the chain that the next post (ringLocked) sends,
// and gives it its send-queue slot. Every SendDepth/4-th request is
// signaled, so a full send queue always holds a signaled request whose
// completion retires the ones before it. The slots of requests whose post
// fails are not given back: the transport is then suspect.
func (c *Conn) queueLocked(wr verbs.SendWR, signal bool) error {
	if c.sqFreeLocked() <= 0 {
		return verbs.ErrQueueFull
	}
	if c.nchain == len(c.chain) {
		if err := c.ringLocked(); err != nil {
			return err
		}
	}
	c.sqPosted++
	wr.ID = c.sqPosted
	if signal || c.sqPosted-c.lastSig >= uint64(max(c.opts.SendDepth/4, 1)) {
		wr.Signaled = true
		c.lastSig = c.sqPosted
	}
	c.chain[c.nchain] = wr
	c.nchain++
	return nil
}

// ringLocked posts the queued chain with one PostSend: the WRITEs of the
// chunks a state message announces go out with it, one doorbell.
func (c *Conn) ringLocked() error {
	if c.nchain == 0 {
		return nil
	}
	for i := range c.nchain - 1 {
		c.chain[i].Next = &c.chain[i+1]
	}
	err := c.ep.qp.PostSend(&c.chain[0])
	clear(c.chain[:c.nchain])
	c.nchain = 0
	if err == nil {
		c.stats.Posts.Add(1)
	}
	return err
}

// sendLocked posts a state message with our cursors and the extra flags,
// signaled if signal (Close's final message); with no credit or queue slot
// left it posts nothing, and a later message carries the cursors.
func (c *Conn) sendLocked(extra ring.Flags, signal bool) {
	// Nothing goes to a peer that closed: it is tearing its queue pair down.
	if c.err != nil || c.life == lifePeerGone || c.st.PeerClosed() || !c.st.CanSendControl() || c.sqFreeLocked() <= 0 {
		return
	}
	m, err := c.st.Next(extra)
	if err != nil {
		return
	}
	// The BLOCKED of a writer short of message credits is solicited, so
	// that it wakes an idle peer (docs/protocol.md §4.1).
	c.postMsgLocked(&m, signal, extra&ring.FlagBlocked != 0 && !c.st.CanSendData())
}

// postMsgLocked posts m, which ring.State recorded as sent, inline, after
// the WRITEs queued before it, in one post.
func (c *Conn) postMsgLocked(m *ring.Msg, signal, solicited bool) {
	m.Marshal(c.msgBuf[:])
	err := c.queueLocked(verbs.SendWR{Op: verbs.OpSend, Inline: c.msgBuf[:], Solicited: solicited}, signal)
	id := c.sqPosted
	if err == nil {
		err = c.ringLocked()
	}
	if err != nil {
		c.suspectLocked(reset("posting a state message", err))
		return
	}
	c.stats.MsgsSent.Add(1)
	if signal {
		c.closeSig = id
	}
}

// flushLocked sends what we owe the peer: written bytes not yet announced,
// and the updates ring.State.NeedUpdate asks for.
func (c *Conn) flushLocked() {
	c.growLocked()
	if c.st.Unannounced() > 0 && c.st.CanSendData() || c.st.FINPending() && c.life < lifeClosing || c.st.NeedUpdate() {
		c.sendLocked(0, false)
	}
}

// suspectGrace is how long a transport failure waits for the peer's CLOSE
// or goodbye before it fails the connection.
const suspectGrace = 250 * time.Millisecond

// suspectLocked handles a transport failure that may be the peer's orderly
// teardown (docs/protocol.md §4, "Transport failures near a close"): judge
// decides later, since judging here would poll from inside completion
// handling, out of order. While Close waits for its final message, a
// failure is only recorded: Close's wait (sayGoodbye) decides.
func (c *Conn) suspectLocked(err error) {
	if c.err != nil || c.life == lifePeerGone || c.st.PeerClosed() || c.suspect != nil {
		return
	}
	c.suspect = err
	if c.life >= lifeClosing {
		c.wakeLocked(evClose)
		return
	}
	c.loops.Add(1)
	if c.opts.Failover {
		// A failover is cheap to undo if the peer's goodbye turns up after
		// all (the Owner checks it): decide now, outside completion handling.
		go c.judge()
		return
	}
	time.AfterFunc(suspectGrace, c.judge)
}

// judge fails the connection with c.suspect unless the peer closed since.
func (c *Conn) judge() {
	defer c.loops.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.life >= lifeClosing || c.err != nil {
		return
	}
	c.progressLocked()
	if c.life == lifePeerGone || c.st.PeerClosed() {
		return
	}
	c.transportFailedLocked(c.suspect)
}

// failLocked tears the connection down with err: every blocked and later
// call returns it, and the Owner tells the peer (Owner.Failed).
func (c *Conn) failLocked(err error) {
	if c.err != nil {
		return
	}
	var re *ResetError
	if !errors.As(err, &re) {
		err = reset("transport failed", err)
	}
	c.err = err
	c.wakeLocked(evRead | evWrite | evClose)
	if c.life >= lifeClosing {
		return // Close says goodbye itself
	}
	c.tellOwnerLocked()
}

// tellOwnerLocked calls Owner.Failed with c.err, in the background: the
// owner may call c back.
func (c *Conn) tellOwnerLocked() {
	err := c.err
	c.loops.Add(1)
	go func() {
		defer c.loops.Done()
		c.owner.Failed(c, err)
	}()
}
