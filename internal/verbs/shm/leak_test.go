//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// cycle opens two ends, connects them, moves data both ways through every
// path (regions exported at connect time, MapRemote,
// SEND, WRITE, an armed notification), and closes everything,
// in rsock's order or by closing the devices only.
func cycle(t *testing.T, i int) {
	t.Helper()
	newEnd := func() *end {
		dev, err := New().OpenDevice()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := newTestCQ(dev, 64)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := dev.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 16, RecvDepth: 8, MaxInline: 32})
		if err != nil {
			t.Fatal(err)
		}
		return &end{dev: dev, cq: cq, qp: qp.(*QP)}
	}
	a, b := newEnd(), newEnd()
	alloc := func(e *end, size int, access verbs.Access) *MR {
		mr, err := e.dev.AllocMR(size, access)
		if err != nil {
			t.Fatal(err)
		}
		e.mrs = append(e.mrs, mr.(*MR))
		return mr.(*MR)
	}
	ringA, ringB := alloc(a, 64<<10, verbs.AccessRemoteWrite), alloc(b, 64<<10, verbs.AccessRemoteWrite)
	slotsA, slotsB := alloc(a, 8*64, verbs.AccessLocalWrite), alloc(b, 8*64, verbs.AccessLocalWrite)
	for k := range 8 {
		_ = a.qp.PostRecv(&verbs.RecvWR{ID: uint64(k), Local: verbs.SGE{MR: slotsA, Offset: k * 64, Length: 64}})
		_ = b.qp.PostRecv(&verbs.RecvWR{ID: uint64(k), Local: verbs.SGE{MR: slotsB, Offset: k * 64, Length: 64}})
	}
	late := alloc(b, 4096, verbs.AccessRemoteWrite) // a second region passed in the exchange
	connect(t, a, b)

	direct, err := a.qp.MapRemote(ringB.Addr(), ringB.RKey(), 64<<10)
	if err != nil {
		t.Fatalf("cycle %d: MapRemote: %v", i, err)
	}
	copy(direct[100:], "direct")
	post := func(e *end, wr verbs.SendWR) {
		if err := e.qp.PostSend(&wr); err != nil {
			t.Fatalf("cycle %d: PostSend: %v", i, err)
		}
	}
	post(a, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Inline: []byte("late"), RemoteAddr: late.Addr() + 8, RKey: late.RKey()})
	post(a, verbs.SendWR{ID: 2, Op: verbs.OpSend, Inline: []byte("msg"), Signaled: true})
	if c := pollN(t, b.cq, 1)[0]; c.Err() != nil || !bytes.Equal(ringB.Bytes()[100:106], []byte("direct")) || !bytes.Equal(late.Bytes()[8:12], []byte("late")) {
		t.Fatalf("cycle %d: b got %+v", i, c)
	}
	// b -> a, with a armed and waiting for its notification.
	if err := a.cq.Arm(); err != nil {
		t.Fatal(err)
	}
	drain(t, a.cq)
	post(b, verbs.SendWR{ID: 3, Op: verbs.OpWrite, Inline: []byte("wrt"), RemoteAddr: ringA.Addr(), RKey: ringA.RKey()})
	post(b, verbs.SendWR{ID: 4, Op: verbs.OpSend, Inline: []byte("msg"), Signaled: true})
	if !notified(a.cq, 10*time.Second) {
		t.Fatalf("cycle %d: no notification", i)
	}
	if c := pollN(t, a.cq, 1)[0]; c.Err() != nil || !bytes.Equal(ringA.Bytes()[:3], []byte("wrt")) {
		t.Fatalf("cycle %d: a got %+v", i, c)
	}
	if i%2 == 0 {
		for _, e := range []*end{a, b} {
			_ = e.qp.Close()
			_ = e.cq.Close()
			for _, mr := range e.mrs {
				_ = mr.Close()
			}
			_ = e.dev.Close()
		}
	} else {
		_ = b.dev.Close()
		_ = a.dev.Close()
	}
}

