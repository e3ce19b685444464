// Package shm is a verbs provider between two processes on one host: the
// peer's memory is mapped into this process, an RDMA WRITE is a copy into
// it, and SENDs travel through a queue in shared memory. Nothing on the data
// path enters the kernel unless the receiver sleeps. It keeps the
// reliable-connected (RC) semantics described in the verbs package
// documentation, with the differences listed under Deviations.
//
// # Memory
//
// Every memory region is a memfd, size-sealed (F_SEAL_SHRINK, F_SEAL_GROW,
// F_SEAL_SEAL) so that a peer holding it cannot make our accesses fault,
// mapped MAP_SHARED and MADV_DONTFORK. Remote-writable regions keep their
// memfd so the peer can map them: those that exist when the QP connects are
// passed in the exchange, later ones are fetched over the control
// connection on first use of their remote key (PostSend then waits for the
// peer, once per region). Addr is a distinct non-zero multiple of 1<<36;
// RKey is a keyed bijection of a per-device counter, so it looks random and
// is never reused by the device.
//
// # Inbox
//
// Each QP owns an inbox (its own memfd, see inbox.go for the layout): a
// single-producer single-consumer queue that the connected peer writes and
// this side reads. Its capacity is a power of two at least RecvDepth and 64;
// entries are EntrySize (64) bytes: opcode, flags, immediate, length and up
// to MaxSend (48) bytes of inline payload. A SEND's payload is copied into
// the entry when it is posted; a WRITE with immediate's entry carries only
// the length. The header also carries the owner's published count of posted
// RECVs: the sender compares it with the entries it has sent, and posts
// against no RECV complete with StatusRNR (RC's receiver-not-ready). Since
// a RECV is posted before its count is published, and the count minus the
// consumed entries never exceeds RecvDepth, an honest peer never finds the
// inbox full.
//
// CQ.Poll turns entries into receive completions, matching them in order
// with the posted RECVs. Send completions are made in the sender's process
// when the request is posted (it has fully executed by then) and queued in
// its CQ.
//
// # Memory ordering
//
// The producer writes the entry (after copying any WRITE data into the
// peer's region) with plain stores, then stores tail with sync/atomic; the
// consumer loads tail with sync/atomic, then reads the entry and the data.
// Go's atomics are sequentially consistent, so the store releases and the
// load acquires: everything written before the store is visible after the
// load. The same holds across processes, because the guarantee comes from
// the instructions (on amd64 a plain MOV load and an XCHG store; on arm64
// LDAR and STLR) acting on the same physical memory, and Go's compiler does
// not move plain accesses across atomics. So data copied before a SEND or
// WRITE with immediate is posted is visible when its receive completion is,
// whether it was copied by a WRITE or directly into a MapRemote slice. The
// consumer publishes head and the posted count with atomic stores after it
// is done with the entries and buffers they cover.
//
// Sleeping uses UCX's signal bit, with two doorbells. CQ.Arm stores
// sleeping=1 (armWait) in the inbox of each attached QP, CQ.ArmDirect
// stores 2 (armDirect); then the caller polls once more, loading tail. The
// producer stores tail, then loads sleeping and, if set, swaps it to 0 and
// rings the doorbell it names: for 2 it writes the eventfd of the peer's CQ
// (WaitDirect waits for its edge in the Go netpoller without reading it:
// each write is an edge, and the counter may grow), for any other value it
// sends a ring message on the control connection (whose reader signals the
// channel Wait parks on). This is Dekker's pattern: both sides store then
// load, and with sequentially consistent atomics (the XCHG is a full
// barrier) at least one sees the other's store, so either the poll after
// Arm finds the entry or the producer rings. The swap makes one ring per
// Arm. A busy receiver does not arm, so it costs the sender no system call.
// Two doorbells let a caller that waits on the CQ itself (rsock's blocked
// Read or Write) be woken by the peer directly, while the goroutine that
// makes progress in the background stays parked in Wait: one wake-up per
// message instead of two. The background doorbell costs no file
// descriptor (the control connection exists anyway) and is the slower one
// (a sendmsg and a goroutine hand-off), which suits the path taken only
// when no call waits.
//
// # Hostile shared memory
//
// Either side treats everything the other can write as hostile. Neither
// side reads back a counter it owns: the consumer keeps head and the posted
// count privately, the producer keeps tail. The consumer rejects a tail
// behind its head or more than the capacity ahead, an unknown opcode, a
// SEND longer than MaxSend and an entry without a posted RECV: the QP moves
// to the error state, its oldest RECV completes with StatusFatal and the
// others are flushed. The producer writes entries at its own tail modulo
// the capacity it validated at connect time, whatever head and the posted
// count say (an impossible pair completes with StatusFatal). Received memfds
// must be regular files of exactly the announced size, sealed against
// shrinking; the eventfd must be an eventfd in non-blocking mode. (A
// connected peer could later clear O_NONBLOCK on its own eventfd and fill
// its counter, making our signalling write block; that takes the secret,
// and stalls only the posting goroutine's thread.)
//
// # Connection and trust model
//
// QP.Info carries a magic and version, the boot id, the network namespace,
// a 32-byte random secret of this QP, and the name of this process's
// rendezvous listener: an abstract SOCK_SEQPACKET Unix socket
// ("@rsock-shm-<pid>-<random>"), started by the first QP that needs it and
// closed with the last one. The passive side (server) registers its secret
// with the listener in Connect and returns; the active side dials the
// listener and sends the secret and its fds (inbox, CQ eventfd,
// remote-writable regions) in one SCM_RIGHTS message; the listener compares
// the secret in constant time with the registered ones (each usable once),
// answers with the passive side's fds and Established returns. Both ends
// check SO_PEERCRED and refuse a peer running as another (effective) user.
//
// The secret travels only inside the Info exchanged over rsock's TCP
// bootstrap connection, so only the process at the other end of that
// connection can attach to the QP: another local process, even one of the
// same user, does not know it (abstract socket names are visible in
// /proc/net/unix, secrets are not). A process of the same user could
// ptrace either side anyway, so the uid check is defence in depth and keeps
// processes of other users out before they send anything; peers in
// different user namespaces (whose uids map differently) are refused.
// Connections that present no registered secret are closed without
// touching any registration; a failure after the secret matched is reported
// to that QP's Established. Every received fd is checked before it is
// mapped, and closed unless kept, on every path.
//
// The listener never blocks its accept loop: it reads each connection's
// SO_PEERCRED as it accepts it, serves at most 16 exchanges of one peer
// process at once and queues that process's further connections (up to
// 1024; 4096 held in all), and each connection has 2 s from its accept to
// send its connect message. So a local process that opens many silent
// connections to the (public) socket name delays only its own exchanges.
//
// The rendezvous connection then stays open as the QP's control connection
// (a goroutine per QP reads it, parked in the netpoller): it carries
// remote-key fetches and revocations and the background doorbell, and its
// end tells the QP that the peer's QP or process is gone.
//
// # Deviations from RC
//
//   - A SEND larger than the posted RECV completes at the receiver with
//     StatusLocalLength, but the sender's completion (made at post time) is
//     a success; the sender's next post fails with StatusRetryExceeded.
//   - SENDs carry at most MaxSend bytes (ErrSendTooLong at post otherwise).
//   - A region the peer deregistered stays writable here until the control
//     connection has delivered the revocation (and forever through a
//     MapRemote slice, until Close): the writes land in memory only this
//     side still maps.
//   - A peer process that dies without closing its QP is noticed when the
//     control connection ends: sends posted before that succeed into memory
//     nobody reads (rsock learns of the death from its TCP bootstrap).
package shm
