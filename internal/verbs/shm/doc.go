// Package shm is a verbs provider between two processes on one host: the
// peer's memory is mapped into this process, an RDMA WRITE is a copy into
// it, and SENDs travel through a queue in shared memory. Nothing on the data
// path enters the kernel unless the receiver sleeps. It keeps the
// reliable-connected (RC) semantics described in the verbs package
// documentation, with the differences listed under Deviations.
//
// # Memory
//
// Every memory a peer maps (remote-writable regions, inboxes, bell pages) is
// a memfd, size-sealed (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL) so that a
// peer holding it cannot make our accesses fault, mapped MAP_SHARED and
// MADV_DONTFORK. A file descriptor is kept only while a peer may still have
// to map the memory:
//
//   - A local-only region is Go memory: no memfd, no mapping.
//   - An inbox closes its memfd once the peer has mapped it.
//   - A remote-writable region keeps its memfd until the device has QPs and
//     none of them is still to connect. The regions that exist when a QP
//     connects (up to 128) are passed in its exchange, and only those are
//     the peer's to WRITE (verbs.MR).
//
// So rsock's connection (one QP per device, its ring registered before it
// connects) keeps no memfd open once connected. Addr is a distinct non-zero
// multiple of 1<<36; RKey is a keyed bijection of a per-device counter, so
// it looks random and is never reused by the device.
//
// # Inbox
//
// Each QP owns an inbox (layout in inbox.go): a single-producer
// single-consumer queue that the connected peer writes and this side reads,
// of a power-of-two capacity at least RecvDepth and 64. Entries are
// EntrySize (64) bytes: a sequence word (the entry's number plus one, which
// says it is there), opcode (SEND), length and up to MaxSend (48) bytes of
// payload, copied in when the SEND is posted. The header also carries
// the owner's published count of posted RECVs; a SEND beyond it completes
// with StatusRNR (RC's receiver-not-ready). A RECV is posted before its
// count is published, and the count minus the consumed entries never
// exceeds RecvDepth, so an honest peer never finds the inbox full.
//
// CQ.Poll turns entries into receive completions, matching them in order
// with the posted RECVs. Send completions are made in the sender's process
// when the request is posted (it has fully executed by then) and queued in
// its CQ.
//
// # Memory ordering
//
// The producer writes the entry (after copying any WRITE data into the
// peer's region) with plain stores, then stores its sequence word with
// sync/atomic; the consumer loads that word with sync/atomic, then reads
// the entry and the data.
// Go's atomics are sequentially consistent, so the store releases and the
// load acquires. That holds across processes, because the guarantee comes
// from the instructions (amd64: plain MOV load, XCHG store; arm64: LDAR,
// STLR) acting on the same physical memory, and Go's compiler does not move
// plain accesses across atomics. So data copied before a SEND is posted, by
// a WRITE or into a MapRemote slice, is visible when its receive completion
// is. The consumer publishes head and the posted count with atomic stores
// after it is done with the entries and buffers they cover.
//
// # Sleeping
//
// Notification (verbs.CQ's Arm and notify) uses UCX's signal bit at the QP
// level and one doorbell per link and direction at the process level. A CQ
// owns no file descriptor.
//
//  1. CQ.Arm stores sleeping=1 in the inbox of each attached QP
//     (ArmSolicited 2) unless it holds that value already (the producer
//     loads it at every SEND: a store would take its line from the
//     producer); the caller then polls once more, loading the next
//     entry's sequence word.
//  2. The producer stores the sequence word, then loads sleeping; if it is
//     set (2: and the SEND is solicited) it swaps it to 0 and rings: it
//     sets the bit of the consumer QP's link slot in the consumer's bell
//     page (bell.go) and that word's bit in the page's summary, then loads
//     the page's armed word and, if set, swaps it to 0 and writes the
//     consumer's eventfd of that link.
//  3. The link's one dispatcher goroutine (link.go) waits on that eventfd
//     in the Go netpoller (RawConn.Read, edge-triggered; it never reads the
//     counter). Each time it wakes it stores armed=1, then swaps the summary
//     and the words it names to 0 and calls fire on the CQ of each QP rung
//     (an empty slot is skipped). fire calls notify if the CQ is armed,
//     swapping its armed value to 0: one notification per Arm.
//
// A local completion (a send's, made at post time, or a failure) calls fire
// itself, and so does an overrun.
//
// No notification is lost. Both levels are Dekker's pattern: each side
// stores, then loads what the other stores, with sequentially consistent
// atomics (XCHG and LOCK OR are full barriers), so at least one of them
// sees the other's store. Inbox: either the poll after Arm sees the entry, or
// the producer sees sleeping and rings. Link: armed starts set; either the
// drain after the dispatcher stored armed sees the bit, or the producer
// sees armed and writes the eventfd. Every eventfd write is an edge that
// the netpoller delivers to the parked dispatcher, or remembers for it
// while it drains; the runtime forgets readiness only when the
// dispatcher's RawConn.Read starts, before its first drain, which sees
// every bit set before. The swap of sleeping makes one ring per Arm, the
// swap of armed one eventfd write per wake-up of the dispatcher, however
// many QPs ring meanwhile. A busy receiver does not arm, so it costs the
// sender nothing. A goroutine hand-off per wake-up is the price of one
// eventfd per process pair rather than per connection (BENCHMARKS.md).
//
// The sleeping and armed words are in memory the peer can write: a peer
// that overwrites them loses notifications, its own or ours, as a lost
// wake-up of any cause would. QP.Kick (verbs.Kicker) rings whatever they
// say; rsock's engine kicks a peer that has consumed none of the bytes in
// flight for a while (internal/stream's backstop).
//
// # Hostile shared memory
//
// Either side treats everything the other can write as hostile. Neither
// side reads back a counter it owns: the consumer keeps head and the posted
// count privately, the producer its count of entries. The consumer reads an
// entry only once its sequence word is the number its head expects (another
// value leaves it unread: the producer stalls only itself), and rejects an
// unknown opcode, a SEND longer than MaxSend and an entry without a posted
// RECV: the QP moves to the error state, its oldest RECV completes with
// StatusFatal and the others are flushed. The producer writes entries at
// its own count modulo the capacity it validated at connect time, whatever
// head and the posted count say (an impossible pair completes with
// StatusFatal). Received memfds must be regular files of exactly the
// announced size, sealed against shrinking; the eventfd must be an eventfd
// in non-blocking mode. (A connected peer could later clear O_NONBLOCK on
// its own eventfd and fill its counter, making our signalling write block;
// that takes the secret, and stalls only the posting goroutine's thread.)
//
// # Connection and trust model
//
// QP.Info carries a magic and version, the boot id, the network namespace,
// a 32-byte random secret of this QP, and the name of this process's
// rendezvous listener: an abstract SOCK_SEQPACKET Unix socket
// ("@rsock-shm-<pid>-<random>"), started by the first QP that needs it and
// closed when no QP and no link it accepted is left. The passive side
// registers its secret with the listener in Connect and returns; the active
// side attaches on the link to the passive side's process, sending the
// secret and its fds (inbox, remote-writable regions); the passive process
// compares the secret in constant time with the registered ones (each
// usable once), answers with its own fds and Established returns.
//
// A link (link.go; SMC-D's link group, UCX's per-peer endpoint) is what two
// processes share for all their QPs: one connection to the peer's
// rendezvous listener, dialed by the first active QP towards it, and a
// doorbell per direction (a bell page and an eventfd, traded in the link's
// first message, which proves the secret of a registered QP, and its
// answer). Every QP to that process, the first one too, then attaches to
// the link: one message each way, carrying the secret and the QPs' fds.
// The dialing side closes the link a second after its last QP closed
// (linkLinger), unless another QP to that process took it over by then, so
// a client that connects, talks and closes in a loop does not set up a link
// each time. The accepting side closes the link when it ends, and holds its
// listener until then, so that the lingering link's name stays valid. A
// QP's close tells its peer QP; the link's end tells every QP on it that
// the peer process is gone. So a connection costs no file descriptor of its
// own: each process holds, per peer process, one Unix socket, its own
// eventfd and the peer's.
//
// The secret travels only inside the Info exchanged over rsock's TCP
// bootstrap connection, so only the process at the other end of that
// connection can attach to the QP: another local process, even one of the
// same user, does not know it (abstract socket names are visible in
// /proc/net/unix, secrets are not). That holds on a link too: a process
// attaching a QP over an existing link proves the secret of that QP, and a
// link is only ever shared by QPs of the two processes at its ends. Both
// ends check SO_PEERCRED when the link is set up and refuse a peer running
// as another (effective) user. A process of the same user could ptrace
// either side anyway, so the uid check is defence in depth and keeps
// processes of other users out before they send anything; peers in
// different user namespaces (whose uids map differently) are refused. A
// new connection to the listener must present a registered secret in its
// first message, before anything else it sent is looked at, or it is
// closed without touching any registration (a secret sets up one link at
// most, so links number no more than registrations); a wrong secret in an
// attach is refused with a message and leaves the link alone. A failure of
// an attach after its secret matched is reported to that QP's Established.
// Every received fd is checked before it is mapped, and closed unless kept,
// on every path. A malformed message on a link is a protocol violation that
// ends the link, and with it the QPs of that peer process only.
//
// The listener never blocks its accept loop: it reads each connection's
// SO_PEERCRED as it accepts it, serves at most 16 first messages of one
// peer process at once and queues that process's further connections (up
// to 1024), and each connection has 2 s from its accept to send its first
// message. With 4096 held in all, a new connection takes the place of one
// of the process that holds the most. So a local process, or many, that
// open silent connections to the (public) socket name delay only their
// own exchanges.
//
// # Deviations from RC
//
//   - A SEND larger than the posted RECV completes at the receiver with
//     StatusLocalLength, but the sender's completion (made at post time) is
//     a success; the sender's next post fails with StatusRetryExceeded.
//   - SENDs carry at most MaxSend bytes (ErrSendTooLong at post otherwise).
//   - A region registered after a QP connected is not the QP's peer's to
//     WRITE (its key completes with StatusRemoteAccess there): RC hardware
//     allows it, verbs.MR does not promise it.
//   - Deregistering a region revokes nothing: a peer that mapped it keeps
//     it, and its WRITEs succeed, until its QP closes. Remote keys are never
//     reused, so such a WRITE cannot reach a newer region.
//   - A peer process that dies without closing its QP is noticed when the
//     link ends; sends posted before that succeed into memory nobody reads.
//   - A remote-writable region whose memfd was closed (see Memory) is not
//     writable by the peer of a QP created later: create the QPs first.
//
// The package is Linux's (memfd, SCM_RIGHTS, SO_PEERCRED, eventfd), empty elsewhere.
package shm
