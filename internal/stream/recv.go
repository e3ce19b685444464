package stream

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"

	"github.com/rdmanet/rdmanet/internal/deadline"
)

// recvHalf is the reading side and its read lease (docs/protocol.md §4.2).
// CopyTo takes a lease back first; CloseRead and Close set rd.stop, which
// Reads check before using a lease. CloseRead gives the lease back itself
// if no call holds rd.mu, else the holder does when it unlocks (rdUnlock):
// the store of rd.stop comes before CloseRead's TryLock, the Unlock before
// the holder's load of rd.stop, so one of them sees the other. Lease Reads
// are not counted among the calls (that would cost the atomics the lease
// saves): Close sets rd.stop, and the ring's release waits for rd.mu after
// the counted calls returned (close.go), so a lease Read still copying
// finishes before the ring is unmapped.
type recvHalf struct {
	mu   sync.Mutex // serialises Reads and CopyTo
	e    entry
	dl   *deadline.Deadline // the caller's (Endpoint.Start)
	stop atomic.Bool        // Close or CloseRead was called: no more Reads from a lease; set under Conn.mu
	shut bool               // CloseRead was called; guarded by Conn.mu
	// copying is the piece a CopyTo has handed to its writer, which may
	// block at will: Detach counts it read. Guarded by Conn.mu.
	copying uint64

	base  uint64 // consumer cursor (ring.State.Cons) when the lease was taken or last reported
	lease uint64 // bytes from base lent to Reads; written under Conn.mu too
	taken uint64 // bytes of the lease copied out, not yet reported
	mem   []byte // the ring that holds the lease (one ring: a lease never spans a move, grow.go)
}

// lentLocked reports whether readable bytes are lent outside mu (a lease,
// a CopyTo's piece): CloseRead leaves them to their holder.
func (c *Conn) lentLocked() bool { return c.rd.lease > 0 || c.rd.copying > 0 }

// Lease Reads report what they took at ring size>>leaseReportShift bytes.
const leaseReportShift = 4 // 1/16

// Read reads up to len(b) bytes. It returns io.EOF once the peer has closed
// its writing side and every byte was read, and after CloseRead.
func (c *Conn) Read(b []byte) (int, error) {
	c.rd.mu.Lock()
	defer c.rdUnlock()
	if c.rd.lease <= c.rd.taken || len(b) == 0 || c.rd.stop.Load() || c.rd.dl.Expired() {
		c.mu.Lock()
		// enter, under the lock awaitLeaseLocked needs anyway.
		if err := c.enterLocked(); err != nil {
			c.mu.Unlock()
			return 0, err
		}
		err := c.awaitLeaseLocked(len(b) == 0)
		var n uint64
		if err == nil && len(b) > 0 && c.rd.lease <= lockedCopy {
			// A small lease is copied and reported in this one section.
			n = c.copyLease(b)
			err = c.syncLeaseLocked()
		}
		c.exitLocked()
		c.mu.Unlock()
		if err != nil || n > 0 || len(b) == 0 {
			c.stats.BytesRead.Add(n)
			return int(n), err
		}
	}
	n, err := c.readLease(b)
	c.stats.BytesRead.Add(n)
	return int(n), err
}

// lockedCopy is the most a call copies holding mu: a larger copy goes
// outside it, so that completions are handled meanwhile.
const lockedCopy = 4 << 10

// copyLease copies the next bytes of the lease into b, at most a quarter
// of the ring, and counts them taken; rd.mu is held.
func (c *Conn) copyLease(b []byte) uint64 {
	mem := c.rd.mem // the lease's ring changes only with the lease (a ring that grew)
	size := uint64(len(mem))
	n := min(uint64(len(b)), c.rd.lease-c.rd.taken, max(size/4, 1))
	// No lock: the peer does not overwrite these bytes until we report
	// them consumed, and nothing else consumes them while lent.
	off := (c.rd.base + c.rd.taken) & (size - 1)
	k := copy(b[:n], mem[off:])
	copy(b[k:n], mem)
	c.rd.taken += n
	return n
}

