//go:build !linux || rsock_tcponly

package rsock_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/rsockenv"
	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
	"github.com/rdmanet/rdmanet/rsock"
)

// TestTCPOnlyPlatform is rsock where no accelerated transport is built:
// every platform but Linux, and Linux built with the rsock_tcponly tag
// (`go test -tags rsock_tcponly -run TestTCPOnlyPlatform ./rsock/`). Through
// the public API only: connections run on TCP, say so with a reason that
// names the platform, are settled at once, and carry data both ways; a
// Dial that does not allow TCP fails with that reason; and a server here
// keeps a client that offers a ring (a Linux peer's) on TCP, saying why.
func TestTCPOnlyPlatform(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "") // the defaults: verbs, shm, tcp
	for _, name := range []string{"verbs", "shm"} {
		_, built := transport.Lookup(name)
		require.False(t, built, "%s is built into this binary", name)
	}
	absent := "not available on " + runtime.GOOS
	t.Run("dial", func(t *testing.T) {
		addr, accepted := serveEcho(t)
		c, err := rsock.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		roundTrip(t, c)
		assert.Equal(t, "tcp", rsock.TransportOf(c))
		info, ok := rsock.InfoOf(c)
		require.True(t, ok)
		assert.Equal(t, rsock.CodeNothingHere, info.Code)
		assert.True(t, info.Fallback)
		assert.Contains(t, info.Reason, "verbs: "+absent)
		assert.Contains(t, info.Reason, "shm: "+absent)
		t.Logf("client: %s (%s)", info.Reason, info.Code)
		assertSettled(t, c)
		s := <-accepted
		assert.Equal(t, "tcp", rsock.TransportOf(s))
		sinfo, _ := rsock.InfoOf(s)
		assert.Equal(t, rsock.CodePlainClient, sinfo.Code, sinfo.Reason) // this client sent no hello
	})

	t.Run("no-tcp", func(t *testing.T) {
		addr, _ := serveEcho(t)
		d := rsock.Dialer{Config: &rsock.Config{Transports: []string{"shm"}}}
		c, err := d.Dial("tcp", addr)
		if c != nil {
			c.Close()
		}
		require.ErrorIs(t, err, rsock.ErrNoTransport)
		assert.Contains(t, err.Error(), "shm: "+absent)
	})

	t.Run("ring-offered", func(t *testing.T) {
		// A client that offers a ring (sim, standing for a Linux peer's
		// shm or verbs, which the listener's configuration does not name).
		prev, had := transport.Lookup("sim")
		transport.Register("sim", sim.New())
		t.Cleanup(func() {
			if had {
				transport.Register("sim", prev)
			} else {
				transport.Unregister("sim")
			}
		})
		addr, accepted := serveEcho(t)
		d := rsock.Dialer{Config: &rsock.Config{Transports: []string{"sim", "tcp"}, UpgradeAfter: time.Nanosecond}}
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		roundTrip(t, c)
		assertSettled(t, c)
		assert.Equal(t, "tcp", rsock.TransportOf(c))
		info, _ := rsock.InfoOf(c)
		assert.True(t, info.Fallback)
		assert.Equal(t, rsock.CodeDeclined, info.Code, info.Reason)
		s := <-accepted
		assertSettled(t, s)
		assert.Equal(t, "tcp", rsock.TransportOf(s))
		sinfo, _ := rsock.InfoOf(s)
		assert.Contains(t, sinfo.Reason, "verbs ("+absent)
		assert.Contains(t, sinfo.Reason, "shm ("+absent)
		t.Logf("server: %s (%s)", sinfo.Reason, sinfo.Code)
	})
}

// serveEcho serves an echo on an rsock listener (default configuration)
// and sends each connection it accepts on accepted.
func serveEcho(t *testing.T) (addr string, accepted <-chan net.Conn) {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	ch := make(chan net.Conn, 16)
	go func() {
		for {
			s, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(s, s); _ = s.Close() }()
			ch <- s
		}
	}()
	return ln.Addr().String(), ch
}

// roundTrip writes 1 MiB through c, echoed by the server, and checks it
// comes back whole.
func roundTrip(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(time.Minute)))
	want := make([]byte, 1<<20)
	_, _ = rand.Read(want)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(want)
		errc <- err
	}()
	got := make([]byte, len(want))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.True(t, bytes.Equal(want, got), "the echo differs")
}

func assertSettled(t *testing.T, c net.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := rsock.WaitSettled(ctx, c)
	require.NoError(t, err, "not settled after a minute")
}
