package sim_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

func TestSendLargerThanRecvBuffer(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	rbuf := b.alloc(4096, localWrite)
	b.recvs(rbuf, 0, 3, 8)
	a.post(verbs.SendWR{ID: 1, Op: verbs.OpSend, Inline: make([]byte, 9), Signaled: true})
	status(t, a.poll(1)[0], 1, verbs.StatusRemoteAccess)
	wc := b.poll(3)
	status(t, wc[0], 0, verbs.StatusLocalLength)
	status(t, wc[1], 1, verbs.StatusFlushed)
	status(t, wc[2], 2, verbs.StatusFlushed)
	if err := isQPState(b.qp.PostRecv(&verbs.RecvWR{ID: 5})); err != nil {
		t.Errorf("receiver after a length error: %v", err)
	}
}

func TestRNR(t *testing.T) {
	t.Run("Send", func(t *testing.T) {
		a, b := newPair(t, sim.New(), defaultEnd)
		b.qp.Stall(true)                                                   // hold both, so that the second is posted before the first fails
		a.post(verbs.SendWR{ID: 1, Op: verbs.OpSend, Inline: []byte("x")}) // failures complete even unsignaled
		a.sendU64(2, 2)
		b.qp.Stall(false)
		wc := a.poll(2)
		status(t, wc[0], 1, verbs.StatusRNR)
		status(t, wc[1], 2, verbs.StatusFlushed)
		b.empty()
	})
}

func TestRemoteAccessFailsResponderToo(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	dst := b.alloc(64, remoteWrite)
	rbuf := b.alloc(64, localWrite)
	b.recvs(rbuf, 0, 2, 8)
	a.post(verbs.SendWR{ID: 1, Op: verbs.OpWrite, Inline: []byte("data"), RemoteAddr: dst.Addr() + 62, RKey: dst.RKey()})
	status(t, a.poll(1)[0], 1, verbs.StatusRemoteAccess)
	wc := b.poll(2)
	status(t, wc[0], 0, verbs.StatusFlushed)
	status(t, wc[1], 1, verbs.StatusFlushed)
}

func TestWriteKeyResolvedInPeerDomainOnly(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	own := a.alloc(64, remoteWrite) // a's key is meaningless at b
	_ = b.alloc(64, remoteWrite)
	a.post(verbs.SendWR{ID: 1, Op: verbs.OpWrite, Inline: []byte("x"), RemoteAddr: own.Addr(), RKey: own.RKey(), Signaled: true})
	status(t, a.poll(1)[0], 1, verbs.StatusRemoteAccess)
	if own.Bytes()[0] != 0 {
		t.Error("WRITE landed in the sender's own domain")
	}
}

func TestZeroLengthWriteChecksNothing(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	a.post(verbs.SendWR{ID: 1, Op: verbs.OpWrite, RemoteAddr: 12345, RKey: 777, Signaled: true})
	status(t, a.poll(1)[0], 1, verbs.StatusSuccess)
	// A zero-length RECV without an MR takes a zero-length SEND.
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 3}); err != nil {
		t.Fatal(err)
	}
	a.post(verbs.SendWR{ID: 4, Op: verbs.OpSend, Signaled: true})
	status(t, b.poll(1)[0], 3, verbs.StatusSuccess)
	status(t, a.poll(1)[0], 4, verbs.StatusSuccess)
}

