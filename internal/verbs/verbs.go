// Package verbs is the transport abstraction that rsock's ring protocol runs
// on. It is modelled on the RDMA verbs (libibverbs): a Device is a protection
// domain, memory regions (MR) are registered buffers outside the Go heap that
// a connected peer may write into with a remote key, queue pairs (QP) are
// reliable-connected (RC) and carry RDMA WRITE, SEND and RECV, and completion queues (CQ) report finished work requests.
//
// Three providers implement it: ibverbs (libibverbs through cgo), shm (two
// processes on one host, shared memory) and sim (in-process, with fault
// injection, for tests). The verbstest package holds the conformance suite
// every provider passes.
//
// Semantics every provider keeps (they are the RC guarantees the ring
// protocol relies on):
//   - Work requests posted on one QP execute in order. A SEND posted after a
//     WRITE is delivered to the peer only after the WRITE's data is visible in
//     the peer's memory.
//   - A SEND consumes exactly one posted RECV at the
//     peer, in posting order. Posting one when the peer has no RECV posted is a
//     receiver-not-ready error that moves the QP to the error state.
//   - A WRITE outside the bounds of the peer MR named by the remote key, or to
//     an MR without remote-write access, fails with StatusRemoteAccess and
//     moves the QP to the error state. (On iWARP a WRITE's completion is
//     local, so the WRITE may complete successfully; the peer then ends the
//     connection and the QP moves to the error state all the same.)
//   - Once a QP is in the error state, all outstanding work requests complete
//     with StatusFlushed. A later post either returns ErrQPState or completes
//     as flushed (devices differ); callers handle both.
//   - Completion.Op is valid on failed completions too (at least OpRecv for
//     a receive-queue request against a send-queue opcode): providers whose
//     device leaves the opcode undefined on error track it per request.
//   - A send-queue slot stays in use until a completion that retires it has
//     been polled: its own, or a later signaled one on the same QP. Callers
//     signal at least once every SendDepth requests. The CQ must be deep
//     enough for every queue using it; an overrun is fatal to those QPs.
//   - RECEIVER-NOT-READY is an error, never retried forever: the protocol
//     above never sends without a posted receive (message credits).
//   - AccessRemoteWrite implies AccessLocalWrite.
//   - Inline data (SendWR.Inline) is copied when PostSend returns, so the
//     caller may reuse its buffer at once.
//   - A new QP is in the INIT state: PostRecv works at once (receive buffers
//     are posted before the QP's Info goes to the peer), PostSend only after
//     Connect.
//
// Concurrency: PostSend, PostRecv, CQ.Poll, CQ.Arm and CQ.Disarm may be
// called from different goroutines at the same time.
package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// Access says who may write a memory region.
type Access uint32

const (
	// AccessLocalWrite lets the local side's RECVs write into the region.
	AccessLocalWrite Access = 1 << iota
	// AccessRemoteWrite lets the connected peer RDMA WRITE into the region.
	// rsock never grants remote read.
	AccessRemoteWrite
)

// Opcode is the operation of a send work request or of a completion.
type Opcode uint8

const (
	OpWrite Opcode = iota + 1 // RDMA WRITE (send queue)
	OpSend                    // SEND (send queue)
	OpRecv                    // a RECV consumed by the peer's SEND
)

