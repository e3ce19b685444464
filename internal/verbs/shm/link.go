//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// A link is what two processes share for all their QPs (Connection and
// trust model in the package documentation). Every message on it names a
// QP by its link id: its slot (low 16 bits, the bit it is rung by) and the
// slot's generation (high 16 bits), so a message for a closed QP does not
// reach the QP that reuses its slot.
type link struct {
	c      *net.UnixConn
	dialed bool   // this side dialed (it closes the link after its last QP: linkLinger)
	lnRef  bool   // accepted: it holds a reference to the rendezvous listener
	name   string // dialed: the peer's rendezvous name (the table key)
	pid    int32  // SO_PEERCRED of the peer, checked at setup
	uid    uint32

	own     bellPage        // rung by the peer, drained by dispatch
	efile   *os.File        // this side's eventfd, waited on by dispatch
	eraw    syscall.RawConn // efile's
	peer    bellPage        // the peer's bell page
	peerEvt int             // the peer's eventfd, or -1

	wmu sync.Mutex // serialises writes on c

	mu        sync.Mutex
	slots     []linkSlot
	free      []uint32
	qps       int  // QPs bound (attaching or connected)
	reader    bool // the reader runs
	closing   bool // no new QP may bind
	freed     bool
	attaching map[uint32]chan attachReply // active attaches waiting, by our id
	ready     chan struct{}               // dialed: closed once the first exchange finished
	readyErr  error
	// lingering: the dialed link's last QP has gone and the link holds
	// itself (one count of qps) until lingerGen's timer ends it or a new
	// QP takes the hold over (getLink).
	lingering bool
	lingerGen uint64
	dispWG    sync.WaitGroup // the dispatcher, once started

	wakeups atomic.Uint64 // wake-ups of the dispatcher by an eventfd edge
}

type linkSlot struct {
	gen uint16
	q   *QP
}

// attachReply is the peer's answer to an attach: an accept (x and its fds)
// or a refusal (x nil).
type attachReply struct {
	x   *exchange
	fds []int
	err error
}

// The links this process dialed, by the peer's rendezvous name.
var links struct {
	mu     sync.Mutex
	byName map[string]*link
}

func linkID(slot uint32, gen uint16) uint32 { return uint32(gen)<<16 | slot }

// bind gives q a slot; it fails once the link is closing or full.
func (l *link) bind(q *QP, wait chan attachReply) (uint32, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing {
		return 0, false
	}
	var s uint32
	switch {
	case len(l.free) > 0:
		s = l.free[len(l.free)-1]
		l.free = l.free[:len(l.free)-1]
	case len(l.slots) < maxLinkSlots:
		s = uint32(len(l.slots))
		l.slots = append(l.slots, linkSlot{})
	default:
		return 0, false
	}
	l.slots[s].q = q
	id := linkID(s, l.slots[s].gen)
	if wait != nil {
		if l.attaching == nil {
			l.attaching = map[uint32]chan attachReply{}
		}
		l.attaching[id] = wait
	}
	return id, true
}

// lookup returns the QP with link id id, if it is still bound.
func (l *link) lookup(id uint32) *QP {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := id & 0xffff
	if int(s) >= len(l.slots) || l.slots[s].gen != uint16(id>>16) {
		return nil
	}
	return l.slots[s].q
}

// unbind frees id's slot and drops the QP's hold on the link.
func (l *link) unbind(id uint32) {
	l.mu.Lock()
	s := id & 0xffff
	if int(s) < len(l.slots) && l.slots[s].gen == uint16(id>>16) && l.slots[s].q != nil {
		l.slots[s].q = nil
		l.slots[s].gen++
		l.free = append(l.free, s)
	}
	delete(l.attaching, id)
	l.dropUnlock()
}

// drop releases a hold taken by getLink: the dialing side lingers or
// closes with its last QP; the last of the QPs and the reader frees it.
func (l *link) drop() {
	l.mu.Lock()
	l.dropUnlock()
}