// TestSourceReadAtDelivery: a non-inline source is read when the transfer
// is delivered, so reusing it before completion is visible (as on hardware).
func TestSourceReadAtDelivery(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	src := a.alloc(8, localWrite)
	rbuf := b.alloc(8, localWrite)
	b.recvs(rbuf, 0, 1, 8)
	copy(src.Bytes(), "original")
	b.qp.Stall(true)
	a.post(verbs.SendWR{ID: 1, Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: 8}, Signaled: true})
	copy(src.Bytes(), "modified")
	b.qp.Stall(false)
	status(t, b.poll(1)[0], 0, verbs.StatusSuccess)
	if string(rbuf.Bytes()) != "modified" {
		t.Errorf("peer got %q", rbuf.Bytes())
	}

	// Inline data, in contrast, is copied by PostSend.
	b.recvs(rbuf, 0, 1, 8)
	inline := []byte("inline!!")
	b.qp.Stall(true)
	a.post(verbs.SendWR{ID: 2, Op: verbs.OpSend, Inline: inline, Signaled: true})
	copy(inline, "changed!")
	b.qp.Stall(false)
	status(t, b.poll(1)[0], 0, verbs.StatusSuccess)
	if string(rbuf.Bytes()) != "inline!!" {
		t.Errorf("peer got %q for held inline data", rbuf.Bytes())
	}
}

func TestMRClosedUnderRequest(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	src := a.alloc(8, localWrite)
	rbuf := b.alloc(8, localWrite)
	b.recvs(rbuf, 0, 1, 8)
	b.qp.Stall(true)
	a.post(verbs.SendWR{ID: 1, Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: 8}, Signaled: true})
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if src.Bytes() != nil {
		t.Error("Bytes after Close")
	}
	b.qp.Stall(false)
	status(t, a.poll(1)[0], 1, verbs.StatusFatal)
	err := a.qp.PostSend(&verbs.SendWR{Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: 8}})
	if !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("post after fatal error: %v", err)
	}
}

// TestRecvBeforeConnect: a new QP is in INIT, where RECVs may be posted
// before its Info goes to the peer.
func TestRecvBeforeConnect(t *testing.T) {
	p := sim.New()
	a, b := newEnd(t, p, defaultEnd), newEnd(t, p, defaultEnd)
	rbuf := b.alloc(64, localWrite)
	b.recvs(rbuf, 0, 2, 8)
	connect(t, a, b)
	a.sendU64(1, 11)
	a.sendU64(2, 22)
	wc := b.poll(2)
	status(t, wc[0], 0, verbs.StatusSuccess)
	status(t, wc[1], 1, verbs.StatusSuccess)
	if binary.LittleEndian.Uint64(rbuf.Bytes()[8:]) != 22 {
		t.Error("wrong payload")
	}
	// RECVs posted in INIT flush when the QP is closed unconnected.
	c := newEnd(t, p, defaultEnd)
	c.recvs(c.alloc(64, localWrite), 0, 3, 8)
	if err := c.qp.Close(); err != nil {
		t.Fatal(err)
	}
	for i, cmp := range c.poll(3) {
		status(t, cmp, uint64(i), verbs.StatusFlushed)
	}
}

func TestConnectBeforePeerHoldsTransfers(t *testing.T) {
	p := sim.New()
	a, b := newEnd(t, p, defaultEnd), newEnd(t, p, defaultEnd)
	dst := b.alloc(64, remoteWrite)
	// Unusual order: a connects first and sends at once.
	if err := a.qp.Connect(t.Context(), b.qp.Info(), true); err != nil {
		t.Fatal(err)
	}
	a.post(verbs.SendWR{ID: 1, Op: verbs.OpWrite, Inline: []byte("early"), RemoteAddr: dst.Addr(), RKey: dst.RKey(), Signaled: true})
	a.empty()
	// Established waits for the peer to connect back.
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := a.qp.Established(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("Established before the peer connected back: %v", err)
	}
	established := make(chan error, 1)
	go func() { established <- a.qp.Established(t.Context()) }()
	if err := b.qp.Connect(t.Context(), a.qp.Info(), false); err != nil {
		t.Fatal(err)
	}
	if err := <-established; err != nil {
		t.Errorf("Established: %v", err)
	}
	if err := b.qp.Established(t.Context()); err != nil {
		t.Errorf("Established: %v", err)
	}
	status(t, a.poll(1)[0], 1, verbs.StatusSuccess)
	if string(dst.Bytes()[:5]) != "early" {
		t.Errorf("held WRITE: %q", dst.Bytes()[:5])
	}
}

