//go:build cgo && linux

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// MR is a registered memory region: anonymous memory outside the Go heap,
// marked MADV_DONTFORK (so a child started while it is registered never
// shares its pages), registered with the device. It implements verbs.MR.
//
// A spare (a closed region a pooling Device keeps, pool.go) is an MR too:
// registered, or, once retired (see Close), memory only, with mr nil.
type MR struct {
	dev    *Device
	mr     *C.struct_rs_mr // nil once retired
	buf    []byte
	size   int   // as asked for
	flags  C.int // access flags
	lkey   uint32
	rkey   uint32 // zero unless remote-writable
	closed atomic.Bool
}

// AllocMR allocates and registers size bytes. A remote-writable region
// gets local write and remote write access, never remote read. On a
// Device that pools, it may hand out a spare region of the same size and
// access instead (pool.go): zeroed first, and registered again if it was
// retired, so with a new rkey.
func (d *Device) AllocMR(size int, access verbs.Access) (verbs.MR, error) {
	if err := d.check(); err != nil {
		return nil, err
	}
	flags := C.int(0)
	if access&(verbs.AccessLocalWrite|verbs.AccessRemoteWrite) != 0 {
		flags |= C.RS_ACCESS_LOCAL_WRITE
	}
	if access&verbs.AccessRemoteWrite != 0 {
		flags |= C.RS_ACCESS_REMOTE_WRITE
	}
	spare, err := d.spareMR(size, flags)
	if err != nil {
		return nil, err
	}
	m, e, err := d.register(spare, size, flags)
	if err != nil && outOfMemory(e) {
		// Pooled regions count against RLIMIT_MEMLOCK too: give them
		// back and try once more.
		DrainPools()
		d.freeSpares()
		m, _, err = d.register(nil, size, flags)
	}
	if err != nil {
		d.dropLive()
		return nil, err
	}
	return m, nil
}

// register makes a region of size bytes with flags: out of spare (a
// region spareMR took, of that size and flags), which it zeroes, and
// registers again if it was retired; or, when spare is nil, out of new
// memory. e is the errno of a failed registration, whose memory (spare's
// too) is freed.
func (d *Device) register(spare *MR, size int, flags C.int) (*MR, C.int, error) {
	var buf []byte
	if spare != nil {
		// Zeroed on the way out, not on the way in: whatever reached
		// it while it was spare, nothing of it reaches the new owner.
		clear(spare.buf)
		if spare.mr != nil {
			return &MR{dev: d, mr: spare.mr, buf: spare.buf, size: size, flags: flags, lkey: spare.lkey, rkey: spare.rkey}, 0, nil
		}
		buf = spare.buf
	} else {
		var err error
		if buf, err = verbs.AllocMem(size); err != nil {
			return nil, 0, err
		}
	}
	var e C.int
	mr := C.rs_reg_mr(d.pd, unsafe.Pointer(&buf[0]), C.size_t(len(buf)), flags, &e)
	if mr == nil {
		_ = verbs.FreeMem(buf)
		return nil, e, fmt.Errorf("ibverbs: register %d bytes: %w (RLIMIT_MEMLOCK may be too low)", size, errnoErr("reg MR", e))
	}
	m := &MR{dev: d, mr: mr, buf: buf, size: size, flags: flags, lkey: uint32(mr.lkey)}
	if flags&C.RS_ACCESS_REMOTE_WRITE != 0 {
		m.rkey = uint32(mr.rkey)
	}
	return m, 0, nil
}

// Bytes is the region's memory.
func (m *MR) Bytes() []byte { return m.buf }

// Addr is the region's virtual address, which peers use in WRITEs.
func (m *MR) Addr() uint64 { return uint64(uintptr(unsafe.Pointer(&m.buf[0]))) }

// RKey is the remote key (zero unless remote-writable).
func (m *MR) RKey() uint32 { return m.rkey }

// Close deregisters the region and unmaps its memory, or, on a Device that
// pools (pool.go), keeps it for the Device's next AllocMR of the same size
// and access, which zeroes it. A remote-writable region closed while a QP
// of its Device exists (a ring retired by growth, whose peer still holds
// its rkey) is retired: deregistered before Close returns, so that a
// WRITE with its old rkey fails at the device (StatusRemoteAccess at the
// peer; on iWARP the peer's connection ends), and only its memory is kept.
// (Not ibv_rereg_mr with IBV_REREG_MR_CHANGE_ACCESS, dropping remote
// write: Linux 6.1's rxe and siw have no rereg_user_mr, so it fails there,
// and where a device has it, it changes the keys like a registration.)
// A region closed with no QP of its Device left (a connection's end: rsock
// destroys the QP first) stays registered: no peer can reach it. So the
// pool's saving stays whole for the regions of ended connections, and a
// retired ring, at most one per connection that grows, costs one
// registration when it is handed out again.
func (m *MR) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	if m.dev.keepMR(m) {
		return nil
	}
	if err := m.free(); err != nil {
		return err
	}
	m.dev.dropLive()
	return nil
}

// retire deregisters the region, keeping its memory.
func (m *MR) retire() error {
	if e := C.rs_dereg_mr(m.mr); e != 0 {
		return errnoErr("dereg MR", e)
	}
	m.mr, m.lkey, m.rkey = nil, 0, 0
	return nil
}

// free deregisters the region, unless it is retired, and unmaps its
// memory.
func (m *MR) free() error {
	if m.mr != nil {
		if err := m.retire(); err != nil {
			// Still registered: the device may write into it, so it
			// is never unmapped.
			return err
		}
	}
	return verbs.FreeMem(m.buf)
}

// sge resolves a scatter entry to an address and key, checking that it
// lies inside an MR of this device.
func (d *Device) sge(s verbs.SGE) (addr uint64, lkey uint32, err error) {
	m, ok := s.MR.(*MR)
	if !ok || m == nil || m.dev.pd != d.pd {
		return 0, 0, fmt.Errorf("%w: %w", verbs.ErrBounds, errForeign)
	}
	if m.closed.Load() {
		return 0, 0, verbs.ErrClosed
	}
	if s.Offset < 0 || s.Length < 0 || s.Offset > len(m.buf) || s.Length > len(m.buf)-s.Offset {
		return 0, 0, fmt.Errorf("%w: %d bytes at %d of a %d-byte region", verbs.ErrBounds, s.Length, s.Offset, len(m.buf))
	}
	return m.Addr() + uint64(s.Offset), m.lkey, nil
}