// dropUnlock is drop for a caller holding mu; it unlocks mu.
func (l *link) dropUnlock() {
	l.qps--
	if linger := time.Duration(linkLinger.Load()); l.qps == 0 && l.dialed && !l.closing && l.reader && linger > 0 {
		// The last QP has gone: keep the link for the next (linkLinger).
		l.qps, l.lingering = 1, true
		l.lingerGen++
		gen := l.lingerGen
		time.AfterFunc(linger, func() { l.endLinger(gen) })
		l.mu.Unlock()
		return
	}
	if l.qps == 0 && l.dialed {
		l.closeLocked()
	}
	free := l.qps == 0 && !l.reader && !l.freed
	l.freed = l.freed || free
	closing := l.closing
	l.mu.Unlock()
	if closing {
		l.forget()
	}
	if free {
		l.release()
	}
}

// linkLinger is how long a dialed link outlives its last QP, for a QP to
// the same peer process to attach to it instead of setting up a new one
// (BENCHMARKS.md). Meanwhile the link costs each side three descriptors
// (the Unix socket, both eventfds) and two parked goroutines.
var linkLinger atomic.Int64 // a time.Duration

func init() { linkLinger.Store(int64(time.Second)) }

// endLinger ends the linger gen of l, unless a QP has taken it over (or a
// later linger replaced it).
func (l *link) endLinger(gen uint64) {
	l.mu.Lock()
	if !l.lingering || l.lingerGen != gen {
		l.mu.Unlock()
		return
	}
	l.endLingerUnlock()
}

// endLingerUnlock ends l's linger: it closes the link and drops the hold
// the linger took. It unlocks mu.
func (l *link) endLingerUnlock() {
	l.lingering = false
	l.closeLocked()
	l.dropUnlock()
}

// EndIdleLinks ends every lingering link of this process now, rather than
// after linkLinger: for tests and tools that count descriptors and links.
func EndIdleLinks() {
	links.mu.Lock()
	var all []*link
	for _, l := range links.byName {
		all = append(all, l)
	}
	links.mu.Unlock()
	for _, l := range all {
		l.mu.Lock()
		if !l.lingering {
			l.mu.Unlock()
			continue
		}
		l.endLingerUnlock() // its timer then finds it not lingering
	}
}

// closeLocked stops new binds and closes the connection (the reader ends).
// The caller then calls forget, without mu (links.mu comes before a
// link's mu).
func (l *link) closeLocked() {
	l.closing = true
	if l.c != nil {
		_ = l.c.Close()
	}
}

// forget removes a closing dialed link from the table.
func (l *link) forget() {
	if !l.dialed {
		return
	}
	links.mu.Lock()
	if links.byName[l.name] == l {
		delete(links.byName, l.name)
	}
	links.mu.Unlock()
}

// liveLinks counts the links not yet released (tests wait for it).
var liveLinks atomic.Int64

func newLink() *link {
	liveLinks.Add(1)
	return &link{peerEvt: -1}
}

// release frees the link's resources; nothing uses them any more.
func (l *link) release() {
	defer liveLinks.Add(-1)
	if l.c != nil {
		_ = l.c.Close()
	}
	if l.efile != nil {
		_ = l.efile.Close() // dispatch returns
	}
	l.dispWG.Wait()
	l.own.release()
	l.peer.release()
	closeFD(l.peerEvt)
	l.peerEvt = -1
	if l.lnRef {
		releaseListener()
	}
}

// start runs the reader and the dispatcher of an established link.
func (l *link) start() {
	l.mu.Lock()
	l.reader = true
	l.mu.Unlock()
	l.dispWG.Add(1)
	go l.dispatch()
	go l.readLoop()
}

