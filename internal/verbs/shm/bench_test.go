//go:build linux

package shm

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// BenchmarkPostPollSend32 is the cost of one 32-byte inline SEND between
// two QPs of this process: post, poll the receive completion, re-post the
// RECV; a send completion every 16 posts is polled too. One goroutine.
func BenchmarkPostPollSend32(b *testing.B) {
	a, z := pair(b, 64)
	slots := z.postRecvs(b, 64, 64)
	wr := verbs.SendWR{Op: verbs.OpSend, Inline: make([]byte, 32)}
	recv := verbs.RecvWR{Local: verbs.SGE{MR: slots, Length: 64}}
	wc := make([]verbs.Completion, 4)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		wr.ID, wr.Signaled = uint64(i), i%16 == 15
		if err := a.qp.PostSend(&wr); err != nil {
			b.Fatal(err)
		}
		if n, err := z.cq.Poll(wc); n != 1 || err != nil {
			b.Fatalf("Poll: %d, %v", n, err)
		}
		recv.ID, recv.Local.Offset = wc[0].ID, int(wc[0].ID)*64
		if err := z.qp.PostRecv(&recv); err != nil {
			b.Fatal(err)
		}
		if wr.Signaled {
			if _, err := a.cq.Poll(wc); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// pingPonger is one side of a ping-pong modelled on rsock: the payload is
// copied straight into the peer's ring (MapRemote), then a 32-byte state
// message is SENT; the receiver copies the payload out of its own ring.
type pingPonger struct {
	e      *end
	ring   *MR
	slots  *MR
	direct []byte
	msg    [32]byte
	wc     [1]verbs.Completion
	sent   int
	parks  int // times recv waited for a notification
}

func newPingPongers(b *testing.B, ringSize int) (x, y *pingPonger) {
	a, z := openEnd(b, 64), openEnd(b, 64)
	x, y = &pingPonger{e: a}, &pingPonger{e: z}
	for _, p := range []*pingPonger{x, y} {
		p.ring = p.e.alloc(b, ringSize, verbs.AccessRemoteWrite)
		p.slots = p.e.postRecvs(b, 64, 64)
	}
	connect(b, a, z)
	var err error
	if x.direct, err = a.qp.MapRemote(y.ring.Addr(), y.ring.RKey(), ringSize); err != nil {
		b.Fatal(err)
	}
	if y.direct, err = z.qp.MapRemote(x.ring.Addr(), x.ring.RKey(), ringSize); err != nil {
		b.Fatal(err)
	}
	return x, y
}

// send copies data into the peer's ring at off and posts the state message.
func (p *pingPonger) send(b *testing.B, data []byte, off int) {
	copy(p.direct[off:], data)
	binary.LittleEndian.PutUint64(p.msg[:], uint64(off))
	binary.LittleEndian.PutUint64(p.msg[8:], uint64(len(data)))
	p.sent++
	wr := verbs.SendWR{ID: uint64(p.sent), Op: verbs.OpSend, Inline: p.msg[:], Signaled: p.sent%16 == 0}
	if err := p.e.qp.PostSend(&wr); err != nil {
		b.Error(err)
	}
}

// spinFor is how long a benchmark waiter busy-polls before it arms the CQ
// and waits for its notification (rsock's BusyPoll). It only matters when cores are short: with a
// free core per side, the answer comes well within it.
const spinFor = 50 * time.Microsecond

// recv busy-polls for the next message, parking after spinFor, and copies
// its payload into buf.
func (p *pingPonger) recv(b *testing.B, buf []byte) int {
	var start time.Time
	for i := 0; ; i++ {
		n, err := p.e.cq.Poll(p.wc[:1]) // one at a time: nothing to keep for later
		if err != nil {
			b.Error(err)
			return 0
		}
		if n == 0 && i%64 == 63 {
			switch {
			case start.IsZero():
				start = time.Now()
			case time.Since(start) > spinFor:
				if err := p.e.cq.Arm(); err != nil {
					b.Error(err)
					return 0
				}
				if n, err = p.e.cq.Poll(p.wc[:1]); n == 0 && err == nil {
					p.parks++
					<-bellOf(p.e.cq).ch
				}
				if err != nil {
					b.Error(err)
					return 0
				}
				start = time.Time{}
			}
		}
		for _, c := range p.wc[:n] {
			if c.Op != verbs.OpRecv {
				continue // a send completion
			}
			if c.Status != verbs.StatusSuccess {
				b.Errorf("completion %+v", c)
				return 0
			}
			m := p.slots.Bytes()[int(c.ID)*64:]
			off, size := int(binary.LittleEndian.Uint64(m)), int(binary.LittleEndian.Uint64(m[8:]))
			copy(buf, p.ring.Bytes()[off:off+size])
			if err := p.e.qp.PostRecv(&verbs.RecvWR{ID: c.ID, Local: verbs.SGE{MR: p.slots, Offset: int(c.ID) * 64, Length: 64}}); err != nil {
				b.Error(err)
			}
			return size
		}
	}
}

// BenchmarkPingPong64 is a 64-byte round trip between two goroutines that
// busy-poll (ns/op is the round-trip time).
func BenchmarkPingPong64(b *testing.B) {
	x, y := newPingPongers(b, 1<<16)
	data, buf := make([]byte, 64), make([]byte, 64)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64)
		for range b.N {
			y.recv(b, buf)
			y.send(b, buf, 0)
		}
	})
	b.ResetTimer()
	for range b.N {
		x.send(b, data, 0)
		x.recv(b, buf)
	}
	wg.Wait()
	b.ReportMetric(float64(x.parks+y.parks)/float64(b.N), "parks/op")
}

