package rsock

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	pool "github.com/libp2p/go-buffer-pool"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/stream"
)

// readerState is who reads a switching connection's bootstrap socket: one
// reader at a time (docs/protocol.md §9.3, "Reading").
type readerState uint8

const (
	readerNone    readerState = iota // no one: the next Read (or poll) takes it
	readerApp                        // a Read (or poll) reads it
	readerHanding                    // a Read reads it, its socket read ended (claimReaderLocked): readLoop takes over after it
	readerLoop                       // readLoop reads it, to its end (or Close has claimed it)
	readerEnded                      // its end or failure was read: no one reads it any more
)

// serverReaderAfter is how long after the handshake a server's readLoop
// starts, to answer an offer the client's default policy may make then.
const serverReaderAfter = DefaultUpgradeAfter

// readSocket is a Read's turn at the socket when no one else reads it: the
// next frame, and if it is Data, what b takes of its payload (counted, and
// dropped after CloseRead or Close). n 0 and err nil: the caller looks
// again; err is a deadline. took is false when the socket is not the
// Read's to read: it then waits for readLoop.
func (w *swConn) readSocket(b []byte) (n int, took bool, err error) {
	took, handed := w.socketTurn(false, func() {
		var data bool
		if data, _, err = w.frame(true); !data {
			return
		}
		if n, err = w.in.take(b, true); err != nil {
			n, err = 0, w.socketEnded(err)
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.rcvd += uint64(n)
		if w.rclosed || w.closed {
			n = 0
		}
	})
	if handed && errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil // ended for a reason: the caller looks again
	}
	return n, took, err
}

// socketTurn runs f as a Read's (or, with poll, poll's) turn at the socket,
// unless someone else reads it (took false). The socket has the Read's
// deadline, or none for poll (a past one would fail even a read that does
// not wait). handed: readLoop was called for meanwhile, and takes over;
// else a waiting Read may take the next turn.
func (w *swConn) socketTurn(poll bool, f func()) (took, handed bool) {
	w.mu.Lock()
	if w.reader != readerNone {
		w.mu.Unlock()
		return false, false
	}
	w.reader = readerApp
	if poll {
		w.socketDeadlineLocked(time.Time{})
	} else {
		w.socketDeadlineLocked(w.rdlT)
	}
	w.mu.Unlock()
	f()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch w.reader { // (readerEnded: f read the socket's end)
	case readerHanding:
		w.reader = readerNone
		w.needReaderLocked()
		return true, true
	case readerApp:
		w.reader = readerNone
		w.rnote.wake()
	}
	return true, false
}

// frame is one step of a reader of the socket (readSocket, readLoop,
// pollSocket). data: a Data payload (in.data bytes) is next, for the caller
// to take. Else it reads the next frame and acts on a control frame
// (handle), but not after Close (§9.6, "Lingering close"). over: the
// reading has ended, at the peer's goodbye or a failure (socketEnded). err
// is a deadline or errWouldBlock (wait false): it ends the caller's turn.
func (w *swConn) frame(wait bool) (data, over bool, err error) {
	if w.in.data > 0 {
		return true, false, nil
	}
	h, msg, err := w.in.next(wait) // msg nil: a Data frame, its payload next
	if err == nil && h.Type == handshake.TypeData {
		err = w.dataAllowed()
	}
	if err == nil && msg != nil && !w.isClosed() {
		if err = w.handle(msg); err == nil && h.Type == handshake.TypeGoodbye {
			w.readerStopped() // nothing is read after the peer's goodbye
			return false, true, nil
		}
	}
	if err != nil {
		err = w.socketEnded(err)
		return false, err == nil, err
	}
	return msg == nil, false, nil
}

// socketEnded handles an error reading the socket: a deadline or
// errWouldBlock is returned, for the reader's turn alone; anything else
// ends the reading (ended).
func (w *swConn) socketEnded(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, errWouldBlock) {
		return err
	}
	w.ended(err)
	return nil
}

