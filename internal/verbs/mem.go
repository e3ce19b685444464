package verbs

import (
	"fmt"
	"os"
	"sync/atomic"
)

// liveMem counts the mappings AllocMem made and FreeMem has not yet
// released. Private anonymous mappings are indistinguishable in
// /proc/self/maps from the Go heap's own, so leak tests ask LiveMem.
var liveMem atomic.Int64

// LiveMem reports how many AllocMem mappings are currently mapped.
func LiveMem() int { return int(liveMem.Load()) }

// AllocMem maps size bytes of zeroed anonymous memory outside the Go heap,
// rounded up to whole pages (mapMem: on Linux marked MADV_DONTFORK, so
// that a child started by os/exec never shares pages a NIC or a peer
// writes into). Free it with FreeMem.
func AllocMem(size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("verbs: allocation of %d bytes", size)
	}
	page := os.Getpagesize()
	b, err := mapMem((size + page - 1) &^ (page - 1))
	if err != nil {
		return nil, err
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
	if err := unmapMem(b[:cap(b)]); err != nil {
		return err
	}
	liveMem.Add(-1)
	return nil
}