// TestNoLeaks: after many connect/close cycles the process has the same
// fds, no mapping of this package's memfds and no extra goroutines.
func TestNoLeaks(t *testing.T) {
	cycles := 500
	if testing.Short() {
		cycles = 100
	}
	for i := range 3 { // warm up: the netpoller's own fds, the heap
		cycle(t, i)
	}
	waitLinks(t)
	runtime.GC()
	fds0 := fdCount(t)
	maps0, ours0 := mapsCount(t)
	g0 := runtime.NumGoroutine()
	start := time.Now()
	for i := range cycles {
		cycle(t, i)
	}
	elapsed := time.Since(start)
	waitLinks(t)
	runtime.GC()
	fds := fdCount(t)
	maps, ours := mapsCount(t)
	t.Logf("%d cycles in %v (%v each); fds %d -> %d; mappings %d -> %d (memfd %d -> %d)",
		cycles, elapsed.Round(time.Millisecond), (elapsed / time.Duration(cycles)).Round(time.Microsecond), fds0, fds, maps0, maps, ours0, ours)
	if fds != fds0 {
		t.Errorf("%d fds after %d cycles, %d before", fds, cycles, fds0)
	}
	if ours != 0 || ours0 != 0 {
		t.Errorf("memfd mappings left: %d (before the cycles: %d)", ours, ours0)
	}
	if live, _ := Mappings(); live != 0 {
		t.Errorf("the mapping budget counts %d mappings, with none left", live)
	}
	if n := verbs.LiveMem(); n != 0 {
		t.Errorf("%d regions of verbs.AllocMem still mapped", n)
	}
	// The Go runtime may map more heap or thread stacks (the race
	// detector's shadow too); our memory is accounted above. A mapping
	// left per cycle would show here.
	if maps > maps0+max(16, cycles/4) {
		t.Errorf("%d mappings after %d cycles, %d before", maps, cycles, maps0)
	}
	end := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > g0 && time.Now().Before(end) {
		time.Sleep(time.Millisecond)
	}
	if g := runtime.NumGoroutine(); g > g0 {
		t.Errorf("%d goroutines after the cycles, %d before", g, g0)
	}
	if rv.ln != nil || rv.refs != 0 || len(rv.regs) != 0 {
		t.Errorf("rendezvous listener still up: refs %d, registrations %d", rv.refs, len(rv.regs))
	}
}

// TestRegionLifetime: a region passed in the exchange is the peer's to
// WRITE; once deregistered, it stays mapped at the writer (no revoke: see
// Deviations). A region registered after the connection is not passed:
// a WRITE to its key fails as one to an rkey the peer never had.
func TestRegionLifetime(t *testing.T) {
	a, b := openEnd(t, 16), openEnd(t, 16)
	early := b.alloc(t, 8192, verbs.AccessRemoteWrite)
	connect(t, a, b)
	wr := verbs.SendWR{ID: 1, Op: verbs.OpWrite, Inline: []byte("hello"), RemoteAddr: early.Addr() + 4096, RKey: early.RKey(), Signaled: true}
	if err := a.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if c := pollN(t, a.cq, 1)[0]; c.Err() != nil || !bytes.Equal(early.Bytes()[4096:4101], []byte("hello")) {
		t.Fatalf("WRITE to a region passed in the exchange: %+v", c)
	}
	if err := early.Close(); err != nil {
		t.Fatal(err)
	}
	wr.ID = 2
	if err := a.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if c := pollN(t, a.cq, 1)[0]; c.ID != 2 || c.Err() != nil {
		t.Fatalf("WRITE to a region the peer deregistered: %+v (%v), want success (no revoke)", c, c.Status)
	}
	late := b.alloc(t, 4096, verbs.AccessRemoteWrite)
	wr.ID, wr.RemoteAddr, wr.RKey = 3, late.Addr(), late.RKey()
	if err := a.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if c := pollN(t, a.cq, 1)[0]; c.ID != 3 || c.Status != verbs.StatusRemoteAccess {
		t.Fatalf("WRITE to a region registered after the connection: %+v (%v), want StatusRemoteAccess", c, c.Status)
	}
	// An RC responder fails on an access violation too.
	b.postRecvs(t, 1, 64)
	if wc := drain(t, b.cq); len(wc) != 1 || wc[0].Status != verbs.StatusFlushed {
		t.Errorf("responder after the access violation: %+v, want its RECV flushed", wc)
	}
}

// TestPeerProcessGone: when the control connection ends (as when the peer
// process dies), sends fail with StatusRetryExceeded.
func TestPeerProcessGone(t *testing.T) {
	a, b := pair(t, 16)
	b.postRecvs(t, 4, 64)
	b.qp.cmu.Lock()
	l := b.qp.link
	b.qp.cmu.Unlock()
	_ = l.c.Close() // the kernel does this when the process exits
	end := time.Now().Add(5 * time.Second)
	for !a.qp.peerGone.Load() && time.Now().Before(end) {
		time.Sleep(time.Millisecond)
	}
	sendInline(t, a, 1, []byte("anyone?"))
	if c := pollN(t, a.cq, 1)[0]; c.Status != verbs.StatusRetryExceeded {
		t.Errorf("SEND after the peer vanished: %+v (%v), want StatusRetryExceeded", c, c.Status)
	}
}

