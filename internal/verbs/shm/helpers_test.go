//go:build linux

package shm

import (
	"context"
	"encoding/binary"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// end is one side of a test connection.
type end struct {
	dev *Device
	cq  *CQ
	qp  *QP
	mrs []*MR
}

// openEnd opens a device with a CQ and a QP of the given depth; everything
// is released at the end of the test.
func openEnd(t testing.TB, depth int) *end {
	t.Helper()
	dev, err := New().OpenDevice()
	if err != nil {
		t.Fatalf("OpenDevice: %v", err)
	}
	e := &end{dev: dev}
	t.Cleanup(e.close)
	cq, err := newTestCQ(dev, 4*depth)
	if err != nil {
		t.Fatalf("NewCQ: %v", err)
	}
	e.cq = cq
	qp, err := dev.NewQP(verbs.QPAttr{CQ: cq, SendDepth: depth, RecvDepth: depth, MaxInline: 32})
	if err != nil {
		t.Fatalf("NewQP: %v", err)
	}
	e.qp = qp.(*QP)
	return e
}

// close releases the end: QP, CQ, regions, device.
func (e *end) close() {
	if e.qp != nil {
		_ = e.qp.Close()
	}
	if e.cq != nil {
		_ = e.cq.Close()
	}
	for _, mr := range e.mrs {
		_ = mr.Close()
	}
	_ = e.dev.Close()
}

func (e *end) alloc(t testing.TB, size int, access verbs.Access) *MR {
	t.Helper()
	mr, err := e.dev.AllocMR(size, access)
	if err != nil {
		t.Fatalf("AllocMR(%d): %v", size, err)
	}
	e.mrs = append(e.mrs, mr.(*MR))
	return mr.(*MR)
}

// postRecvs posts n RECVs of size bytes each in a new region and returns it.
func (e *end) postRecvs(t testing.TB, n, size int) *MR {
	t.Helper()
	mr := e.alloc(t, n*size, verbs.AccessLocalWrite)
	for i := range n {
		if err := e.qp.PostRecv(&verbs.RecvWR{ID: uint64(i), Local: verbs.SGE{MR: mr, Offset: i * size, Length: size}}); err != nil {
			t.Fatalf("PostRecv %d: %v", i, err)
		}
	}
	return mr
}

// connect connects a (active) and b (passive) the way rsock does.
func connect(t testing.TB, a, b *end) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.qp.Connect(ctx, a.qp.Info(), false); err != nil {
		t.Fatalf("passive Connect: %v", err)
	}
	if err := a.qp.Connect(ctx, b.qp.Info(), true); err != nil {
		t.Fatalf("active Connect: %v", err)
	}
	if err := b.qp.Established(ctx); err != nil {
		t.Fatalf("Established: %v", err)
	}
}

// pair returns two connected ends with RECVs of 64 bytes posted on both.
func pair(t testing.TB, depth int) (a, b *end) {
	t.Helper()
	a, b = openEnd(t, depth), openEnd(t, depth)
	connect(t, a, b)
	return a, b
}

