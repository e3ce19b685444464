// Package sim is an in-process verbs provider with fault injection. It lets
// tests drive rsock's whole ring protocol inside one process as if it ran on
// RDMA hardware, and keeps the reliable-connected (RC) semantics described in
// the verbs package documentation.
//
// # Connection
//
// Every QP gets a process-unique id that its Info carries, so QPs opened by
// any Provider in the process find each other through a global registry.
// A new QP accepts RECVs at once (the INIT state); Connect links it to its
// peer, and sending works as soon as this side has connected. Transfers to a
// peer that exists but has not connected yet are held (as RC hardware keeps
// retrying) and delivered once it connects.
//
// # Execution and data visibility
//
// Each QP has a "wire": the send work requests it has accepted but not yet
// delivered, in posting order. Delivering one means reading its source (the
// inline copy or the local MR), checking the remote key and bounds, copying
// the data into the peer's MR or into the peer's oldest posted RECV buffer,
// and generating the completions of both sides. Deliveries of one wire happen
// strictly in order; when nothing holds the wire, the transfer is delivered
// synchronously inside PostSend. A wire is held while
//   - the peer is stalled (QP.Stall): no data reaches the peer's memory and no
//     completion is generated on either side until the stall ends;
//   - the head transfer was "lost" (Faults.LossRate) and waits for its
//     retransmission (head-of-line blocking, like go-back-N);
//   - the peer has not connected yet.
//
// Because data is copied at delivery, a WRITE's data is in the peer's memory
// before any later SEND or WRITE with immediate of the same QP is even
// delivered, so before its receive completion can be seen. Non-inline source
// data is read at delivery, not at post: a caller that reuses a send buffer
// before the request completes sees the corruption it would see on hardware.
//
// Completions are then made visible in their CQ after a random delay
// (Faults.Delay). The completions of one work queue (the send or the receive
// queue of one QP) always become visible in the order they were generated;
// with Faults.Reorder, completions of different work queues sharing a CQ may
// overtake each other, otherwise a CQ shows everything in generation order.
//
// # Errors
//
// A transfer that fails moves its QP to the error state: the failing request
// completes with its status and every request still on the wire and every
// posted RECV completes with verbs.StatusFlushed. Failures always complete,
// whatever SendWR.Signaled says. The statuses are:
//   - StatusRNR: a SEND or WRITE with immediate found no RECV posted.
//   - StatusRemoteAccess: a WRITE named an unknown remote key, an MR without
//     remote-write access, or a range outside the MR. The peer QP moves to the
//     error state too (as an RC responder does on an access violation).
//     Zero-length WRITEs check neither key nor bounds, as on hardware.
//   - StatusLocalLength (receiver) and StatusRemoteAccess (sender): a SEND
//     larger than the RECV buffer; both QPs move to the error state.
//   - StatusRetryExceeded: the peer QP is closed, in the error state, or
//     connected to another QP. The peer itself is not told, like real RC.
//   - StatusFatal: a local MR was closed while a request used it.
//
// Posting on a QP in the error state fails with verbs.ErrQPState, unless
// Faults.FlushPostsInError asks for the other common hardware behaviour.
//
// # Queue accounting
//
// As on hardware, a send work request occupies its send-queue slot until a
// completion that retires it is polled: its own, or that of a later signaled
// request of the same QP. Unsignaled requests are therefore never retired on
// their own, and a QP that never signals fills up (verbs.ErrQueueFull). A
// RECV occupies its slot until its completion is polled. A CQ that would hold
// more than its depth of unpolled completions (visible or still delayed)
// overruns: Poll then fails with ErrCQOverrun and every QP using the
// CQ moves to the error state. Size CQs for the sum of the depths of the work
// queues that use them.
package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Name is the provider name reported by Provider.Name and Device.Provider.
const Name = "sim"

// Limits of the simulated device.
const (
	// MaxInline caps the inline size a QP grants, so that callers exercise
	// both the inline and the memory-region paths.
	MaxInline = 256
	// MaxQueueDepth is the largest SendDepth or RecvDepth of a QP.
	MaxQueueDepth = 1 << 16
	// MaxCQDepth is the largest CQ depth.
	MaxCQDepth = 1 << 22
	// MaxMRSize is the largest memory region.
	MaxMRSize int64 = 1 << 36
	// maxRetransmits bounds how often one transfer is lost in a row.
	maxRetransmits = 7
	// defaultRetransmitDelay applies when Faults.RetransmitDelay is zero.
	defaultRetransmitDelay = time.Millisecond
)

