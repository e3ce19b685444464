//go:build linux

package shm

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The active side of an exchange, and what both sides send and map.

// connectActive runs the active side: it attaches q to the link to the
// peer's process, setting up that link if there is none.
func (q *QP) connectActive(ctx context.Context, info *peerInfo) (err error) {
	if info.name == "" {
		return fmt.Errorf("%w: shm: peer has no rendezvous listener", verbs.ErrPeerInfo)
	}
	q.cmu.Lock()
	if q.isClosing {
		q.cmu.Unlock()
		return verbs.ErrClosed
	}
	if !q.state.CompareAndSwap(stateInit, stateConnecting) {
		q.cmu.Unlock()
		return fmt.Errorf("%w: shm: Connect on a queue pair already connected or in the error state", verbs.ErrQPState)
	}
	q.cmu.Unlock()
	defer func() {
		if err == nil {
			return
		}
		q.cmu.Lock()
		closing := q.isClosing
		q.state.CompareAndSwap(stateConnecting, stateInit)
		q.cmu.Unlock()
		switch {
		case closing:
			err = verbs.ErrClosed
		case ctx.Err() != nil:
			err = fmt.Errorf("shm: exchange with the peer: %w", context.Cause(ctx))
		}
	}()
	// xctx also ends when q closes, which aborts the exchange.
	xctx, cancel := context.WithTimeout(ctx, rendezvousTimeout)
	defer cancel()
	go func() {
		select {
		case <-q.closing:
			cancel()
		case <-xctx.Done():
		}
	}()
	wait := make(chan attachReply, 1)
	l, id, err := getLink(xctx, q, info, wait)
	if err != nil {
		return err
	}
	return q.attach(xctx, l, id, info, wait)
}

// attach runs the active side of an exchange on an established link.
func (q *QP) attach(ctx context.Context, l *link, id uint32, info *peerInfo, wait chan attachReply) error {
	msg, fds, err := q.exportLocal(msgAttach, &exchange{secret: info.secret, src: id})
	if err == nil {
		err = l.write(msg, fds)
		closeFDs(fds)
	}
	if err != nil {
		l.unbind(id)
		return verbs.PeerFault("shm: sending to the peer", err)
	}
	var r attachReply
	select {
	case r = <-wait:
	case <-ctx.Done():
	case <-q.closing:
	}
	if r.x == nil && r.err == nil { // gave up: an answer may still come
		l.mu.Lock()
		delete(l.attaching, id)
		l.mu.Unlock()
		select {
		case r = <-wait:
			l.deliverAttach(id, r) // to nobody: it closes the fds, tells an accepted peer QP
		default:
		}
		l.unbind(id)
		return errQPClosing
	}
	if r.err != nil {
		l.unbind(id)
		return fmt.Errorf("%w: shm: %v", verbs.ErrPeerInfo, r.err)
	}
	p, err := mapPeerSide(r.x, r.fds)
	if err != nil {
		_ = l.write(appendID(appendHeader(nil, msgGone), r.x.src), nil)
		l.unbind(id)
		return verbs.PeerFault("shm: mapping the peer's regions", err)
	}
	return q.install(p, l, id, r.x.src)
}

// setup dials the peer's rendezvous, proves the secret of info's QP in a
// new link's first exchange, trades the doorbells and starts the link.
func (l *link) setup(ctx context.Context, info *peerInfo) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unixpacket", info.name)
	if err != nil {
		return verbs.PeerFault("shm: dialing the peer's rendezvous", err)
	}
	c := conn.(*net.UnixConn)
	l.mu.Lock()
	l.c = c
	l.mu.Unlock()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	stopCtx := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stopCtx()

	cred, err := peerCred(c)
	if err != nil {
		return err
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: shm: the peer's rendezvous runs as uid %d (pid %d)", verbs.ErrPeerInfo, cred.Uid, cred.Pid)
	}
	l.cred = cred
	if err := l.sendDoorbell(c, append(appendHeader(nil, msgConnect), info.secret[:]...)); err != nil {
		return err
	}
	buf := make([]byte, maxMsgLen)
	oob := make([]byte, unix.CmsgSpace(4*maxMsgFDs))
	b, rfds, err := readMsg(c, buf, oob)
	if err == nil {
		err = decodeLinked(b)
		if err == nil {
			err = l.mapPeerDoorbell(rfds)
		} else {
			closeFDs(rfds)
		}
	}
	if !stopCtx() { // ctx ended: the deadline may already be in the past
		return context.Cause(ctx)
	}
	if err != nil {
		return verbs.PeerFault("shm: link to the peer's rendezvous", err)
	}
	_ = c.SetDeadline(time.Time{})
	l.start()
	return nil
}

// exportLocal builds this side's attach or accept message (x gives the
// secret and ids) and its fds: duplicates of the inbox memfd and of up to
// maxExportMRs remote-writable regions' memfds. The caller closes the fds.
func (q *QP) exportLocal(kind byte, x *exchange) ([]byte, []int, error) {
	x.inboxCap = q.in.cap
	q.cmu.Lock()
	inFD := -1
	var err error
	if q.isClosing || q.inFD < 0 {
		err = verbs.ErrClosed
	} else if inFD, err = unix.FcntlInt(uintptr(q.inFD), unix.F_DUPFD_CLOEXEC, 0); err != nil {
		err = fmt.Errorf("shm: dup inbox: %w", err)
	}
	q.cmu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	fds, mrs := q.dev.exportFDs([]int{inFD}, maxExportMRs)
	x.mrs = mrs
	return encodeExchange(kind, x), fds, nil
}

// mapPeerSide validates and maps what the peer sent for a QP: fds are its
// inbox and one memfd per region record, in that order. It closes every fd
// on every path.
func mapPeerSide(x *exchange, fds []int) (_ *peerSide, err error) {
	p := &peerSide{mrs: make(map[uint32]*peerMR, len(x.mrs))}
	defer func() {
		closeFDs(fds)
		if err != nil {
			p.release()
		}
	}()
	if len(fds) != 1+len(x.mrs) {
		return nil, fmt.Errorf("shm: %d file descriptors for %d regions", len(fds), len(x.mrs))
	}
	if p.in, err = mapPeerInbox(fds[0], x.inboxCap); err != nil {
		return nil, err
	}
	for i, r := range x.mrs {
		if _, dup := p.mrs[r.rkey]; dup {
			return nil, fmt.Errorf("shm: a peer region sent twice")
		}
		m, err := mapPeerMR(fds[1+i], r)
		if err != nil {
			return nil, err
		}
		p.mrs[r.rkey] = m
	}
	return p, nil
}