// needReaderLocked makes readLoop read the socket, now or once the reading Read ends.
func (w *swConn) needReaderLocked() {
	if w.claimReaderLocked() {
		go w.readLoop()
	}
}

// claimReaderLocked takes the socket's reading if no one reads it: true,
// and the caller starts readLoop or, at Close, ends the reading
// (closeReading). A Read reading it is ended, and readLoop reads on after
// it (socketTurn).
func (w *swConn) claimReaderLocked() bool {
	switch w.reader {
	case readerNone:
		w.reader = readerLoop
		w.socketDeadlineLocked(time.Time{}) // a Read's deadline, maybe past, is not readLoop's
		return true
	case readerApp:
		w.reader = readerHanding
		w.socketDeadlineLocked(aLongTimeAgo)
	}
	return false
}

// socketDeadlineLocked sets the socket's read deadline unless it is t
// already: re-arming the same one would cost a timer operation per Read.
func (w *swConn) socketDeadlineLocked(t time.Time) {
	if !t.Equal(w.socketDL) {
		w.socketDL = t
		_ = w.raw.SetReadDeadline(t)
	}
}

// readerStopped records that nothing reads the socket any more: the
// sender may close it once its last frame is written.
func (w *swConn) readerStopped() {
	w.mu.Lock()
	w.reader = readerEnded
	w.mu.Unlock()
	w.out.readerDone()
}

// closeReading ends the reading at a Close on TCP when no one reads the
// socket (claimReaderLocked): docs/protocol.md §9.6, "Closing at once".
func (w *swConn) closeReading(orderly bool) {
	if orderly && w.in.buffered() == 0 && w.in.data == 0 && w.out.delivered(true) {
		w.readerStopped()
		return
	}
	var err error
	for err == nil { // drop what has arrived, without waiting
		if w.in.data > 0 {
			buf := pool.Get(min(w.in.data, inboxSize))
			_, err = w.in.take(buf, false)
			pool.Put(buf)
		} else {
			_, _, err = w.in.next(false)
		}
	}
	if !errors.Is(err, errWouldBlock) || orderly && w.out.delivered(false) {
		// The peer's end, a failure, or all we sent is with the peer:
		// nothing to wait for.
		w.readerStopped()
		return
	}
	go w.readLoop()
}

// readLoop reads the socket, to its end, for good: it queues Data payloads
// for Read (readData), the rest first of one a Read had begun. Its socket
// has no deadline, so any error ends it.
func (w *swConn) readLoop() {
	w.in.lean = true // it may wait on an idle socket for the connection's life
	for {
		data, over, err := w.frame(true)
		if data {
			err = w.readData(w.in.data)
		}
		if err != nil {
			w.ended(err)
			return
		}
		if over {
			return
		}
	}
}

func (w *swConn) dataAllowed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch p := w.pending; {
	case p != nil:
		w.pending = nil
		p.due.Stop() // as takePending does
		return p.refused("data before its answer")
	case w.recv == recvRing:
		return protocolError("data after the peer's switch")
	case !w.client && w.up == upOffered:
		return protocolError("data between an offer and its confirm")
	case w.recv == recvEnd:
		return protocolError("data after the peer's fin")
	}
	return nil
}

