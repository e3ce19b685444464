//go:build linux

package rsock

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// unreadBytes is what the kernel holds unread on w's socket (SIOCINQ).
func (w *swConn) unreadBytes(t *testing.T) int {
	rc, err := w.raw.SyscallConn()
	require.NoError(t, err)
	n := -1
	require.NoError(t, rc.Control(func(fd uintptr) {
		n, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	}))
	require.NoError(t, err)
	return n
}

// TestReadingShortConnection: a connection that never upgrades runs no
// reader goroutine (its Reads read the socket), and its Close closes the
// socket at once, as plain TCP's does; the peer's reads still end in an
// orderly end, also when frames of its are unread at the Close or come
// after it.
func TestReadingShortConnection(t *testing.T) {
	registerSim(t)
	cfg := swCfg("sim", time.Hour)
	ln := listen(t, cfg)
	for _, tc := range []struct {
		name         string
		unread, late bool
	}{
		{"all read", false, false},
		{"a frame unread at Close", true, false},
		// A Read that timed out left its deadline, now past, on the
		// socket: Close reads what is unread all the same.
		{"a frame unread at Close, after a read timed out", true, true},
	} {
		unread := tc.unread
		t.Run(tc.name, func(t *testing.T) {
			c, s := dialAccept(t, ln, cfg)
			defer s.Close()
			_ = c.SetDeadline(time.Now().Add(time.Minute))
			_ = s.SetDeadline(time.Now().Add(time.Minute))
			got := make([]byte, 4)
			_, err := c.Write([]byte("ping"))
			require.NoError(t, err)
			_, err = io.ReadFull(s, got)
			require.NoError(t, err)
			_, err = s.Write([]byte("pong"))
			require.NoError(t, err)
			_, err = io.ReadFull(c, got)
			require.NoError(t, err)
			assert.Equal(t, "pong", string(got))
			bg, _ := c.w.readerState()
			assert.False(t, bg, "a short connection's Reads read the socket themselves")
			if tc.late {
				require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
				_, err = c.Read(got)
				require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			}
			if unread {
				// In c's socket, not read: without Close's reading of
				// it, the close would be a reset.
				_, err = s.Write([]byte("tail"))
				require.NoError(t, err)
				require.Eventually(t, func() bool { return c.w.unreadBytes(t) > 0 }, time.Minute, time.Millisecond)
			}

			require.NoError(t, c.Close())
			_, ended := c.w.readerState()
			assert.True(t, ended, "Close closed the socket at once")

			if !unread {
				// A frame after the close meets a reset; s's reads
				// still end in c's orderly end, which came first.
				_, err = s.Write([]byte("late"))
				require.NoError(t, err)
			}
			// (Unread bytes at the close would have made it a reset,
			// ending s's reads with an error.)
			n, err := s.Read(got)
			assert.Equal(t, 0, n)
			assert.Equal(t, io.EOF, err)
		})
	}
}
