//go:build cgo && linux

package ibverbs_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
)

// end is one side of a connected pair: its device, a CQ that notifies
// bell, and a QP.
type end struct {
	dev  verbs.Device
	cq   verbs.CQ
	qp   verbs.QP
	bell chan struct{}
}

// newEnd makes a CQ and a QP on dev, destroyed at the end of the test
// (before dev, which the caller closes in an earlier Cleanup).
func newEnd(t *testing.T, dev verbs.Device) *end {
	t.Helper()
	e := &end{dev: dev, bell: make(chan struct{}, 1)}
	var err error
	e.cq, err = dev.NewCQ(64, func() {
		select {
		case e.bell <- struct{}{}:
		default:
		}
	})
	require.NoError(t, err)
	e.qp, err = dev.NewQP(verbs.QPAttr{CQ: e.cq, SendDepth: 16, RecvDepth: 16, MaxInline: 32})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = e.qp.Close()
		_ = e.cq.Close()
	})
	return e
}

// next waits for e's next completion, within ctx.
func (e *end) next(t *testing.T, ctx context.Context) verbs.Completion {
	t.Helper()
	c, ok := e.within(t, ctx)
	if !ok {
		t.Fatalf("no completion: %v", ctx.Err())
	}
	return c
}

// within waits for e's next completion, or reports false once ctx is
// done.
func (e *end) within(t *testing.T, ctx context.Context) (verbs.Completion, bool) {
	t.Helper()
	wc := make([]verbs.Completion, 1)
	for {
		n, err := e.cq.Poll(wc)
		require.NoError(t, err)
		if n == 0 {
			require.NoError(t, e.cq.Arm())
			n, err = e.cq.Poll(wc)
			require.NoError(t, err)
		}
		if n == 1 {
			return wc[0], true
		}
		select {
		case <-e.bell:
		case <-ctx.Done():
			return verbs.Completion{}, false
		}
	}
}

// connect connects a (active) and b (passive) as rsock does.
func connect(t *testing.T, ctx context.Context, a, b *end) {
	t.Helper()
	require.NoError(t, b.qp.Connect(ctx, a.qp.Info(), false), "passive Connect")
	require.NoError(t, a.qp.Connect(ctx, b.qp.Info(), true), "active Connect")
	require.NoError(t, b.qp.Established(ctx), "Established")
}

