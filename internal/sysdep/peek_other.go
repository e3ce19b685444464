//go:build unix && !linux

package sysdep

import "golang.org/x/sys/unix"

// peek peeks at one byte of fd without waiting.
func peek(fd uintptr, one *[1]byte) unix.Errno {
	_, _, err := unix.Recvfrom(int(fd), one[:], unix.MSG_PEEK) // the socket is non-blocking
	if errno, ok := err.(unix.Errno); ok {
		return errno
	}
	return 0
}
