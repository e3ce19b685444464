package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"

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
// Notification: the CQ owns one eventfd (non-blocking, wrapped in an
// os.File so that Wait parks in the Go netpoller). Each connected peer has a
// duplicate of it. Arm sets the CQ's local armed flag and the sleeping flag
// in the inbox of every attached QP; a peer that publishes an entry and
// finds the flag set clears it and writes the eventfd, as does a local
// completion finding the CQ armed. A busy CQ (not armed) costs its peers no
// system call.
type CQ struct {
	dev   *Device
	depth int

	efile   *os.File // the eventfd; closing it unblocks Wait
	closed  atomic.Bool
	overrun atomic.Bool
	armed   atomic.Uint32

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

	rbuf [8]byte // Wait's read buffer (one Wait at a time)
}

// localEntry is a queued local completion and the work-queue slots its
// polling frees.
type localEntry struct {
	c     verbs.Completion
	used  *atomic.Int32
	slots int32
}

var _ verbs.CQ = (*CQ)(nil)

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
	return &CQ{
		dev:   d,
		depth: depth,
		efile: os.NewFile(uintptr(efd), "rsock-shm-cq"),
		local: make([]localEntry, min(depth, 64)),
	}, nil
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

// Arm requests a notification for the next completion: a local one, or an
// entry a peer publishes in the inbox of an attached QP. Poll once more
// after Arm before Wait. It makes no system call. Errors: verbs.ErrClosed
// after Close, ErrCQOverrun after an overrun.
func (cq *CQ) Arm() error {
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
	cq.armed.Store(1)
	for _, q := range cq.qps {
		q.in.hdr.sleeping.Store(1)
	}
	return nil
}

// Disarm withdraws an Arm: peers stop writing the eventfd (verbs.Disarmer).
// rsock calls it while a blocked call busy-polls, and arms again after.
func (cq *CQ) Disarm() {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	cq.armed.Store(0)
	for _, q := range cq.qps {
		q.in.hdr.sleeping.Store(0)
	}
}

// Wait blocks until the eventfd is signalled (an armed notification fired,
// possibly an earlier one: spurious wake-ups happen) and returns nil. It
// parks the goroutine in the Go netpoller. It returns verbs.ErrClosed once
// the CQ is closed (Close unblocks it) and ErrCQOverrun after an overrun.
func (cq *CQ) Wait() error {
	if cq.closed.Load() {
		return verbs.ErrClosed
	}
	if cq.overrun.Load() {
		return ErrCQOverrun
	}
	_, err := cq.efile.Read(cq.rbuf[:])
	switch {
	case cq.closed.Load() || errors.Is(err, os.ErrClosed):
		return verbs.ErrClosed
	case err != nil:
		return fmt.Errorf("shm: reading the completion eventfd: %w", err)
	case cq.overrun.Load():
		return ErrCQOverrun
	}
	return nil
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
		cq.signal()
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
	if cq.armed.Load() != 0 && cq.armed.Swap(0) != 0 {
		cq.signal()
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

// signal writes the eventfd. A closed CQ ignores it.
func (cq *CQ) signal() {
	_, _ = cq.efile.Write(eventOne[:])
}

// breakQPsLocked moves every attached QP to the error state after an
// overrun; their completions are lost with the CQ.
func (cq *CQ) breakQPsLocked() {
	for _, q := range cq.qps {
		q.fail(verbs.StatusFlushed, false)
	}
}