// BenchmarkTCPPingPong64 is the same round trip over TCP loopback.
func BenchmarkTCPPingPong64(b *testing.B) {
	c1, c2 := tcpPair(b)
	data, buf := make([]byte, 64), make([]byte, 64)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64)
		for range b.N {
			if _, err := io.ReadFull(c2, buf); err != nil {
				b.Error(err)
				return
			}
			if _, err := c2.Write(buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ResetTimer()
	for range b.N {
		if _, err := c1.Write(data); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c1, buf); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}

// BenchmarkStream1MiB streams 1 MiB writes through a 4 MiB ring: the writer
// copies into the peer's ring, the reader copies out into its buffer and
// returns a credit message per chunk (as rsock does, two copies, like TCP).
func BenchmarkStream1MiB(b *testing.B) {
	const chunk, ringSize = 1 << 20, 4 << 20
	x, y := newPingPongers(b, ringSize)
	data := make([]byte, chunk)
	credit := make([]byte, 0)
	b.SetBytes(chunk)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, chunk)
		for range b.N {
			y.recv(b, buf)
			y.send(b, credit, 0)
		}
	})
	b.ResetTimer()
	inflight := 0
	for i := range b.N {
		if inflight == ringSize/chunk {
			x.recv(b, nil)
			inflight--
		}
		x.send(b, data, (i%(ringSize/chunk))*chunk)
		inflight++
	}
	for ; inflight > 0; inflight-- {
		x.recv(b, nil)
	}
	wg.Wait()
	b.ReportMetric(float64(x.parks+y.parks)/float64(b.N), "parks/op")
}

// BenchmarkTCPStream1MiB is the same stream over TCP loopback.
func BenchmarkTCPStream1MiB(b *testing.B) {
	const chunk = 1 << 20
	c1, c2 := tcpPair(b)
	data := make([]byte, chunk)
	b.SetBytes(chunk)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, chunk)
		for range b.N {
			if _, err := io.ReadFull(c2, buf); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ResetTimer()
	for range b.N {
		if _, err := c1.Write(data); err != nil {
			b.Fatal(err)
		}
	}
	wg.Wait()
}

func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	c2, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c1.Close(); _ = c2.Close() })
	return c1, c2
}

// BenchmarkAllocRing is what a pool of memfds could save a connection:
// a 1 MiB remote-writable region made (memfd, size, seals, mapping) and
// closed. rsock's shm setup (two processes, the default handshake) takes
// hundreds of microseconds (BENCHMARKS.md), one such region per side.
func BenchmarkAllocRing(b *testing.B) {
	d, err := New().Open(verbs.OpenOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	b.ReportAllocs()
	for b.Loop() {
		mr, err := d.AllocMR(1<<20, verbs.AccessRemoteWrite)
		if err != nil {
			b.Fatal(err)
		}
		_ = mr.Close()
	}
}
