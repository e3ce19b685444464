package verbs

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// liveMem counts the mappings AllocMem made and FreeMem has not yet
// released. Private anonymous mappings are indistinguishable in
// /proc/self/maps from the Go heap's own, so leak tests ask LiveMem.
var liveMem atomic.Int64

// LiveMem reports how many AllocMem mappings are currently mapped.
func LiveMem() int { return int(liveMem.Load()) }

// AllocMem maps size bytes of zeroed anonymous memory outside the Go heap,
// rounded up to whole pages. The memory is marked MADV_DONTFORK so that a
// child started by os/exec never shares pages a NIC or a peer writes into.
// Free it with FreeMem.
func AllocMem(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("verbs: allocation of %d bytes", size)
	}
	page := unix.Getpagesize()
	n := (size + page - 1) &^ (page - 1)
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("verbs: mmap %d bytes: %w", n, err)
	}
	if err := unix.Madvise(b, unix.MADV_DONTFORK); err != nil {
		_ = unix.Munmap(b)
		return nil, fmt.Errorf("verbs: madvise DONTFORK: %w", err)
	}
	liveMem.Add(1)
	// The capacity stays the mapped length: FreeMem needs it.
	return b[:size], nil
}

// FreeMem unmaps memory returned by AllocMem.
func FreeMem(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	if err := unix.Munmap(b[:cap(b)]); err != nil {
		return err
	}
	liveMem.Add(-1)
	return nil
}
