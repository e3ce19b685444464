//go:build linux

package rsock

import (
	"io"
	"testing"

	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs/shm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShmMapBudgetFallsBack: past the process's mapping budget a new
// connection does not get shm: it continues on TCP and says why, and the
// connections that have shm keep working.
func TestShmMapBudgetFallsBack(t *testing.T) {
	cfg := &Config{Transports: []string{"shm", "tcp"}}
	ln := listen(t, cfg)
	c1, s1 := pipe(t, ln, cfg)
	defer c1.Close()
	defer s1.Close()
	require.Equal(t, "shm", TransportOf(c1), c1.Info().Reason)
	live, _ := shm.Mappings()
	old := shm.SetMapBudget(live + 2) // less than a connection needs
	defer shm.SetMapBudget(old)
	c2, s2 := pipe(t, ln, cfg)
	defer c2.Close()
	defer s2.Close()
	info := c2.Info()
	assert.Equal(t, "tcp", info.Transport)
	assert.True(t, info.Fallback)
	assert.Contains(t, info.Reason, "mapping budget")
	for _, p := range [][2]*Conn{{c1, s1}, {c2, s2}} {
		go func() { _, _ = io.Copy(p[1], p[1]) }()
		echoTrip(t, p[0], "still served")
	}
}

// TestSameHostPreparesShmOnly: a client whose peer is on this host
// prepares the shm endpoint and not the others (a verbs one would cost its
// registration for nothing: the server prefers shm); when shm cannot be
// prepared, it prepares the next.
func TestSameHostPreparesShmOnly(t *testing.T) {
	registerSim(t)
	counting := &slowOpen{Provider: simProv, fast: 1 << 30}
	transport.Register("sim", counting)
	t.Cleanup(func() { transport.Register("sim", simProv) })
	cfg := &Config{Transports: []string{"sim", "shm", "tcp"}}
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	assert.Equal(t, "shm", TransportOf(c), c.Info().Reason)
	assert.Equal(t, int32(0), counting.opens.Load(), "sim endpoints prepared beside shm")

	live, _ := shm.Mappings()
	old := shm.SetMapBudget(live) // shm cannot be prepared
	defer shm.SetMapBudget(old)
	c2, s2 := pipe(t, ln, cfg)
	defer c2.Close()
	defer s2.Close()
	assert.Equal(t, "sim", TransportOf(c2), c2.Info().Reason)
	assert.Equal(t, int32(2), counting.opens.Load(), "sim endpoints: the client's and the server's")
}
