//go:build linux

package shm

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The listener never blocks its accept loop (Connection and trust model in
// the package documentation): it reads each connection's SO_PEERCRED as it
// accepts it and serves at most maxPerPeer first messages of one peer
// process (pid) at once; that process's further connections wait, in
// order, up to maxQueuedPerPeer (a connection past that is refused at
// once: its peer falls back to TCP). Each has firstMessageTimeout from
// its accept to send its first message, which a real peer sends at once.
// With maxHeld connections held in all, a new one takes the place of one
// of the process that holds the most (evictLocked).
const (
	maxPerPeer          = 16
	maxQueuedPerPeer    = 1024
	firstMessageTimeout = 2 * time.Second
	// queuedGrace is the least time left for the first message (which a
	// real peer sent long ago) of a connection queued past firstMessageTimeout.
	queuedGrace = 10 * time.Millisecond
	// rendezvousTimeout bounds one exchange on the passive side, and on the
	// active side when ctx has no earlier deadline.
	rendezvousTimeout = 10 * time.Second
)

var maxHeld = 4096 // a variable for tests

// The rendezvous listener (Connection and trust model in the package
// documentation), with the secrets of passive QPs registered.
var rv = struct {
	mu          sync.Mutex
	ln          *net.UnixListener
	name        string
	refs        int
	regs        []*QP // passive QPs waiting for their active peer
	lastRefusal string

	// peers holds, per peer pid, the exchanges being served and the
	// connections waiting for a slot; held counts both, over all pids.
	peers map[int32]*peerQueue
	held  int

	accepted atomic.Uint64
	refused  atomic.Uint64
}{peers: map[int32]*peerQueue{}}

// peerQueue is one peer process's share of the rendezvous listener.
type peerQueue struct {
	active int             // exchanges being served, at most maxPerPeer
	queue  []pendingConn   // waiting for a slot, in accept order
	silent []*net.UnixConn // served, their first message not read yet, oldest first
}

func (pq *peerQueue) held() int { return pq.active + len(pq.queue) }

// pendingConn is an accepted connection and what is known of it.
type pendingConn struct {
	c        *net.UnixConn
	cred     *unix.Ucred
	accepted time.Time
}

// RendezvousStats counts what this process's rendezvous listener did.
type RendezvousStats struct {
	Accepted uint64 // exchanges completed for a registered QP
	Refused  uint64 // connections closed without an exchange
	// LastRefusal is the reason for the latest refusal, with the peer's
	// pid and uid (SO_PEERCRED) when known.
	LastRefusal string
}

// Stats returns the counters of this process's rendezvous listener.
func Stats() RendezvousStats {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return RendezvousStats{Accepted: rv.accepted.Load(), Refused: rv.refused.Load(), LastRefusal: rv.lastRefusal}
}

// acquireListener returns the name of the listener, starting it if needed,
// and takes a reference to it. Errors wrap verbs.ErrUnavailable.
func acquireListener() (string, error) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	for try := 1; rv.ln == nil; try++ { // a random name collides only by accident
		var r [8]byte
		_, _ = rand.Read(r[:])
		name := fmt.Sprintf("%s%d-%s", namePrefix, os.Getpid(), hex.EncodeToString(r[:]))
		ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: name, Net: "unixpacket"})
		switch {
		case err == nil:
			rv.ln, rv.name = ln, name
			go acceptLoop(ln)
		case try == 4:
			return "", fmt.Errorf("%w: shm: rendezvous listener: %v", verbs.ErrUnavailable, err)
		}
	}
	rv.refs++
	return rv.name, nil
}

// holdListener takes a reference to the listener if it is up, for a link
// it accepted (Connection and trust model in the package documentation).
func holdListener() bool {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if rv.ln == nil {
		return false
	}
	rv.refs++
	return true
}

// releaseListener drops a reference; the last one closes the listener.
func releaseListener() {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	rv.refs--
	if rv.refs == 0 && rv.ln != nil {
		_ = rv.ln.Close()
		rv.ln, rv.name = nil, ""
	}
}

func register(q *QP) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	rv.regs = append(rv.regs, q)
}

func unregister(q *QP) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if i := slices.Index(rv.regs, q); i >= 0 {
		rv.regs = slices.Delete(rv.regs, i, i+1)
	}
}

