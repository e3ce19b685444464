//go:build cgo && linux

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Queue pair settings (IB spec encodings). The retry limits are finite:
// a peer that stops answering fails the connection, never hangs it.
const (
	// defaultAckTimeout is the local ACK timeout, 4.096 us << 17 = 537
	// ms, as production RDMA stacks use (UCX and NCCL: 2^18; 2^14 proved
	// too short on congested fabrics). With defaultRetries retries a dead
	// path fails in about 3.8 s; rsock's bootstrap connection usually
	// notices a dead peer sooner (OpenOptions.AckTimeout, RetryCount).
	defaultAckTimeout = 17
	// defaultRetries is 6, the field's largest finite value: Soft-RoCE
	// (rxe) treats 7 as "retry forever", as the spec does only for the
	// RNR retry.
	defaultRetries = 6
	// rnrRetry 6 (7 would mean "forever") with minRNRTimer 12 (0.64 ms)
	// between tries. The ring protocol never sends without a posted RECV,
	// so RNR means a broken peer.
	rnrRetry    = 6
	minRNRTimer = 12
)

// ackTimeoutCode encodes d as the QP's local ACK timeout, 4.096 us << n,
// rounded up; 0 gives the default. It fails past the largest, 2^31 (2.4
// hours).
func ackTimeoutCode(d time.Duration) (uint8, error) {
	if d <= 0 {
		return defaultAckTimeout, nil
	}
	for n := uint8(1); n <= 31; n++ {
		if d <= 4096*time.Nanosecond<<n {
			return n, nil
		}
	}
	return 0, fmt.Errorf("ibverbs: ACK timeout %v is longer than the largest, %v", d, 4096*time.Nanosecond<<31)
}

// QP state.
const (
	qpInit int32 = iota
	qpConnected
	qpClosed
)

// sendRec is what the QP remembers of a posted send until it completes.
type sendRec struct {
	id uint64
	op verbs.Opcode
}

// QP is a reliable-connected queue pair. It implements verbs.QP.
//
// The device's work request IDs are the QP's own sequence numbers (receive
// ones with the top bit set); the caller's ID and opcode are kept in a ring
// per queue and restored when the completion is polled, so a failed
// completion still says what it was. The same records enforce the queue
// depths the caller asked for (verbs.ErrQueueFull).
type QP struct {
	dev   *Device
	cq    *CQ
	qp    *C.struct_rs_qp
	qpn   uint32
	psn   uint32
	state atomic.Int32

	inline    int    // granted by the device
	inlBuf    []byte // staging for inline data handed to the device, inline bytes per request of a post (under smu)
	maxInline int    // what MaxInline reports: requested, met by bounce if need be
	bounce    *MR    // slot per send WQE for inline data the device won't take
	slot      int    // bounce slot size

	smu    sync.Mutex
	sends  []sendRec
	post   [C.RS_MAX_CHAIN]C.struct_rs_post // the requests of one post (under smu)
	sqHead uint64                           // posted (under smu)
	sqTail atomic.Uint64                    // retired (by Poll)
	// doorbells counts the ibv_post_send calls (under smu).
	doorbells uint64

	rmu    sync.Mutex
	recvs  []uint64
	rqHead uint64
	rqTail atomic.Uint64

	asyncErr atomic.Pointer[string]
	// portErr is set (by why) when a failure found the port down;
	// portAsked once why has asked.
	portErr   atomic.Pointer[string]
	portAsked atomic.Bool

	// Connected through rdma_cm (cm.go): viaCM, the QP's connection
	// manager state (set by Connect), and on the passive side the
	// listener port for Info.
	viaCM  bool
	cm     *cmConn
	cmPort uint16

	// sl is the service level given to the device at RTR (the configured
	// one, or through rdma_cm the path's). Tests read it: Soft-RoCE does
	// not keep an SL, so ibv_query_qp cannot tell.
	sl uint8
}