// TestPoolRetiredRingRefusesWrites: a remote-writable region closed while
// its Device's QP lives (a ring that growth replaced) is kept by the pool
// deregistered: the peer's WRITE with its old address and rkey fails at
// the device (StatusRemoteAccess; on iWARP, where a WRITE completes
// locally, the peer's connection ends) and does not reach the memory. The
// pool zeroes the memory when it hands it out again, registered anew, and
// a region closed once no QP is left stays registered.
func TestPoolRetiredRingRefusesWrites(t *testing.T) {
	d, _ := pooledOpen(t, 1, time.Minute)
	t.Cleanup(func() {
		_ = d.Close()
		ibverbs.DrainPools()
	})
	peerDev, err := ibverbs.New().Open(deviceOptions())
	require.NoError(t, err)
	t.Cleanup(func() { _ = peerDev.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // a hang guard
	defer cancel()

	const size = 64 << 10
	ring, err := d.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	rbuf, err := d.AllocMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	src, err := peerDev.AllocMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = rbuf.Close()
		_ = src.Close()
	})
	b := newEnd(t, d)
	a := newEnd(t, peerDev)
	connect(t, ctx, a, b)

	// The peer's WRITE lands, as the SEND after it proves.
	const at, n = 1000, 256
	addr, rkey := ring.Addr(), ring.RKey()
	first, second := bytes.Repeat([]byte{0x5a}, n), bytes.Repeat([]byte{0xc3}, n)
	copy(src.Bytes(), first)
	copy(src.Bytes()[n:], second)
	require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{ID: 1, Local: verbs.SGE{MR: rbuf, Length: 64}}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{ID: 1, Op: verbs.OpWrite, Local: verbs.SGE{MR: src, Length: n}, RemoteAddr: addr + at, RKey: rkey, Signaled: true}))
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{ID: 2, Op: verbs.OpSend, Inline: []byte{1}, Signaled: true}))
	for range 2 {
		c := a.next(t, ctx)
		require.Equal(t, verbs.StatusSuccess, c.Status, "peer's completion %+v", c)
	}
	c := b.next(t, ctx)
	require.Equal(t, verbs.StatusSuccess, c.Status, "receive completion %+v", c)
	require.Equal(t, first, ring.Bytes()[at:at+n], "the WRITE landed")

	// Retired while the QP lives: kept, memory only.
	require.NoError(t, ring.Close())
	mem, registered, ok := ibverbs.Spare(d, addr)
	require.True(t, ok, "the pool keeps the retired ring's memory")
	assert.False(t, registered, "a ring closed while its QP lives is deregistered")
	require.Equal(t, first, mem[at:at+n], "not zeroed when returned")

	// The peer WRITEs with the old rkey: refused. (RECVs are posted, so
	// that on iWARP the SENDs that follow fail only if the connection
	// ended.)
	for i := range 8 {
		require.NoError(t, b.qp.PostRecv(&verbs.RecvWR{ID: uint64(10 + i), Local: verbs.SGE{MR: rbuf, Offset: 64 * (i + 1), Length: 64}}))
	}
	require.NoError(t, a.qp.PostSend(&verbs.SendWR{ID: 3, Op: verbs.OpWrite, Local: verbs.SGE{MR: src, Offset: n, Length: n}, RemoteAddr: addr + at, RKey: rkey, Signaled: true}))
	c = a.next(t, ctx)
	require.EqualValues(t, 3, c.ID)
	type localWriter interface{ WriteCompletesLocally() bool }
	if l, ok := a.qp.(localWriter); ok && l.WriteCompletesLocally() && c.Status == verbs.StatusSuccess {
		t.Log("iWARP: the WRITE completed locally; waiting for the peer to end the connection")
		awaitUnusable(t, ctx, a)
	} else {
		require.Equal(t, verbs.StatusRemoteAccess, c.Status, "the peer's WRITE into a retired ring: %+v", c)
	}
	assert.Equal(t, first, mem[at:at+n], "the refused WRITE reached the retired ring")
	assert.False(t, bytes.Contains(mem, second[:16]), "the refused WRITE's bytes are in the retired ring")

	// Handed out again: zeroed then, whatever the memory holds (bytes
	// that reached it while spare too), and registered anew.
	for i := range mem {
		mem[i] = 0xee
	}
	again, err := d.AllocMR(size, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	require.Equal(t, addr, again.Addr(), "the pooled memory")
	assert.NotZero(t, again.RKey())
	t.Logf("rkey %#x, registered again: %#x", rkey, again.RKey())
	for i, v := range again.Bytes() {
		if v != 0 {
			t.Fatalf("a pooled region handed out with byte %d %#x, not zero", i, v)
		}
	}
	_, _, ok = ibverbs.Spare(d, addr)
	assert.False(t, ok, "handed out: no longer spare")

	// Closed with no QP left: kept registered.
	require.NoError(t, a.qp.Close())
	require.NoError(t, b.qp.Close())
	require.NoError(t, again.Close())
	_, registered, ok = ibverbs.Spare(d, addr)
	require.True(t, ok)
	assert.True(t, registered, "a region closed with no QP left stays registered")
}

// awaitUnusable waits, within ctx, until e's QP refuses work: SENDs are
// posted until one is refused with ErrQPState or completes with an error
// (each completion waited for at most 100 ms: a SEND the peer never sees
// may not complete before the QP's error is known).
func awaitUnusable(t *testing.T, ctx context.Context, e *end) {
	t.Helper()
	for id := uint64(10); ctx.Err() == nil; id++ {
		err := e.qp.PostSend(&verbs.SendWR{ID: id, Op: verbs.OpSend, Inline: []byte{2}, Signaled: true})
		switch {
		case errors.Is(err, verbs.ErrQPState):
			return
		case errors.Is(err, verbs.ErrQueueFull):
		case err != nil:
			t.Fatalf("post on a QP the peer refused: %v", err)
		}
		wait, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		c, ok := e.within(t, wait)
		cancel()
		if ok && c.Status != verbs.StatusSuccess {
			return
		}
	}
	t.Fatal("the QP still takes work after the peer refused a WRITE")
}