// awaitLeaseLocked waits until bytes are lent to Reads (rd.lease > 0, with
// nothing taken), or why the Read ends; with zero set it does not wait, and
// returns nil also when nothing is readable. rd.mu and mu are held.
func (c *Conn) awaitLeaseLocked(zero bool) error {
	// The deadline ends a Read that starts after it; one that waited and
	// was woken takes what came, as a socket's does (wait ends at it).
	for first := true; ; first = false {
		// What this loop checks answers any wake-up sent so far (they are
		// sent under mu): drop it, or the next wait returns for nothing.
		drain(c.rd.e.ch)
		if err := c.stopLocked(first); err != nil {
			return err
		}
		if err := c.syncLeaseLocked(); err != nil || c.rd.lease > 0 {
			return err
		}
		if err := c.endLocked(); err != nil || zero {
			return err
		}
		if err := c.wait(&c.rd.e, c.rd.dl, true); err != nil {
			return err
		}
	}
}

// stopLocked is why a Read ends before it looks at the ring: Close,
// CloseRead (io.EOF), the read deadline (if dl), or a failover (what is
// readable is Detach's now). mu is held.
func (c *Conn) stopLocked(dl bool) error {
	switch {
	case c.life >= lifeClosing:
		return net.ErrClosed
	case c.rd.shut:
		return io.EOF
	case dl && c.rd.dl.Expired():
		return os.ErrDeadlineExceeded
	case errors.Is(c.err, ErrMoving):
		return c.err
	}
	return nil
}

// readLease copies up to len(b) bytes of the lease into b, in pieces of
// at most a quarter ring; rd.mu is held. After a piece, what was taken is
// reported under mu if it reaches 1/16 of the ring or ends the lease (so a
// drained ring is reported at once, as the peer's BLOCKED rule needs; this
// lends what became readable since). It stops once rd.stop is set.
func (c *Conn) readLease(b []byte) (uint64, error) {
	var done uint64
	for done < uint64(len(b)) && c.rd.lease > c.rd.taken {
		report := max(uint64(len(c.rd.mem))>>leaseReportShift, 1)
		done += c.copyLease(b[done:])
		if c.rd.taken >= report || c.rd.taken == c.rd.lease {
			c.mu.Lock()
			err := c.syncLeaseLocked()
			if c.rd.lease == 0 {
				c.idleLocked() // a lease that ends arms as a call that leaves
			}
			c.mu.Unlock()
			if err != nil {
				return done, err
			}
			if c.rd.stop.Load() {
				break
			}
		}
	}
	return done, nil
}

// syncLeaseLocked reports the bytes taken from the lease consumed and lends
// everything readable as the new lease; after CloseRead or Close it
// discards the readable bytes instead and lends nothing. Called with rd.mu
// and mu held; it sends the peer what it is owed (flushLocked).
func (c *Conn) syncLeaseLocked() error {
	if c.rd.taken > 0 {
		if err := c.st.Consumed(c.rd.taken); err != nil {
			return err
		}
		c.rd.taken = 0
	}
	if c.st.Readable() == 0 {
		// Drained: poll for more bytes, or for the unsolicited BLOCKED of a
		// peer short of space, which flushLocked then answers.
		c.progressLocked()
	}
	if c.rd.shut || c.life >= lifeClosing {
		_ = c.st.Consumed(c.st.Readable())
		c.rd.lease = 0
	} else {
		var old bool
		c.rd.lease, old = c.st.ReadableHere()
		c.rd.mem = c.ringMemLocked(old)
	}
	c.rd.base = c.st.Cons()
	if c.life < lifeClosing {
		c.flushLocked()
	}
	return nil
}

// rdUnlock releases rd.mu, then gives a lease back after rd.stop (recvHalf).
func (c *Conn) rdUnlock() {
	c.rd.mu.Unlock()
	if c.rd.stop.Load() {
		c.dropLease()
	}
}

// dropLease gives the lease back unless a call holds rd.mu (which then does).
func (c *Conn) dropLease() {
	if !c.rd.mu.TryLock() {
		return
	}
	c.mu.Lock()
	if c.rd.lease > 0 && c.life < lifeClosing {
		_ = c.syncLeaseLocked()
	}
	c.mu.Unlock()
	c.rd.mu.Unlock()
}