// NewQP creates an RC queue pair in the INIT state: receives can be posted
// at once, sends after Connect. Depths beyond the device's max_qp_wr are
// refused, not shrunk (devLimits says why). A device that refuses the
// inline size asked for is asked again for none (inline data then goes
// through registered bounce slots); if that fails too, the error names
// the first request's capabilities and errno, and the retry's.
func (d *Device) NewQP(attr verbs.QPAttr) (verbs.QP, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	cq, ok := attr.CQ.(*CQ)
	if !ok || cq == nil || cq.dev.dc != d.dc {
		return nil, errForeign
	}
	if cq.closed.Load() {
		return nil, verbs.ErrClosed
	}
	if attr.SendDepth <= 0 || attr.RecvDepth <= 0 || attr.MaxInline < 0 {
		return nil, fmt.Errorf("ibverbs: QP depths %d/%d, inline %d", attr.SendDepth, attr.RecvDepth, attr.MaxInline)
	}
	if err := d.dc.limits.checkQP(d.t.dev, attr.SendDepth, attr.RecvDepth); err != nil {
		return nil, err
	}
	q, err := d.createQP(cq, attr)
	if err != nil {
		return nil, err // not a nil *QP in the interface
	}
	return q, nil
}

// createQP is NewQP once the request is checked: it asks the device.
func (d *Device) createQP(cq *CQ, attr verbs.QPAttr) (*QP, error) {
	cap := C.struct_rs_qp_cap{
		max_send_wr:     C.uint32_t(attr.SendDepth),
		max_recv_wr:     C.uint32_t(attr.RecvDepth),
		max_send_sge:    1,
		max_recv_sge:    1,
		max_inline_data: C.uint32_t(attr.MaxInline),
	}
	if err := d.addLive(); err != nil { // until destroy
		return nil, err
	}
	var e C.int
	qpp := C.rs_create_qp(d.pd, cq.cq, &cap, &e)
	if qpp == nil && outOfMemory(e) {
		DrainPools() // pooled regions count against RLIMIT_MEMLOCK
		qpp = C.rs_create_qp(d.pd, cq.cq, &cap, &e)
	}
	first, retried := e, false
	if qpp == nil && attr.MaxInline > 0 {
		// Some devices refuse any inline size they cannot do: ask for
		// none and carry inline data through registered bounce slots.
		// If this works, the refusal was the inline size: nothing is
		// wrong.
		cap.max_inline_data = 0
		qpp = C.rs_create_qp(d.pd, cq.cq, &cap, &e)
		retried = true
	}
	if qpp == nil {
		d.dropQP()
		return nil, qpRefused(d.t.dev, qpCaps{attr.SendDepth, attr.RecvDepth, attr.MaxInline}, syscall.Errno(first), retried, syscall.Errno(e))
	}
	q := &QP{
		dev: d, cq: cq, qp: qpp, qpn: uint32(qpp.qp_num), psn: rand.Uint32N(1 << 24),
		inline: int(cap.max_inline_data), maxInline: attr.MaxInline,
		sends: make([]sendRec, attr.SendDepth), recvs: make([]uint64, attr.RecvDepth),
		viaCM: d.t.cm,
	}
	q.maxInline = max(q.maxInline, q.inline)
	if q.inline > 0 {
		q.inlBuf = make([]byte, q.inline*len(q.post))
	}
	if q.inline < attr.MaxInline {
		q.slot = (attr.MaxInline + 63) &^ 63
		m, err := d.AllocMR(q.slot*attr.SendDepth, verbs.AccessLocalWrite)
		if err != nil {
			if C.rs_destroy_qp(qpp) == 0 {
				d.dropQP()
			}
			return nil, fmt.Errorf("ibverbs: inline bounce buffer: %w", err)
		}
		q.bounce = m.(*MR)
	}
	if e := C.rs_qp_init(qpp, C.uint8_t(d.t.port), C.RS_ACCESS_LOCAL_WRITE|C.RS_ACCESS_REMOTE_WRITE); e != 0 {
		q.destroy()
		return nil, errnoErr("QP to INIT", e)
	}
	d.dc.mu.Lock()
	d.dc.qps[qpp] = q
	d.dc.mu.Unlock()
	cq.attach(q)
	return q, nil
}

