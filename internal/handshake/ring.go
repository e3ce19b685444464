package handshake

import (
	"fmt"
	"math"
	"math/bits"
)

// RingInfo describes one side's receive ring: the memory region the peer
// writes into and how many messages it may send before waiting for credit.
// On the wire it is a fixed RingInfoLen bytes: size uint64, addr uint64,
// rkey uint32, credits uint16.
type RingInfo struct {
	Size    uint64 // receive ring bytes
	Addr    uint64 // remote address of the ring in the peer's memory region
	RKey    uint32 // remote key of that memory region
	Credits uint16 // receive work requests initially posted = message credits
}

// RingInfoLen is the encoded size of a RingInfo.
const RingInfoLen = 8 + 8 + 4 + 2

// Validate reports whether r is acceptable: Size a power of two in
// [MinRing, MaxRing], Credits in [MinCredits, MaxCredits], and Addr+Size not
// past the end of the 64-bit address space. Decoding does not call it; the
// caller decides what to do with a peer's bad ring (the error wraps
// ErrMalformed).
func (r RingInfo) Validate() error {
	switch {
	case r.Size < MinRing || r.Size > MaxRing || bits.OnesCount64(r.Size) != 1:
		return fmt.Errorf("%w: ring size %d is not a power of two in [%d, %d]", ErrMalformed, r.Size, MinRing, MaxRing)
	case r.Credits < MinCredits || r.Credits > MaxCredits:
		return fmt.Errorf("%w: ring credits %d not in [%d, %d]", ErrMalformed, r.Credits, MinCredits, MaxCredits)
	case r.Addr > math.MaxUint64-r.Size:
		return fmt.Errorf("%w: ring addr %#x + size %d overflows the address space", ErrMalformed, r.Addr, r.Size)
	}
	return nil
}
