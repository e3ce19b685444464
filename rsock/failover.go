package rsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	pool "github.com/libp2p/go-buffer-pool"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/stream"
)

// Failover: docs/protocol.md §9.10.

// owed is what a failover owes the peer: our ring bytes it had not
// reported consumed, to send again from where its Resume says.
type owed struct {
	x     uint64 // the stream cursor at which our ring began (our Switch)
	first uint64 // the stream cursor of data[0]
	data  []byte
	fin   bool          // CloseWrite on the ring: Fin follows the data
	known bool          // the peer's Resume came; from is set
	from  uint64        // the stream cursor to send from
	done  chan struct{} // closed once sent (resendLocked)
}

func (o *owed) end() uint64 { return o.first + uint64(len(o.data)) }

// failover detaches the ring and sends Resume, once (a concurrent call waits
// for it); it returns an error only if the connection failed instead.
func (w *swConn) failover(cause string) error {
	w.mu.Lock()
	if ch := w.moving; ch != nil {
		w.mu.Unlock()
		w.await(ch)
		return nil
	}
	r := w.ring
	if r == nil || w.closed || w.err != nil {
		w.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	w.moving = ch
	w.wfast.Store(nil) // (a Write on TCP may publish the old ring again: its calls fail, and take the slow path)
	w.rfast.Store(nil)
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.moving = nil
		w.mu.Unlock()
		close(ch)
		w.rnote.wake()
		w.wnote.wake()
	}()
	if !w.set.failover {
		err := &stream.ResetError{Reason: cause + " (failover is off)"}
		w.fail(err)
		return err
	}
	lo, err := r.Detach()
	if err != nil {
		if !w.isClosed() {
			w.fail(&stream.ResetError{Reason: "failing over: detaching the ring", Err: err})
		}
		return err
	}
	testHookDetached.run(w)
	st := r.Stats()
	from := w.c.label.Load().transport
	w.mu.Lock()
	w.ringPaths = append(w.ringPaths, PathBytes{Transport: w.ringName, BytesRead: st.BytesRead.Load(), BytesWritten: st.BytesWritten.Load()})
	w.c.writes.Add(st.Writes.Load())
	w.ring = nil
	recv := w.rcvd
	if w.recv == recvRing {
		// The peer's bytes went on in the ring from rcvd (its Switch).
		recv += lo.Received
		if len(lo.Unread) > 0 && !w.rclosed && !w.closed {
			buf := pool.Get(len(lo.Unread))
			copy(buf, lo.Unread)
			w.rq = append(w.rq, buf)
			w.rqLen += len(buf)
			w.rqCost += len(buf) + entryCost
		}
		w.rcvd = recv
		w.recv = recvTCP
		w.noteLocked("receive", from, "tcp", fmt.Sprintf("%s; stream byte %d received", cause, recv))
	} else if w.recv == recvTCP {
		// The peer's Switch may still be on its way, behind the Data
		// before it: the peer sends again from there.
		w.recv = recvStale
	}
	if w.gone.set && w.recv != recvEnd {
		// The peer's goodbye came while the ring failed: it ends the
		// stream where it says, which must be what we have.
		if w.peerFinal != recv {
			w.mu.Unlock()
			w.fail(&stream.ResetError{Reason: "peer's goodbye does not match the data it sent", Err: fmt.Errorf("have %d bytes, goodbye says %d", recv, w.peerFinal)})
			return errors.New("goodbye mismatch")
		}
		w.recv = recvEnd
		defer w.out.halfClose() // as peerGoodbye's check would have
	}
	if w.send == sendRing {
		w.send = sendOwed
		w.owe = &owed{x: w.switchAt, first: w.switchAt + lo.Sent - uint64(len(lo.Unacked)), data: lo.Unacked, fin: lo.FIN, done: make(chan struct{})}
		w.noteLocked("send", from, "tcp", fmt.Sprintf("%s; stream byte %d sent, from %d not confirmed", cause, w.switchAt+lo.Sent, w.owe.first))
		w.space.wake() // a reader parked for room reads on: the peer's Resume may be behind its Data
	}
	w.resumeOnTCPUnlock(recv, fmt.Sprintf("failed over from %s to TCP: %s", from, cause))
	return nil
}

// resumeOnTCPUnlock ends a failover's work under mu, which it releases:
// the upgrade is over, the peer's Resume is awaited, the connection is
// relabelled for reason, and Resume{recv} goes out.
func (w *swConn) resumeOnTCPUnlock(recv uint64, reason string) {
	w.awaitResume = true
	w.setbacks++
	w.settled.fire() // back on TCP: settled, as an upgrade that ended without a ring
	w.mu.Unlock()
	w.c.relabel(&label{transport: "tcp", code: CodeFailedOver, fallback: true, reason: reason})
	_ = w.out.send(&handshake.Resume{Cursor: recv}) // if the socket failed, the reader reports it
}

// startFailed handles a failed start of the server's agreed ring as the
// failover of a ring that carried nothing (§9.4 step 4): the client's
// Switch, if it comes, is stale, and our Resume asks for every byte after
// the Data we read. Without failover it resets.
func (w *swConn) startFailed(cause string, err error) {
	if !w.set.failover {
		w.fail(&stream.ResetError{Reason: cause + " (failover is off)", Err: err})
		return
	}
	why := fmt.Sprintf("%s: %v", cause, err)
	w.mu.Lock()
	if w.closed || w.err != nil {
		w.mu.Unlock()
		return
	}
	if w.recv == recvTCP {
		w.recv = recvStale
	}
	w.noteLocked("", "tcp", "tcp", "the ring failed as it started: "+why)
	w.resumeOnTCPUnlock(w.rcvd, "failed over to TCP: the ring failed as it started: "+why)
}