func TestConnectErrors(t *testing.T) {
	p := sim.New()
	a, b := newPair(t, p, defaultEnd)
	c := newEnd(t, p, defaultEnd)
	ctx := t.Context()
	if err := a.qp.Connect(ctx, b.qp.Info(), true); !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("second Connect: %v", err)
	}
	if err := c.qp.Connect(ctx, b.qp.Info(), true); !errors.Is(err, verbs.ErrPeerInfo) {
		t.Errorf("Connect to a QP connected elsewhere: %v", err)
	}
	info := b.qp.Info()
	for name, mutate := range map[string]func([]byte){
		"magic":   func(b []byte) { b[0] ^= 1 },
		"version": func(b []byte) { b[4]++ },
		"process": func(b []byte) { b[6] ^= 1 },
		"id":      func(b []byte) { clear(b[13:]) },
	} {
		bad := bytes.Clone(info)
		mutate(bad)
		if err := c.qp.Connect(ctx, bad, true); !errors.Is(err, verbs.ErrPeerInfo) {
			t.Errorf("Connect with a bad %s: %v", name, err)
		}
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.qp.Connect(cancelled, a.qp.Info(), true); !errors.Is(err, context.Canceled) {
		t.Errorf("Connect with a cancelled context: %v", err)
	}
	d := newEnd(t, p, defaultEnd)
	dinfo := d.qp.Info()
	if err := d.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.qp.Connect(ctx, dinfo, true); !errors.Is(err, verbs.ErrPeerInfo) {
		t.Errorf("Connect to a closed QP: %v", err)
	}
	if err := d.qp.Connect(ctx, c.qp.Info(), true); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Connect on a closed QP: %v", err)
	}
	if err := isQPState(c.qp.PostSend(&verbs.SendWR{Op: verbs.OpSend})); err != nil {
		t.Errorf("PostSend before Connect: %v", err)
	}
	if err := c.qp.PostRecv(&verbs.RecvWR{ID: 1}); err != nil {
		t.Errorf("PostRecv before Connect (INIT): %v", err)
	}
	if err := c.qp.Established(ctx); !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("Established before Connect: %v", err)
	}
	if err := b.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.Established(ctx); err != nil {
		t.Errorf("Established with a peer that connected and then closed: %v", err)
	}
	e, f := newEnd(t, p, defaultEnd), newEnd(t, p, defaultEnd)
	if err := e.qp.Connect(ctx, f.qp.Info(), false); err != nil {
		t.Fatal(err)
	}
	if err := f.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.qp.Established(ctx); !errors.Is(err, verbs.ErrPeerInfo) {
		t.Errorf("Established with a peer closed before it connected: %v", err)
	}
}

func TestLoopback(t *testing.T) {
	a := newEnd(t, sim.New(), defaultEnd)
	if err := a.qp.Connect(t.Context(), a.qp.Info(), true); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.Established(t.Context()); err != nil {
		t.Fatal(err)
	}
	rbuf := a.alloc(64, localWrite)
	a.recvs(rbuf, 0, 1, 8)
	a.sendU64(7, 42)
	wc := a.poll(2)
	status(t, wc[0], 0, verbs.StatusSuccess) // the receive is generated first
	status(t, wc[1], 7, verbs.StatusSuccess)
	if binary.LittleEndian.Uint64(rbuf.Bytes()) != 42 || a.qp.Peer() != a.qp {
		t.Error("loopback SEND")
	}
	a.post(verbs.SendWR{ID: 8, Op: verbs.OpSend, Inline: make([]byte, 9), Signaled: true})
	status(t, a.poll(1)[0], 8, verbs.StatusRNR)
}

