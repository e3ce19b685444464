package sim_test

import (
	"bytes"
	"encoding/binary"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

func TestForceErrorFlushesReceiver(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	rbuf := b.alloc(4096, localWrite)
	b.recvs(rbuf, 0, 5, 8)
	b.qp.ForceError()
	for i, c := range b.poll(5) {
		status(t, c, uint64(i), verbs.StatusFlushed)
	}
	b.empty()
	if err := isQPState(b.qp.PostRecv(&verbs.RecvWR{ID: 9})); err != nil {
		t.Errorf("PostRecv after ForceError: %v", err)
	}
	if err := isQPState(b.qp.PostSend(&verbs.SendWR{ID: 9, Op: verbs.OpSend, Inline: []byte{}})); err != nil {
		t.Errorf("PostSend after ForceError: %v", err)
	}
	b.qp.ForceError() // idempotent

	// The peer learns when it next sends.
	a.sendU64(1, 1)
	status(t, a.poll(1)[0], 1, verbs.StatusRetryExceeded)
	if err := isQPState(a.qp.PostSend(&verbs.SendWR{ID: 2, Op: verbs.OpSend, Inline: []byte{}})); err != nil {
		t.Errorf("PostSend after RetryExceeded: %v", err)
	}
	b.empty()
}

func TestForceErrorFlushesUndeliveredSends(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	rbuf := b.alloc(4096, localWrite)
	b.recvs(rbuf, 0, 3, 8)
	abuf := a.alloc(4096, localWrite)
	a.recvs(abuf, 0, 2, 8)
	b.qp.Stall(true)
	a.post(verbs.SendWR{ID: 10, Op: verbs.OpSend, Inline: []byte("x")}) // unsignaled
	a.post(verbs.SendWR{ID: 11, Op: verbs.OpSend, Inline: []byte("y")}) // unsignaled
	a.post(verbs.SendWR{ID: 12, Op: verbs.OpSend, Inline: []byte("z"), Signaled: true})
	a.empty()
	a.qp.ForceError()
	wc := a.poll(5)
	// Failures always complete: the unsignaled sends flush too, send queue
	// first (it was flushed first), then the receive queue.
	for i, id := range []uint64{10, 11, 12} {
		status(t, wc[i], id, verbs.StatusFlushed)
	}
	status(t, wc[3], 0, verbs.StatusFlushed)
	status(t, wc[4], 1, verbs.StatusFlushed)
	b.qp.Stall(false)
	b.empty() // nothing was delivered
	if !bytes.Equal(rbuf.Bytes()[:24], make([]byte, 24)) {
		t.Error("flushed sends reached the peer's memory")
	}
}

func TestStallHoldsThenReleasesInOrder(t *testing.T) {
	const n = 100
	a, b := newPair(t, sim.New(), defaultEnd)
	dst := b.alloc(n*16, remoteWrite)
	rbuf := b.alloc(n*8, localWrite)
	b.recvs(rbuf, 0, n, 8)
	b.qp.Stall(true)
	for i := range n {
		data := bytes.Repeat([]byte{byte(i + 1)}, 16)
		a.post(verbs.SendWR{ID: uint64(2 * i), Op: verbs.OpWrite, Inline: data, RemoteAddr: dst.Addr() + uint64(16*i), RKey: dst.RKey()})
		a.sendU64(uint64(2*i+1), uint64(i))
	}
	// While stalled: no data, no completions on either side.
	a.empty()
	b.empty()
	if !bytes.Equal(dst.Bytes(), make([]byte, n*16)) {
		t.Fatal("a stalled peer saw WRITE data")
	}
	b.qp.Stall(false)
	for i, c := range b.poll(n) {
		status(t, c, uint64(i), verbs.StatusSuccess)
		if got := binary.LittleEndian.Uint64(rbuf.Bytes()[8*i:]); got != uint64(i) || c.Len != 8 {
			t.Errorf("RECV %d: message %d, Len %d", i, got, c.Len)
		}
	}
	for i := range n {
		if !bytes.Equal(dst.Bytes()[16*i:16*i+16], bytes.Repeat([]byte{byte(i + 1)}, 16)) {
			t.Errorf("WRITE %d not in memory after the stall", i)
		}
	}
	for i, c := range a.poll(n) {
		status(t, c, uint64(2*i+1), verbs.StatusSuccess)
	}
}

func TestStallThenPeerClosedRetryExceeded(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	rbuf := b.alloc(4096, localWrite)
	b.recvs(rbuf, 0, 3, 8)
	b.qp.Stall(true)
	for i := range 3 {
		a.sendU64(uint64(i), uint64(i))
	}
	a.empty()
	if err := b.qp.Close(); err != nil {
		t.Fatal(err)
	}
	wc := a.poll(3)
	status(t, wc[0], 0, verbs.StatusRetryExceeded)
	status(t, wc[1], 1, verbs.StatusFlushed)
	status(t, wc[2], 2, verbs.StatusFlushed)
	for i, c := range b.poll(3) { // Close flushed b's RECVs
		status(t, c, uint64(i), verbs.StatusFlushed)
	}
}

func TestStalledErroredPeerFailsOnRelease(t *testing.T) {
	a, b := newPair(t, sim.New(), defaultEnd)
	rbuf := b.alloc(4096, localWrite)
	b.recvs(rbuf, 0, 2, 8)
	b.qp.Stall(true)
	a.sendU64(1, 1)
	b.qp.ForceError()
	a.empty() // still held by the stall
	b.qp.Stall(false)
	status(t, a.poll(1)[0], 1, verbs.StatusRetryExceeded)
}

// TestDelayReorderKeepsQueueOrder: with delayed, reordered completions each
// work queue still completes in order, and a SEND's data and the WRITE data
// posted before it are in memory when its completion is seen.
func TestDelayReorderKeepsQueueOrder(t *testing.T) {
	const n = 500
	p := sim.New()
	p.SetFaults(sim.Faults{Delay: 2 * time.Millisecond, Reorder: true})
	cfg := endConfig{sendDepth: 2 * n, recvDepth: n, cqDepth: 4 * n, maxInline: 64}
	a, b := newPair(t, p, cfg)
	dst := b.alloc(n*8, remoteWrite)
	rbuf := b.alloc(n*8, localWrite)
	b.recvs(rbuf, 0, n, 8)
	for i := range n {
		a.post(verbs.SendWR{ID: uint64(2 * i), Op: verbs.OpWrite, Signaled: i%3 == 0,
			Inline: binary.LittleEndian.AppendUint64(nil, uint64(i)+1), RemoteAddr: dst.Addr() + uint64(8*i), RKey: dst.RKey()})
		a.sendU64(uint64(2*i+1), uint64(i))
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		last := -1
		wc, err := pollN(a.cq, n+(n+2)/3)
		if err != nil {
			t.Error(err)
		}
		for _, c := range wc {
			if c.Status != verbs.StatusSuccess || int(c.ID) <= last {
				t.Errorf("send completion %+v after id %d", c, last)
			}
			last = int(c.ID)
		}
	})
	for i := range n {
		c := b.poll(1)[0]
		status(t, c, uint64(i), verbs.StatusSuccess)
		if got := binary.LittleEndian.Uint64(rbuf.Bytes()[8*i:]); got != uint64(i) {
			t.Fatalf("RECV %d carries message %d", i, got)
		}
		if got := binary.LittleEndian.Uint64(dst.Bytes()[8*i:]); got != uint64(i)+1 {
			t.Fatalf("RECV %d seen before the WRITE posted before it", i)
		}
	}
	wg.Wait()
}

