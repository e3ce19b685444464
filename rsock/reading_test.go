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

// simPair is dialAccept on a new sim listener with cfg for both ends,
// closed when the test ends.
func simPair(t *testing.T, cfg *Config) (c, s *Conn) {
	t.Helper()
	registerSim(t)
	c, s = dialAccept(t, listen(t, cfg), cfg)
	t.Cleanup(func() {
		c.Close()
		s.Close()
	})
	return c, s
}

func (w *swConn) readerState() (bg, ended bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.reader >= readerLoop, w.reader == readerEnded
}

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

// TestReadingServerAnswersWithoutReads: a server whose application never
// reads still answers the client's offer (its reader starts on its own,
// serverReaderAfter after the handshake), and the connection reaches the
// ring.
func TestReadingServerAnswersWithoutReads(t *testing.T) {
	c, s := simPair(t, swCfg("sim", time.Nanosecond))
	awaitSettled(t, c, s)
	assert.Equal(t, "sim", TransportOf(c), c.Info().Reason)
	assert.Equal(t, "sim", TransportOf(s), s.Info().Reason)
}

// TestReadingHandsOverToTheReader: a Read waiting on the socket when the
// upgrade begins hands the socket to the reader goroutine and returns the
// peer's bytes from the ring.
func TestReadingHandsOverToTheReader(t *testing.T) {
	c, s := simPair(t, swCfg("sim", time.Hour))
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	read := make(chan string, 1)
	go func() {
		b := make([]byte, 8)
		n, err := c.Read(b)
		if err != nil {
			read <- err.Error()
			return
		}
		read <- string(b[:n])
	}()
	require.Eventually(t, func() bool {
		c.w.mu.Lock()
		defer c.w.mu.Unlock()
		return c.w.reader == readerApp
	}, time.Minute, time.Millisecond, "the Read reads the socket")
	c.w.kick() // the upgrade begins: the socket goes to the reader goroutine
	awaitSettled(t, c, s)
	require.Equal(t, "sim", TransportOf(c), c.Info().Reason)
	_, err := s.Write([]byte("ring"))
	require.NoError(t, err)
	assert.Equal(t, "ring", <-read)
	bg, _ := c.w.readerState()
	assert.True(t, bg)
}