// Info describes this end: QP number, PSN, GID, LID and MTU.
// Connected through rdma_cm (iWARP, or OpenOptions.ConnectionManager),
// it carries, on the passive side once Connect has returned, the listener
// port and the ticket the active side must connect with (cm.go).
func (q *QP) Info() []byte {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.viaCM {
		in := info{cm: true}
		if q.cm != nil && q.cm.ticket != nil {
			in.port, in.ticket, in.secret = q.cmPort, q.cm.ticket.num, q.cm.ticket.secret
		}
		return in.marshal()
	}
	in := info{mtu: q.dev.mtu, lid: q.dev.lid, qpn: q.qpn, psn: q.psn, gid: q.dev.gid}
	return in.marshal()
}

// Connect takes the QP through RTR to RTS towards the peer. The path MTU
// is the smaller of the two ports' active MTUs.
func (q *QP) Connect(ctx context.Context, peer []byte, active bool) error {
	in, err := parseInfo(peer)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	switch q.state.Load() {
	case qpClosed:
		return verbs.ErrClosed
	case qpConnected:
		return fmt.Errorf("%w: already connected", verbs.ErrQPState)
	}
	d := q.dev
	switch {
	case d.t.iwarp && !in.cm:
		return fmt.Errorf("%w: %s is iWARP, and the peer does not connect through rdma_cm", verbs.ErrPeerInfo, d.t.dev)
	case !active && !d.t.iwarp:
		q.viaCM = in.cm // the passive side follows the active side's choice
	case q.viaCM != in.cm:
		return fmt.Errorf("%w: the peer answered rdma_cm %v to rdma_cm %v", verbs.ErrPeerInfo, in.cm, q.viaCM)
	}
	if q.viaCM {
		return q.connectCM(ctx, in, active)
	}
	if d.t.roce && in.gid == [16]byte{} {
		return fmt.Errorf("%w: RoCE peer without a GID", verbs.ErrPeerInfo)
	}
	if !d.t.roce && in.lid == 0 {
		return fmt.Errorf("%w: InfiniBand peer without a LID", verbs.ErrPeerInfo)
	}
	global := C.int(0)
	if d.t.roce {
		global = 1
	}
	q.sl = uint8(max(d.sl, 0))
	mtu := min(d.mtu, in.mtu)
	if e := C.rs_qp_rtr(q.qp, C.uint8_t(d.t.port), C.uint32_t(mtu), C.uint32_t(in.qpn), C.uint32_t(in.psn),
		(*C.uint8_t)(unsafe.Pointer(&in.gid[0])), global, C.uint8_t(d.t.gidIndex), C.uint16_t(in.lid), minRNRTimer,
		C.uint8_t(d.tclass), C.uint8_t(q.sl)); e != 0 {
		return fmt.Errorf("%w: QP to RTR (peer QPN %#x, MTU %d): %v", verbs.ErrPeerInfo, in.qpn, mtuBytes(mtu), syscall.Errno(e))
	}
	if e := C.rs_qp_rts(q.qp, C.uint32_t(q.psn), C.uint8_t(d.ackTimeout), C.uint8_t(d.retries), rnrRetry); e != 0 {
		return errnoErr("QP to RTS", e)
	}
	q.state.Store(qpConnected)
	return nil
}

// connectCM connects through the connection manager (cm.go). The
// passive side files its ticket and returns; Established waits for the
// active side's connect request.
func (q *QP) connectCM(ctx context.Context, in info, active bool) error {
	s, err := cmLoad()
	if err != nil {
		return err
	}
	if q.cm != nil {
		return fmt.Errorf("%w: already connecting", verbs.ErrQPState)
	}
	if !active {
		if q.cm, q.cmPort, err = s.listenFor(q); err != nil {
			q.cm = nil
			return err
		}
		return nil
	}
	if in.port == 0 {
		return fmt.Errorf("%w: the passive side sent no rdma_cm listener port", verbs.ErrPeerInfo)
	}
	t := cmTicket{num: in.ticket, secret: in.secret}
	if q.cm, err = s.connect(ctx, q, in.port, t.pdata()); err != nil {
		return err
	}
	q.state.Store(qpConnected)
	return nil
}