// pollN busy-polls cq for n completions (failing the test after 10s).
func pollN(t testing.TB, cq *CQ, n int) []verbs.Completion {
	t.Helper()
	out := make([]verbs.Completion, 0, n)
	wc := make([]verbs.Completion, n)
	end := time.Now().Add(10 * time.Second)
	for len(out) < n {
		k, err := cq.Poll(wc[:n-len(out)])
		if err != nil {
			t.Fatalf("Poll after %d of %d completions: %v", len(out), n, err)
		}
		out = append(out, wc[:k]...)
		if k == 0 {
			if time.Now().After(end) {
				t.Fatalf("%d of %d completions after 10s: %+v", len(out), n, out)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return out
}

// bells holds each test CQ's notification channel (capacity 1) and count.
var bells sync.Map // *CQ -> *bell

type bell struct {
	ch chan struct{}
	n  atomic.Int64
}

// newTestCQ creates a CQ whose notifications signal its bell.
func newTestCQ(dev *Device, depth int) (*CQ, error) {
	b := &bell{ch: make(chan struct{}, 1)}
	cq, err := dev.NewCQ(depth, func() {
		b.n.Add(1)
		select {
		case b.ch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	bells.Store(cq, b)
	return cq.(*CQ), nil
}

func bellOf(cq *CQ) *bell {
	b, _ := bells.Load(cq)
	return b.(*bell)
}

// notified waits for a notification of cq, at most hangGuard; false means
// none came.
func notified(cq *CQ, hangGuard time.Duration) bool {
	select {
	case <-bellOf(cq).ch:
		return true
	case <-time.After(hangGuard):
		return false
	}
}

// drain polls cq until it is empty.
func drain(t testing.TB, cq *CQ) []verbs.Completion {
	t.Helper()
	var out []verbs.Completion
	wc := make([]verbs.Completion, 16)
	for {
		k, err := cq.Poll(wc)
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if k == 0 {
			return out
		}
		out = append(out, wc[:k]...)
	}
}

// sendInline posts a signaled inline SEND.
func sendInline(t testing.TB, e *end, id uint64, msg []byte) {
	t.Helper()
	if err := e.qp.PostSend(&verbs.SendWR{ID: id, Op: verbs.OpSend, Inline: msg, Signaled: true}); err != nil {
		t.Fatalf("PostSend: %v", err)
	}
}

// fdCount returns the number of open fds of this process.
func fdCount(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("reading /proc/self/fd: %v", err)
	}
	return len(ents)
}

// mapsCount returns the lines of /proc/self/maps and those of this
// package's memfds.
func mapsCount(t testing.TB) (all, ours int) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatalf("reading /proc/self/maps: %v", err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		all++
		if strings.Contains(l, "memfd:rsock-shm") {
			ours++
		}
	}
	return all, ours
}

// waitLinks ends the lingering links and waits until every link of this
// process is released: a link's passive end goes when its reader sees the
// active end close, after the QPs on both sides are closed.
func waitLinks(t testing.TB) {
	t.Helper()
	EndIdleLinks()
	end := time.Now().Add(5 * time.Second)
	for liveLinks.Load() != 0 {
		if time.Now().After(end) {
			t.Fatalf("%d links still open", liveLinks.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// sharedCQ is one device whose n QPs share one CQ, each connected
// (passive) to a client end of its own; all of them are on one link.
type sharedCQ struct {
	cq      *CQ
	qps     []*QP
	slots   *MR // recvs RECVs of 64 bytes per QP: QP i's RECV j is ID i*recvs+j
	clients []*end
}

func newSharedCQ(t testing.TB, n, recvs int) *sharedCQ {
	t.Helper()
	dev, err := New().OpenDevice()
	if err != nil {
		t.Fatal(err)
	}
	srv := &end{dev: dev}
	t.Cleanup(srv.close)
	cq, err := newTestCQ(dev, 256)
	if err != nil {
		t.Fatal(err)
	}
	srv.cq = cq
	s := &sharedCQ{cq: cq, slots: srv.alloc(t, n*recvs*64, verbs.AccessLocalWrite)}
	for i := range n {
		qp, err := dev.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 8, RecvDepth: max(recvs, 8)})
		if err != nil {
			t.Fatal(err)
		}
		q := qp.(*QP)
		t.Cleanup(func() { _ = q.Close() })
		for j := range recvs {
			id := i*recvs + j
			if err := q.PostRecv(&verbs.RecvWR{ID: uint64(id), Local: verbs.SGE{MR: s.slots, Offset: id * 64, Length: 64}}); err != nil {
				t.Fatal(err)
			}
		}
		c := openEnd(t, 8)
		connect(t, c, &end{dev: dev, cq: cq, qp: q})
		s.qps = append(s.qps, q)
		s.clients = append(s.clients, c)
	}
	for _, q := range s.qps[1:] {
		if q.link != s.qps[0].link {
			t.Fatal("the shared CQ's QPs are not on one link")
		}
	}
	return s
}

// sleeping returns the sleeping words of the QPs' inboxes.
func (s *sharedCQ) sleeping() []uint32 {
	var v []uint32
	for _, q := range s.qps {
		v = append(v, q.in.hdr.sleeping.Load())
	}
	return v
}

// eventfdWrites returns how many times peers wrote l's eventfd since the
// last call (or since the link was set up), and resets the count. The
// dispatcher never reads the counter, so this does not disturb it: a read
// makes no edge, and the dispatcher waits for edges only.
func eventfdWrites(t testing.TB, l *link) uint64 {
	t.Helper()
	var buf [8]byte
	var n int
	var rerr error
	if err := l.eraw.Control(func(fd uintptr) { n, rerr = unix.Read(int(fd), buf[:]) }); err != nil {
		t.Fatal(err)
	}
	switch {
	case rerr == unix.EAGAIN:
		return 0
	case rerr != nil || n != 8:
		t.Fatalf("reading the link's eventfd: %d bytes, %v", n, rerr)
	}
	return binary.NativeEndian.Uint64(buf[:])
}
