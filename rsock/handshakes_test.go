package rsock

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// An Accept with nothing else to do waits for a new connection's first
// bytes itself (awaitFirst). These tests run Accept's part
// (acceptArrived) on sockets accepted from a listener of their own, so
// that whether Accept was waiting when a connection came plays no part,
// and give the sniff an hour, so that only what they do ends the wait.

// awaiting is the result of acceptArrived run in the background.
type awaiting chan *Conn

// awaitOn runs ln's acceptArrived on a socket accepted from a plain
// listener of the test's, and returns the client's end and the result.
func awaitOn(t *testing.T, ln *Listener) (net.Conn, awaiting) {
	t.Helper()
	side, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer side.Close()
	client, err := net.Dial("tcp", side.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })
	s, err := side.Accept()
	require.NoError(t, err)
	res := make(awaiting, 1)
	go func() { res <- ln.acceptArrived(&arrival{raw: s.(*net.TCPConn)}) }()
	return client, res
}

// result waits for acceptArrived's result.
func (r awaiting) result(t *testing.T, why string) *Conn {
	t.Helper()
	select {
	case c := <-r:
		return c
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: acceptArrived did not return", why)
		return nil
	}
}

// hourListener listens with an hour's sniff.
func hourListener(t *testing.T) *Listener {
	return listen(t, &Config{Transports: []string{"shm", "tcp"}, SniffTimeout: time.Hour})
}

// waitingFirst waits until an Accept of ln waits for a first read.
func waitingFirst(t *testing.T, ln *Listener) {
	t.Helper()
	require.Eventually(t, func() bool {
		ln.firstMu.Lock()
		defer ln.firstMu.Unlock()
		return ln.firstRaw != nil && !ln.firstStop
	}, 10*time.Second, time.Millisecond, "no Accept waits for a first read")
}

// earlyHelloFrame is a switching client's first bytes: the magic and its
// hello.
func earlyHelloFrame(t *testing.T) []byte {
	t.Helper()
	h := switchHello([]string{"shm"})
	h.Flags |= handshake.FlagEarly
	b, err := handshake.Append(nil, h)
	require.NoError(t, err)
	return b
}

// acceptedFrom waits for ln's next connection and checks that it is
// raw's other end.
func acceptedFrom(t *testing.T, ln *Listener, raw net.Conn, why string) *Conn {
	t.Helper()
	res := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		res <- c
	}()
	select {
	case c := <-res:
		require.NotNil(t, c, "%s: the listener closed", why)
		assert.Equal(t, raw.LocalAddr().String(), c.RemoteAddr().String(), "%s: the connection accepted", why)
		return c.(*Conn)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing accepted", why)
		return nil
	}
}

func dialRaw(t *testing.T, ln *Listener) net.Conn {
	t.Helper()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	return raw
}

// TestAcceptAwaitsFirstBytes: a hello that comes after the connection was
// accepted is answered by the waiting Accept, with no handshaker, and the
// connection is a switching one.
func TestAcceptAwaitsFirstBytes(t *testing.T) {
	ln := hourListener(t)
	client, res := awaitOn(t, ln)
	waitingFirst(t, ln)
	_, err := client.Write(earlyHelloFrame(t))
	require.NoError(t, err)
	c := res.result(t, "the hello after the accept")
	require.NotNil(t, c, "no connection")
	defer c.Close()
	require.NotNil(t, c.w, "a switching connection")
	assert.Equal(t, CodeUpgrading, c.Info().Code)
	assert.Zero(t, ln.handedOff.Load(), "sockets given to a handshaker")
}

// TestAcceptWaitEndsForNext: a silent connection does not hold Accept
// when the accept loop has the next one; the silent one goes to a
// handshaker, which still answers it when its hello comes.
func TestAcceptWaitEndsForNext(t *testing.T) {
	ln := hourListener(t)
	silent, res := awaitOn(t, ln)
	waitingFirst(t, ln)
	next := dialRaw(t, ln)
	_, err := next.Write(earlyHelloFrame(t))
	require.NoError(t, err)
	c := res.result(t, "the next connection, the first still silent")
	require.NotNil(t, c, "no connection")
	defer c.Close()
	assert.Equal(t, next.LocalAddr().String(), c.RemoteAddr().String(), "the connection answered")
	assert.EqualValues(t, 1, ln.handedOff.Load(), "sockets given to a handshaker")

	_, err = silent.Write(earlyHelloFrame(t))
	require.NoError(t, err)
	c = acceptedFrom(t, ln, silent, "the first, once it spoke")
	defer c.Close()
	require.NotNil(t, c.w, "a switching connection")
}

// TestAcceptWaitEndsForReady: a handshake a handshaker finishes is not
// held behind a silent connection Accept waits on.
func TestAcceptWaitEndsForReady(t *testing.T) {
	ln := hourListener(t)
	frame := earlyHelloFrame(t)
	// Part of a hello, with no Accept running: a handshaker waits for
	// the rest.
	slow := dialRaw(t, ln)
	_, err := slow.Write(frame[:len(handshake.Magic)+2])
	require.NoError(t, err)
	require.Eventually(t, func() bool { return ln.handedOff.Load() == 1 }, 10*time.Second, time.Millisecond, "the socket was not handed over")
	_, res := awaitOn(t, ln)
	waitingFirst(t, ln)
	_, err = slow.Write(frame[len(handshake.Magic)+2:])
	require.NoError(t, err)
	assert.Nil(t, res.result(t, "the silent one's wait, a handshake finished"))
	c := acceptedFrom(t, ln, slow, "the handshaker's")
	defer c.Close()
	require.NotNil(t, c.w, "a switching connection")
}

// TestAcceptWaitEndsAtClose: Close ends an Accept's wait for a first
// read.
func TestAcceptWaitEndsAtClose(t *testing.T) {
	ln := hourListener(t)
	_, res := awaitOn(t, ln)
	waitingFirst(t, ln)
	require.NoError(t, ln.Close())
	assert.Nil(t, res.result(t, "the wait, the listener closed"))
	_, err := ln.Accept()
	assert.ErrorIs(t, err, net.ErrClosed)
}

// TestCloseAsSniffStarts: a handshake whose listener closes just before
// it sets its sniff deadline ends at once: Close does not wait out the
// sniff.
func TestCloseAsSniffStarts(t *testing.T) {
	ln := hourListener(t)
	testHookSniff.set(func(*swConn) { _ = ln.shutdown(nil) })
	defer testHookSniff.set(nil)
	dialRaw(t, ln) // no Accept runs: a handshaker takes it
	require.Eventually(t, func() bool { return receivable(ln.done) }, 10*time.Second, time.Millisecond, "no handshake started")
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