// readData reads n bytes of a Data payload and queues them for Read.
func (w *swConn) readData(n int) error {
	buf := pool.Get(n)
	for k := 0; k < n; {
		m, err := w.in.take(buf[k:], true)
		if err != nil { // io.ErrUnexpectedEOF at the socket's end (take)
			pool.Put(buf)
			return err
		}
		k += m
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rcvd += uint64(n)
	if w.rclosed || w.closed {
		pool.Put(buf)
		return nil
	}
	w.rq = append(w.rq, buf)
	w.rqLen += n
	w.rqCost += n + entryCost
	w.rnote.wake()
	for w.rqCost >= recvQueue && !w.closed && !w.rclosed {
		if w.send == sendOwed && !w.owe.known || w.client && w.up == upOffered {
			// A Write may wait for the peer's Resume, or for its answer to
			// our Offer, behind this Data.
			if w.rqCost >= recvQueue+resumeLag {
				return protocolError("more than %d bytes of data without the frame our writes wait for", resumeLag)
			}
			break
		}
		w.parked.Store(true)
		w.mu.Unlock()
		w.await(w.space)
		w.mu.Lock()
		w.parked.Store(false)
	}
	return nil
}

// protocolErr is a peer that broke the switching protocol's rules.
type protocolErr struct{ why string }

func (e *protocolErr) Error() string { return "the peer broke the switching protocol: " + e.why }

func protocolError(format string, args ...any) error {
	return &protocolErr{fmt.Sprintf(format, args...)}
}

// handle acts on a control frame.
func (w *swConn) handle(msg handshake.Message) error {
	if w.client {
		if p := w.takePending(); p != nil {
			return w.answered(p, msg)
		}
	}
	switch m := msg.(type) {
	case *handshake.Accept, *handshake.Decline:
		if !w.client || !w.takeAnswer(upAnswered) {
			return protocolError("%v without an offer", msg.Type())
		}
		w.answers <- msg
	case *handshake.UpgradeOffer:
		if w.client {
			return protocolError("an offer to the client")
		}
		// An offer right behind the Confirm that declined the last Accept:
		// that upgrade ends first, waiting for nothing from the client.
		w.mu.Lock()
		finishing, done := w.up >= upAnswered, w.upDone
		w.mu.Unlock()
		if finishing {
			w.await(done)
		}
		w.mu.Lock()
		if w.up != upIdle || w.ring != nil || w.moving != nil || w.awaitResume {
			w.mu.Unlock()
			return protocolError("an offer while another upgrade runs, a ring exists or a failover is not over")
		}
		mine := w.upgradingLocked()
		w.needReaderLocked() // the client's Confirm comes whether or not the application reads
		w.mu.Unlock()
		go w.serveUpgrade(m.Offer, mine)
	case *handshake.Confirm:
		to := upAnswered
		if m.Code == handshake.DeclineNone {
			to = upAgreed // the client's Switch may follow at once
		}
		if w.client || !w.takeAnswer(to) {
			return protocolError("a confirm without an accept")
		}
		w.answers <- msg
	case *handshake.Switch:
		return w.peerSwitched(m.Cursor)
	case *handshake.Resume:
		return w.peerResumed(m.Cursor)
	case *handshake.Fin:
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.recv == recvRing || w.recv == recvEnd || m.Cursor != w.rcvd {
			return protocolError("fin at %d after %d data bytes (receiving %d)", m.Cursor, w.rcvd, w.recv)
		}
		w.recv = recvEnd
		w.settleLocked()
		w.rnote.wake()
	case *handshake.Goodbye:
		return w.peerGoodbye(m)
	default:
		return protocolError("unexpected %v", msg.Type())
	}
	return nil
}

// takeAnswer moves an upgrade from upOffered to the answer's phase; false if none.
func (w *swConn) takeAnswer(to upPhase) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.up != upOffered {
		return false
	}
	w.up = to
	return true
}

// peerSwitched handles the peer's Switch{x}: its Data ends at x (§9.5).
func (w *swConn) peerSwitched(x uint64) error {
	w.mu.Lock()
	wait := w.upDone // set: each way to agree follows an upgrade (upgradingLocked)
	agreed := w.up == upAgreed || w.ring != nil || w.recv == recvStale
	w.mu.Unlock()
	if !agreed {
		return protocolError("a switch without an agreed ring")
	}
	// Our side of the ring may not be started or installed yet: the
	// client switches right after its Confirm.
	if !w.await(wait) {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.recv == recvRing || w.recv == recvEnd:
		return protocolError("a switch after a switch or fin")
	case x != w.rcvd:
		return protocolError("switch at stream byte %d after %d data bytes", x, w.rcvd)
	case w.recv == recvStale && w.ring == nil:
		// Sent before our failover took the ring away: the peer sends
		// the bytes after x again as Data.
		w.recv = recvTCP
		return nil
	case w.ring == nil:
		return &stream.ResetError{Reason: "the peer switched to a ring this side could not start"}
	}
	w.recv = recvRing
	w.settleLocked()
	w.noteLocked("receive", "tcp", w.c.label.Load().transport, fmt.Sprintf("peer switched at stream byte %d", x))
	w.rnote.wake()
	return nil
}

