//go:build linux

package shm

import (
	"fmt"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// PostSend executes a send work request, and those chained to it, in the
// caller's goroutine before it returns, with their completions (failures
// always; successes when Signaled) in the local CQ:
//   - WRITE copies the data into the peer's region named by RKey (mapped at
//     connect time). An unknown key, one registered after the connection,
//     or a range outside the region completes with
//     verbs.StatusRemoteAccess.
//   - SEND publishes an inbox entry. With no RECV posted at the peer it
//     completes with verbs.StatusRNR.
//   - A peer that closed its QP, is in the error state or whose process went
//     away makes them complete with verbs.StatusRetryExceeded.
//
// Any failure moves the QP to the error state. It makes no system call and
// does not allocate, but for one eventfd write when the peer's CQ is armed
// (once per Arm) and its link's dispatcher sleeps.
//
// Errors (the request, and those after it, then have no effect):
// verbs.ErrClosed after Close; verbs.ErrQPState before the connection is
// established or in the error state; verbs.ErrInlineTooLong;
// ErrSendTooLong for a SEND from a region longer than MaxSend;
// verbs.ErrBounds for a local SGE outside its region, of another device or
// closed; verbs.ErrQueueFull when SendDepth requests are outstanding.
func (q *QP) PostSend(wr *verbs.SendWR) error {
	if wr == nil {
		return errNilWR
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	for ; wr != nil; wr = wr.Next {
		if err := q.usable(true); err != nil {
			return err
		}
		switch wr.Op {
		case verbs.OpWrite, verbs.OpSend:
		default:
			return fmt.Errorf("shm: send work request with opcode %v", wr.Op)
		}
		src, mr := wr.Inline, (*MR)(nil)
		if src != nil {
			if len(src) > q.maxInline {
				return fmt.Errorf("%w: %d bytes, at most %d", verbs.ErrInlineTooLong, len(src), q.maxInline)
			}
		} else {
			var err error
			if mr, err = q.localSGE(&wr.Local); err != nil {
				return err
			}
			if wr.Op == verbs.OpSend && wr.Local.Length > MaxSend {
				return fmt.Errorf("%w: %d bytes", ErrSendTooLong, wr.Local.Length)
			}
		}
		if q.sqUsed.Load() >= q.sqDepth {
			return verbs.ErrQueueFull
		}
		q.sqUsed.Add(1)
		var status verbs.Status
		switch {
		case mr == nil:
			status = q.executeLocked(wr, src)
		case mr.pin():
			status = q.executeLocked(wr, mr.buf[wr.Local.Offset:wr.Local.Offset+wr.Local.Length])
			mr.unpin()
		default:
			status = verbs.StatusFatal // the region was closed under the request
		}
		q.completeLocked(wr, status)
	}
	return nil
}

// executeLocked performs wr with source data src.
func (q *QP) executeLocked(wr *verbs.SendWR, src []byte) verbs.Status {
	if q.peerGone.Load() || q.out.hdr.state.Load() != ownerReady {
		return verbs.StatusRetryExceeded
	}
	if wr.Op == verbs.OpWrite {
		var dst []byte
		if len(src) > 0 { // zero-length WRITEs check neither key nor bounds
			if dst = q.remoteLocked(wr.RemoteAddr, wr.RKey, len(src)); dst == nil {
				q.out.hdr.fault.Store(1) // the responder of an RC connection fails too
				return verbs.StatusRemoteAccess
			}
		}
		copy(dst, src)
		return verbs.StatusSuccess
	}
	if st := q.creditLocked(); st != verbs.StatusSuccess { // OpSend
		return st
	}
	return q.enqueueLocked(src, wr.Solicited)
}

// creditLocked checks that the peer has a RECV posted for one more entry
// (StatusRNR otherwise) and that its inbox has room, which an honest peer
// always has when it has a RECV posted (StatusFatal otherwise). The peer's
// counters are reloaded from shared memory only when the cached values do
// not suffice; whatever they say, the entry written is within the inbox.
func (q *QP) creditLocked() verbs.Status {
	if q.tail >= q.credit {
		q.credit = q.out.hdr.posted.Load()
		if q.tail >= q.credit {
			return verbs.StatusRNR
		}
	}
	if q.tail-q.peerHead >= q.out.cap {
		q.peerHead = q.out.hdr.head.Load()
		if q.tail-q.peerHead >= q.out.cap {
			return verbs.StatusFatal
		}
	}
	return verbs.StatusSuccess
}

// enqueueLocked writes a SEND's entry into the peer's inbox, publishes it
// with the store of its seq (which orders the entry, and data copied before
// it, before the peer's load of seq) and rings the peer if its sleeping
// word asks (Sleeping in the package documentation: either the Poll after
// Arm sees the entry or this load sees the word). A change of the word
// meanwhile makes the swap fail; the peer's poll after it finds the entry.
func (q *QP) enqueueLocked(payload []byte, solicited bool) verbs.Status {
	e := q.out.entryAt(q.tail)
	e.op, e.length = entrySend, uint32(len(payload))
	copy(e.data[:], payload)
	q.tail++
	e.seq.Store(q.tail)
	if v := q.out.hdr.sleeping.Load(); v != 0 && (v != armSolicited || solicited) && q.out.hdr.sleeping.CompareAndSwap(v, 0) {
		q.link.peer.ring(q.peerID&0xffff, q.link.peerEvt, false)
	}
	return verbs.StatusSuccess
}

// Kick rings the peer as if it slept, unless its inbox is empty
// (verbs.Kicker).
func (q *QP) Kick() bool {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.usable(true) != nil || q.out.hdr.head.Load() == q.tail {
		return false
	}
	q.link.peer.ring(q.peerID&0xffff, q.link.peerEvt, true)
	return true
}

// completeLocked generates the completion of wr, if it needs one: failures
// always complete (and move the QP to the error state), successes only
// when signaled. A completion retires the unsignaled requests before it.
func (q *QP) completeLocked(wr *verbs.SendWR, status verbs.Status) {
	if status == verbs.StatusSuccess && !wr.Signaled {
		q.unretired++
		return
	}
	slots := 1 + q.unretired
	q.unretired = 0
	q.cq.push(verbs.Completion{ID: wr.ID, Op: wr.Op, Status: status}, &q.sqUsed, slots)
	if status != verbs.StatusSuccess {
		q.fail(verbs.StatusFlushed, true)
	}
}

// remoteLocked resolves raddr..raddr+n of the peer region named by rkey,
// or returns nil for an unknown key or a range outside the region.
func (q *QP) remoteLocked(raddr uint64, rkey uint32, n int) []byte {
	p := q.lastMR
	if p == nil || p.rkey != rkey {
		if p = q.peerMRs[rkey]; p == nil {
			return nil
		}
		q.lastMR = p
	}
	return p.rangeOf(raddr, n)
}

// MapRemote returns the peer's memory at addr..addr+length of the region
// named by rkey, mapped in this process, so that a writer can copy into it
// directly instead of posting a WRITE. Bytes copied before a SEND is
// posted are visible to the peer when that message's receive completion
// is (the entry's publication orders them). The slice stays valid until
// Close, even if the peer deregisters the region. It does not block.
// Errors: verbs.ErrClosed, verbs.ErrQPState when not connected, and an
// error wrapping verbs.ErrBounds when the range is not inside a
// remote-writable region of the peer.
func (q *QP) MapRemote(addr uint64, rkey uint32, length int) ([]byte, error) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if err := q.usable(true); err != nil {
		return nil, err
	}
	dst := q.remoteLocked(addr, rkey, length)
	if dst == nil {
		return nil, fmt.Errorf("%w: shm: %d bytes at %#x of remote key %#x are not remote-writable at the peer",
			verbs.ErrBounds, length, addr, rkey)
	}
	return dst, nil
}