// dispatch waits for edges of the link's eventfd in the Go netpoller and,
// each time it wakes, drains the bell page and fires the CQ of every QP
// rung (Sleeping in the package documentation). It returns when the
// eventfd is closed (release).
func (l *link) dispatch() {
	defer l.dispWG.Done()
	woke := false
	_ = l.eraw.Read(func(uintptr) bool {
		if woke {
			l.wakeups.Add(1)
		}
		woke = true
		l.mu.Lock()
		l.own.drain(func(slot uint32) {
			if int(slot) < len(l.slots) {
				if q := l.slots[slot].q; q != nil && q.cq != nil {
					q.cq.fire(true) // the producer rang only as the inbox asked
				}
			}
		})
		l.mu.Unlock()
		return false // park until the next edge
	})
}

// readLoop serves the connection until it fails or is closed; then every
// QP on the link learns that its peer is gone.
func (l *link) readLoop() {
	buf := make([]byte, maxMsgLen)
	oob := make([]byte, unix.CmsgSpace(4*maxMsgFDs))
	for {
		b, fds, err := readMsg(l.c, buf, oob)
		if err != nil {
			break
		}
		if !l.handle(b, fds) {
			break // a protocol violation: the link is unusable
		}
	}
	l.mu.Lock()
	l.closeLocked()
	l.reader = false
	if l.lingering { // the peer went first: the hold goes now
		l.lingering = false
		l.qps--
	}
	var gone []*QP
	for _, s := range l.slots {
		if s.q != nil {
			gone = append(gone, s.q)
		}
	}
	waiting := l.attaching
	l.attaching = nil
	free := l.qps == 0 && !l.freed
	l.freed = l.freed || free
	l.mu.Unlock()
	l.forget()
	for _, q := range gone {
		q.peerGone.Store(true)
	}
	for _, w := range waiting {
		w <- attachReply{err: errors.New("the rendezvous connection ended")}
	}
	if free {
		l.release()
	}
}

// handle serves one message; false means the peer broke the protocol
// (the message's fds are closed then).
func (l *link) handle(b []byte, fds []int) bool {
	kind, body, err := decodeHeader(b)
	switch {
	case err != nil:
	case kind == msgAttach && !l.dialed:
		return l.serveAttach(body, fds)
	case kind == msgAccept && l.dialed:
		if x, err := decodeExchange(kind, body); err == nil {
			l.deliverAttach(x.dst, attachReply{x: x, fds: fds})
			return true
		}
	case len(body) < 4 || len(fds) > 0:
	case kind == msgRefuse && l.dialed && len(body) <= 4+maxRefusal:
		l.deliverAttach(binary.LittleEndian.Uint32(body), attachReply{err: refusal(body[4:])})
		return true
	case kind == msgGone && len(body) == 4:
		if q := l.lookup(binary.LittleEndian.Uint32(body)); q != nil {
			q.peerGone.Store(true)
		}
		return true
	}
	closeFDs(fds)
	return false
}

// deliverAttach hands an attach's answer to the QP waiting for it. If none
// waits any more, the fds are closed and an accepted peer QP is told that
// its partner is gone.
func (l *link) deliverAttach(id uint32, r attachReply) {
	l.mu.Lock()
	w := l.attaching[id]
	delete(l.attaching, id)
	l.mu.Unlock()
	if w != nil {
		w <- r
		return
	}
	closeFDs(r.fds)
	if r.x != nil {
		_ = l.write(appendID(appendHeader(nil, msgGone), r.x.src), nil)
	}
}

// serveAttach runs the passive side of an attach on an established link:
// the peer proves it knows the secret of a registered QP (one use, compared
// in constant time); a wrong secret or a bad exchange is refused without
// touching the link.
func (l *link) serveAttach(body []byte, fds []int) bool {
	x, err := decodeExchange(msgAttach, body)
	if err != nil {
		closeFDs(fds)
		return false
	}
	refuseAttach := func(why string) {
		rv.refused.Add(1)
		rv.mu.Lock()
		rv.lastRefusal = fmt.Sprintf("%s (peer pid %d, uid %d)", why, l.pid, l.uid)
		rv.mu.Unlock()
		_ = l.write(appendRefuse(x.src, why), nil)
	}
	q := claimRegistration(x.secret[:], false)
	if q == nil {
		closeFDs(fds)
		refuseAttach("unknown secret")
		return true
	}
	if err := q.acceptActive(l, x, fds); err != nil {
		refuseAttach(err.Error())
		q.setEstablished(verbs.PeerFault("shm: exchange with the active side", err))
		return true
	}
	rv.accepted.Add(1)
	q.setEstablished(nil)
	return true
}

