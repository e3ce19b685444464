//go:build linux

package shm

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Name is the provider name reported by Provider.Name and Device.Provider.
const Name = "shm"

// Limits.
const (
	// MaxInline is the largest inline size a QP grants (it is MaxSend: an
	// inline SEND travels in one inbox entry).
	MaxInline = MaxSend
	// MaxQueueDepth is the largest SendDepth or RecvDepth of a QP.
	MaxQueueDepth = 1 << 16
	// MaxCQDepth is the largest CQ depth.
	MaxCQDepth = 1 << 22
	// MaxMRSize is the largest memory region.
	MaxMRSize = 1 << 36
)

var (
	// ErrCQOverrun is returned by CQ.Poll and CQ.Arm once more local
	// completions were generated than the CQ's depth allows; the QPs using
	// the CQ are then in the error state.
	ErrCQOverrun = errors.New("shm: completion queue overrun")
	// ErrSendTooLong is returned by PostSend for a SEND of more than
	// MaxSend bytes from a memory region (an inline one gets
	// verbs.ErrInlineTooLong).
	ErrSendTooLong = fmt.Errorf("shm: SEND longer than %d bytes", MaxSend)
	// ErrMapBudget is wrapped by the error of an operation that needed a
	// memory mapping past the process's mapping budget (Mappings).
	ErrMapBudget = fmt.Errorf("%w: shm: the process's memory mapping budget is used up", verbs.ErrLocalLimit)
)

// Provider opens shm devices. It has no state; New is the constructor.
type Provider struct{}

var _ verbs.Provider = (*Provider)(nil)

// New returns the shm provider.
func New() *Provider { return &Provider{} }

// Name returns "shm".
func (p *Provider) Name() string { return Name }

// Open opens a device (protection domain); opts are ignored. It fails with
// an error wrapping verbs.ErrUnavailable if this host lacks what shm needs
// (memfd with sealing, eventfd, /proc).
func (p *Provider) Open(opts verbs.OpenOptions) (verbs.Device, error) {
	return p.OpenDevice()
}

// OpenDevice is Open returning the concrete type.
func (p *Provider) OpenDevice() (*Device, error) {
	if _, err := localHost(); err != nil {
		return nil, err
	}
	var salt [4]byte
	_, _ = rand.Read(salt[:]) // it never fails (crypto/rand, Go 1.24)
	return &Device{
		keySalt: binary.LittleEndian.Uint32(salt[:]),
		mrs:     make(map[*MR]struct{}),
		cqs:     make(map[*CQ]struct{}),
		qps:     make(map[*QP]struct{}),
	}, nil
}

// hostID is what tells two processes they can share memory and reach each
// other's abstract Unix sockets: the same boot (kernel instance) and the
// same network namespace.
type hostID struct {
	boot         [16]byte
	nsDev, nsIno uint64
}

// localHost returns this process's host identity, probing once that the
// kernel features shm needs work.
var localHost = sync.OnceValues(probeHost)

func probeHost() (hostID, error) {
	var id hostID
	unavailable := func(format string, args ...any) (hostID, error) {
		return hostID{}, fmt.Errorf("%w: shm: "+format, append([]any{verbs.ErrUnavailable}, args...)...)
	}
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return unavailable("boot id: %v", err)
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(string(b)), "-", ""))
	if err != nil || len(raw) != len(id.boot) {
		return unavailable("boot id %q does not parse", strings.TrimSpace(string(b)))
	}
	copy(id.boot[:], raw)
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return unavailable("network namespace: %v", err)
	}
	id.nsDev, id.nsIno = uint64(st.Dev), st.Ino // Dev: uint32 on mips
	fd, err := unix.MemfdCreate("rsock-shm-probe", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return unavailable("memfd_create: %v", err)
	}
	_ = unix.Close(fd)
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return unavailable("eventfd: %v", err)
	}
	err = checkEventfd(efd)
	_ = unix.Close(efd)
	if err != nil {
		return unavailable("%v", err)
	}
	return id, nil
}

// mrAddrs hands out region base addresses (process-wide, so that regions of
// different devices differ too).
var mrAddrs atomic.Uint64

func newMRAddr() uint64 {
	for {
		if a := mrAddrs.Add(1) * MaxMRSize; a != 0 {
			return a
		}
	}
}

// Device is a protection domain. It implements verbs.Device. A peer
// connected to one of its QPs can write into its remote-writable regions
// only.
type Device struct {
	keySalt uint32

	// mu is a leaf lock.
	mu     sync.Mutex
	closed bool
	keySeq uint32
	mrs    map[*MR]struct{}
	cqs    map[*CQ]struct{}
	qps    map[*QP]struct{}
}

var _ verbs.Device = (*Device)(nil)

// Provider returns "shm".
func (d *Device) Provider() string { return Name }

