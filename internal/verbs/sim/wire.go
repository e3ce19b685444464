package sim

import (
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// fifo is a queue that reuses its storage.
type fifo[T any] struct {
	buf  []T
	head int
}

func (f *fifo[T]) len() int { return len(f.buf) - f.head }

func (f *fifo[T]) push(v T) { f.buf = append(f.buf, v) }

// front returns the oldest element; the queue must not be empty.
func (f *fifo[T]) front() *T { return &f.buf[f.head] }

// pop removes and returns the oldest element; the queue must not be empty.
func (f *fifo[T]) pop() T {
	v := f.buf[f.head]
	var zero T
	f.buf[f.head] = zero
	f.head++
	switch {
	case f.head == len(f.buf):
		f.buf, f.head = f.buf[:0], 0
	case f.head >= 64 && f.head > len(f.buf)/2:
		n := copy(f.buf, f.buf[f.head:])
		clear(f.buf[n:])
		f.buf, f.head = f.buf[:n], 0
	}
	return v
}

// take empties the queue and returns its elements, oldest first.
func (f *fifo[T]) take() []T {
	v := f.buf[f.head:]
	f.buf, f.head = nil, 0
	return v
}

// pump delivers whatever q's wire can deliver now.
func (q *QP) pump() {
	p := q.lockWithPeer()
	defer unlockPair(q, p)
	if p != nil {
		q.pumpLocked(p)
	}
}

// pumpLocked delivers transfers from the head of q's wire until the wire is
// empty, held, or q fails. q and its peer p are locked.
func (q *QP) pumpLocked(p *QP) {
	if q.wire.len() == 0 {
		return
	}
	fq := q.dev.prov.currentFaults()
	fp := p.dev.prov.currentFaults()
	now := time.Now()
	for q.wire.len() > 0 && q.state == stateConnected {
		if due := q.wire.front().due; due.After(now) {
			q.scheduleRetransmitLocked(due, now)
			return
		}
		switch {
		case p.state == stateClosed:
			t := q.wire.pop()
			q.failLocked(&t, verbs.StatusRetryExceeded, &fq)
			return
		case p.stalled, p.state == stateInit:
			return // held; Stall(false) or Connect pumps again
		case p.state == stateError, p.peer != q:
			t := q.wire.pop()
			q.failLocked(&t, verbs.StatusRetryExceeded, &fq)
			return
		}
		t := q.wire.pop()
		q.deliverLocked(p, &t, &fq, &fp)
	}
}

// deliverLocked executes transfer t of q at peer p (both locked) and
// generates the completions. fq and fp are the faults for q's and p's CQs.
func (q *QP) deliverLocked(p *QP, t *transfer, fq, fp *Faults) {
	var src []byte
	switch {
	case t.isInline:
		src = t.inline
	case t.mr != nil:
		buf := t.mr.pin()
		if buf == nil { // the local MR was closed under the request
			q.failLocked(t, verbs.StatusFatal, fq)
			return
		}
		defer t.mr.unpin()
		src = buf[t.off : t.off+t.n]
	}

	switch t.op {
	case verbs.OpWrite:
		var dst []byte
		if t.n > 0 {
			var buf []byte
			mr := p.dev.lookupKey(t.rkey)
			off, ok := 0, false
			if mr != nil {
				off, ok = mr.inRemote(t.raddr, t.n)
			}
			if ok {
				buf = mr.pin()
			}
			if buf == nil {
				// Both ends of an RC connection fail on an access violation.
				q.failLocked(t, verbs.StatusRemoteAccess, fq)
				p.flushLocked(fp)
				return
			}
			defer mr.unpin()
			dst = buf[off : off+t.n]
		}
		copy(dst, src)

	case verbs.OpSend:
		if p.recvs.len() == 0 {
			q.failLocked(t, verbs.StatusRNR, fq)
			return
		}
		r := p.recvs.pop()
		var dst []byte
		status := verbs.StatusSuccess
		if t.n > r.n {
			status = verbs.StatusLocalLength
		} else if t.n > 0 {
			buf := r.mr.pin()
			if buf == nil { // the receive buffer's MR was closed
				status = verbs.StatusFatal
			} else {
				defer r.mr.unpin()
				dst = buf[r.off : r.off+t.n]
			}
		}
		if status != verbs.StatusSuccess {
			p.cq.push(verbs.Completion{ID: r.id, Op: verbs.OpRecv, Status: status}, &p.rq, 1, fp, false)
			q.failLocked(t, verbs.StatusRemoteAccess, fq)
			p.flushLocked(fp)
			return
		}
		copy(dst, src)
		p.cq.push(verbs.Completion{ID: r.id, Op: verbs.OpRecv, Len: t.n}, &p.rq, 1, fp, t.solicit)
	}
	q.completeSendLocked(t, verbs.StatusSuccess, fq)
}

// completeSendLocked generates the completion of send request t, if it
// needs one: failures always complete, successes only when signaled, and
// a request completed at post (Faults.LocalCompletion) never again. A
// completion retires the unsignaled requests before it.
func (q *QP) completeSendLocked(t *transfer, status verbs.Status, f *Faults) {
	if t.done {
		return
	}
	if status == verbs.StatusSuccess && !t.signaled {
		q.unretired++
		return
	}
	slots := 1 + q.unretired
	q.unretired = 0
	q.cq.push(verbs.Completion{ID: t.id, Op: t.op, Status: status}, &q.sq, slots, f, false)
}

// failLocked completes t with status and moves q to the error state.
func (q *QP) failLocked(t *transfer, status verbs.Status, f *Faults) {
	q.completeSendLocked(t, status, f)
	q.flushLocked(f)
}

// flushLocked moves q to the error state: every undelivered send and every
// posted RECV completes with StatusFlushed, in order.
func (q *QP) flushLocked(f *Faults) {
	if q.state != stateClosed {
		q.state = stateError
	}
	for _, t := range q.wire.take() {
		q.completeSendLocked(&t, verbs.StatusFlushed, f)
	}
	for _, r := range q.recvs.take() {
		q.cq.push(recvFlush(r.id), &q.rq, 1, f, false)
	}
	if q.timer != nil {
		q.timer.Stop()
		q.timer = nil
	}
}

func recvFlush(id uint64) verbs.Completion {
	return verbs.Completion{ID: id, Op: verbs.OpRecv, Status: verbs.StatusFlushed}
}

// scheduleRetransmitLocked makes sure the wire is pumped again at due.
func (q *QP) scheduleRetransmitLocked(due, now time.Time) {
	if q.timer != nil && !q.timerAt.After(due) {
		return
	}
	if q.timer != nil {
		q.timer.Stop()
	}
	q.timerAt = due
	q.timer = time.AfterFunc(due.Sub(now), q.onRetransmit)
}

func (q *QP) onRetransmit() {
	p := q.lockWithPeer()
	defer unlockPair(q, p)
	// A stopped timer may still fire; pumpLocked reschedules if needed.
	q.timer = nil
	if p != nil {
		q.pumpLocked(p)
	}
}
