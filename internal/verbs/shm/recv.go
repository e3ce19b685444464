//go:build linux

package shm

import (
	"fmt"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// PostRecv posts a buffer for one incoming SEND and publishes the new
// count of posted RECVs in the inbox, where the peer checks it before
// sending. It works from the QP's creation on. A zero-length buffer may
// leave Local.MR nil. It does not block, make a system call or allocate.
// Errors: verbs.ErrClosed after Close; verbs.ErrQPState in the error state;
// verbs.ErrBounds for a buffer outside its region, in a region of another
// device, closed or without verbs.AccessLocalWrite; verbs.ErrQueueFull when
// RecvDepth RECVs are outstanding (a slot is freed when its completion is
// polled).
func (q *QP) PostRecv(wr *verbs.RecvWR) error {
	if wr == nil {
		return errNilWR
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if err := q.usable(false); err != nil {
		return err
	}
	mr, err := q.localSGE(&wr.Local)
	if err != nil {
		return err
	}
	if mr != nil && mr.access&verbs.AccessLocalWrite == 0 {
		return fmt.Errorf("%w: shm: receive buffer in a region without local write access", verbs.ErrBounds)
	}
	if int(q.rqUsed.Load()) >= len(q.recvs) {
		return verbs.ErrQueueFull
	}
	q.rqUsed.Add(1)
	// rcount <= rqUsed <= RecvDepth = len(recvs)
	q.recvs[(q.rfirst+q.rcount)%len(q.recvs)] = recvWR{id: wr.ID, mr: mr, off: wr.Local.Offset, n: wr.Local.Length}
	q.rcount++
	q.posted++
	q.in.hdr.posted.Store(q.posted)
	return nil
}

// popRecvLocked removes the oldest posted RECV; there must be one.
func (q *QP) popRecvLocked() recvWR {
	r := q.recvs[q.rfirst]
	q.recvs[q.rfirst] = recvWR{}
	q.rfirst++
	if q.rfirst == len(q.recvs) {
		q.rfirst = 0
	}
	q.rcount--
	return r
}

// pollInbox turns entries of this QP's inbox into receive completions in wc
// and returns how many. Called by CQ.Poll with the CQ's mu held. The check
// for new entries takes no lock.
func (q *QP) pollInbox(wc []verbs.Completion) int {
	if !q.in.ready(q.head.Load()) && q.in.hdr.fault.Load() == 0 {
		return 0
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if st := q.state.Load(); st == stateError || st == stateClosed {
		return 0
	}
	if q.in.hdr.fault.Load() != 0 {
		// The peer's WRITE hit an access violation here: as an RC
		// responder, deliver what came before it, then fail.
		q.failLocked(verbs.StatusFlushed, true)
		return 0
	}
	n, fail := q.consumeLocked(wc)
	if fail != verbs.StatusSuccess {
		q.failLocked(fail, false)
	}
	return n
}

// consumeLocked turns inbox entries into completions: into wc while there
// is room, or, with a nil wc, into the CQ's local queue (all of them). It
// returns how many went into wc and, if the QP must fail, the status for
// its oldest remaining RECV (StatusFatal for a corrupt inbox, StatusFlushed
// after a length error).
//
// The inbox is the peer's to write: an entry is read only once its seq
// says it is the one the private head expects, each field is read once
// and validated, and a payload is copied only within the entry and the
// posted buffer. Each entry takes a posted RECV, which bounds the loop.
func (q *QP) consumeLocked(wc []verbs.Completion) (int, verbs.Status) {
	toLocal := wc == nil
	h := q.head.Load()
	fail := verbs.StatusSuccess
	n := 0
	var one [1]verbs.Completion
	for (toLocal || n < len(wc)) && q.in.ready(h) {
		e := q.in.entryAt(h)
		op, length := e.op, e.length
		if q.rcount == 0 || op != entrySend || length > MaxSend {
			// A message without a RECV (the peer ignored its credits), an
			// unknown opcode or an impossible length.
			fail = verbs.StatusFatal
			break
		}
		r := q.popRecvLocked()
		c := &one[0]
		if !toLocal {
			c = &wc[n]
		}
		*c = verbs.Completion{ID: r.id, Op: verbs.OpRecv, Len: int(length)}
		switch {
		case int(length) > r.n:
			c.Status, c.Len = verbs.StatusLocalLength, 0
			fail = verbs.StatusFlushed
		case length == 0:
		case r.mr.pin():
			copy(r.mr.buf[r.off:r.off+int(length)], e.data[:length])
			r.mr.unpin()
		default: // the buffer's region was closed under the RECV
			c.Status, c.Len = verbs.StatusFatal, 0
			fail = verbs.StatusFlushed
		}
		h++
		if toLocal {
			q.cq.push(*c, &q.rqUsed, 1)
		} else {
			q.rqUsed.Add(-1)
			n++
		}
		if fail != verbs.StatusSuccess {
			break
		}
	}
	q.head.Store(h)
	q.in.hdr.head.Store(h)
	return n, fail
}

// fail moves the QP to the error state; see failLocked.
func (q *QP) fail(first verbs.Status, drain bool) {
	q.rmu.Lock()
	defer q.rmu.Unlock()
	q.failLocked(first, drain)
}

// failLocked moves the QP to the error state, unless it is there already
// or closed: with drain, the messages already in the inbox complete first
// (the peer saw them succeed); then the posted RECVs complete, the oldest
// with first and the others with StatusFlushed. The inbox header tells the
// peer, whose later sends fail with StatusRetryExceeded.
func (q *QP) failLocked(first verbs.Status, drain bool) {
	for {
		st := q.state.Load()
		if st == stateError || st == stateClosed {
			return
		}
		if q.state.CompareAndSwap(st, stateError) {
			break
		}
	}
	q.in.hdr.state.Store(ownerError)
	if drain {
		if _, f := q.consumeLocked(nil); f == verbs.StatusFatal {
			first = verbs.StatusFatal
		}
	}
	for q.rcount > 0 {
		r := q.popRecvLocked()
		q.cq.push(verbs.Completion{ID: r.id, Op: verbs.OpRecv, Status: first}, &q.rqUsed, 1)
		first = verbs.StatusFlushed
	}
}