// WriteCompletesLocally reports whether a WRITE's completion says only that
// it left this side (iWARP: RDMAP does not acknowledge WRITEs), so that a
// WRITE the peer refuses may complete successfully; the peer then ends
// the connection and the QP moves to the error state.
func (q *QP) WriteCompletesLocally() bool { return q.dev.t.iwarp }

// Established waits, on the passive side of an rdma_cm device, until the
// active side's connect request was accepted and the connection is up.
// Devices connected without the connection manager have nothing to wait
// for.
func (q *QP) Established(ctx context.Context) error {
	q.smu.Lock()
	c := q.cm
	q.smu.Unlock()
	if c == nil || c.ticket == nil {
		return nil
	}
	if err := c.await(ctx, C.RS_CM_ESTABLISHED, "accept"); err != nil {
		return err
	}
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.state.Load() == qpClosed {
		return verbs.ErrClosed
	}
	q.state.Store(qpConnected)
	return nil
}

// MaxInline is the largest SendWR.Inline accepted.
func (q *QP) MaxInline() int { return q.maxInline }

// PostSend posts wr and the requests chained to it: up to RS_MAX_CHAIN of
// them with one ibv_post_send, that is one cgo call, one provider lock and
// one doorbell. Each is checked before any of its post goes to the device.
func (q *QP) PostSend(wr *verbs.SendWR) error {
	q.smu.Lock()
	defer q.smu.Unlock()
	switch q.state.Load() {
	case qpClosed:
		return verbs.ErrClosed
	case qpInit:
		return verbs.ErrQPState
	}
	if q.isDead() {
		// The QP is in the error state. Refused here, because some
		// devices (soft-iWARP) take a post in that state and never
		// complete it.
		return fmt.Errorf("%w (%s)", verbs.ErrQPState, q.why())
	}
	for wr != nil {
		n := 0
		for ; wr != nil && n < len(q.post); wr, n = wr.Next, n+1 {
			if err := q.prepareLocked(wr, n); err != nil {
				return err
			}
		}
		var posted C.int
		e := C.rs_post_sends(q.qp, &q.post[0], C.int(n), q.inlPtr(), &posted)
		q.sqHead += uint64(posted)
		q.doorbells++
		if e != 0 {
			return q.postErr("post send", e)
		}
	}
	return nil
}

// prepareLocked checks wr and fills q.post[i] with it, as the request
// after the i before it in this post; smu is held.
func (q *QP) prepareLocked(wr *verbs.SendWR, i int) error {
	p := &q.post[i]
	*p = C.struct_rs_post{}
	switch wr.Op {
	case verbs.OpWrite:
		p.opcode = C.RS_WR_RDMA_WRITE
	case verbs.OpSend:
		p.opcode = C.RS_WR_SEND
	default:
		return fmt.Errorf("ibverbs: send opcode %v", wr.Op)
	}
	seq := q.sqHead + uint64(i)
	if seq-q.sqTail.Load() >= uint64(len(q.sends)) {
		return verbs.ErrQueueFull
	}
	if wr.Signaled {
		p.flags |= C.RS_SEND_SIGNALED
	}
	if wr.Solicited {
		p.flags |= C.RS_SEND_SOLICITED
	}
	switch n := len(wr.Inline); {
	case wr.Inline == nil:
		addr, lkey, err := q.dev.sge(wr.Local)
		if err != nil {
			return err
		}
		p.laddr, p.lkey, p.len = C.uint64_t(addr), C.uint32_t(lkey), C.uint32_t(wr.Local.Length)
	case n > q.maxInline:
		return verbs.ErrInlineTooLong
	case n == 0:
	case n <= q.inline:
		// Copied into the QP's own pointer-free buffer: the caller's
		// bytes may sit in a struct holding Go pointers, which cgo
		// must not be handed.
		p.flags |= C.RS_SEND_INLINE
		p.inl_off = C.uint32_t(i * q.inline)
		p.len = C.uint32_t(copy(q.inlBuf[i*q.inline:], wr.Inline))
	default:
		off := int(seq%uint64(len(q.sends))) * q.slot
		copy(q.bounce.buf[off:], wr.Inline)
		p.laddr, p.lkey, p.len = C.uint64_t(q.bounce.Addr()+uint64(off)), C.uint32_t(q.bounce.lkey), C.uint32_t(n)
	}
	p.wr_id = C.uint64_t(seq)
	p.raddr, p.rkey = C.uint64_t(wr.RemoteAddr), C.uint32_t(wr.RKey)
	q.sends[seq%uint64(len(q.sends))] = sendRec{id: wr.ID, op: wr.Op}
	return nil
}