// claimRegistration returns the registered QP whose secret is secret, or
// nil; every registration is compared, in constant time, whatever
// matches. For an attach (link false) it removes the registration: one
// use. For a link's setup it leaves it, but a secret sets up one link at
// most, so links number no more than registrations.
func claimRegistration(secret []byte, link bool) *QP {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	found := -1
	for i, q := range rv.regs {
		if subtle.ConstantTimeCompare(q.secret[:], secret) == 1 {
			found = i
		}
	}
	if found < 0 {
		return nil
	}
	q := rv.regs[found]
	switch {
	case !link:
		rv.regs = slices.Delete(rv.regs, found, found+1)
	case q.rvLinked:
		return nil
	default:
		q.rvLinked = true
	}
	return q
}

// testHookLinkRefused, if set, runs in serveRendezvous once a link whose
// secret was claimed has been refused (tests: the genuine peer connects
// while it runs).
var testHookLinkRefused atomic.Pointer[func()]

// refuse closes c (nil: an attach on a link) and records the refusal.
func refuse(c *net.UnixConn, cred *unix.Ucred, why string) {
	if c != nil {
		_ = c.Close()
	}
	rv.refused.Add(1)
	if cred != nil {
		why = fmt.Sprintf("%s (peer pid %d, uid %d)", why, cred.Pid, cred.Uid)
	}
	rv.mu.Lock()
	rv.lastRefusal = why
	rv.mu.Unlock()
}

func acceptLoop(ln *net.UnixListener) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(5 * time.Millisecond) // e.g. out of fds
			continue
		}
		cred, err := peerCred(c)
		if err != nil {
			refuse(c, nil, err.Error())
			continue
		}
		admit(pendingConn{c: c, cred: cred, accepted: time.Now()})
	}
}

// admit starts a new connection's exchange, or queues it behind its
// process's other exchanges (maxPerPeer), or refuses it. It does not
// block, so no process can hold up the connections of another.
func admit(p pendingConn) {
	cred := p.cred
	// Same user only: see the package documentation's trust model.
	if int(cred.Uid) != os.Geteuid() {
		refuse(p.c, cred, "peer runs as another user")
		return
	}
	rv.mu.Lock()
	pq := rv.peers[cred.Pid]
	if pq == nil {
		pq = &peerQueue{}
		rv.peers[cred.Pid] = pq
	}
	if rv.held >= maxHeld {
		queued, ok := evictLocked(pq)
		if !ok {
			if pq.held() == 0 {
				delete(rv.peers, cred.Pid)
			}
			rv.mu.Unlock()
			refuse(p.c, cred, fmt.Sprintf("%d connections waiting for an exchange", maxHeld))
			return
		}
		if queued != nil {
			defer refuse(queued.c, queued.cred, fmt.Sprintf("evicted: %d connections held, the most by this process", maxHeld))
		}
	}
	switch {
	case pq.active < maxPerPeer:
		pq.active++
		pq.silent = append(pq.silent, p.c)
		rv.held++
		rv.mu.Unlock()
		go serveQueued(p)
	case len(pq.queue) < maxQueuedPerPeer:
		pq.queue = append(pq.queue, p)
		rv.held++
		rv.mu.Unlock()
	default: // pq holds maxPerPeer served connections: it stays
		rv.mu.Unlock()
		refuse(p.c, cred, fmt.Sprintf("the process has %d connections waiting for an exchange", maxPerPeer+maxQueuedPerPeer))
	}
}

// evictLocked makes room, with maxHeld held, for a connection of pq's
// process by closing one of the process that holds the most, if it holds
// more than pq's would: its newest queued one, which is returned for
// refusal; else its oldest served one whose first message has not come,
// closed here, which ends its exchange (its place is freed when that
// ends). It reports whether it made room.
func evictLocked(pq *peerQueue) (queued *pendingConn, ok bool) {
	var big *peerQueue
	for _, o := range rv.peers {
		if big == nil || o.held() > big.held() {
			big = o
		}
	}
	switch {
	case big.held() <= pq.held()+1:
		return nil, false
	case len(big.queue) > 0:
		p := big.queue[len(big.queue)-1]
		big.queue = big.queue[:len(big.queue)-1]
		rv.held--
		return &p, true
	case len(big.silent) > 0:
		_ = big.silent[0].Close()
		big.silent = big.silent[1:]
		return nil, true
	}
	return nil, false
}