func (o Opcode) String() string {
	switch o {
	case OpWrite:
		return "WRITE"
	case OpSend:
		return "SEND"
	case OpRecv:
		return "RECV"
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Status is the outcome of a work request.
type Status uint8

const (
	StatusSuccess       Status = iota
	StatusFlushed              // the QP was in the error state; the request did not execute
	StatusRemoteAccess         // the peer refused the access (bad rkey, bounds, no permission)
	StatusLocalLength          // a received message was larger than the posted buffer
	StatusRNR                  // the peer had no RECV posted (receiver not ready, retries exhausted)
	StatusRetryExceeded        // the peer did not answer (transport retries exhausted)
	StatusFatal                // any other error; the QP is in the error state
)

func (s Status) String() string {
	switch s {
	case StatusSuccess:
		return "success"
	case StatusFlushed:
		return "flushed"
	case StatusRemoteAccess:
		return "remote access error"
	case StatusLocalLength:
		return "local length error"
	case StatusRNR:
		return "receiver not ready"
	case StatusRetryExceeded:
		return "transport retry exceeded"
	case StatusFatal:
		return "fatal error"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Errors shared by all providers.
var (
	// ErrClosed is returned by operations on a closed Device, QP, CQ or MR.
	ErrClosed = errors.New("verbs: closed")
	// ErrQPState is returned when posting on a QP that is not connected or is
	// in the error state.
	ErrQPState = errors.New("verbs: queue pair not in a state to post")
	// ErrQueueFull is returned when a post would exceed the queue's depth.
	ErrQueueFull = errors.New("verbs: work queue full")
	// ErrInlineTooLong is returned when SendWR.Inline exceeds QP.MaxInline.
	ErrInlineTooLong = errors.New("verbs: inline data longer than the queue pair allows")
	// ErrBounds is returned for a local scatter entry outside its MR.
	ErrBounds = errors.New("verbs: buffer outside its memory region")
	// ErrUnavailable wraps the reason a provider cannot be used on this host.
	ErrUnavailable = errors.New("verbs: provider unavailable")
	// ErrPeerInfo is returned by Connect for a peer description that does not
	// parse or cannot be reached.
	ErrPeerInfo = errors.New("verbs: bad peer information")
	// ErrLocalLimit is wrapped by the error of an operation that a limit
	// of this host refused (memory mappings); see LocalLimit.
	ErrLocalLimit = errors.New("verbs: a limit of this host")
)

// PeerFault is the error of a step with the peer (what) that failed with
// err: the peer's (ErrPeerInfo), unless a limit of this host refused it
// (LocalLimit), which keeps err in the chain.
func PeerFault(what string, err error) error {
	if LocalLimit(err) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%w: %s: %v", ErrPeerInfo, what, err)
}

// LocalLimit reports whether err is a limit of this host, not the peer's
// doing: ErrLocalLimit, or out of memory (locked memory too) or file
// descriptors (ENOMEM, EMFILE, ENFILE).
func LocalLimit(err error) bool {
	for _, e := range []error{ErrLocalLimit, syscall.ENOMEM, syscall.EMFILE, syscall.ENFILE} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// CompletionError is the error form of a failed completion.
type CompletionError struct {
	Op     Opcode
	Status Status
	Vendor uint32 // Completion.Vendor
	Why    string // Completion.Why
}

func (e *CompletionError) Error() string {
	msg := "verbs: " + e.Op.String() + " completed with " + e.Status.String() + vendorSuffix(e.Vendor)
	if e.Why != "" {
		msg += " (" + e.Why + ")"
	}
	return msg
}

// vendorSuffix is how an error names a device's vendor syndrome: nothing
// for 0 (none reported), else " (vendor error 0x..)", in hex as vendors'
// documentation lists them.
func vendorSuffix(v uint32) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf(" (vendor error %#x)", v)
}

// SGE names Length bytes at Offset inside a memory region.
type SGE struct {
	MR     MR
	Offset int
	Length int
}

// SendWR is a send-queue work request.
type SendWR struct {
	ID uint64
	Op Opcode // OpWrite or OpSend
	// Local is the data source. Ignored when Inline is non-nil.
	Local SGE
	// Inline, when non-nil, is the data itself; it is copied before PostSend
	// returns and needs no memory region. len(Inline) <= QP.MaxInline().
	Inline []byte
	// RemoteAddr and RKey name the destination of a WRITE: RemoteAddr is the
	// peer MR's Addr() plus an offset.
	RemoteAddr uint64
	RKey       uint32
	// Signaled requests a completion on success. Failed requests always
	// complete. Unsignaled requests are retired by a later signaled one.
	Signaled bool
	// Solicited marks a SEND whose receive completion is solicited: it
	// fires the peer's CQ armed by ArmSolicited (the Solicited Event bit).
	Solicited bool
	// Next chains another request to this one: PostSend posts the chain
	// in order, with as few doorbells as the provider can (ibverbs: one
	// ibv_post_send per 8 requests).
	Next *SendWR
}

// RecvWR is a receive-queue work request: a buffer for one incoming SEND.
type RecvWR struct {
	ID    uint64
	Local SGE
}

// Completion reports a finished work request.
type Completion struct {
	ID     uint64
	Op     Opcode
	Status Status
	// Len is the number of bytes received (OpRecv).
	Len int
	// Vendor is the device's own code for a failure (ibverbs: the work
	// completion's vendor_err, the NIC's syndrome), 0 when there is none;
	// it means something only to the device's vendor, and only in the
	// error text.
	Vendor uint32
	// Why, on a failed completion, is what the provider knows of the
	// cause beyond Status (the event that moved the QP to the error
	// state), or empty.
	Why string
}

// Err returns nil for a successful completion and a *CompletionError
// otherwise.
func (c *Completion) Err() error {
	if c.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{Op: c.Op, Status: c.Status, Vendor: c.Vendor, Why: c.Why}
}

// MR is a registered memory region. Its memory stays valid until Close.
// The memory of a region a device can reach by DMA or a peer can map is
// outside the Go heap; a provider with neither (shm's local-only regions)
// may use Go memory.
type MR interface {
	// Bytes is the local mapping of the region.
	Bytes() []byte
	// Addr is the address a peer uses in SendWR.RemoteAddr for offset 0.
	Addr() uint64
	// RKey is the remote key a peer uses to WRITE into the region (zero
	// unless registered with AccessRemoteWrite). The peer of a QP may use
	// it if the region was registered before the QP connected; a provider
	// may allow later ones (RC hardware does, shm does not: it passes the
	// regions in its connection exchange).
	RKey() uint32
	// Close deregisters the region and frees its memory, or keeps it
	// for a later AllocMR of the same device (ibverbs pools them, and
	// zeroes one when it hands it out).
	// Nothing may use the region, its Bytes or its keys once Close has
	// started: the memory may belong to another region by then.
	Close() error
}

// CQ is a completion queue shared by the send and receive queues of QPs.
//
// Notification. Every provider signals completions one way: the notify
// function given to Device.NewCQ. Arm requests one notification (an edge):
// notify is called once, after the first completion that becomes pollable
// after the Arm, and the CQ is then disarmed until the next Arm. A
// completion that was already pollable when Arm was called does not fire
// it, so a caller polls once more after Arm before it waits for notify;
// either that poll finds the completion or notify is called. A failure that
// makes Poll fail (a CQ overrun) fires an armed notification too.
// ArmSolicited is Arm for solicited completions only (ibv_req_notify_cq's
// solicited_only): the receive completion of a SEND posted with
// SendWR.Solicited, or any failed completion. The latest Arm or
// ArmSolicited decides; a provider may notify for more than asked (a
// device whose earlier full Arm is still pending), never for less.
//
// notify runs on a goroutine of the provider's, or inside a post on one of
// the CQ's QPs, possibly with the provider's locks held: it must return
// quickly, must not block, and must not call the CQ or its QPs. It may still
// run once while Close is in progress, never after Close returned.
type CQ interface {
	// Poll moves up to len(wc) completions into wc without blocking and
	// returns how many.
	Poll(wc []Completion) (int, error)
	// Arm requests one notification (see above).
	Arm() error
	// ArmSolicited requests one notification for a solicited completion
	// (see above).
	ArmSolicited() error
	// Disarm withdraws an Arm that has not fired, so that peers stop paying
	// for notifications (shm: no eventfd write) while a caller busy-polls.
	// Providers that cannot withdraw it drop the notification instead.
	Disarm()
	// Close releases the CQ. Close the QPs first.
	Close() error
}

// QPAttr sizes a queue pair.
type QPAttr struct {
	CQ        CQ  // receives both send and receive completions
	SendDepth int // outstanding send work requests
	RecvDepth int // outstanding receive work requests
	MaxInline int // requested inline size; the provider may grant more or less
}

// Check reports what is wrong with a's depths and inline size for a
// provider (name) whose work queues hold at most maxDepth requests.
func (a QPAttr) Check(name string, maxDepth int) error {
	switch {
	case a.SendDepth <= 0 || a.SendDepth > maxDepth:
		return fmt.Errorf("%s: send depth %d (allowed 1..%d)", name, a.SendDepth, maxDepth)
	case a.RecvDepth <= 0 || a.RecvDepth > maxDepth:
		return fmt.Errorf("%s: receive depth %d (allowed 1..%d)", name, a.RecvDepth, maxDepth)
	case a.MaxInline < 0:
		return fmt.Errorf("%s: negative inline size %d", name, a.MaxInline)
	}
	return nil
}

// QP is a reliable-connected queue pair.
type QP interface {
	// Info describes this end for the peer (for ibverbs: QPN, PSN, GID,
	// LID, MTU; on iWARP, where to connect through rdma_cm). It is sent
	// over the bootstrap connection: by the active side before Connect,
	// by the passive side after its Connect, which may add to it (a
	// ticket the active side must present).
	Info() []byte
	// Connect connects this QP to the peer described by peer (the peer's
	// Info). The passive side (server) calls it before answering the
	// handshake, the active side (client) after. It may do side exchanges
	// (shm passes file descriptors) and honours ctx.
	Connect(ctx context.Context, peer []byte, active bool) error
	// Established is called on the passive side once the active side has
	// confirmed; it waits for any side exchange Connect started.
	Established(ctx context.Context) error
	// MaxInline is the largest SendWR.Inline this QP accepts.
	MaxInline() int
	// PostSend posts wr and the requests chained to it through Next, in
	// order. If it fails, the request that failed and those after it were
	// not posted; those before it may have been (they complete as usual).
	PostSend(wr *SendWR) error
	PostRecv(wr *RecvWR) error
	// Close moves the QP to the error state, so outstanding requests
	// complete as flushed, and releases it.
	Close() error
}

// Device is an opened RDMA device with a protection domain: memory regions
// and queue pairs of one Device belong together, and a peer connected to a
// QP can write only into remote-writable MRs of the same Device.
type Device interface {
	// Provider is the name of the provider: "ibverbs", "shm" or "sim".
	Provider() string
	// AllocMR allocates and registers size bytes outside the Go heap.
	AllocMR(size int, access Access) (MR, error)
	// NewCQ creates a completion queue for depth completions whose
	// notifications call notify (see CQ).
	NewCQ(depth int, notify func()) (CQ, error)
	NewQP(attr QPAttr) (QP, error)
	// Close releases the device. Close QPs, CQs and MRs first.
	Close() error
}

// OpenOptions carries what a provider needs to pick a device for one
// connection.
type OpenOptions struct {
	// LocalAddr and RemoteAddr are the bootstrap TCP connection's addresses
	// (RoCE picks the device and GID that own LocalAddr's IP).
	LocalAddr  net.Addr
	RemoteAddr net.Addr
	// Device, Port and GIDIndex override automatic selection (ibverbs).
	Device   string
	Port     int
	GIDIndex int // -1 for automatic
	// ConnectionManager connects ibverbs QPs through rdma_cm on RoCE too
	// (iWARP and InfiniBand always use it): addressing and path follow the
	// kernel's routes (VLANs, bonds). The passive side follows the active
	// side's choice.
	ConnectionManager bool
	// TrafficClass is the traffic class of the queue pair's packets
	// (ibverbs): on RoCE, the IP header's DS field (DSCP << 2 | ECN),
	// 0-255. -1 takes the port's default: rdma_cm's default_roce_tos for
	// the device and port where the administrator set one, else 0; through
	// rdma_cm, rdma_cm applies it. Through rdma_cm the passive side's
	// packets take the active side's class.
	TrafficClass int
	// ServiceLevel is the InfiniBand service level (0-15; on RoCE, the
	// priority some devices put in the VLAN tag). -1 means 0, or, through
	// rdma_cm, the path's; through rdma_cm 0-15 replaces the path's.
	ServiceLevel int
	// AckTimeout is the local ACK timeout of reliable-connected QPs
	// (ibverbs), rounded up to the device's encoding (4.096 us << n); 0
	// means 537 ms. RetryCount (1-6; 0 means 6) is how many times a
	// request that was not acknowledged in time is sent again before the
	// QP fails: a dead path fails a QP after about AckTimeout *
	// (RetryCount+1).
	AckTimeout time.Duration
	RetryCount int
	// Pool and PoolIdle bound the provider's pool of closed devices kept
	// for reuse with the memory they registered (ibverbs: protection
	// domains and their regions), per RDMA device: at most Pool of them,
	// each for at most PoolIdle. Zero Pool: no pooling. Providers that
	// pool nothing ignore them.
	Pool     int
	PoolIdle time.Duration
}

// Provider opens devices of one transport kind.
type Provider interface {
	// Name is the provider's name: "ibverbs", "shm" or "sim".
	Name() string
	// Open opens a device (protection domain) for one connection. An
	// error that wraps ErrUnavailable means the provider cannot work on this
	// host, with the reason in the message.
	Open(opts OpenOptions) (Device, error)
}

// RemoteMapper is implemented by QPs whose peer memory is mapped into this
// process (shm). A writer may copy straight into the returned slice of the
// peer's memory instead of staging the bytes and posting a WRITE; the
// ordering rule still holds: bytes copied before a SEND is posted are
// visible to the peer when that SEND's receive completion is.
type RemoteMapper interface {
	// MapRemote returns the peer's memory at addr..addr+length of the MR
	// named by rkey, or an error if that range is not remote-writable.
	MapRemote(addr uint64, rkey uint32, length int) ([]byte, error)
}

// Kicker is implemented by QPs that can tell whether the peer has taken
// every SEND posted to it, and make its completion queue notify, if it is
// armed, as a post does only while the peer asked for it: the backstop
// for a notification that was lost (a wake-up bug, or the peer's
// doorbell word overwritten from outside). Kick rings the peer if it has
// not taken them all, and reports whether it did.
type Kicker interface {
	Kick() bool
}

// Peeker is implemented by CQs that can tell cheaply (no system call, no
// allocation, no lock a poster takes) whether Poll would find anything. A
// busy-polling caller asks it before it takes its own locks to Poll, so
// that its spinning does not contend with the goroutines posting on the
// same connection. It is a hint: a completion that arrives as Pending
// returns may be missed, and Pending may report true for a completion that
// another caller then polls.
type Peeker interface {
	Pending() bool
}

// Laner is implemented by CQs whose notification one parked caller at a
// time can wait for itself, in the Go netpoller, rather than through a
// dispatcher goroutine and the notify function (shm's lane: an eventfd per
// process pair and direction, which the peer writes). The sequence:
// TakeLane, a Poll, WaitLane unless the Poll found something, then
// ReleaseLane. TakeLane arms the CQ as Arm does, for WaitLane; it reports
// false, having armed nothing, when the CQ cannot take a lane or another
// CQ holds it (which it interrupts, if that one took it over kickAfter
// ago). WaitLane blocks until the notification (true) or InterruptLane
// (false). Any goroutine may call InterruptLane, to end the current or
// next WaitLane of the CQ until its next TakeLane. ReleaseLane turns an
// arm not yet consumed into an ordinary Arm (whose notification calls
// notify), and reports whether the notification had come: then the
// caller has had it.
type Laner interface {
	TakeLane(kickAfter time.Duration) bool
	WaitLane() bool
	InterruptLane()
	ReleaseLane() bool
}
