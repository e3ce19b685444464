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
type MR struct {
	dev    *Device
	mr     *C.struct_rs_mr
	buf    []byte
	size   int   // as asked for
	flags  C.int // access flags
	lkey   uint32
	rkey   uint32 // zero unless remote-writable
	closed atomic.Bool
}

// AllocMR allocates and registers size bytes. A remote-writable region
// gets local write and remote write access, never remote read.
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
	if m, err := d.spareMR(size, flags); m != nil || err != nil {
		return m, err
	}
	m, e, err := d.register(size, flags)
	if err != nil && outOfMemory(e) {
		// Pooled regions count against RLIMIT_MEMLOCK too: give them
		// back and try once more.
		DrainPools()
		d.freeSpares()
		m, _, err = d.register(size, flags)
	}
	if err != nil {
		d.dropLive()
		return nil, err
	}
	return m, nil
}

// register allocates and registers a new region; e is the errno of a
// failed registration.
func (d *Device) register(size int, flags C.int) (*MR, C.int, error) {
	buf, err := verbs.AllocMem(size)
	if err != nil {
		return nil, 0, err
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
// pools (pool.go), zeroes it and keeps it for the Device's next AllocMR of
// the same size and access.
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

// free deregisters the region and unmaps its memory.
func (m *MR) free() error {
	if e := C.rs_dereg_mr(m.mr); e != 0 {
		// Still registered: the device may write into it, so it is
		// never unmapped.
		return errnoErr("dereg MR", e)
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