func TestValidation(t *testing.T) {
	p := sim.New()
	a, b := newPair(t, p, endConfig{sendDepth: 4, recvDepth: 4, cqDepth: 64, maxInline: 1000})
	if a.qp.MaxInline() != sim.MaxInline {
		t.Errorf("MaxInline() = %d, want the cap %d", a.qp.MaxInline(), sim.MaxInline)
	}
	if small := newEnd(t, p, endConfig{sendDepth: 1, recvDepth: 1, cqDepth: 1, maxInline: 10}); small.qp.MaxInline() != 10 {
		t.Errorf("MaxInline() = %d, want 10", small.qp.MaxInline())
	}
	local := a.alloc(64, localWrite)
	remote := a.alloc(64, remoteWrite)
	foreign := b.alloc(64, localWrite)
	if local.RKey() != 0 || remote.RKey() == 0 || local.Addr() == 0 || local.Addr() == remote.Addr() {
		t.Errorf("keys %#x %#x, addresses %#x %#x", local.RKey(), remote.RKey(), local.Addr(), remote.Addr())
	}
	checks := []struct {
		name string
		err  error
		want error
	}{
		{"nil send", a.qp.PostSend(nil), nil},
		{"nil recv", a.qp.PostRecv(nil), nil},
		{"opcode", a.qp.PostSend(&verbs.SendWR{Op: verbs.OpRecv}), nil},
		{"inline", a.qp.PostSend(&verbs.SendWR{Op: verbs.OpSend, Inline: make([]byte, sim.MaxInline+1)}), verbs.ErrInlineTooLong},
		{"foreign MR", a.qp.PostSend(&verbs.SendWR{Op: verbs.OpSend, Local: verbs.SGE{MR: foreign, Length: 1}}), verbs.ErrBounds},
		{"no MR", a.qp.PostSend(&verbs.SendWR{Op: verbs.OpSend, Local: verbs.SGE{Length: 1}}), verbs.ErrBounds},
		{"recv without local write", a.qp.PostRecv(&verbs.RecvWR{Local: verbs.SGE{MR: mustAlloc(t, a, 0), Length: 1}}), verbs.ErrBounds},
	}
	for _, c := range checks {
		if c.err == nil || (c.want != nil && !errors.Is(c.err, c.want)) {
			t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
		}
	}
	for _, size := range []int{0, -1} {
		if _, err := a.dev.AllocMR(size, localWrite); err == nil {
			t.Errorf("AllocMR(%d) succeeded", size)
		}
	}
	for _, attr := range []verbs.QPAttr{
		{CQ: nil, SendDepth: 1, RecvDepth: 1},
		{CQ: b.cq, SendDepth: 1, RecvDepth: 1},
		{CQ: a.cq, SendDepth: 0, RecvDepth: 1},
		{CQ: a.cq, SendDepth: 1, RecvDepth: sim.MaxQueueDepth + 1},
		{CQ: a.cq, SendDepth: 1, RecvDepth: 1, MaxInline: -1},
	} {
		if qp, err := a.dev.NewQP(attr); err == nil {
			_ = qp.Close()
			t.Errorf("NewQP(%+v) succeeded", attr)
		}
	}
	if _, err := a.dev.NewCQ(0, func() {}); err == nil {
		t.Error("NewCQ(0) succeeded")
	}
}

func mustAlloc(t *testing.T, e *end, access verbs.Access) verbs.MR {
	t.Helper()
	return e.alloc(64, access)
}

// TestUnsignaledFillsSendQueue: unsignaled requests are retired only by a
// later signaled completion, so a QP that never signals fills up.
func TestUnsignaledFillsSendQueue(t *testing.T) {
	a, b := newPair(t, sim.New(), endConfig{sendDepth: 4, recvDepth: 4, cqDepth: 64})
	dst := b.alloc(64, remoteWrite)
	wr := verbs.SendWR{Op: verbs.OpWrite, RemoteAddr: dst.Addr(), RKey: dst.RKey(), Inline: []byte{}}
	for range 4 {
		a.post(wr)
	}
	if err := a.qp.PostSend(&wr); !errors.Is(err, verbs.ErrQueueFull) {
		t.Errorf("fifth unsignaled post: %v, want ErrQueueFull", err)
	}
}

