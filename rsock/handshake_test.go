package rsock

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// fakeServer answers each connection with answer(n, conn), n counting from 0.
func fakeServer(t *testing.T, answer func(n int, c net.Conn)) string {
	t.Helper()
	var n atomic.Int32
	return plainServer(t, func(c net.Conn) { answer(int(n.Add(1)-1), c) })
}

func TestVersionDeclineRedialsPlainly(t *testing.T) {
	addr := fakeServer(t, func(n int, c net.Conn) {
		if n == 0 {
			_, _ = handshake.Read(c)
			_ = handshake.Write(c, &handshake.Decline{Code: handshake.DeclineVersion, Reason: "server speaks version 2"})
			c.Close()
			return
		}
		echo(c)
	})
	c, err := dialProbing(t, addr, nil)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, "tcp", c.Info().Transport)
	assert.Contains(t, c.Info().Reason, "version")
	_, err = c.Write([]byte("hi"))
	require.NoError(t, err)
	got := make([]byte, 2)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(got))
	assert.False(t, plainServers.known("tcp "+addr), "a version decline is not a plain-server verdict")
}

func TestMalformedAnswerRedialsPlainly(t *testing.T) {
	addr := fakeServer(t, func(n int, c net.Conn) {
		if n == 0 {
			_, _ = handshake.Read(c)
			_, _ = c.Write(append([]byte(handshake.Magic), 1, 99, 0, 0)) // unknown type
			c.Close()
			return
		}
		echo(c)
	})
	c, err := dialProbing(t, addr, nil)
	require.NoError(t, err)
	defer c.Close()
	assert.Equal(t, "tcp", c.Info().Transport)
	assert.Contains(t, c.Info().Reason, "did not parse")
}

func TestClientHandshakeIsBounded(t *testing.T) {
	// The server answers with the magic and then stalls forever.
	addr := fakeServer(t, func(n int, c net.Conn) {
		_, _ = handshake.Read(c)
		_, _ = c.Write([]byte(handshake.Magic))
		time.Sleep(10 * time.Second)
		c.Close()
	})
	t.Cleanup(func() { plainServers.forget("tcp " + addr) })
	start := time.Now()
	_, err := dialProbing(t, addr, &Config{HandshakeTimeout: 200 * time.Millisecond})
	require.Error(t, err)
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestOversizedPeerRingDeclined: an offer whose ring is over what the
// server accepts is declined, and the connection goes on on TCP.
func TestOversizedPeerRingDeclined(t *testing.T) {
	registerSim(t)
	ln := listen(t, simCfg())
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	require.NoError(t, handshake.Write(c, &handshake.Hello{Flags: handshake.FlagSwitch, Offers: []handshake.Offer{{Transport: handshake.TransportSim}}}))
	msg, err := handshake.Read(c)
	require.NoError(t, err)
	require.IsType(t, &handshake.Upgrade{}, msg)
	s := <-accepted
	defer s.Close()
	require.NoError(t, handshake.Write(c, &handshake.UpgradeOffer{Offer: handshake.Offer{
		Transport: handshake.TransportSim,
		Ring:      handshake.RingInfo{Size: 1 << 30, Credits: 64},
		Info:      []byte("x"),
	}}))
	msg, err = handshake.Read(c)
	require.NoError(t, err)
	d, ok := msg.(*handshake.Decline)
	require.True(t, ok, "%T", msg)
	assert.Contains(t, d.Reason, "over the limit")
}

func TestLateHelloIsDeclinedNotDelivered(t *testing.T) {
	for _, early := range []int{0, 3} { // bytes of the magic sent in time
		t.Run(fmt.Sprintf("early=%d", early), func(t *testing.T) {
			ln := listen(t, &Config{SniffTimeout: 50 * time.Millisecond})
			got := make(chan string, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				b := make([]byte, 5)
				_, err = io.ReadFull(c, b)
				got <- string(b)
				if err == nil {
					_, _ = c.Write([]byte("pong!"))
				}
				info, _ := InfoOf(c)
				assert.Contains(t, info.Reason, "sniff timeout")
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			require.NoError(t, err)
			defer c.Close()
			hello, err := handshake.Append(nil, &handshake.Hello{Offers: []handshake.Offer{{Transport: handshake.TransportSim, Ring: handshake.RingInfo{Size: 4096, Credits: 8}}}})
			require.NoError(t, err)
			_, err = c.Write(hello[:early])
			require.NoError(t, err)
			time.Sleep(150 * time.Millisecond) // past the sniff timeout
			_, err = c.Write(hello[early:])
			require.NoError(t, err)
			msg, err := handshake.Read(c)
			require.NoError(t, err)
			d, ok := msg.(*handshake.Decline)
			require.True(t, ok, "%T", msg)
			assert.Equal(t, handshake.DeclinePolicy, d.Code)
			// Both carry on over this TCP connection; the application
			// never saw the hello.
			_, err = c.Write([]byte("ping!"))
			require.NoError(t, err)
			assert.Equal(t, "ping!", <-got)
			b := make([]byte, 5)
			_, err = io.ReadFull(c, b)
			require.NoError(t, err)
			assert.Equal(t, "pong!", string(b))
		})
	}
}

func TestLatePlainClientStillReplayed(t *testing.T) {
	// A plain client that is slow to speak is not mistaken for anything.
	ln := listen(t, &Config{SniffTimeout: 50 * time.Millisecond})
	go func() {
		c, err := ln.Accept()
		if err == nil {
			echo(c)
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	time.Sleep(150 * time.Millisecond)
	_, err = c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	require.NoError(t, err)
	b := make([]byte, 18)
	_, err = io.ReadFull(c, b)
	require.NoError(t, err)
	assert.Equal(t, "GET / HTTP/1.0\r\n\r\n", string(b))
}
