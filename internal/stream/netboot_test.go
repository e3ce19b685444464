package stream

import (
	"errors"
	"fmt"
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

// NetBootstrap is an Owner on nc: after the switch, nc carries one
// Goodbye each way (Watch reads the peer's).
func NetBootstrap(nc net.Conn) Owner { return &netBoot{Conn: nc} }

type netBoot struct {
	net.Conn
	once sync.Once
}

func (b *netBoot) Goodbye(g *handshake.Goodbye) <-chan struct{} {
	b.once.Do(func() {
		_ = b.SetWriteDeadline(time.Now().Add(time.Second))
		_ = handshake.Write(b.Conn, g)
		_ = b.Close()
	})
	return closedChan
}

var closedChan = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

func (b *netBoot) Failed(_ *Conn, err error) {
	if errors.Is(err, ErrMoving) {
		panic("the engine's tests run without Failover")
	}
	b.Goodbye(&handshake.Goodbye{Abort: true, Reason: handshake.SanitizeReason(Why(err))})
}

// Watch reads the bootstrap connection r after the switch and passes the
// peer's goodbye to PeerGoodbye; an end without one is an abort. It
// returns once r ends or Close closed it.
func (c *Conn) Watch(r io.Reader) {
	msg, err := handshake.Read(r)
	g, ok := msg.(*handshake.Goodbye)
	if err != nil || !ok {
		g = &handshake.Goodbye{Abort: true, Reason: fmt.Sprintf("peer vanished: %v", err)}
	}
	c.PeerGoodbye(g)
}