// peerGoodbye handles the peer's goodbye: an abort resets; an orderly one,
// checked against what arrived, ends the stream and our sending.
func (w *swConn) peerGoodbye(g *handshake.Goodbye) error {
	if g.Abort {
		return &stream.ResetError{Reason: "peer aborted: " + g.Reason}
	}
	w.awaitMove()
	// Checked and published in one section: a failover that comes after
	// it finds the goodbye (gone, peerFinal) and checks it itself.
	w.mu.Lock()
	r := w.ring
	switched, rcvd := w.recv == recvRing, w.rcvd
	var ringFinal uint64
	switch {
	case switched && g.FinalProd < rcvd:
		w.mu.Unlock()
		return protocolError("goodbye at %d before its switch at %d", g.FinalProd, rcvd)
	case switched:
		ringFinal = g.FinalProd - rcvd
		w.peerFinal = g.FinalProd
	case g.FinalProd != rcvd:
		w.mu.Unlock()
		return &stream.ResetError{Reason: "peer's goodbye does not match the data it sent", Err: fmt.Errorf("have %d bytes, goodbye says %d", rcvd, g.FinalProd)}
	default:
		w.recv = recvEnd
	}
	w.gone.fire()
	w.settleLocked()
	w.mu.Unlock()
	testHookGoodbye.run(w)
	gone := r == nil || r.PeerGoodbye(&handshake.Goodbye{FinalProd: ringFinal})
	w.rnote.wake()
	w.wnote.wake()
	if gone {
		// The peer's end checks out: half-close the bootstrap now, which
		// tells the peer we have what it sent (it keeps its queue pair until
		// then). A ring that failed the check resets, or a failover checks.
		w.out.halfClose()
	}
	return nil
}

// ended stops the reading at the end of the bootstrap, or an error reading
// it: after Close, nothing more; else a peer that vanished or broke the
// protocol resets the connection.
func (w *swConn) ended(err error) {
	w.readerStopped()
	if w.isClosed() {
		return
	}
	if p := w.takePending(); p != nil {
		err = p.refused(err.Error())
	}
	if err == io.EOF && w.peerClosedOnTCP() {
		return
	}
	w.fail(bootstrapFailure(err))
}

// bootstrapFailure is what a connection fails with when its bootstrap
// ends with err, not a goodbye: err if a reset or a protocol error, else a
// *stream.ResetError. It is apart from ended so that an orderly end
// allocates no errors.As targets.
func bootstrapFailure(err error) error {
	var re *stream.ResetError
	var pe *protocolErr
	switch {
	case errors.As(err, &re), errors.As(err, &pe):
		return err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET):
		return &stream.ResetError{Reason: "peer vanished (bootstrap connection closed without goodbye)", Err: err}
	}
	return &stream.ResetError{Reason: "bootstrap connection failed", Err: err}
}

// peerClosedOnTCP handles the end of the bootstrap at a frame boundary:
// the peer's orderly close while its sending is on TCP (§9.6); false if its
// bytes were on a ring (it vanished). Awaiting its Resume changes nothing
// if it had not switched (recvStale): its bytes all came on TCP.
func (w *swConn) peerClosedOnTCP() bool {
	w.awaitMove() // a failover in progress decides what the peer owes us, as for its goodbye
	w.mu.Lock()
	if w.recv == recvRing || w.awaitResume && w.recv == recvTCP || w.moving != nil {
		// Its bytes were on a ring, or a failover has not heard from it.
		w.mu.Unlock()
		return false
	}
	w.recv = recvEnd
	w.gone.fire()
	w.settleLocked()
	r := w.ring
	w.mu.Unlock()
	w.rnote.wake()
	w.wnote.wake()
	if r != nil {
		r.PeerGoodbye(&handshake.Goodbye{}) // its ring carried nothing
	}
	return true
}
