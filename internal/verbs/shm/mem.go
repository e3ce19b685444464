//go:build linux

package shm

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// MR is a memory region: a sealed memfd, or Go memory if local-only (see
// Memory in the package documentation). It implements verbs.MR.
type MR struct {
	dev    *Device
	mem    []byte // the whole mapping (page-rounded); nil for a local-only region
	buf    []byte // mem[:size], or the Go memory of a local-only region
	fd     int    // the memfd while a peer may need it, else -1 (guarded by dev.mu)
	addr   uint64
	rkey   uint32
	access verbs.Access

	// pins counts copies in progress from or into buf (local sources and
	// receive buffers, fd exports); mrClosed is set by Close, which then
	// waits for the count to drop to zero.
	pins atomic.Int64
}

const mrClosed = 1 << 62

var _ verbs.MR = (*MR)(nil)

// Bytes returns the region's local mapping, or nil after Close.
func (m *MR) Bytes() []byte {
	if m.pins.Load()&mrClosed != 0 {
		return nil
	}
	return m.buf
}

// Addr returns the region's base address for SendWR.RemoteAddr: a distinct
// non-zero multiple of 1<<36 (it is not a virtual address of either side).
func (m *MR) Addr() uint64 { return m.addr }

// RKey returns the remote key: non-zero and unique within the device if
// the region was registered with verbs.AccessRemoteWrite, else zero.
func (m *MR) RKey() uint32 { return m.rkey }

// Close deregisters the region and unmaps it here, after waiting (briefly)
// for copies in progress from or into it. Peers that mapped it keep it (see
// Deviations in the package documentation). A second Close returns
// verbs.ErrClosed.
func (m *MR) Close() error {
	if m.pins.Or(mrClosed)&mrClosed != 0 {
		return verbs.ErrClosed
	}
	for i := 0; m.pins.Load() != mrClosed; i++ {
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
	closeFD(m.dev.forgetMR(m))
	return unmap(m.mem)
}

// pin keeps the region mapped until unpin; it fails once Close started.
func (m *MR) pin() bool {
	if m.pins.Add(1)&mrClosed != 0 {
		m.pins.Add(-1)
		return false
	}
	return true
}

func (m *MR) unpin() { m.pins.Add(-1) }

// sgeIn reports whether off..off+n is a valid range of a region of size
// bytes.
func sgeIn(off, n, size int) bool {
	return off >= 0 && n >= 0 && off <= size && n <= size-off
}

// peerMR is a remote-writable region of the peer, mapped here.
type peerMR struct {
	rkey uint32
	addr uint64
	size uint64 // the region's size; mem may be longer (page-rounded)
	mem  []byte // mapped until the QP closes
}

// rangeOf returns the region's memory at raddr..raddr+n, or nil if that is
// outside the region.
func (p *peerMR) rangeOf(raddr uint64, n int) []byte {
	if raddr < p.addr || n < 0 {
		return nil
	}
	off := raddr - p.addr
	if off > p.size || uint64(n) > p.size-off {
		return nil
	}
	return p.mem[off : off+uint64(n) : off+uint64(n)]
}

// mapPeerMR validates and maps a peer's region from fd; it does not close fd.
func mapPeerMR(fd int, r mrRecord) (*peerMR, error) {
	switch {
	case r.rkey == 0:
		return nil, fmt.Errorf("shm: peer region with remote key 0")
	case r.size == 0 || r.size > MaxMRSize:
		return nil, fmt.Errorf("shm: peer region of %d bytes", r.size)
	case r.addr == 0 || r.addr+r.size < r.addr:
		return nil, fmt.Errorf("shm: peer region at %#x of %d bytes", r.addr, r.size)
	}
	mem, err := mapMemfd(fd, roundPage(int(r.size)))
	if err != nil {
		return nil, fmt.Errorf("shm: mapping a peer region: %w", err)
	}
	return &peerMR{rkey: r.rkey, addr: r.addr, size: r.size, mem: mem}, nil
}

// pageSize is the system page size.
var pageSize = unix.Getpagesize()

func roundPage(n int) int { return (n + pageSize - 1) &^ (pageSize - 1) }

// newMemfd creates a memfd of size bytes (a multiple of the page size),
// seals its size, and maps it shared and MADV_DONTFORK. The caller owns
// the fd and the mapping.
func newMemfd(name string, size int) (int, []byte, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("shm: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("shm: ftruncate memfd to %d bytes: %w", size, err)
	}
	// A peer that could shrink the file would make our accesses SIGBUS.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("shm: sealing memfd: %w", err)
	}
	mem, err := mmapShared(fd, size)
	if err != nil {
		_ = unix.Close(fd)
		return -1, nil, err
	}
	return fd, mem, nil
}

