package stream

import (
	"net"
	"os"
	"sync"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/verbs"
)

// sendHalf is the Conn's writing side: Writes are serialised by mu and
// wait on e (for room, credits, or the side's end) until dl.
type sendHalf struct {
	mu   sync.Mutex
	e    entry
	dl   *deadline.Deadline // the caller's (Endpoint.Start)
	shut bool               // CloseWrite was called; guarded by Conn.mu
	busy bool               // a Write holds wr.mu (writeNow waits its turn); guarded by Conn.mu
	// chunk: a Write copies a chunk outside Conn.mu, to the destination it
	// computed; the writing does not move rings meanwhile. Guarded by Conn.mu.
	chunk bool
}

// Write writes all of b unless an error stops it first; it returns how many
// bytes it took: copied to the peer's mapped ring or to the staging buffer,
// whence their WRITEs go with the message that announces them (and a
// failover sends them again). The bytes are copied before Write
// returns, so b may be reused at once. A deadline that passes mid-way
// leaves a whole prefix written and reports its length.
func (c *Conn) Write(b []byte) (int, error) {
	if n, ok := c.writeNow(b); ok {
		return n, nil
	}
	c.wr.mu.Lock()
	defer c.wr.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	// Counted in the Conn from here: a Write waiting for wr.mu touches
	// nothing before it finds the Conn closed.
	if err := c.enterLocked(); err != nil {
		return 0, err
	}
	c.wr.busy = true
	defer func() {
		c.wr.busy = false
		c.exitLocked()
	}()
	written := 0
	stalled := false
	for {
		// A write that placed every byte succeeded, whatever happened since
		// (the peer closing, a concurrent Close or CloseWrite, the deadline).
		if written == len(b) && written > 0 {
			c.stats.Writes.Add(1)
			return written, nil
		}
		drain(c.wr.e.ch) // what follows answers any wake-up sent so far
		if err := c.writeErrLocked(); err != nil {
			return written, err
		}
		if len(b) == 0 {
			return 0, nil
		}
		space := c.st.Space()
		// A data chunk needs: ring space, a data credit, and send-queue room
		// for two WRITEs and the SEND (plus two slots kept for control).
		if space == 0 || !c.st.CanSendData() || c.sqFreeLocked() < 5 {
			if c.st.CanSendControl() && c.sqFreeLocked() > 0 && c.st.Block() {
				c.sendLocked(ring.FlagBlocked, false)
			}
			if !stalled {
				stalled = true
				c.armBackstopLocked() // the peer's answer may be a notification that gets lost
				c.stats.CreditStalls.Add(1)
			}
			if err := c.wait(&c.wr.e, c.wr.dl, true); err != nil {
				return written, err
			}
			continue
		}
		stalled = false
		// A quarter of the peer's ring at most, announced before the next:
		// the peer reads one piece while we copy the next.
		n := min(uint64(len(b)-written), space, max(c.peer.Size/4, 1))
		s1, s2 := c.st.WriteSegments(n)
		chunk := b[written : written+int(n)]
		// A large chunk is copied outside the lock: only this writer
		// moves the producer cursor, and the peer has released this
		// space. Inline chunks are staged too: a failover sends them again.
		if n <= lockedCopy {
			c.copyChunk(chunk, s1, s2)
		} else {
			c.wr.chunk = true
			c.mu.Unlock()
			c.copyChunk(chunk, s1, s2)
			c.mu.Lock()
			c.wr.chunk = false
			if err := c.writeErrLocked(); err != nil {
				return written, err
			}
		}
		if err := c.queueWritesLocked(s1, s2); err != nil {
			// The bytes did not go; whether that is the peer's orderly
			// close or a failure is decided shortly (suspectLocked).
			c.suspectLocked(reset("posting a write", err))
			if err := c.wait(&c.wr.e, c.wr.dl, false); err != nil {
				return written, err
			}
			continue
		}
		if err := c.wroteLocked(n); err != nil {
			return written, err
		}
		written += int(n)
	}
}

