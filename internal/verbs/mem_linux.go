package verbs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

func mapMem(n int) ([]byte, error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("verbs: mmap %d bytes: %w", n, err)
	}
	if err := unix.Madvise(b, unix.MADV_DONTFORK); err != nil {
		_ = unix.Munmap(b)
		return nil, fmt.Errorf("verbs: madvise DONTFORK: %w", err)
	}
	return b, nil
}

func unmapMem(b []byte) error { return unix.Munmap(b) }
