package rsock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
