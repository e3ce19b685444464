package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// CQ is a completion queue. It implements verbs.CQ.
//
// It holds two kinds of completions. Local ones (send completions, made at
// post time by this process, and flushed or failed receives) wait in a
// bounded queue. Completions of incoming messages are not queued at all:
// Poll makes them from the inboxes of the attached QPs, matching each entry
// with the QP's oldest posted RECV. So a busy CQ costs one mutex and, per
// attached QP, two loads of shared memory when nothing arrived.
//
// Notification has two doorbells, so that a caller waiting on the CQ itself
// (WaitDirect) is woken by the notification, not by a goroutine that was
// woken by it. Direct: the CQ owns one eventfd (non-blocking, wrapped in an
// os.File so that WaitDirect parks in the Go netpoller); each connected
// peer has a duplicate of it. Wait: a channel, which the control
// connection's reader of each attached QP signals when the peer rings
// there (a message on the control connection), so the doorbell costs no
// file descriptor. Arm (or ArmDirect) sets the CQ's local armed value and
// the sleeping value in the inbox of every attached QP to the doorbell
// wanted; a peer that publishes an entry and finds the value set clears it
// and rings that doorbell, as does a local completion finding the CQ
// armed. A busy CQ (not armed) costs its peers no system call.
type CQ struct {
	dev   *Device
	depth int

	efile   *os.File      // the direct doorbell, an eventfd; closing it unblocks WaitDirect
	bell    chan struct{} // Wait's doorbell, capacity 1
	done    chan struct{} // closed by Close: unblocks Wait
	closed  atomic.Bool
	overrun atomic.Bool
	armed   atomic.Uint32 // 0, armWait or armDirect (the inboxes' sleeping values too)

	// mu serialises the consumers of the attached QPs' inboxes (Poll) and
	// guards qps. It is taken before a QP's rmu, never after.
	mu  sync.Mutex
	qps []*QP
	rr  int // round-robin start of the next Poll

	// lmu guards the local queue; nothing is locked under it.
	lmu    sync.Mutex
	local  []localEntry // ring buffer, grown up to depth
	lhead  int
	ln     int
	lcount atomic.Int32 // ln, readable without lmu

	raw    syscall.RawConn    // efile's, for WaitDirect
	rawFn  func(uintptr) bool // WaitDirect's callback (cq.rawReady), bound once
	parked bool               // rawReady has been called once in this wait (one WaitDirect at a time)
	woken  atomic.Bool        // WakeDirect was called; WaitDirect clears it
}

// The values of CQ.armed and of an inbox's sleeping field: which doorbell
// the next entry rings. A peer treats any other non-zero value as armWait.
const (
	armWait   = 1 // ring the control connection: Wait returns
	armDirect = 2 // write the eventfd: WaitDirect returns
)

// localEntry is a queued local completion and the work-queue slots its
// polling frees.
type localEntry struct {
	c     verbs.Completion
	used  *atomic.Int32
	slots int32
}

var (
	_ verbs.CQ           = (*CQ)(nil)
	_ verbs.Disarmer     = (*CQ)(nil)
	_ verbs.DirectWaiter = (*CQ)(nil)
	_ verbs.Peeker       = (*CQ)(nil)
)

// eventOne is the value written to an eventfd to signal it.
var eventOne = func() (b [8]byte) {
	binary.NativeEndian.PutUint64(b[:], 1)
	return b
}()

func newCQ(d *Device, depth int) (*CQ, error) {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("shm: eventfd: %w", err)
	}
	cq := &CQ{
		dev:   d,
		depth: depth,
		efile: os.NewFile(uintptr(efd), "rsock-shm-cq"),
		bell:  make(chan struct{}, 1),
		done:  make(chan struct{}),
		local: make([]localEntry, min(depth, 64)),
	}
	if cq.raw, err = cq.efile.SyscallConn(); err != nil {
		cq.efile.Close()
		return nil, fmt.Errorf("shm: eventfd: %w", err)
	}
	cq.rawFn = cq.rawReady
	return cq, nil
}

// Poll moves up to len(wc) completions into wc without blocking and returns
// how many: queued local completions first, then the incoming messages of
// the attached QPs. It does not block; it makes no system call and does
// not allocate unless a QP fails (its completions are then queued, which may
// signal an armed CQ). An inbox whose shared state is corrupt moves its QP
// to the error state (its oldest RECV completes with verbs.StatusFatal, the
// others flushed). Errors: verbs.ErrClosed after Close, ErrCQOverrun after
// an overrun.
func (cq *CQ) Poll(wc []verbs.Completion) (int, error) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return 0, verbs.ErrClosed
	}
	if cq.overrun.Load() {
		cq.breakQPsLocked()
		return 0, ErrCQOverrun
	}
	n := 0
	if cq.lcount.Load() > 0 {
		n = cq.popLocal(wc)
	}
	if k := len(cq.qps); k > 0 {
		cq.rr++
		for i := 0; i < k && n < len(wc); i++ {
			n += cq.qps[(cq.rr+i)%k].pollInbox(wc[n:])
		}
	}
	// Failures found in an inbox queue their completions locally.
	if n < len(wc) && cq.lcount.Load() > 0 {
		n += cq.popLocal(wc[n:])
	}
	return n, nil
}