// Doorbells is the number of ibv_post_send calls made for q: one per
// PostSend of a chain of up to RS_MAX_CHAIN requests.
func (q *QP) Doorbells() uint64 {
	q.smu.Lock()
	defer q.smu.Unlock()
	return q.doorbells
}

// qpAttrs are the attributes rsock sets on a QP, as the device reports
// them (ibv_query_qp).
type qpAttrs struct {
	State, Access, PKeyIndex, Port   int
	Global                           bool
	TrafficClass                     int
	SL                               int // what rsock gave at RTR (QP.sl)
	Timeout, RetryCount, RNRRetry    int
	MaxReadAtomic, MaxDestReadAtomic int
}

// attrs asks the device for q's attributes.
func (q *QP) attrs() (qpAttrs, error) {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.state.Load() == qpClosed {
		return qpAttrs{}, verbs.ErrClosed
	}
	var a C.struct_rs_qp_attr
	if e := C.rs_query_qp(q.qp, &a); e != 0 {
		return qpAttrs{}, fmt.Errorf("ibverbs: query QP: %v", syscall.Errno(e))
	}
	return qpAttrs{State: int(a.qp_state), Access: int(a.qp_access_flags), PKeyIndex: int(a.pkey_index), Port: int(a.port_num),
		Global: a.ah_attr.is_global != 0, TrafficClass: int(a.ah_attr.grh.traffic_class), SL: int(q.sl),
		Timeout: int(a.timeout), RetryCount: int(a.retry_cnt), RNRRetry: int(a.rnr_retry),
		MaxReadAtomic: int(a.max_rd_atomic), MaxDestReadAtomic: int(a.max_dest_rd_atomic)}, nil
}

// inlPtr is the inline staging buffer for rs_post_sends, or nil.
func (q *QP) inlPtr() *C.uint8_t {
	if len(q.inlBuf) == 0 {
		return nil
	}
	return (*C.uint8_t)(unsafe.Pointer(&q.inlBuf[0]))
}

// PostRecv posts one receive buffer.
func (q *QP) PostRecv(wr *verbs.RecvWR) error {
	laddr, lkey, err := q.dev.sge(wr.Local)
	if err != nil {
		return err
	}
	q.rmu.Lock()
	defer q.rmu.Unlock()
	if q.state.Load() == qpClosed {
		return verbs.ErrClosed
	}
	if q.isDead() {
		return fmt.Errorf("%w (%s)", verbs.ErrQPState, q.why())
	}
	seq := q.rqHead
	if seq-q.rqTail.Load() >= uint64(len(q.recvs)) {
		return verbs.ErrQueueFull
	}
	q.recvs[seq%uint64(len(q.recvs))] = wr.ID
	if e := C.rs_post_recv(q.qp, C.uint64_t(seq|wrRecv), C.uint64_t(laddr), C.uint32_t(wr.Local.Length), C.uint32_t(lkey)); e != 0 {
		return q.postErr("post recv", e)
	}
	q.rqHead++
	return nil
}

// postErr maps a refused post: a full queue is ErrQueueFull; anything
// else means the QP cannot take work (the error state).
func (q *QP) postErr(op string, e C.int) error {
	if syscall.Errno(e) == syscall.ENOMEM {
		return verbs.ErrQueueFull
	}
	err := fmt.Errorf("%w: %s: %v", verbs.ErrQPState, op, syscall.Errno(e))
	if why := q.why(); why != "" {
		err = fmt.Errorf("%w (%s)", err, why)
	}
	return err
}