// writeNow writes all of b in one section of mu, without wr.mu, if it can at
// once: b is at most lockedCopy, no other Write is in the Conn (wr.busy keeps
// Writes whole and in order), and space, a credit and send-queue room are
// there. If not, or if its WRITEs cannot be queued, Write goes the long way.
func (c *Conn) writeNow(b []byte) (int, bool) {
	n := uint64(len(b))
	if n == 0 || n > lockedCopy {
		return 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wr.busy || c.writeErrLocked() != nil || c.st.Space() < n || n > max(c.peer.Size/4, 1) || !c.st.CanSendData() || c.sqFreeLocked() < 5 {
		return 0, false
	}
	s1, s2 := c.st.WriteSegments(n)
	c.copyChunk(b, s1, s2)
	if c.queueWritesLocked(s1, s2) != nil || c.wroteLocked(n) != nil {
		return 0, false
	}
	c.stats.Writes.Add(1)
	c.idleLocked()
	return len(b), true
}

// wroteLocked records n bytes taken (their WRITEs queued) and announces
// them if a credit allows.
func (c *Conn) wroteLocked(n uint64) error {
	if err := c.st.Wrote(n); err != nil {
		c.failLocked(err)
		return c.err
	}
	c.stats.BytesWritten.Add(n)
	c.armBackstopLocked()
	if c.ep.nextStage != nil {
		c.growLocked() // a move waits for no chunk in flight; its message announces these bytes
	}
	if c.st.Unannounced() > 0 && c.st.CanSendData() {
		c.sendLocked(0, false)
	}
	return nil
}

// copyChunk copies chunk to its segments of the peer's mapping or of the
// staging buffer. wr.chunk or mu keeps the destination in place.
func (c *Conn) copyChunk(chunk []byte, s1, s2 ring.Seg) {
	dst := c.direct
	if dst == nil {
		dst = c.ep.stage.Bytes()
	}
	copy(dst[s1.Off:s1.Off+s1.Len], chunk)
	copy(dst[s2.Off:s2.Off+s2.Len], chunk[s1.Len:])
}

func (c *Conn) writeErrLocked() error {
	switch {
	case c.life >= lifeClosing:
		return net.ErrClosed
	case c.err != nil:
		return c.err
	case c.wr.shut, c.st.PeerClosed(), c.life == lifePeerGone:
		return ErrBrokenPipe
	case c.wr.dl.Expired():
		return os.ErrDeadlineExceeded
	}
	return nil
}

// queueWritesLocked queues the WRITEs of a chunk already copied to its
// segments of the staging buffer (none if the peer's ring is mapped): they
// go out with the state message that announces them (ringLocked). A chunk
// within the QP's inline size goes inline, from the staging buffer, which
// holds it until the peer has consumed it.
func (c *Conn) queueWritesLocked(s1, s2 ring.Seg) error {
	if c.direct != nil {
		return nil
	}
	stage := c.ep.stage
	inline := s1.Len+s2.Len <= uint64(c.inline)
	for _, s := range [2]ring.Seg{s1, s2} {
		if s.Len == 0 {
			continue
		}
		wr := verbs.SendWR{Op: verbs.OpWrite, RemoteAddr: c.peer.Addr + s.Off, RKey: c.peer.RKey}
		if inline {
			wr.Inline = stage.Bytes()[s.Off : s.Off+s.Len]
		} else {
			wr.Local = verbs.SGE{MR: stage, Offset: int(s.Off), Length: int(s.Len)}
		}
		if err := c.queueLocked(wr, false); err != nil {
			return err
		}
	}
	return nil
}

// CloseWrite shuts down the writing side: the peer reads EOF after the data
// already written; later Writes fail with ErrBrokenPipe.
func (c *Conn) CloseWrite() error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	// No wr.mu: a Write blocked for space must not hold CloseWrite up. A
	// Write in flight either announced its bytes before the FIN or finds
	// wr.shut and fails with ErrBrokenPipe.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	if c.wr.shut {
		return nil
	}
	c.wr.shut = true
	c.st.SetFIN()
	// Without a credit now, the FIN stays pending for flushLocked.
	c.sendLocked(0, false)
	return nil
}