// peerResumed handles the peer's Resume{r}: our ring is detached (if the
// peer saw the failure first), and what we owe is sent again from r.
func (w *swConn) peerResumed(r uint64) error {
	w.mu.Lock()
	wait, agreed := w.upDone, w.up == upAgreed || w.ring != nil
	w.mu.Unlock()
	if agreed && wait != nil {
		// Our side of an agreed ring may still be starting (the server
		// after Confirm{0}): fail over once it is installed.
		if !w.await(wait) {
			return nil
		}
	}
	if err := w.failover("the peer's ring failed (its Resume)"); err != nil {
		return nil // the connection failed: the reader stops on it
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.awaitResume {
		return protocolError("resume at %d without a failover", r)
	}
	w.awaitResume = false
	if w.recv == recvStale {
		w.recv = recvTCP // a Switch sent before the peer's failover came before this
	}
	o := w.owe
	if o == nil || o.known {
		// Our sending was on TCP (where an earlier failover's bytes may
		// still be going out again): nothing is sent again (§9.10).
		if sent := w.out.cursor(); r > sent {
			return protocolError("resume at %d after %d bytes sent", r, sent)
		}
		w.reupgradeLocked()
		return nil
	}
	from := max(r, o.x) // bytes before our Switch went on TCP
	if from < o.first || r > o.end() {
		// (An honest peer that called CloseRead before our Switch came
		// consumed ring bytes it cannot count: it gets this reset too.)
		return protocolError("resume at %d: our ring's unconfirmed bytes are [%d, %d), it began at %d", r, o.first, o.end(), o.x)
	}
	o.known, o.from = true, from
	w.wnote.wake()
	go w.resendBg()
	w.reupgradeLocked()
	return nil
}

// resendBg sends what is owed if no Write does first, within the write
// deadline (a Write waiting for wmu behind it must not wait past its
// own); setDeadline starts it again.
func (w *swConn) resendBg() {
	w.wmu.Lock()
	defer w.wunlock()
	_ = w.resendLocked(&w.wdl)
}

// resendLocked sends what a failover owes before any new Data: it waits
// for the peer's Resume (until dl, Close or a failure), then sends the
// bytes from where it says and the ring's Fin, if any. wmu is held.
func (w *swConn) resendLocked(dl *deadline.Deadline) error {
	for {
		w.mu.Lock()
		o := w.owe
		switch {
		case o == nil:
			w.mu.Unlock()
			return nil
		case w.closed || w.err != nil || w.gone.set:
			w.mu.Unlock()
			return w.writeErr()
		case !o.known:
			w.mu.Unlock()
			if dl.Expired() {
				return os.ErrDeadlineExceeded
			}
			w.awaitDL(w.wnote, dl)
			continue
		}
		w.mu.Unlock()
		w.out.seek(o.from) // (again after a deadline: the cursor is at from already)
		if rest := o.data[o.from-o.first:]; len(rest) > 0 {
			k, err := w.out.data(rest, dl, w.done)
			o.from += uint64(k)
			if err != nil {
				return err
			}
		}
		if o.fin {
			if _, err := w.out.sendAt(func(x uint64) handshake.Message { return &handshake.Fin{Cursor: x} }, false); err != nil {
				return err
			}
		}
		w.mu.Lock()
		w.owe, w.send = nil, sendTCP
		if o.fin {
			w.send = sendFin
		}
		w.settleLocked()
		w.mu.Unlock()
		close(o.done)
		return nil
	}
}

// offRing waits, after the ring r returned err, until the failover has
// taken the connection off r; it returns err if err is not the ring's
// failover (or the connection failed instead).
func (w *swConn) offRing(r *stream.Conn, err error, dl *deadline.Deadline, n note) error {
	if !moved(err) {
		return err
	}
	for {
		w.mu.Lock()
		switch {
		case w.closed:
			w.mu.Unlock()
			return net.ErrClosed
		case w.err != nil:
			err := w.err
			w.mu.Unlock()
			return err
		case w.ring != r && w.moving == nil:
			w.mu.Unlock()
			return nil
		case !errors.Is(err, stream.ErrMoving) && w.moving == nil:
			w.mu.Unlock()
			return err // the ring was closed, not moved
		}
		w.mu.Unlock()
		if dl.Expired() {
			return os.ErrDeadlineExceeded
		}
		w.awaitDL(n, dl)
	}
}

// awaitMove waits for a failover in progress, if any.
func (w *swConn) awaitMove() {
	w.mu.Lock()
	ch := w.moving
	w.mu.Unlock()
	if ch != nil {
		w.await(ch)
	}
}

// resendDone waits at most wait, for Close, until no failover runs and its
// bytes went again (resendBg); false if some are still owed (Close loses them).
func (w *swConn) resendDone(wait time.Duration) bool {
	var timeout <-chan time.Time // made only if there is something to wait for
	for {
		w.mu.Lock()
		ch, o, gone := w.moving, w.owe, w.gone.set || w.err != nil
		w.mu.Unlock()
		switch {
		case ch == nil && (o == nil || gone):
			return true
		case ch == nil:
			ch = o.done
		}
		if timeout == nil {
			timeout = time.After(wait)
		}
		select {
		case <-ch:
		case <-timeout:
			return false
		}
	}
}

// resumeLag bounds the Data the reader queues beyond recvQueue while our
// Writes wait for a frame behind it (readData): the peer's Resume, or the
// answer to our Offer. An honest peer queues no Data in its failover (§9.10).
const resumeLag = 64 << 20