// CopyTo hands the stream to w until EOF (both errors nil), an error of
// the stream (readErr, as Read would return it) or of w (writeErr). The
// bytes go to w.Write straight from the ring (w must not keep the slice),
// in pieces of at most a quarter ring, each consumed once w took it. It
// blocks and honours the read deadline as Read does.
func (c *Conn) CopyTo(w io.Writer) (n int64, readErr, writeErr error) {
	if err := c.enter(); err != nil {
		return 0, err, nil
	}
	defer c.exit()
	c.rd.mu.Lock()
	defer c.rdUnlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	// A lease of earlier Reads comes back first: this reads the ring directly.
	err := c.syncLeaseLocked()
	c.rd.lease = 0
	if err != nil {
		return 0, err, nil
	}
	for {
		drain(c.rd.e.ch) // as in Read
		if err := c.stopLocked(true); err != nil {
			return n, eofNil(err), nil
		}
		if avail, old := c.st.ReadableHere(); avail > 0 {
			mem := c.ringMemLocked(old)
			s1, s2 := c.st.ReadSegments(min(avail, max(uint64(len(mem))/4, 1)))
			c.rd.copying = s1.Len + s2.Len
			c.mu.Unlock()
			k, werr := writeSegs(w, mem[s1.Off:s1.Off+s1.Len], mem[s2.Off:s2.Off+s2.Len])
			c.mu.Lock()
			c.rd.copying = 0
			if c.life >= lifeClosing {
				return n + int64(k), net.ErrClosed, werr // detached meanwhile: it took the piece as read
			}
			// The piece is consumed, and the rest discarded if CloseRead came meanwhile.
			err := c.st.Consumed(uint64(k))
			if c.rd.shut {
				_ = c.st.Consumed(c.st.Readable())
			}
			if err == nil {
				c.flushLocked()
			}
			n += int64(k)
			c.stats.BytesRead.Add(uint64(k))
			switch {
			case werr != nil:
				return n, nil, werr
			case err != nil:
				return n, err, nil
			}
			continue
		}
		if err := c.endLocked(); err != nil {
			return n, eofNil(err), nil
		}
		if err := c.wait(&c.rd.e, c.rd.dl, true); err != nil {
			return n, err, nil
		}
	}
}

func writeSegs(w io.Writer, a, b []byte) (int, error) {
	n := 0
	for _, seg := range [][]byte{a, b} {
		if len(seg) == 0 {
			continue
		}
		k, err := w.Write(seg)
		if k < 0 || k > len(seg) {
			k, err = 0, errInvalidWrite
		} else if err == nil && k < len(seg) {
			err = io.ErrShortWrite
		}
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func eofNil(err error) error {
	if err == io.EOF {
		return nil
	}
	return err
}

// errInvalidWrite is io's: a writer returned an impossible count.
var errInvalidWrite = errors.New("invalid write result")

// CloseRead shuts down the reading side: Reads return io.EOF, and data
// that arrives is discarded.
func (c *Conn) CloseRead() error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.rd.shut = true
	c.rd.stop.Store(true)
	if !c.lentLocked() { // else their holder discards them (CopyTo, dropLease)
		_ = c.st.Consumed(c.st.Readable())
		c.flushLocked()
	}
	c.wakeLocked(evRead)
	c.mu.Unlock()
	c.dropLease() // a lease no call holds
	return nil
}

// Poll reports what a Read would find now, without waiting or taking anything:
// readable is true when bytes wait to be read; else err is what a Read would
// return at once (io.EOF, net.ErrClosed, the connection's failure, or an error
// wrapping ErrMoving), and both zero values mean a Read would wait. While a
// Read or CopyTo runs, what is readable is that call's, and Poll reports only
// an end or a failure. It ignores the read deadline.
func (c *Conn) Poll() (readable bool, err error) {
	if !c.rd.mu.TryLock() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.st.Readable() > 0 && c.life < lifeClosing && !c.rd.shut {
			return false, nil // the running call's to take
		}
		return false, c.endLocked()
	}
	defer c.rdUnlock()
	if c.rd.lease > c.rd.taken && !c.rd.stop.Load() {
		return true, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.stopLocked(false); err != nil {
		return false, err
	}
	// As a zero-length Read: report what was taken, look for what came.
	if err := c.syncLeaseLocked(); err != nil {
		return false, err
	}
	if c.rd.lease > 0 {
		return true, nil
	}
	return false, c.endLocked()
}

// endLocked is what a Read that finds nothing readable returns at once,
// or nil if it would wait. mu is held.
func (c *Conn) endLocked() error {
	switch {
	case c.life >= lifeClosing:
		return net.ErrClosed
	case c.rd.shut, c.st.EOF():
		return io.EOF
	case c.err != nil:
		return c.err
	case c.life == lifePeerGone:
		return io.EOF
	}
	return nil
}
