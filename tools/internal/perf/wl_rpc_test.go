package perf

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A connection the client closes itself is no fault, even with a read
// pending that the close ends; one whose peer goes away while it is in
// use is, and broken names it.
func TestDialCounterFaults(t *testing.T) {
	dc := &dialCounter{watch: true}

	own, ownPeer := net.Pipe()
	defer ownPeer.Close()
	w := &watchedConn{Conn: own, dc: dc, id: 1}
	readDone := make(chan error, 1)
	go func() { _, err := w.Read(make([]byte, 1)); readDone <- err }()
	require.NoError(t, w.Close())
	require.ErrorIs(t, <-readDone, io.ErrClosedPipe)
	require.NoError(t, dc.broken(1), "a close of our own is no fault")

	lost, lostPeer := net.Pipe()
	w2 := &watchedConn{Conn: lost, dc: dc, id: 2}
	require.NoError(t, lostPeer.Close())
	_, err := w2.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	_, err = w2.Write([]byte{1})
	require.Error(t, err)
	require.NoError(t, w2.Close())
	dc.n.Store(2)

	err = dc.broken(1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "connection 2: read: EOF")
	assert.NotContains(t, err.Error(), "connection 2: write", "only the first error of a connection")
	assert.NotContains(t, err.Error(), "connection 1")
}