// markDead records, once, why q is in the error state: posts are refused
// from then on (some devices take them and never complete them), the CQ
// completes what is outstanding as flushed if the device does not
// (CQ.flushDead), and a caller waiting on the CQ is woken to poll.
func (q *QP) markDead(why string) {
	if !q.asyncErr.CompareAndSwap(nil, &why) {
		return
	}
	q.cq.dead.Add(1)
	q.cq.wake()
}

func (q *QP) isDead() bool { return q.asyncErr.Load() != nil }

// why says what is known of the cause of q's failed work or refused post:
// its port is down, or the event that marked it dead; else "". A device
// fails the work of a port that went down on its own, often before the
// port's event is read here (soft-iWARP's connection manager reports its
// connections DISCONNECTED), so the first failure with no known port
// cause asks the device for the port's state (once per QP: the rest are
// flushes). A port found down counts as its event: the other QPs on it
// fail over after the grace from now, not from when the kernel delivers
// the event (0.07-0.65 s later in the emulated guest).
func (q *QP) why() string {
	if why := q.dev.dc.portWhy(q.dev.t.port); why != "" {
		return why
	}
	if why := q.portErr.Load(); why != nil {
		return *why
	}
	if q.portAsked.CompareAndSwap(false, true) && !q.dev.portActive() {
		why := portDownWhy(q.dev.dc.name, q.dev.t.port)
		q.portErr.Store(&why)
		q.dev.dc.portEvent(q.dev.t.port, false)
		return why
	}
	if why := q.asyncErr.Load(); why != nil {
		return *why
	}
	return ""
}

// retireSend returns the ID and opcode of send seq and retires it and
// every earlier send (completions of a send queue come in order). Called
// by Poll under the CQ's lock.
func (q *QP) retireSend(seq uint64) (uint64, verbs.Opcode) {
	r := q.sends[seq%uint64(len(q.sends))]
	q.sqTail.Store(seq + 1)
	return r.id, r.op
}

// retireRecv does the same for receive seq.
func (q *QP) retireRecv(seq uint64) (uint64, verbs.Opcode) {
	id := q.recvs[seq%uint64(len(q.recvs))]
	q.rqTail.Store(seq + 1)
	return id, verbs.OpRecv
}

// ForceError moves the QP to the error state, as a fault of the fabric or
// the device would, without destroying it: outstanding and later requests
// complete as flushed. It is for fault injection (tests, and the guest
// suite's failover checks).
func (q *QP) ForceError() error {
	q.smu.Lock()
	defer q.smu.Unlock()
	if q.state.Load() == qpClosed {
		return verbs.ErrQPState
	}
	if e := C.rs_qp_err(q.qp); e != 0 {
		return fmt.Errorf("ibverbs: moving the queue pair to the error state: %w", syscall.Errno(e))
	}
	return nil
}

// Close moves the QP to the error state, so outstanding requests complete
// as flushed (by the device, or by the CQ where the device does not), and
// destroys it; once it returns the device no longer touches memory
// through this QP.
func (q *QP) Close() error {
	q.smu.Lock()
	q.rmu.Lock()
	was := q.state.Swap(qpClosed)
	q.rmu.Unlock()
	q.smu.Unlock()
	if was == qpClosed {
		return nil
	}
	var id *C.struct_rs_cm_id
	if q.cm != nil {
		if s, _ := cmLoad(); s != nil {
			if id = s.detach(q.cm); id != nil {
				C.rs_cm_disconnect(id)
			}
		}
	}
	C.rs_qp_err(q.qp)
	err := q.destroy()
	if id != nil {
		destroyID(id)
	}
	// The device flushes what was outstanding, unless the QP is destroyed
	// before it does (Soft-RoCE, now and then): the CQ completes the rest.
	q.markDead("queue pair closed")
	return err
}

func (q *QP) destroy() error {
	q.dev.dc.mu.Lock()
	delete(q.dev.dc.qps, q.qp)
	q.dev.dc.mu.Unlock()
	var err error
	if e := C.rs_destroy_qp(q.qp); e != 0 {
		err = errnoErr("destroy QP", e)
	} else {
		q.dev.dropQP()
	}
	if q.bounce != nil && err == nil {
		err = q.bounce.Close()
	}
	return err
}