// Pending reports whether Poll would find a completion now: a queued
// local one, or an entry (or a fault) in the inbox of an attached QP. It
// takes only the CQ's mutex (which posters never take) and makes two loads
// of shared memory per attached QP (verbs.Peeker).
func (cq *CQ) Pending() bool {
	if cq.lcount.Load() > 0 {
		return true
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	for _, q := range cq.qps {
		if q.in.hdr.tail.Load() != q.head.Load() || q.in.hdr.fault.Load() != 0 {
			return true
		}
	}
	return false
}

// Arm requests a notification for the next completion: a local one, or an
// entry a peer publishes in the inbox of an attached QP; it makes Wait
// return. Poll once more after Arm before Wait. It makes no system call.
// Errors: verbs.ErrClosed after Close, ErrCQOverrun after an overrun.
func (cq *CQ) Arm() error { return cq.arm(armWait) }

// ArmDirect is Arm for WaitDirect (verbs.DirectWaiter); it replaces an Arm,
// as Arm replaces it.
func (cq *CQ) ArmDirect() error { return cq.arm(armDirect) }

func (cq *CQ) arm(v uint32) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return verbs.ErrClosed
	}
	if cq.overrun.Load() {
		return ErrCQOverrun
	}
	// Each store is sequentially consistent: it is ordered before the loads
	// of the Poll that must follow (see the package documentation).
	cq.armed.Store(v)
	for _, q := range cq.qps {
		q.in.hdr.sleeping.Store(v)
	}
	return nil
}

// Disarm withdraws an Arm: peers stop ringing (verbs.Disarmer). rsock calls
// it while a blocked call busy-polls, and arms again after.
func (cq *CQ) Disarm() {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	cq.armed.Store(0)
	for _, q := range cq.qps {
		q.in.hdr.sleeping.Store(0)
	}
}

// Wait blocks until the doorbell Arm asks for rings (an armed notification
// fired, possibly an earlier one: spurious wake-ups happen) and returns nil.
// It parks the goroutine on a channel. It returns verbs.ErrClosed once the
// CQ is closed (Close unblocks it) and ErrCQOverrun after an overrun.
func (cq *CQ) Wait() error {
	if err := cq.waitErr(); err != nil {
		return err
	}
	select {
	case <-cq.bell:
	case <-cq.done:
	}
	return cq.waitErr()
}

// WaitDirect blocks until the eventfd is signalled (by a notification
// ArmDirect asked for), WakeDirect is called, or spuriously, and returns
// nil. It parks the goroutine in the Go netpoller. Errors as Wait's.
//
// It never reads the eventfd: the netpoller is edge-triggered and every
// write to an eventfd is an edge, so the counter is left to grow (it
// would take centuries of notifications to fill), and a wait costs no
// system call at all, where a read would cost two (one that finds nothing
// before parking, one after). The runtime forgets readiness it saw before
// the wait began, so a notification whose edge came between ArmDirect and
// the wait would be lost; a peer clears the inbox's sleeping value before
// it writes the eventfd, so rawReady checks those values after the runtime
// has forgotten and does not park if one was cleared.
func (cq *CQ) WaitDirect() error {
	for {
		if err := cq.waitErr(); err != nil {
			return err
		}
		if cq.woken.Swap(false) {
			// A WakeDirect after the swap sets woken again: the next
			// WaitDirect returns at once, whatever this reset undoes.
			_ = cq.efile.SetReadDeadline(time.Time{})
			return cq.waitErr()
		}
		cq.parked = false
		err := cq.raw.Read(cq.rawFn)
		switch {
		case cq.closed.Load() || errors.Is(err, os.ErrClosed):
			return verbs.ErrClosed
		case errors.Is(err, os.ErrDeadlineExceeded):
			// A WakeDirect set the deadline, but woken may be clear: a
			// WakeDirect that stored woken before an earlier Swap can set
			// its deadline after that WaitDirect's reset. Reset before
			// the Swap: a WakeDirect whose store the Swap misses sets its
			// deadline after this reset, so it is not lost.
			_ = cq.efile.SetReadDeadline(time.Time{})
			continue
		case err != nil:
			return fmt.Errorf("shm: waiting on the completion eventfd: %w", err)
		}
		return cq.waitErr()
	}
}

// rawReady is WaitDirect's callback to the runtime: true ends the wait. It
// is called once before parking (after the runtime forgot earlier
// readiness) and once after each wake-up.
func (cq *CQ) rawReady(uintptr) bool {
	if cq.parked {
		return true
	}
	cq.parked = true
	return cq.rang()
}

