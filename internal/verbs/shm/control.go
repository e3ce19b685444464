package shm

import (
	"encoding/binary"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// After the exchange, the rendezvous connection stays open as the QP's
// control connection. It carries what RC hardware does without asking the
// peer's CPU: resolving a remote key the peer registered after the exchange
// (pull), dropping the mapping of a region the peer deregistered (revoke),
// and the doorbell of the peer CQ's Wait (ring, see CQ). Its end (EOF) means the peer's QP or process is gone, after
// which sends fail with StatusRetryExceeded. One goroutine per QP reads it,
// parked in the netpoller.
const (
	// pullTimeout bounds how long a post waits for the peer to answer a
	// remote-key fetch.
	pullTimeout = 5 * time.Second
	// ctlWriteTimeout bounds a control write (the peer reads at once).
	ctlWriteTimeout = time.Second
	// maxQueuedRevokes bounds the revocations queued between two WRITEs;
	// beyond it every unpinned peer region is dropped (and re-fetched on
	// use).
	maxQueuedRevokes = 1024
	// maxPeerMRs bounds the peer regions mapped per QP.
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

// readLoop serves the control connection until it fails or is closed.
func (q *QP) readLoop(c *net.UnixConn, done chan struct{}) {
	defer close(done)
	buf := make([]byte, 256)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		b, fds, err := readMsg(c, buf, oob)
		if err != nil {
			q.peerGone.Store(true)
			return
		}
		kind, body, err := decodeHeader(b)
		if err == nil {
			switch {
			case kind == msgPull && len(body) == 8 && len(fds) == 0:
				q.answerPull(c, binary.LittleEndian.Uint32(body), binary.LittleEndian.Uint32(body[4:]))
				continue
			case kind == msgPullReply && len(body) == 8+recordLen:
				q.deliverPull(body, fds)
				continue
			case kind == msgRevoke && len(body) == 4 && len(fds) == 0:
				q.queueRevoke(binary.LittleEndian.Uint32(body))
				continue
			case kind == msgRing && len(body) == 0 && len(fds) == 0:
				q.cq.ringBell()
				continue
			}
		}
		// A protocol violation: treat the peer as gone.
		closeFDs(fds)
		q.peerGone.Store(true)
		_ = c.Close()
		return
	}
}

// ringMsg rings the peer CQ's Wait doorbell (see CQ).
var ringMsg = appendHeader(nil, msgRing)

// ringPeerLocked sends ringMsg without blocking (smu held). If the peer's
// socket buffer is full, rings are pending there already.
func (q *QP) ringPeerLocked() {
	if q.ctlRaw == nil {
		return
	}
	_ = q.ctlRaw.Write(func(fd uintptr) bool {
		_ = unix.Sendmsg(int(fd), ringMsg, nil, nil, unix.MSG_DONTWAIT)
		return true
	})
}

// ctlWrite sends a control message (fds stay the caller's).
func (q *QP) ctlWrite(c *net.UnixConn, b []byte, fds []int) error {
	q.wmu.Lock()
	defer q.wmu.Unlock()
	_ = c.SetWriteDeadline(time.Now().Add(ctlWriteTimeout))
	return writeMsg(c, b, fds)
}

// answerPull answers the peer's fetch of rkey with the region's memfd if it
// is an open remote-writable region of this QP's device.
func (q *QP) answerPull(c *net.UnixConn, id, rkey uint32) {
	b := binary.LittleEndian.AppendUint32(appendHeader(nil, msgPullReply), id)
	var fds []int
	rec := mrRecord{rkey: rkey}
	if mr := q.dev.lookupKey(rkey); mr != nil {
		if fd := mr.dupFD(); fd >= 0 {
			fds = []int{fd}
			rec.addr, rec.size = mr.addr, uint64(len(mr.buf))
		}
	}
	found := byte(0)
	if len(fds) > 0 {
		found = 1
	}
	b = append(b, found, 0, 0, 0)
	b = appendRecord(b, rec)
	_ = q.ctlWrite(c, b, fds)
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
	c := q.ctl
	if c == nil {
		q.cmu.Unlock()
		return nil, verbs.StatusRetryExceeded
	}
	q.pullSeq++
	w := &pullWait{id: q.pullSeq, ch: make(chan pullReply, 1)}
	q.pend = w
	q.cmu.Unlock()

	b := binary.LittleEndian.AppendUint32(appendHeader(nil, msgPull), w.id)
	b = binary.LittleEndian.AppendUint32(b, rkey)
	var r pullReply
	ok := q.ctlWrite(c, b, nil) == nil
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

// queueRevoke records that the peer deregistered rkey; the next WRITE or
// MapRemote applies it (the reader must not wait for smu, which a post
// fetching a key holds while it waits for this reader).
func (q *QP) queueRevoke(rkey uint32) {
	q.cmu.Lock()
	defer q.cmu.Unlock()
	if len(q.revokes) < maxQueuedRevokes {
		q.revokes = append(q.revokes, rkey)
	} else {
		q.revokeAll = true
	}
	q.hasRevokes.Store(true)
}

// applyRevokesLocked drops the peer regions revoked so far. A region handed
// out by MapRemote stays mapped (its user may still copy into it) until
// Close, but is no longer found by its key.
func (q *QP) applyRevokesLocked() {
	q.cmu.Lock()
	keys, all := q.revokes, q.revokeAll
	q.revokes, q.revokeAll = nil, false
	q.hasRevokes.Store(false)
	q.cmu.Unlock()
	drop := func(p *peerMR) {
		delete(q.peerMRs, p.rkey)
		if q.lastMR == p {
			q.lastMR = nil
		}
		if p.pinned {
			q.retired = append(q.retired, p)
		} else {
			_ = unmap(p.mem)
		}
	}
	if all {
		for _, p := range q.peerMRs {
			drop(p)
		}
		return
	}
	for _, k := range keys {
		if p := q.peerMRs[k]; p != nil {
			drop(p)
		}
	}
}

// sendRevoke tells the peer that rkey is gone (best effort).
func (q *QP) sendRevoke(rkey uint32) {
	q.cmu.Lock()
	c := q.ctl
	q.cmu.Unlock()
	if c == nil {
		return
	}
	b := binary.LittleEndian.AppendUint32(appendHeader(nil, msgRevoke), rkey)
	_ = q.ctlWrite(c, b, nil)
}