// ErrCQOverrun is returned by CQ.Poll once more completions were
// generated than the CQ's depth allows.
var ErrCQOverrun = errors.New("sim: completion queue overrun")

// Faults configures fault injection. The zero value injects nothing. The
// faults of the Provider that opened the sending QP's device govern loss;
// those of the Provider that opened a CQ's device govern completion delay.
type Faults struct {
	// Delay: each completion becomes visible after a random delay in
	// [0, Delay]; the order within one work queue is kept.
	Delay time.Duration
	// Reorder lets completions of different work queues (send vs receive,
	// different QPs) that share a CQ overtake each other.
	Reorder bool
	// LossRate is the probability that a WRITE, WRITE with immediate or SEND
	// is lost and retransmitted after RetransmitDelay (repeatedly, up to 7
	// times). Loss only adds delay: everything is delivered, in order.
	LossRate float64
	// RetransmitDelay is the time a lost transfer takes to be retransmitted;
	// zero means 1ms.
	RetransmitDelay time.Duration
	// FlushPostsInError makes posts on a QP in the error state succeed and
	// complete with StatusFlushed (as some hardware does) instead of failing
	// with verbs.ErrQPState.
	FlushPostsInError bool
	// LoseWakes is the probability that the notification an armed CQ
	// owes for a new completion is lost: the CQ stays armed and notify is
	// not called, as when a peer's doorbell ring is lost. A Kick
	// (verbs.Kicker) still fires it.
	LoseWakes float64
	// LocalCompletion completes a send request as soon as it is posted,
	// before it is delivered, as iWARP does once the local TCP took it.
	// Closing a QP then loses what is still on its wire, and moves its
	// peer to the error state, as the TCP connection's end does.
	LocalCompletion bool
	// MRLimit, if positive, caps the bytes registered on one device:
	// AllocMR past it fails with ENOMEM, as registration does past
	// RLIMIT_MEMLOCK.
	MRLimit int64
}

// Provider opens simulated devices. The zero value is ready to use (with no
// faults), but New is the usual constructor.
type Provider struct {
	faults atomic.Pointer[Faults]
}

var _ verbs.Provider = (*Provider)(nil)

// New returns a Provider without faults.
func New() *Provider { return &Provider{} }

// Name returns "sim".
func (p *Provider) Name() string { return Name }

// Open opens a new device (protection domain). It never fails; opts are
// ignored.
func (p *Provider) Open(opts verbs.OpenOptions) (verbs.Device, error) {
	return p.OpenDevice(), nil
}

// OpenDevice is Open returning the concrete type.
func (p *Provider) OpenDevice() *Device {
	return &Device{
		prov: p,
		mrs:  make(map[*MR]struct{}),
		keys: make(map[uint32]*MR),
		cqs:  make(map[*CQ]struct{}),
		qps:  make(map[*QP]struct{}),
	}
}

// SetFaults replaces the fault configuration. It is safe to call while
// traffic runs; requests already accepted keep the loss decided when they
// were posted. Negative durations count as zero and LossRate is clamped to
// [0, 1].
func (p *Provider) SetFaults(f Faults) {
	f.Delay = max(f.Delay, 0)
	f.RetransmitDelay = max(f.RetransmitDelay, 0)
	if !(f.LossRate > 0) { // also catches NaN
		f.LossRate = 0
	}
	f.LossRate = min(f.LossRate, 1)
	p.faults.Store(&f)
}

// Faults returns the current fault configuration.
func (p *Provider) Faults() Faults {
	return p.currentFaults()
}

func (p *Provider) currentFaults() Faults {
	if f := p.faults.Load(); f != nil {
		return *f
	}
	return Faults{}
}

// lossDelay decides at post time how long a transfer is held by losses.
func (f *Faults) lossDelay() time.Duration {
	if f.LossRate <= 0 {
		return 0
	}
	n := 0
	for n < maxRetransmits && rand.Float64() < f.LossRate {
		n++
	}
	d := f.RetransmitDelay
	if d == 0 {
		d = defaultRetransmitDelay
	}
	return time.Duration(n) * d
}