// rang reports whether a notification may have been sent since ArmDirect:
// a local completion is queued, or a peer cleared an inbox's sleeping
// value (it does so before writing the eventfd).
func (cq *CQ) rang() bool {
	if cq.lcount.Load() > 0 {
		return true
	}
	if cq.armed.Load() != armDirect {
		return false
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	for _, q := range cq.qps {
		if q.in.hdr.sleeping.Load() != armDirect {
			return true
		}
	}
	return false
}

// WakeDirect makes the WaitDirect in progress, or the next one, return. It
// makes no system call: it sets a read deadline in the past on the
// eventfd's file, which the Go runtime delivers to the parked WaitDirect
// at once, as it does net.Conn deadlines (a write to the eventfd would
// cost a system call and a trip through epoll).
func (cq *CQ) WakeDirect() {
	cq.woken.Store(true)
	if cq.efile.SetReadDeadline(aLongTimeAgo) != nil {
		_, _ = cq.efile.Write(eventOne[:]) // not pollable after all
	}
}

// aLongTimeAgo is a deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)

func (cq *CQ) waitErr() error {
	switch {
	case cq.closed.Load():
		return verbs.ErrClosed
	case cq.overrun.Load():
		return ErrCQOverrun
	}
	return nil
}

// ringBell rings Wait's doorbell.
func (cq *CQ) ringBell() {
	select {
	case cq.bell <- struct{}{}:
	default:
	}
}

// ring rings the doorbell that the armed value v names.
func (cq *CQ) ring(v uint32) {
	switch v {
	case 0:
	case armDirect:
		cq.WakeDirect()
	default:
		cq.ringBell()
	}
}

// Close releases the CQ, drops its queued completions and unblocks Wait.
// Completions that QPs still using it generate later are discarded; close
// the QPs first. A second Close returns verbs.ErrClosed.
func (cq *CQ) Close() error {
	cq.mu.Lock()
	if cq.closed.Swap(true) {
		cq.mu.Unlock()
		return verbs.ErrClosed
	}
	cq.qps = nil
	cq.mu.Unlock()
	cq.lmu.Lock()
	cq.local, cq.lhead, cq.ln = nil, 0, 0
	cq.lcount.Store(0)
	cq.lmu.Unlock()
	close(cq.done)
	err := cq.efile.Close()
	cq.dev.forgetCQ(cq)
	return err
}

// attach adds q to the QPs whose inboxes Poll reads; it fails once closed.
func (cq *CQ) attach(q *QP) bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed.Load() {
		return false
	}
	cq.qps = append(cq.qps, q)
	return true
}

// detach removes q. Once it returns, neither Poll nor Arm touches q's
// inbox.
func (cq *CQ) detach(q *QP) {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if i := slices.Index(cq.qps, q); i >= 0 {
		cq.qps = slices.Delete(cq.qps, i, i+1)
	}
}

// dupEventFD returns a close-on-exec duplicate of the eventfd, for a peer.
func (cq *CQ) dupEventFD() (int, error) {
	rc, err := cq.efile.SyscallConn()
	if err != nil {
		return -1, err
	}
	dup, derr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) { dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return -1, fmt.Errorf("shm: completion queue: %w", verbs.ErrClosed)
	}
	if derr != nil {
		return -1, fmt.Errorf("shm: dup eventfd: %w", derr)
	}
	return dup, nil
}

// push queues a local completion whose polling frees slots of used. The
// caller may hold QP locks. A full queue is an overrun: everything queued
// is dropped and Poll fails from then on.
func (cq *CQ) push(c verbs.Completion, used *atomic.Int32, slots int32) {
	cq.lmu.Lock()
	if cq.closed.Load() || cq.overrun.Load() {
		cq.lmu.Unlock()
		return
	}
	if cq.ln == cq.depth {
		cq.overrun.Store(true)
		cq.local, cq.lhead, cq.ln = nil, 0, 0
		cq.lcount.Store(0)
		cq.lmu.Unlock()
		cq.ringBell()
		cq.WakeDirect()
		return
	}
	if cq.ln == len(cq.local) {
		grown := make([]localEntry, min(2*len(cq.local), cq.depth))
		k := copy(grown, cq.local[cq.lhead:])
		copy(grown[k:], cq.local[:cq.lhead])
		cq.local, cq.lhead = grown, 0
	}
	cq.local[(cq.lhead+cq.ln)%len(cq.local)] = localEntry{c: c, used: used, slots: slots}
	cq.ln++
	cq.lcount.Add(1)
	cq.lmu.Unlock()
	if cq.armed.Load() != 0 {
		cq.ring(cq.armed.Swap(0))
	}
}

// popLocal moves queued local completions into wc.
func (cq *CQ) popLocal(wc []verbs.Completion) int {
	cq.lmu.Lock()
	defer cq.lmu.Unlock()
	n := min(len(wc), cq.ln)
	for i := range n {
		e := &cq.local[cq.lhead]
		wc[i] = e.c
		e.used.Add(-e.slots)
		*e = localEntry{}
		cq.lhead++
		if cq.lhead == len(cq.local) {
			cq.lhead = 0
		}
	}
	cq.ln -= n
	cq.lcount.Add(int32(-n))
	return n
}

// breakQPsLocked moves every attached QP to the error state after an
// overrun; their completions are lost with the CQ.
func (cq *CQ) breakQPsLocked() {
	for _, q := range cq.qps {
		q.fail(verbs.StatusFlushed, false)
	}
}
