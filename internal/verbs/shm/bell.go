package shm

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Bell page layout. Each side of a link owns one bell page (a memfd it
// creates, passes to the peer at link setup and then closes): the peer's
// QPs set bits in it to ring this side's CQs, and this side's readers
// (lead.go) clear them. It replaces an eventfd per CQ (plus a duplicate
// per peer) with two eventfds per link and direction, one per doorbell,
// so that the owner of the link who waits on the direct one is not woken
// for the event loops' rings, nor the dispatcher for the owner's:
//
//	offset   writer     field
//	0        creator    magic, version (at creation)
//	128      both       armed[direct], armed[wait]: set by the reader of
//	                    that doorbell's eventfd before it sleeps, swapped
//	                    to 0 by the producer that then writes it
//	256      producer   summary of the direct bitmap: bit w = word w non-zero
//	384      producer   summary of the wait bitmap
//	4096     producer   direct bitmap: bit s = ring WaitDirect of slot s's CQ
//	12288    producer   wait bitmap: bit s = ring Wait of slot s's CQ
//
// A slot is the low 16 bits of a QP's link id (see link.go). The producer
// sets the bitmap bit, then the summary bit, then loads that doorbell's
// armed; its reader stores armed, then swaps the summaries and the words
// they name. Everything the peer writes here is only a hint: a bit names a slot
// of this link, which is looked up (and may be empty) before anything is
// rung, so a hostile peer can cause spurious wake-ups of its own QPs only.
const (
	bellMagic     = 0x6c656272 // "rbel", little-endian
	bellVersion   = 2          // 1 had one armed word and one eventfd
	maxLinkSlots  = 1 << 16
	bellWords     = maxLinkSlots / 64
	bellSumWords  = bellWords / 64
	bellBitsOff   = 4096
	bellPageBytes = bellBitsOff + 2*bellWords*8
)

// bellHeader overlays the start of a bell page; the bitmaps follow at
// bellBitsOff.
type bellHeader struct {
	magic   uint32
	version uint32
	_       [128 - 8]byte
	armed   [2]atomic.Uint32 // [direct, wait]
	_       [128 - 8]byte
	sum     [2][bellSumWords]atomic.Uint64 // [direct, wait]
}

type bellBits [2][bellWords]atomic.Uint64 // [direct, wait]

var _ [bellBitsOff - unsafe.Sizeof(bellHeader{})]byte

// bellPage is a mapping of a bell page, from either side.
type bellPage struct {
	mem  []byte
	hdr  *bellHeader
	bits *bellBits
}

func makeBell(mem []byte) bellPage {
	return bellPage{
		mem:  mem,
		hdr:  (*bellHeader)(unsafe.Pointer(&mem[0])),
		bits: (*bellBits)(unsafe.Pointer(&mem[bellBitsOff : bellBitsOff+int(unsafe.Sizeof(bellBits{}))][0])),
	}
}

// newBell creates this side's bell page. The caller owns fd and mapping.
func newBell() (int, bellPage, error) {
	fd, mem, err := newMemfd("rsock-shm-bell", bellPageBytes)
	if err != nil {
		return -1, bellPage{}, err
	}
	b := makeBell(mem)
	b.hdr.magic, b.hdr.version = bellMagic, bellVersion
	for k := range b.hdr.armed {
		b.hdr.armed[k].Store(1) // nobody has drained the page yet: ring the eventfds
	}
	return fd, b, nil
}

// mapPeerBell validates and maps the peer's bell page (it does not close
// fd).
func mapPeerBell(fd int) (bellPage, error) {
	mem, err := mapMemfd(fd, bellPageBytes)
	if err != nil {
		return bellPage{}, fmt.Errorf("shm: peer bell page: %w", err)
	}
	b := makeBell(mem)
	if b.hdr.magic != bellMagic || b.hdr.version != bellVersion {
		_ = unmap(mem)
		return bellPage{}, fmt.Errorf("shm: peer bell page header does not match")
	}
	return b, nil
}

func (b *bellPage) release() {
	if b.mem != nil {
		_ = unmap(b.mem)
	}
	*b = bellPage{}
}

// bellKind is the doorbell a value v (an inbox's sleeping value) rings:
// 0 for WaitDirect, 1 for Wait (anything but armDirect). It indexes the
// bitmaps, the armed words and the eventfds.
func bellKind(v uint32) int {
	if v == armDirect {
		return bellDirect
	}
	return bellWait
}

const (
	bellDirect = 0
	bellWait   = 1
)

// ring sets slot's bit for doorbell v in the peer's bell page and writes
// the peer's eventfd of that doorbell (efds) if its reader sleeps. The Or
// operations and the load of armed are sequentially consistent: either the
// reader's scan after it stored armed sees the bit, or this load sees
// armed set.
func (b *bellPage) ring(slot uint32, v uint32, efds *[2]int) {
	k := bellKind(v)
	w := (slot % maxLinkSlots) / 64
	b.bits[k][w].Or(1 << (slot % 64))
	b.hdr.sum[k][w/64].Or(1 << (w % 64))
	if b.hdr.armed[k].Load() != 0 && b.hdr.armed[k].Swap(0) != 0 {
		_, _ = unix.Write(efds[k], eventOne[:])
	}
}

// drain stores doorbell k's armed word, then clears every bit set in this
// side's bitmap k and calls fn for each (slot, doorbell value).
func (b *bellPage) drain(k int, fn func(slot uint32, v uint32)) {
	b.hdr.armed[k].Store(1)
	v := uint32(armDirect)
	if k == bellWait {
		v = armWait
	}
	for i := range bellSumWords {
		if b.hdr.sum[k][i].Load() == 0 {
			continue
		}
		s := b.hdr.sum[k][i].Swap(0)
		for s != 0 {
			j := bits.TrailingZeros64(s)
			s &= s - 1
			w := i*64 + j
			x := b.bits[k][w].Swap(0)
			for x != 0 {
				c := bits.TrailingZeros64(x)
				x &= x - 1
				fn(uint32(w*64+c), v)
			}
		}
	}
}
