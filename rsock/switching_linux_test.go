//go:build linux

package rsock

import (
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs/shm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSwitchCloseRacesUpgrade: connections closed at once or soon after
// the dial, by either side, while the upgrade runs, release everything:
// the shm mappings return to where they were.
func TestSwitchCloseRacesUpgrade(t *testing.T) {
	cfg := swCfg("shm", time.Nanosecond)
	ln := listen(t, cfg)
	before, _ := shm.Mappings()
	for i := range 40 {
		c, s := dialAccept(t, ln, cfg)
		if i%4 == 3 {
			awaitSettled(t, c, s)
		}
		first, second := c, s
		if i%2 == 1 {
			first, second = s, c
		}
		if i%3 == 0 {
			_, _ = first.Write([]byte("hello"))
		}
		require.NoError(t, first.Close())
		_ = second.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := io.Copy(io.Discard, second)
		if err != nil {
			assert.ErrorIs(t, err, syscall.ECONNRESET)
		}
		require.NoError(t, second.Close())
	}
	deadline := time.Now().Add(time.Minute)
	for {
		live, _ := shm.Mappings()
		if live <= before {
			break
		}
		require.True(t, time.Now().Before(deadline), "shm mappings: %d before, %d a minute after closing", before, live)
		time.Sleep(10 * time.Millisecond)
	}
}
