package rsock

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hourListener listens with an hour's sniff.
func hourListener(t *testing.T) *Listener {
	return listen(t, &Config{Transports: []string{"shm", "tcp"}, SniffTimeout: time.Hour})
}

func dialRaw(t *testing.T, ln *Listener) net.Conn {
	t.Helper()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	return raw
}

// TestCloseAsSniffStarts: a handshake whose listener closes just before
// it sets its sniff deadline ends at once: Close does not wait out the
// sniff.
func TestCloseAsSniffStarts(t *testing.T) {
	ln := hourListener(t)
	testHookSniff.set(func(*swConn) { _ = ln.shutdown(nil) })
	defer testHookSniff.set(nil)
	dialRaw(t, ln)
	require.Eventually(t, func() bool { return receivable(ln.ctx.Done()) }, 10*time.Second, time.Millisecond, "no handshake started")
	closed := make(chan struct{})
	go func() {
		ln.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waits for a handshake's sniff of an hour")
	}
}
