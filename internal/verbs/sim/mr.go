package sim

import (
	"sync"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// MR is a simulated memory region. It implements verbs.MR. Its memory comes
// from verbs.AllocMem and is freed by Close, which waits for any transfer
// copying from or into it to finish first.
type MR struct {
	dev    *Device
	buf    []byte // immutable; valid while not closed
	addr   uint64
	rkey   uint32
	access verbs.Access

	// mu is a leaf lock. pins counts transfers using buf; Close waits on
	// cond for them.
	mu     sync.Mutex
	cond   sync.Cond
	closed bool
	pins   int
}

var _ verbs.MR = (*MR)(nil)

// Bytes returns the region's memory, or nil after Close.
func (m *MR) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	return m.buf
}

// Addr returns the region's fake base address: a distinct non-zero multiple
// of 1<<40.
func (m *MR) Addr() uint64 { return m.addr }

// RKey returns the remote key, zero unless the region was registered with
// verbs.AccessRemoteWrite.
func (m *MR) RKey() uint32 { return m.rkey }

// Close deregisters the region and frees its memory. It blocks while a
// transfer is copying from or into the region. Requests that name the region
// later fail (locally with StatusFatal, remotely with StatusRemoteAccess). A
// second Close returns verbs.ErrClosed.
func (m *MR) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return verbs.ErrClosed
	}
	m.closed = true
	for m.pins > 0 {
		m.cond.Wait()
	}
	m.mu.Unlock()
	m.dev.forgetMR(m)
	releaseRKey(m.rkey)
	return verbs.FreeMem(m.buf)
}

// pin keeps the memory mapped until unpin; it returns nil once closed.
func (m *MR) pin() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.pins++
	return m.buf
}

func (m *MR) unpin() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pins--
	if m.pins == 0 && m.closed {
		m.cond.Broadcast()
	}
}

func (m *MR) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// inRemote reports whether [raddr, raddr+n) lies inside the region and
// returns the offset of raddr.
func (m *MR) inRemote(raddr uint64, n int) (int, bool) {
	if raddr < m.addr {
		return 0, false
	}
	off := raddr - m.addr
	size := uint64(len(m.buf))
	if off > size || uint64(n) > size-off {
		return 0, false
	}
	return int(off), true
}

// sgeIn reports whether off..off+n is a valid range of a region of size
// bytes.
func sgeIn(off, n, size int) bool {
	return off >= 0 && n >= 0 && off <= size && n <= size-off
}
