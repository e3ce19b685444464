//go:build linux

package rsock

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSenderQuiet: quiet is true only while the socket holds nothing the
// peer sent that is unread, and the sender holds no frame; what Close
// then skips (reading the socket, SIOCOUTQ) would have found nothing.
func TestSenderQuiet(t *testing.T) {
	a, b := tcpPair(t)
	rc, err := a.SyscallConn()
	require.NoError(t, err)
	var s sender
	s.init(a, rc)
	assert.True(t, s.delivered(true), "a fresh connection")

	s.hold([]byte("held"))
	assert.False(t, s.delivered(true), "a held frame")
	s.held = nil

	_, err = b.Write([]byte("x"))
	require.NoError(t, err)
	// Wait until the byte is in a's receive queue.
	require.NoError(t, rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		_, err = unix.Poll(fds, 5000)
	}))
	require.NoError(t, err)
	assert.False(t, s.delivered(true), "a byte of the peer's unread")

	_, err = a.Read(make([]byte, 1))
	require.NoError(t, err)
	assert.True(t, s.delivered(true), "the byte was read")
}
