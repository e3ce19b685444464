//go:build linux

package shm

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Inbox layout. An inbox is one memfd: a header page, then capacity
// entries of EntrySize bytes. The QP that owns it (the consumer) creates
// it; the connected peer (the single producer) maps it and writes entries.
//
// Fields of different writers are in different 128-byte blocks (two cache
// lines, so the adjacent-line prefetcher does not couple them):
//
//	offset   writer    field
//	0        owner     magic, version, capacity (at creation); state (ready,
//	                   error), read by the producer on every post
//	128      producer  fault (access violation)
//	256      owner     head (entries consumed)
//	384      owner     posted (RECVs ever posted)
//	512      both      sleeping (1 after Arm, 2 after ArmSolicited; cleared
//	                   by the producer that rings: see Sleeping in doc.go)
//	4096     producer  entries; an entry's first word, its number plus one,
//	                   published last, says it is there
//
// What either side reads of the other is validated: see Hostile shared
// memory in the package documentation.
const (
	// EntrySize is the size of one inbox entry.
	EntrySize = 64
	// MaxSend is the largest SEND payload: it travels inline in an entry.
	MaxSend = EntrySize - entryHeaderSize

	entryHeaderSize = 16
	inboxHeaderSize = 4096
	minInboxCap     = 64         // so that the entries fill whole 4 KiB pages
	inboxMagic      = 0x6d687372 // "rshm", little-endian
	inboxVersion    = 4
)

// Owner states published in the inbox header.
const (
	ownerReady = 0
	ownerError = 1
)

// entrySend is the opcode of an entry: a SEND (the only one).
const entrySend = 1

// inboxHeader overlays the first page of an inbox.
type inboxHeader struct {
	magic    uint32
	version  uint32
	capacity uint32
	state    atomic.Uint32
	_        [128 - 16]byte
	fault    atomic.Uint32
	_        [128 - 4]byte
	head     atomic.Uint64
	_        [128 - 8]byte
	posted   atomic.Uint64
	_        [128 - 8]byte
	sleeping atomic.Uint32
	_        [128 - 4]byte
}

// entry overlays one inbox entry.
type entry struct {
	seq    atomic.Uint64 // the entry's number plus one: it is there (ready)
	op     uint8
	_      [3]uint8
	length uint32
	data   [MaxSend]byte
}

// Compile-time layout checks.
var (
	_ [EntrySize - unsafe.Sizeof(entry{})]byte
	_ [unsafe.Sizeof(entry{}) - EntrySize]byte
	_ [inboxHeaderSize - unsafe.Sizeof(inboxHeader{})]byte
)

// inbox is a mapping of an inbox, from either side.
type inbox struct {
	mem []byte // the whole mapping; nil when not mapped
	hdr *inboxHeader
	cap uint64 // entries; a power of two, from this side's own knowledge
}

// inboxCap returns the capacity of an inbox for depth receive requests.
func inboxCap(depth int) uint64 {
	c := uint64(minInboxCap)
	for c < uint64(depth) {
		c <<= 1
	}
	return c
}

// inboxBytes is the size of the memfd of an inbox of capacity c.
func inboxBytes(c uint64) int {
	return roundPage(inboxHeaderSize + int(c)*EntrySize)
}

// validInboxCap reports whether c is a capacity this package creates.
func validInboxCap(c uint64) bool {
	return c >= minInboxCap && c <= inboxCap(MaxQueueDepth) && c&(c-1) == 0
}

// newInbox creates the memfd of an inbox for depth receive requests and
// maps it. The caller owns the fd and the mapping.
func newInbox(depth int) (fd int, in inbox, err error) {
	c := inboxCap(depth)
	fd, mem, err := newMemfd("rsock-shm-inbox", inboxBytes(c))
	if err != nil {
		return -1, inbox{}, err
	}
	in = makeInbox(mem, c)
	in.hdr.magic = inboxMagic
	in.hdr.version = inboxVersion
	in.hdr.capacity = uint32(c)
	return fd, in, nil
}

// mapPeerInbox maps the peer's inbox of capacity c from fd, after checking
// the file (see mapMemfd) and the header. It does not close fd.
func mapPeerInbox(fd int, c uint64) (inbox, error) {
	if !validInboxCap(c) {
		return inbox{}, fmt.Errorf("shm: peer inbox capacity %d", c)
	}
	mem, err := mapMemfd(fd, inboxBytes(c))
	if err != nil {
		return inbox{}, fmt.Errorf("shm: peer inbox: %w", err)
	}
	in := makeInbox(mem, c)
	magic, version, capacity := in.hdr.magic, in.hdr.version, in.hdr.capacity
	if magic != inboxMagic || version != inboxVersion || uint64(capacity) != c {
		_ = unmap(mem)
		return inbox{}, fmt.Errorf("shm: peer inbox header does not match (magic %#x version %d capacity %d)", magic, version, capacity)
	}
	return in, nil
}

func makeInbox(mem []byte, c uint64) inbox {
	return inbox{
		mem: mem,
		hdr: (*inboxHeader)(unsafe.Pointer(&mem[0])),
		cap: c,
	}
}

// entryAt returns entry number i (modulo the capacity), bounds-checked
// against the mapping, whose size this side chose or validated.
func (in *inbox) entryAt(i uint64) *entry {
	off := inboxHeaderSize + (i&(in.cap-1))*EntrySize
	return (*entry)(unsafe.Pointer(&in.mem[off : off+EntrySize][0]))
}

// ready reports whether entry number i is there: the consumer polls the
// entry itself, so that a message costs it one cache line from the
// producer, not two (a tail word and the entry).
func (in *inbox) ready(i uint64) bool { return in.entryAt(i).seq.Load() == i+1 }

// release unmaps the inbox.
func (in *inbox) release() {
	_ = unmap(in.mem)
	*in = inbox{}
}
