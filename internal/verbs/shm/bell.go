//go:build linux

package shm

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Bell page layout (protocol: Sleeping in the package documentation).
// Each side of a link creates one, passes its memfd to the peer at link
// setup and then closes it.
//
//	offset   writer     field
//	0        creator    magic, version (at creation)
//	128      both       armed: set by the dispatcher before it sleeps,
//	                    swapped to 0 by the producer that writes the eventfd
//	256      producer   summary: bit w = bitmap word w non-zero
//	4096     producer   bitmap: bit s = ring the CQ of slot s's QP
//
// A slot is the low 16 bits of a QP's link id (link.go). Everything the
// peer writes here is only a hint: a bit names a slot of this link, which
// is looked up (and may be empty) before anything is rung, so a hostile
// peer can cause spurious notifications of its own QPs only.
const (
	bellMagic     = 0x6c656272 // "rbel", little-endian
	bellVersion   = 3
	maxLinkSlots  = 1 << 16
	bellWords     = maxLinkSlots / 64
	bellSumWords  = bellWords / 64
	bellBitsOff   = 4096
	bellPageBytes = bellBitsOff + bellWords*8
)

// bellHeader overlays the start of a bell page; the bitmap is at bellBitsOff.
type bellHeader struct {
	magic   uint32
	version uint32
	_       [128 - 8]byte
	armed   atomic.Uint32
	_       [128 - 4]byte
	sum     [bellSumWords]atomic.Uint64
}

type bellBits [bellWords]atomic.Uint64

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
	b.hdr.armed.Store(1) // nobody has drained the page yet: ring the eventfd
	return fd, b, nil
}

// mapPeerBell validates and maps the peer's bell page; it does not close fd.
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
	_ = unmap(b.mem)
	*b = bellPage{}
}

// ring sets slot's bit in the peer's bell page and writes the peer's
// eventfd efd if its dispatcher sleeps (step 2 of Sleeping in the package
// documentation, which says why no ring is lost), or if force.
func (b *bellPage) ring(slot uint32, efd int, force bool) {
	w := (slot % maxLinkSlots) / 64
	b.bits[w].Or(1 << (slot % 64))
	b.hdr.sum[w/64].Or(1 << (w % 64))
	if b.hdr.armed.Load() != 0 && b.hdr.armed.Swap(0) != 0 || force {
		_, _ = unix.Write(efd, eventOne[:])
	}
}

// drain stores armed, then clears every bit set in this side's bitmap and
// calls fn for each slot.
func (b *bellPage) drain(fn func(slot uint32)) {
	b.hdr.armed.Store(1)
	for i := range bellSumWords {
		if b.hdr.sum[i].Load() == 0 {
			continue
		}
		s := b.hdr.sum[i].Swap(0)
		for s != 0 {
			j := bits.TrailingZeros64(s)
			s &= s - 1
			w := i*64 + j
			x := b.bits[w].Swap(0)
			for x != 0 {
				c := bits.TrailingZeros64(x)
				x &= x - 1
				fn(uint32(w*64 + c))
			}
		}
	}
}