func TestCQOverrun(t *testing.T) {
	a, b := newPair(t, sim.New(), endConfig{sendDepth: 8, recvDepth: 8, cqDepth: 4, maxInline: 8})
	dst := b.alloc(64, remoteWrite)
	wr := verbs.SendWR{Op: verbs.OpWrite, RemoteAddr: dst.Addr(), RKey: dst.RKey(), Inline: []byte{1}, Signaled: true}
	for range 5 {
		a.post(wr)
	}
	var wc [8]verbs.Completion
	if _, err := a.cq.Poll(wc[:]); !errors.Is(err, sim.ErrCQOverrun) {
		t.Errorf("Poll after overrun: %v", err)
	}
	if err := a.cq.Arm(); !errors.Is(err, sim.ErrCQOverrun) {
		t.Errorf("Arm after overrun: %v", err)
	}
	eventually(t, func() error { return isQPState(a.qp.PostSend(&wr)) })
}

func TestDeviceCloseReleasesEverything(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	mr := a.alloc(64, remoteWrite)
	rbuf := a.alloc(64, localWrite)
	a.recvs(rbuf, 0, 1, 8)
	if err := a.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.dev.Close(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("second Device.Close: %v", err)
	}
	if err := a.cq.Arm(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Arm: %v", err)
	}
	if mr.Bytes() != nil {
		t.Error("MR memory still mapped")
	}
	if err := a.qp.PostSend(&verbs.SendWR{Op: verbs.OpSend}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("PostSend: %v", err)
	}
	if _, err := a.dev.AllocMR(64, localWrite); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("AllocMR: %v", err)
	}
	if _, err := a.dev.NewCQ(1, func() {}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("NewCQ: %v", err)
	}
	b.sendU64(1, 1)
	status(t, b.poll(1)[0], 1, verbs.StatusRetryExceeded)
}

// TestFaultsChangeUnderTraffic toggles faults and stalls while messages
// flow; everything must still arrive in order (run with -race).
func TestFaultsChangeUnderTraffic(t *testing.T) {
	const n, window = 3000, 16
	p := sim.New()
	a, b := newPair(t, p, endConfig{sendDepth: 64, recvDepth: window, cqDepth: 256, maxInline: 64})
	rbuf := b.alloc(window*8, localWrite)
	b.recvs(rbuf, 0, window, 8)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // chaos
		for i := 0; ; i++ {
			select {
			case <-stop:
				b.qp.Stall(false)
				return
			default:
			}
			p.SetFaults(sim.Faults{Delay: time.Duration(i%3) * 50 * time.Microsecond, Reorder: i%2 == 0,
				LossRate: float64(i%4) / 10, RetransmitDelay: 20 * time.Microsecond})
			b.qp.Stall(i%5 == 0)
			time.Sleep(100 * time.Microsecond)
		}
	})
	credits := make(chan struct{}, window)
	for range window {
		credits <- struct{}{}
	}
	wg.Go(func() {
		for i := range n {
			wc, err := pollN(b.cq, 1)
			if err != nil {
				t.Error(err)
				return
			}
			if got := binary.LittleEndian.Uint64(rbuf.Bytes()[8*(i%window):]); wc[0].Status != verbs.StatusSuccess || got != uint64(i) {
				t.Errorf("message %d: %+v carrying %d", i, wc[0], got)
				return
			}
			if err := b.qp.PostRecv(&verbs.RecvWR{ID: uint64(i % window), Local: verbs.SGE{MR: rbuf, Offset: 8 * (i % window), Length: 8}}); err != nil {
				t.Error(err)
				return
			}
			credits <- struct{}{}
		}
	})
	for i := range n {
		select {
		case <-credits:
		case <-time.After(hangGuard):
			t.Fatal("stuck")
		}
		a.post(verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Inline: binary.LittleEndian.AppendUint64(nil, uint64(i)), Signaled: true})
		a.poll(1)
	}
	close(stop)
	wg.Wait()
}