// heard records that c's first message came, or that reading it ended:
// c can no longer be evicted.
func heard(pid int32, c *net.UnixConn) {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	if pq := rv.peers[pid]; pq != nil {
		if i := slices.Index(pq.silent, c); i >= 0 {
			pq.silent = slices.Delete(pq.silent, i, i+1)
		}
	}
}

// serveQueued serves p, then the connections its process queued meanwhile,
// one after the other, in the slot p held.
func serveQueued(p pendingConn) {
	pid := p.cred.Pid
	for {
		serveRendezvous(p)
		rv.mu.Lock()
		rv.held--
		pq := rv.peers[pid]
		if len(pq.queue) == 0 {
			pq.active--
			if pq.active == 0 {
				delete(rv.peers, pid)
			}
			rv.mu.Unlock()
			return
		}
		p = pq.queue[0]
		pq.queue[0] = pendingConn{}
		pq.queue = pq.queue[1:]
		pq.silent = append(pq.silent, p.c)
		rv.mu.Unlock()
	}
}

// serveRendezvous runs the passive side of a new link's setup (Connection
// and trust model in the package documentation); on success the link's
// reader and dispatcher take over c, and the QPs attach.
func serveRendezvous(p pendingConn) {
	c, cred := p.c, p.cred
	_ = c.SetDeadline(time.Now().Add(rendezvousTimeout))
	buf := make([]byte, maxMsgLen)
	oob := make([]byte, unix.CmsgSpace(4*maxMsgFDs))
	first := p.accepted.Add(firstMessageTimeout)
	if least := time.Now().Add(queuedGrace); first.Before(least) {
		first = least
	}
	_ = c.SetReadDeadline(first)
	b, fds, err := readMsg(c, buf, oob)
	heard(cred.Pid, c)
	if err != nil {
		refuse(c, cred, "reading the connect message: "+err.Error())
		return
	}
	kind, body, err := decodeHeader(b)
	var q *QP
	switch {
	case err == nil && (kind != msgConnect || len(body) != secretLen):
		err = fmt.Errorf("%w: kind %d, %d bytes", errMsgFormat, kind, len(body))
	case err == nil:
		if q = claimRegistration(body, true); q == nil {
			err = errors.New("unknown secret")
		}
	}
	if err != nil {
		closeFDs(fds)
		refuse(c, cred, err.Error())
		return
	}
	// The setup holds the link (qps) until the reader runs.
	l := newLink()
	l.c, l.cred, l.qps = c, cred, 1
	l.lnRef = holdListener()
	err = l.mapPeerDoorbell(fds)
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(ctlWriteTimeout))
		err = l.sendDoorbell(c, appendHeader(nil, msgLinked))
	}
	if err != nil {
		// The secret may set up a link again, from the moment the peer
		// can learn of this refusal: a genuine peer that connects as
		// soon as the forged link is refused must find it free.
		rv.mu.Lock()
		q.rvLinked = false
		rv.mu.Unlock()
		_ = writeMsg(c, appendRefuse(0, err.Error()), nil)
		l.drop() // frees the link, closing c
		refuse(c, cred, err.Error())
		if h := testHookLinkRefused.Load(); h != nil {
			(*h)()
		}
		return
	}
	_ = c.SetDeadline(time.Time{})
	l.start()
	l.drop()
}

// acceptActive maps the active side's resources (fds: inbox, regions),
// binds q to the link, answers with this side's resources and connects q.
// It owns fds.
func (q *QP) acceptActive(l *link, x *exchange, fds []int) error {
	p, err := mapPeerSide(x, fds)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.qps++
	l.mu.Unlock()
	id, ok := l.bind(q, nil)
	if !ok {
		p.release()
		l.drop()
		return fmt.Errorf("shm: the link has %d queue pairs", maxLinkSlots)
	}
	reply, rfds, err := q.exportLocal(msgAccept, &exchange{dst: x.src, src: id})
	if err == nil {
		err = l.write(reply, rfds)
		closeFDs(rfds)
	}
	if err != nil {
		p.release()
		l.unbind(id)
		return err
	}
	return q.install(p, l, id, x.src)
}