// TestDelayWithoutReorderKeepsCQOrder: without Reorder one CQ shows the
// completions of its QP's send and receive queues in generation order.
func TestDelayWithoutReorderKeepsCQOrder(t *testing.T) {
	for _, reorder := range []bool{false, true} {
		p := sim.New()
		p.SetFaults(sim.Faults{Delay: time.Millisecond, Reorder: reorder})
		a, b := newPair(t, p, defaultEnd)
		abuf, bbuf := a.alloc(4096, localWrite), b.alloc(4096, localWrite)
		const n = 200
		a.recvs(abuf, 0, 1, 8)
		b.recvs(bbuf, 0, 1, 8)
		var kinds []verbs.Opcode
		for i := range n {
			a.sendU64(uint64(i), uint64(i)) // a's send completion, then...
			b.sendU64(uint64(i), uint64(i)) // ...a's receive completion
			// Keep one RECV posted on each side; the slots were consumed.
			a.recvs(abuf, (i+1)%256, 1, 8)
			b.recvs(bbuf, (i+1)%256, 1, 8)
			for _, c := range drainAll(t, a.cq) {
				kinds = append(kinds, c.Op)
			}
		}
		for _, c := range a.poll(2*n - len(kinds)) {
			kinds = append(kinds, c.Op)
		}
		b.poll(n) // b's receive completions
		sends, recvs, inOrder := 0, 0, true
		for i, op := range kinds {
			if op == verbs.OpSend {
				sends++
			} else {
				recvs++
			}
			inOrder = inOrder && op == [2]verbs.Opcode{verbs.OpSend, verbs.OpRecv}[i%2]
		}
		if sends != n || recvs != n {
			t.Fatalf("reorder %v: %d send and %d receive completions, want %d each", reorder, sends, recvs, n)
		}
		if !reorder && !inOrder {
			t.Errorf("without Reorder the CQ did not keep generation order: %v", kinds)
		}
		t.Logf("reorder %v: generation order kept: %v", reorder, inOrder)
	}
}