// AllocMR allocates and registers a region of size bytes. One with
// verbs.AccessRemoteWrite (which implies local write) is a sealed memfd,
// mapped, with a remote key (see Memory in the package documentation); one
// without is Go memory. It fails with verbs.ErrClosed after Close.
func (d *Device) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if size <= 0 || int64(size) > MaxMRSize {
		return nil, fmt.Errorf("shm: memory region of %d bytes (allowed 1..%d)", size, int64(MaxMRSize))
	}
	if access&^(verbs.AccessLocalWrite|verbs.AccessRemoteWrite) != 0 {
		return nil, fmt.Errorf("shm: unknown access flags %#x", uint32(access))
	}
	if access&verbs.AccessRemoteWrite != 0 {
		access |= verbs.AccessLocalWrite
	}
	mr := &MR{dev: d, fd: -1, addr: newMRAddr(), access: access}
	if access&verbs.AccessRemoteWrite == 0 {
		mr.buf = make([]byte, size) // no peer maps it: Go memory, no mapping
	} else {
		fd, mem, err := newMemfd("rsock-shm-mr", roundPage(size))
		if err != nil {
			return nil, err
		}
		mr.mem, mr.buf, mr.fd = mem, mem[:size:size], fd
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		closeFD(mr.fd)
		_ = unmap(mr.mem)
		return nil, verbs.ErrClosed
	}
	if mr.fd >= 0 {
		mr.rkey = d.newRKeyLocked()
	}
	d.mrs[mr] = struct{}{}
	d.mu.Unlock()
	return mr, nil
}

// newRKeyLocked returns a remote key that is non-zero and was never used
// by this device: a keyed bijection (murmur3's finaliser, which is
// invertible) of a counter, so keys look random and never repeat within
// 2^32 allocations, and a peer's stale mapping cannot alias a newer region.
func (d *Device) newRKeyLocked() uint32 {
	for {
		d.keySeq++
		x := d.keySeq ^ d.keySalt
		x ^= x >> 16
		x *= 0x85ebca6b
		x ^= x >> 13
		x *= 0xc2b2ae35
		x ^= x >> 16
		if x != 0 {
			return x
		}
	}
}

// NewCQ creates a completion queue for at most depth unpolled local
// completions (send completions and flushed receives; completions of
// incoming messages are made by Poll and need no room). It fails with
// verbs.ErrClosed after Close.
func (d *Device) NewCQ(depth int, notify func()) (verbs.CQ, error) {
	if depth <= 0 || depth > MaxCQDepth {
		return nil, fmt.Errorf("shm: completion queue depth %d (allowed 1..%d)", depth, MaxCQDepth)
	}
	cq := newCQ(d, depth, notify)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	d.cqs[cq] = struct{}{}
	return cq, nil
}

// NewQP creates a queue pair whose completions go to attr.CQ, a CQ of this
// device, with an inbox for attr.RecvDepth incoming messages. It grants
// min(attr.MaxInline, MaxInline) bytes of inline data. It fails with
// verbs.ErrClosed after Close.
func (d *Device) NewQP(attr verbs.QPAttr) (verbs.QP, error) {
	cq, ok := attr.CQ.(*CQ)
	switch {
	case !ok || cq == nil:
		return nil, fmt.Errorf("shm: queue pair needs a shm completion queue, got %T", attr.CQ)
	case cq.dev != d:
		return nil, errors.New("shm: completion queue of another device")
	}
	if err := attr.Check("shm", MaxQueueDepth); err != nil {
		return nil, err
	}
	q, err := newQP(d, cq, attr)
	if err != nil {
		return nil, err
	}
	if !cq.attach(q) {
		_ = q.Close()
		return nil, fmt.Errorf("shm: completion queue: %w", verbs.ErrClosed)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		_ = q.Close()
		return nil, verbs.ErrClosed
	}
	d.qps[q] = struct{}{}
	d.mu.Unlock()
	return q, nil
}

// Close closes the device: QPs, CQs and regions still open are closed
// first, in that order. A second Close returns verbs.ErrClosed.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return verbs.ErrClosed
	}
	d.closed = true
	qps, cqs, mrs := slices.Collect(maps.Keys(d.qps)), slices.Collect(maps.Keys(d.cqs)), slices.Collect(maps.Keys(d.mrs))
	d.mu.Unlock()
	for _, q := range qps {
		_ = q.Close()
	}
	for _, cq := range cqs {
		_ = cq.Close()
	}
	for _, mr := range mrs {
		_ = mr.Close()
	}
	return nil
}

// exportFDs appends to fds close-on-exec duplicates of the memfds of up
// to max remote-writable regions that still have one, and their records.
func (d *Device) exportFDs(fds []int, max int) ([]int, []mrRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var recs []mrRecord
	for mr := range d.mrs {
		if len(recs) == max {
			break
		}
		if mr.fd < 0 {
			continue
		}
		fd, err := unix.FcntlInt(uintptr(mr.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			continue
		}
		fds = append(fds, fd)
		recs = append(recs, mrRecord{rkey: mr.rkey, addr: mr.addr, size: uint64(len(mr.buf))})
	}
	return fds, recs
}

// settle closes the memfd of every remote-writable region once the device
// has QPs and none of them is still to connect (see Memory and Deviations
// in the package documentation).
func (d *Device) settle() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.qps) == 0 {
		return
	}
	for q := range d.qps {
		if st := q.state.Load(); st == stateInit || st == stateConnecting {
			return
		}
	}
	for mr := range d.mrs {
		closeFD(mr.fd)
		mr.fd = -1
	}
}

// forgetMR deregisters mr and returns its memfd (or -1) for the caller
// to close.
func (d *Device) forgetMR(mr *MR) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.mrs, mr)
	fd := mr.fd
	mr.fd = -1
	return fd
}

func (d *Device) forgetCQ(cq *CQ) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.cqs, cq)
}

func (d *Device) forgetQP(q *QP) {
	d.mu.Lock()
	delete(d.qps, q)
	d.mu.Unlock()
	d.settle()
}
