package doctor

import (
	"bytes"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/rsockenv"
	"github.com/rdmanet/rdmanet/rsock"
)

func run(t *testing.T, o Options) (string, int) {
	t.Helper()
	var b bytes.Buffer
	status := Run(&b, o)
	t.Logf("%s", b.String())
	return b.String(), status
}

// TestDoctorOnThisHost: the report says whether there are RDMA devices
// (and why not), finds shm working by a connection to itself, and exits 0.
func TestDoctorOnThisHost(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "")
	out, status := run(t, Options{Timeout: 10 * time.Second})
	assert.Equal(t, 0, status)
	assert.Contains(t, out, "  valid")
	assert.Contains(t, out, "shm on 127.0.0.1: works (shm agreed")
	assert.Contains(t, out, "RLIMIT_MEMLOCK")
	assert.Contains(t, out, "memfd_create: works")
	assert.Contains(t, out, "abstract Unix sockets: work")
	assert.Contains(t, out, "network namespace: net:[")
	if _, err := os.Stat("/sys/class/infiniband"); err != nil {
		assert.Contains(t, out, "no RDMA device: ")
		assert.Contains(t, out, "verbs: not tried")
	}
}

// TestDoctorInvalidVariable: an invalid RSOCK_* variable is shown and
// makes the status 1.
func TestDoctorInvalidVariable(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_RING_SIZE", "3000")
	out, status := run(t, Options{})
	assert.Equal(t, 1, status)
	assert.Contains(t, out, "RSOCK_RING_SIZE=3000")
	assert.Contains(t, out, "INVALID: ")
}

// TestDoctorConnect: --connect reports the transport a connection gets:
// shm from an rsock listener here, TCP with the plain-server code from a
// plain server, and a failure (status 1) where nothing listens.
func TestDoctorConnect(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "shm,tcp")
	rsockenv.Setenv(t, "RSOCK_PROBE_CACHE_TTL", "0")
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	out, status := run(t, Options{Connect: ln.Addr().String()})
	assert.Equal(t, 0, status)
	assert.Contains(t, out, "transport shm (code agreed)")

	plain, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer plain.Close()
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }() // an echo server
		}
	}()
	out, status = run(t, Options{Connect: plain.Addr().String()})
	assert.Equal(t, 0, status)
	assert.Contains(t, out, "transport tcp (code plain-server)")

	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := dead.Addr().String()
	dead.Close()
	out, status = run(t, Options{Connect: addr, Timeout: 2 * time.Second})
	assert.Equal(t, 1, status)
	assert.Contains(t, out, "FAILED: ")
}