// TestSharedCQ: several QPs on one CQ (and one link); an armed CQ is
// notified for any of them.
func TestSharedCQ(t *testing.T) {
	const n = 4
	s := newSharedCQ(t, n, 1)
	for i := n - 1; i >= 0; i-- {
		if err := s.cq.Arm(); err != nil {
			t.Fatal(err)
		}
		if wc := drain(t, s.cq); len(wc) != 0 {
			t.Fatalf("completions before anything was sent: %+v", wc)
		}
		sendInline(t, s.clients[i], 1, []byte{byte(i)})
		if !notified(s.cq, hangGuard) {
			t.Fatalf("no notification for QP %d", i)
		}
		if c := pollN(t, s.cq, 1)[0]; c.Err() != nil || c.ID != uint64(i) || s.slots.Bytes()[i*64] != byte(i) {
			t.Fatalf("QP %d: %+v", i, c)
		}
	}
}

// TestNoAlloc: the post and poll paths do not allocate.
func TestNoAlloc(t *testing.T) {
	a, b := pair(t, 64)
	slots := b.postRecvs(t, 64, 64)
	wr := verbs.SendWR{Op: verbs.OpSend, Inline: make([]byte, 32)}
	recv := verbs.RecvWR{Local: verbs.SGE{MR: slots, Length: 64}}
	wc := make([]verbs.Completion, 4)
	time.Sleep(10 * time.Millisecond) // let the dispatchers settle
	wakes := map[*end]uint64{a: a.qp.link.wakeups.Load(), b: b.qp.link.wakeups.Load()}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		wr.ID, wr.Signaled = uint64(i), i%16 == 15
		if err := a.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
		if n, err := b.cq.Poll(wc); n != 1 || err != nil {
			t.Fatalf("Poll: %d, %v", n, err)
		}
		recv.ID, recv.Local.Offset = wc[0].ID, int(wc[0].ID)*64
		if err := b.qp.PostRecv(&recv); err != nil {
			t.Fatal(err)
		}
		if _, err := a.cq.Poll(wc); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs != 0 {
		t.Errorf("%v allocations per post+poll", allocs)
	}
	// Nobody armed: no link eventfd was written (the only system call the
	// data path could make), so neither dispatcher woke.
	for _, e := range []*end{a, b} {
		if n := e.qp.link.wakeups.Load(); n != wakes[e] {
			t.Errorf("the link's dispatcher woke %d times though nobody armed", n-wakes[e])
		}
	}
}

// TestLinkChurn: QPs to one peer process connect and close concurrently,
// so that links are set up, shared and closed under each other.
func TestLinkChurn(t *testing.T) {
	const workers, cycles = 4, 300
	errc := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range cycles {
				a, b := openEnd(t, 8), openEnd(t, 8)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := b.qp.Connect(ctx, a.qp.Info(), false)
				if err == nil {
					err = a.qp.Connect(ctx, b.qp.Info(), true)
				}
				if err == nil {
					err = b.qp.Established(ctx)
				}
				cancel()
				if err != nil {
					errc <- fmt.Errorf("worker %d cycle %d: %w", w, i, err)
					return
				}
				if (i+w)%2 == 0 {
					a.close()
					b.close()
				} else {
					b.close()
					a.close()
				}
			}
			errc <- nil
		}()
	}
	for range workers {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	waitLinks(t)
}

// TestClosedDevice: a closed device makes nothing new, and says so.
func TestClosedDevice(t *testing.T) {
	e := openEnd(t, 16)
	fds0 := fdCount(t)
	if err := e.dev.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.dev.NewCQ(16, nil); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("NewCQ after Close: %v, want ErrClosed", err)
	}
	if _, err := e.dev.AllocMR(4096, verbs.AccessRemoteWrite); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("AllocMR after Close: %v, want ErrClosed", err)
	}
	if _, err := e.dev.NewQP(verbs.QPAttr{CQ: e.cq, SendDepth: 16, RecvDepth: 16}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("NewQP after Close: %v, want ErrClosed", err)
	}
	if n := fdCount(t); n > fds0 {
		t.Errorf("%d fds after Close and the refused calls, %d before", n, fds0)
	}
}
