package rsock

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/handshake"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t testing.TB) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s := <-accepted
	require.NotNil(t, s)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// TestSenderKeepsOrder: a held frame, Data written partly at once and
// partly by the goroutine, and a control frame behind them reach the peer
// whole and in order, whatever the socket took at each write.
func TestSenderKeepsOrder(t *testing.T) {
	a, b := tcpPair(t)
	require.NoError(t, a.SetWriteBuffer(4096)) // the first write is cut short
	rc, err := a.SyscallConn()
	require.NoError(t, err)
	var s sender
	s.init(a, rc)

	var want []byte
	held := []byte("hello") // shared: never written to
	want = append(want, held...)
	s.hold(held)
	payload := make([]byte, 3*handshake.MaxData+1000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	for off := 0; off < len(payload); off += handshake.MaxData {
		k := min(len(payload)-off, handshake.MaxData)
		var h [handshake.HeaderLen]byte
		handshake.PutDataHeader(&h, k)
		want = append(append(want, h[:]...), payload[off:off+k]...)
	}
	got := make(chan []byte, 1)
	go func() { all, _ := io.ReadAll(b); got <- all }()

	n, err := s.data(payload, deadline.New(), nil)
	require.NoError(t, err)
	require.Equal(t, len(payload), n)
	bye := &handshake.Fin{Cursor: uint64(len(payload))}
	want, err = handshake.Append(want, bye)
	require.NoError(t, err)
	_, err = s.sendAt(func(uint64) handshake.Message { return bye }, true)
	require.NoError(t, err)
	s.readerDone()
	s.finish(time.Minute)
	all := <-got
	require.Equal(t, len(want), len(all))
	require.True(t, bytes.Equal(want, all), "the bytes differ")
	require.Equal(t, "hello", string(held))
}
