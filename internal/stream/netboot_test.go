package stream

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// The engine's tests run a ring over a bootstrap of their own: one
// Goodbye each way on a net.Conn, which the peer's Watch reads.

// SetReadDeadline and SetWriteDeadline set the deadlines the tests' Conns
// were started with (startPair).
func (c *Conn) SetReadDeadline(t time.Time) error  { c.rd.dl.Set(t); return nil }
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wr.dl.Set(t); return nil }

// NetBootstrap is a Bootstrap on nc: after the switch, nc carries one
// Goodbye each way (Watch reads the peer's).
func NetBootstrap(nc net.Conn) Bootstrap { return &netBoot{Conn: nc} }

type netBoot struct {
	net.Conn
	once sync.Once
}

func (b *netBoot) Goodbye(g *handshake.Goodbye) {
	b.once.Do(func() {
		_ = b.SetWriteDeadline(time.Now().Add(time.Second))
		_ = handshake.Write(b.Conn, g)
		_ = b.Close()
	})
}

// Watch reads the bootstrap connection r after the switch and
// passes the one frame the peer sends there (or the end) to PeerSaid. It
// returns once r ends or Close closed it.
func (c *Conn) Watch(r io.Reader) {
	msg, err := handshake.Read(r)
	c.PeerSaid(msg, err)
}