// mapMemfd checks that fd is a regular file of exactly size bytes, sealed
// against shrinking (see newMemfd), then maps it. It does not close fd.
func mapMemfd(fd int, size int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("not a regular file (mode %#o)", st.Mode)
	}
	if st.Size != int64(size) {
		return nil, fmt.Errorf("file of %d bytes, want %d", st.Size, size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("F_GET_SEALS: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, fmt.Errorf("file size not sealed against shrinking")
	}
	return mmapShared(fd, size)
}

// Every mapping this package makes counts against the process's mapping
// budget, four fifths of vm.max_map_count: the rest is left to the Go
// runtime (heap, thread stacks) and the rest of the process, which dies
// when the runtime finds no mapping for its heap. A mapping past the
// budget fails with ErrMapBudget; the connection that asked falls back.
var mappings struct {
	live   atomic.Int64
	budget atomic.Int64
}

func init() { mappings.budget.Store(int64(maxMapCount()) * 4 / 5) }

// maxMapCount reads vm.max_map_count, or returns the kernel's default.
func maxMapCount() int {
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			return n
		}
	}
	return 65530
}

// Mappings reports the memory mappings this package holds in the process,
// and its budget for them.
func Mappings() (live, budget int64) { return mappings.live.Load(), mappings.budget.Load() }

// SetMapBudget sets the mapping budget (tests and tools: the host's own
// limit is far off) and returns the previous one.
func SetMapBudget(n int64) int64 { return mappings.budget.Swap(n) }

func mmapShared(fd int, size int) ([]byte, error) {
	if n, b := mappings.live.Add(1), mappings.budget.Load(); n > b {
		mappings.live.Add(-1)
		return nil, fmt.Errorf("%w (%d mappings; vm.max_map_count %d)", ErrMapBudget, b, maxMapCount())
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		mappings.live.Add(-1)
		return nil, fmt.Errorf("shm: mmap %d bytes: %w", size, err)
	}
	if err := unix.Madvise(mem, unix.MADV_DONTFORK); err != nil {
		_ = unmap(mem)
		return nil, fmt.Errorf("shm: madvise DONTFORK: %w", err)
	}
	return mem, nil
}

// unmap unmaps a mapping made by mmapShared.
func unmap(mem []byte) error {
	if cap(mem) == 0 {
		return nil
	}
	mappings.live.Add(-1)
	return unix.Munmap(mem[:cap(mem)])
}

// checkEventfd reports whether fd is an eventfd: the peer writes to it, so
// it must not be something that could block or have side effects.
func checkEventfd(fd int) error {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fmt.Errorf("shm: peer eventfd: %w", err)
	}
	if link != "anon_inode:[eventfd]" {
		return fmt.Errorf("shm: peer sent %q where an eventfd belongs", link)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return fmt.Errorf("shm: peer eventfd: %w", err)
	}
	if fl&unix.O_NONBLOCK == 0 {
		return fmt.Errorf("shm: peer eventfd is in blocking mode")
	}
	return nil
}

// closeFD closes fd unless it is negative (no descriptor).
func closeFD(fd int) {
	if fd >= 0 {
		_ = unix.Close(fd)
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		closeFD(fd)
	}
}