// completionDelay returns the visibility delay of one completion.
func (f *Faults) completionDelay() time.Duration {
	if f.Delay <= 0 {
		return 0
	}
	return rand.N(f.Delay + 1)
}

// The process-global registry lets QPs of any Provider find each other.
var registry = struct {
	mu    sync.Mutex
	qps   map[uint64]*QP
	rkeys map[uint32]struct{}
}{
	qps:   make(map[uint64]*QP),
	rkeys: make(map[uint32]struct{}),
}

// procNonce tells Info of this process from Info of another one.
var procNonce = rand.Uint64() | 1

// nextMRBase hands out distinct fake MR base addresses, nextQPID QP ids
// (never reused, so a stale Info cannot name a newer QP).
var nextMRBase, nextQPID atomic.Uint64

const mrBaseShift = 40 // MaxMRSize < 1<<mrBaseShift

func newMRBase() uint64 {
	for {
		if b := nextMRBase.Add(1) << mrBaseShift; b != 0 {
			return b
		}
	}
}

func registerQP(q *QP) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	registry.qps[q.id] = q
}

func unregisterQP(q *QP) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.qps[q.id] == q {
		delete(registry.qps, q.id)
	}
}

func lookupQP(id uint64) *QP {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return registry.qps[id]
}

// newRKey returns a random non-zero remote key unique in the process.
func newRKey() uint32 {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	for {
		k := rand.Uint32()
		if _, used := registry.rkeys[k]; k != 0 && !used {
			registry.rkeys[k] = struct{}{}
			return k
		}
	}
}

func releaseRKey(k uint32) {
	if k == 0 {
		return
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	delete(registry.rkeys, k)
}

// Info wire format: magic, version, process nonce, QP id.
const (
	infoMagic   = "rsim"
	infoVersion = 1
	infoLen     = len(infoMagic) + 1 + 8 + 8
)

func encodeInfo(id uint64) []byte {
	b := make([]byte, 0, infoLen)
	b = append(b, infoMagic...)
	b = append(b, infoVersion)
	b = binary.BigEndian.AppendUint64(b, procNonce)
	return binary.BigEndian.AppendUint64(b, id)
}

// decodeInfo parses a peer's Info. Errors wrap verbs.ErrPeerInfo.
func decodeInfo(b []byte) (uint64, error) {
	switch {
	case len(b) != infoLen:
		return 0, fmt.Errorf("%w: sim: %d bytes, want %d", verbs.ErrPeerInfo, len(b), infoLen)
	case string(b[:len(infoMagic)]) != infoMagic:
		return 0, fmt.Errorf("%w: sim: bad magic", verbs.ErrPeerInfo)
	case b[len(infoMagic)] != infoVersion:
		return 0, fmt.Errorf("%w: sim: version %d, want %d", verbs.ErrPeerInfo, b[len(infoMagic)], infoVersion)
	}
	rest := b[len(infoMagic)+1:]
	if binary.BigEndian.Uint64(rest) != procNonce {
		return 0, fmt.Errorf("%w: sim: queue pair of another process", verbs.ErrPeerInfo)
	}
	id := binary.BigEndian.Uint64(rest[8:])
	if id == 0 {
		return 0, fmt.Errorf("%w: sim: queue pair id 0", verbs.ErrPeerInfo)
	}
	return id, nil
}

// Device is a simulated protection domain. It implements verbs.Device.
type Device struct {
	prov *Provider

	// mu is a leaf lock: nothing else is locked while it is held.
	mu     sync.Mutex
	closed bool
	mrs    map[*MR]struct{}
	keys   map[uint32]*MR // remote-writable MRs by rkey
	cqs    map[*CQ]struct{}
	qps    map[*QP]struct{}
	bytes  int64 // registered (Faults.MRLimit)
}

var _ verbs.Device = (*Device)(nil)

// Provider returns "sim".
func (d *Device) Provider() string { return Name }

// AllocMR allocates size bytes with verbs.AllocMem and registers them.
// It fails with verbs.ErrClosed after Close.
func (d *Device) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if size <= 0 || int64(size) > MaxMRSize {
		return nil, fmt.Errorf("sim: memory region of %d bytes (allowed 1..%d)", size, MaxMRSize)
	}
	if access&^(verbs.AccessLocalWrite|verbs.AccessRemoteWrite) != 0 {
		return nil, fmt.Errorf("sim: unknown access flags %#x", uint32(access))
	}
	if d.isClosed() {
		return nil, verbs.ErrClosed
	}
	if limit := d.prov.currentFaults().MRLimit; limit > 0 {
		d.mu.Lock()
		over := d.bytes+int64(size) > limit
		d.mu.Unlock()
		if over {
			return nil, fmt.Errorf("sim: registering %d bytes passes the device's limit of %d (Faults.MRLimit): %w", size, limit, syscall.ENOMEM)
		}
	}
	buf, err := verbs.AllocMem(size)
	if err != nil {
		return nil, err
	}
	mr := &MR{dev: d, buf: buf, addr: newMRBase(), access: access}
	mr.cond.L = &mr.mu
	if access&verbs.AccessRemoteWrite != 0 {
		mr.rkey = newRKey()
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		releaseRKey(mr.rkey)
		_ = verbs.FreeMem(buf)
		return nil, verbs.ErrClosed
	}
	d.mrs[mr] = struct{}{}
	d.bytes += int64(len(buf))
	if mr.rkey != 0 {
		d.keys[mr.rkey] = mr
	}
	d.mu.Unlock()
	return mr, nil
}

