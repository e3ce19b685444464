package shm

import (
	"encoding/binary"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// After the exchange, the link's connection (link.go) carries for each QP
// what RC hardware does without asking the peer's CPU: resolving a remote
// key the peer registered after the exchange (pull), and the peer QP's end
// (gone; the link's end means the peer process is gone), after which sends
// fail with StatusRetryExceeded. The link's reader serves them. A region
// the peer deregisters is not revoked here (see Deviations in the package
// documentation).
const (
	// pullTimeout bounds how long a post waits for the peer to answer a
	// remote-key fetch.
	pullTimeout = 5 * time.Second
	// ctlWriteTimeout bounds a control write (the peer reads at once).
	ctlWriteTimeout = time.Second
	// maxPeerMRs bounds the peer regions mapped per QP (deregistered
	// ones stay mapped until the QP closes).
	maxPeerMRs = 4096
)

// pullWait is a post waiting for the answer to a remote-key fetch.
type pullWait struct {
	id uint32
	ch chan pullReply // buffered: the reader never blocks
}

type pullReply struct {
	found bool
	rec   mrRecord
	fd    int // -1 unless found
}

// ctlWrite sends a control message for the peer QP on the link (fds stay
// the caller's). It fails if the QP has no link.
func (q *QP) ctlWrite(b []byte, fds []int) error {
	q.cmu.Lock()
	l := q.link
	q.cmu.Unlock()
	if l == nil {
		return verbs.ErrClosed
	}
	return l.write(b, fds)
}

// ctlHeader starts a control message of kind for the peer QP.
func (q *QP) ctlHeader(kind byte) []byte {
	q.cmu.Lock()
	defer q.cmu.Unlock()
	return appendID(appendHeader(make([]byte, 0, 64), kind), q.peerID)
}

// answerPull answers the peer's fetch of rkey with the region's memfd if it
// is an open remote-writable region of this QP's device.
func (q *QP) answerPull(id, rkey uint32) {
	b := binary.LittleEndian.AppendUint32(q.ctlHeader(msgPullReply), id)
	rec := mrRecord{rkey: rkey}
	fd := q.dev.exportKey(&rec)
	found := byte(0)
	var fds []int
	if fd >= 0 {
		found, fds = 1, []int{fd}
	}
	b = append(b, found, 0, 0, 0)
	b = appendRecord(b, rec)
	if q.ctlWrite(b, fds) == nil && fd >= 0 {
		q.dev.passedTo(q, []uint32{rkey})
	}
	closeFDs(fds)
}

// deliverPull hands a fetch's answer to the post waiting for it, or closes
// its fd if nobody waits any more.
func (q *QP) deliverPull(body []byte, fds []int) {
	id := binary.LittleEndian.Uint32(body)
	r := pullReply{found: body[4] == 1, rec: readRecord(body[8:]), fd: -1}
	if r.found != (len(fds) == 1) || len(fds) > 1 {
		closeFDs(fds)
		r.found = false
	} else if r.found {
		r.fd = fds[0]
	}
	q.cmu.Lock()
	w := q.pend
	if w != nil && w.id == id {
		q.pend = nil
		w.ch <- r
		q.cmu.Unlock()
		return
	}
	q.cmu.Unlock()
	if r.fd >= 0 {
		_ = unix.Close(r.fd)
	}
}

// pullLocked fetches the peer's region rkey over the control connection and
// maps it. smu is held: the post waits, at most pullTimeout. It returns
// StatusRemoteAccess if the peer has no such region (or sent a bad one) and
// StatusRetryExceeded if it did not answer.
func (q *QP) pullLocked(rkey uint32) (*peerMR, verbs.Status) {
	if len(q.peerMRs) >= maxPeerMRs {
		return nil, verbs.StatusRemoteAccess
	}
	q.cmu.Lock()
	q.pullSeq++
	w := &pullWait{id: q.pullSeq, ch: make(chan pullReply, 1)}
	q.pend = w
	q.cmu.Unlock()

	b := binary.LittleEndian.AppendUint32(q.ctlHeader(msgPull), w.id)
	b = binary.LittleEndian.AppendUint32(b, rkey)
	var r pullReply
	ok := q.ctlWrite(b, nil) == nil
	if ok {
		timer := time.NewTimer(pullTimeout)
		select {
		case r = <-w.ch:
		case <-timer.C:
			ok = false
		case <-q.closing:
			ok = false
		}
		timer.Stop()
	}
	if !ok {
		q.cmu.Lock()
		if q.pend == w {
			q.pend = nil
		}
		q.cmu.Unlock()
		select {
		case r = <-w.ch: // delivered meanwhile
			if r.fd >= 0 {
				_ = unix.Close(r.fd)
			}
		default:
		}
		return nil, verbs.StatusRetryExceeded
	}
	if !r.found {
		return nil, verbs.StatusRemoteAccess
	}
	defer unix.Close(r.fd)
	if r.rec.rkey != rkey {
		return nil, verbs.StatusRemoteAccess
	}
	p, err := mapPeerMR(r.fd, r.rec)
	if err != nil {
		return nil, verbs.StatusRemoteAccess
	}
	q.peerMRs[rkey] = p
	return p, verbs.StatusSuccess
}