// drainAll returns what a CQ holds without blocking.
func drainAll(t *testing.T, cq *sim.CQ) []verbs.Completion {
	t.Helper()
	var out []verbs.Completion
	var buf [16]verbs.Completion
	for {
		n, err := cq.Poll(buf[:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return out
		}
		out = append(out, buf[:n]...)
	}
}

// TestLossDeliversEverythingInOrder: lost transfers are retransmitted, so
// loss only delays: all WRITEs and SENDs arrive, in order.
func TestLossDeliversEverythingInOrder(t *testing.T) {
	const n, window = 1000, 32
	p := sim.New()
	p.SetFaults(sim.Faults{LossRate: 0.3, RetransmitDelay: 100 * time.Microsecond, Delay: 50 * time.Microsecond, Reorder: true})
	cfg := endConfig{sendDepth: 4 * window, recvDepth: window, cqDepth: 1024, maxInline: 64}
	a, b := newPair(t, p, cfg)
	dst := b.alloc(n*8, remoteWrite)
	rbuf := b.alloc(window*8, localWrite)
	b.recvs(rbuf, 0, window, 8)

	tokens := func(n int) chan struct{} {
		ch := make(chan struct{}, n)
		for range n {
			ch <- struct{}{}
		}
		return ch
	}
	// One credit per posted RECV; one send-queue token per message (two
	// requests, the second signaled).
	credits, sq := tokens(window), tokens(cfg.sendDepth/2)
	var wg sync.WaitGroup
	wg.Go(func() { // receiver
		for i := range n {
			wc, err := pollN(b.cq, 1)
			if err != nil {
				t.Error(err)
				return
			}
			c, slot := wc[0], i%window
			if c.Status != verbs.StatusSuccess || c.ID != uint64(slot) || c.Op != verbs.OpRecv {
				t.Errorf("message %d: %+v", i, c)
				return
			}
			if binary.LittleEndian.Uint64(rbuf.Bytes()[8*slot:]) != uint64(i) {
				t.Errorf("message %d: wrong payload", i)
				return
			}
			if binary.LittleEndian.Uint64(dst.Bytes()[8*i:]) != uint64(i)+1 {
				t.Errorf("message %d seen before the WRITE posted before it", i)
				return
			}
			err = b.qp.PostRecv(&verbs.RecvWR{ID: uint64(slot), Local: verbs.SGE{MR: rbuf, Offset: 8 * slot, Length: 8}})
			if err != nil {
				t.Error(err)
				return
			}
			credits <- struct{}{}
		}
	})
	wg.Go(func() { // send completions: one per message
		last := -1
		for range n {
			wc, err := pollN(a.cq, 1)
			if err != nil {
				t.Error(err)
				return
			}
			c := wc[0]
			if c.Status != verbs.StatusSuccess || int(c.ID) <= last {
				t.Errorf("send completion %+v after %d", c, last)
				return
			}
			last = int(c.ID)
			sq <- struct{}{}
		}
	})
	for i := range n {
		for _, ch := range []chan struct{}{credits, sq} {
			select {
			case <-ch:
			case <-time.After(hangGuard):
				t.Fatal("stuck: receiver or completions stopped")
			}
		}
		a.post(verbs.SendWR{ID: uint64(2 * i), Op: verbs.OpWrite, Inline: binary.LittleEndian.AppendUint64(nil, uint64(i)+1),
			RemoteAddr: dst.Addr() + uint64(8*i), RKey: dst.RKey()})
		a.sendU64(uint64(2*i+1), uint64(i))
	}
	wg.Wait()
}

// TestLocalCompletionLosesTheWireAtClose: with Faults.LocalCompletion a
// send completes at post although the peer, stalled, has nothing; closing
// the QP then loses it, and the peer's receives flush.
func TestLocalCompletionLosesTheWireAtClose(t *testing.T) {
	p := sim.New()
	p.SetFaults(sim.Faults{LocalCompletion: true})
	a, b := newPair(t, p, defaultEnd)
	rbuf := b.alloc(4096, localWrite)
	b.recvs(rbuf, 0, 2, 8)
	b.qp.Stall(true)
	a.post(verbs.SendWR{ID: 1, Op: verbs.OpSend, Inline: []byte("final"), Signaled: true})
	status(t, a.poll(1)[0], 1, verbs.StatusSuccess)
	if err := a.qp.Close(); err != nil {
		t.Fatal(err)
	}
	b.qp.Stall(false)
	for i, c := range b.poll(2) {
		status(t, c, uint64(i), verbs.StatusFlushed)
	}
	b.empty()
	if !bytes.Equal(rbuf.Bytes()[:8], make([]byte, 8)) {
		t.Error("the lost send reached the peer's memory")
	}
}