// NewCQ creates a completion queue holding at most depth completions.
// It fails with verbs.ErrClosed after Close.
func (d *Device) NewCQ(depth int, notify func()) (verbs.CQ, error) {
	if depth <= 0 || depth > MaxCQDepth {
		return nil, fmt.Errorf("sim: completion queue depth %d (allowed 1..%d)", depth, MaxCQDepth)
	}
	cq := &CQ{
		dev:    d,
		depth:  depth,
		notify: notify,
		qps:    make(map[*QP]struct{}),
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	d.cqs[cq] = struct{}{}
	return cq, nil
}

// NewQP creates a queue pair whose completions go to attr.CQ, which must be
// a CQ of this device. The QP grants min(attr.MaxInline, MaxInline) bytes of
// inline data. It fails with verbs.ErrClosed after Close.
func (d *Device) NewQP(attr verbs.QPAttr) (verbs.QP, error) {
	cq, ok := attr.CQ.(*CQ)
	switch {
	case !ok || cq == nil:
		return nil, fmt.Errorf("sim: queue pair needs a sim completion queue, got %T", attr.CQ)
	case cq.dev != d:
		return nil, errors.New("sim: completion queue of another device")
	}
	if err := attr.Check("sim", MaxQueueDepth); err != nil {
		return nil, err
	}
	id := nextQPID.Add(1)
	q := &QP{
		id:        id,
		info:      encodeInfo(id),
		dev:       d,
		cq:        cq,
		maxInline: min(attr.MaxInline, MaxInline),
		incoming:  make(map[*QP]struct{}),
		connected: make(chan struct{}),
		gone:      make(chan struct{}),
	}
	q.sq.depth = int32(attr.SendDepth)
	q.rq.depth = int32(attr.RecvDepth)
	if !cq.attach(q) {
		return nil, fmt.Errorf("sim: completion queue: %w", verbs.ErrClosed)
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		cq.detach(q)
		return nil, verbs.ErrClosed
	}
	d.qps[q] = struct{}{}
	d.mu.Unlock()
	registerQP(q)
	if q.isClosed() { // the device was closed meanwhile
		unregisterQP(q)
		return nil, verbs.ErrClosed
	}
	return q, nil
}

// Close closes the device. QPs, CQs and MRs still open are closed first, in
// that order, so nothing leaks. A second Close returns verbs.ErrClosed.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return verbs.ErrClosed
	}
	d.closed = true
	qps := slices.Collect(maps.Keys(d.qps))
	cqs := slices.Collect(maps.Keys(d.cqs))
	mrs := slices.Collect(maps.Keys(d.mrs))
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

func (d *Device) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// lookupKey resolves a remote key in this protection domain.
func (d *Device) lookupKey(rkey uint32) *MR {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.keys[rkey]
}

func (d *Device) forgetMR(mr *MR) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.mrs, mr)
	d.bytes -= int64(len(mr.buf))
	if mr.rkey != 0 && d.keys[mr.rkey] == mr {
		delete(d.keys, mr.rkey)
	}
}

func (d *Device) forgetCQ(cq *CQ) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.cqs, cq)
}

func (d *Device) forgetQP(q *QP) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.qps, q)
}