// ctlWriteTimeout bounds a write on the link (the peer reads at once).
const ctlWriteTimeout = time.Second

// write sends a message with fds attached (the caller keeps them).
func (l *link) write(b []byte, fds []int) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_ = l.c.SetWriteDeadline(time.Now().Add(ctlWriteTimeout))
	return writeMsg(l.c, b, fds)
}

// getLink returns the established link to the peer process of info, with
// q bound to it (id) and wait registered for the answer to its attach. If
// there is none, q sets one up; other QPs to that peer wait for it.
func getLink(ctx context.Context, q *QP, info *peerInfo, wait chan attachReply) (*link, uint32, error) {
	for {
		links.mu.Lock()
		if links.byName == nil {
			links.byName = map[string]*link{}
		}
		l := links.byName[info.name]
		if l != nil {
			l.mu.Lock()
			switch {
			case l.closing:
				l.mu.Unlock()
				l = nil
			case l.lingering:
				l.lingering = false // q takes over the link's own hold
				l.mu.Unlock()
			default:
				l.qps++
				l.mu.Unlock()
			}
		}
		var err error
		if l == nil {
			l = newLink()
			l.dialed, l.name, l.ready, l.qps = true, info.name, make(chan struct{}), 1
			links.byName[info.name] = l
			links.mu.Unlock()
			err = l.setup(ctx, info)
			l.finishSetup(err)
		} else {
			links.mu.Unlock()
			select {
			case <-l.ready:
			case <-ctx.Done():
				err = context.Cause(ctx)
			case <-q.closing:
				err = errQPClosing
			}
		}
		if err == nil && l.readyErr == nil {
			if id, ok := l.bind(q, wait); ok {
				return l, id, nil
			}
		}
		l.drop()
		if err != nil {
			return nil, 0, err
		}
		// That link failed or is closing: try a new one.
	}
}

var errQPClosing = errors.New("shm: queue pair closed")

// finishSetup records the outcome of a dialed link's setup.
func (l *link) finishSetup(err error) {
	l.mu.Lock()
	l.readyErr = err
	if err != nil {
		l.closeLocked()
	}
	l.mu.Unlock()
	if err != nil {
		l.forget()
	}
	close(l.ready)
}

// sendDoorbell makes this side's eventfd and bell page for the link,
// sends msg on c with both attached (the eventfd, then the bell page), then
// closes the bell page's memfd (the peer has it) and wraps the eventfd for
// the Go netpoller. What it made stays with l (release) on every path.
func (l *link) sendDoorbell(c *net.UnixConn, msg []byte) error {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("shm: eventfd: %w", err)
	}
	l.efile = os.NewFile(uintptr(efd), "rsock-shm-link")
	bfd, own, err := newBell()
	if err != nil {
		return err
	}
	l.own = own
	err = writeMsg(c, msg, []int{efd, bfd})
	_ = unix.Close(bfd)
	if err != nil {
		return verbs.PeerFault("shm: sending to the peer's rendezvous", err)
	}
	l.eraw, err = l.efile.SyscallConn()
	return err
}

// mapPeerDoorbell validates and maps the peer's eventfd and bell page,
// fds; it takes ownership of them on success and failure.
func (l *link) mapPeerDoorbell(fds []int) error {
	if len(fds) != 2 {
		closeFDs(fds)
		return fmt.Errorf("shm: %d file descriptors, want an eventfd and a bell page", len(fds))
	}
	b, err := mapPeerBell(fds[1])
	_ = unix.Close(fds[1])
	if err == nil {
		err = checkEventfd(fds[0])
	}
	if err != nil {
		b.release()
		_ = unix.Close(fds[0])
		return err
	}
	l.peer, l.peerEvt = b, fds[0]
	return nil
}
