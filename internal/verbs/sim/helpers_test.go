package sim_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

// hangGuard bounds every wait of these tests; it is never a timing
// assertion.
const hangGuard = time.Minute

// end is one side of a connection.
type end struct {
	t   *testing.T
	dev *sim.Device
	cq  *sim.CQ
	qp  *sim.QP
}

type endConfig struct {
	sendDepth, recvDepth, cqDepth, maxInline int
}

var defaultEnd = endConfig{sendDepth: 256, recvDepth: 256, cqDepth: 4096, maxInline: 64}

// newEnd opens a device with a CQ and an unconnected QP, all closed at the
// end of the test.
func newEnd(t *testing.T, p *sim.Provider, cfg endConfig) *end {
	t.Helper()
	dev := p.OpenDevice()
	t.Cleanup(func() { _ = dev.Close() })
	cq, err := newCQ(dev, cfg.cqDepth)
	if err != nil {
		t.Fatalf("NewCQ: %v", err)
	}
	qp, err := dev.NewQP(verbs.QPAttr{CQ: cq, SendDepth: cfg.sendDepth, RecvDepth: cfg.recvDepth, MaxInline: cfg.maxInline})
	if err != nil {
		t.Fatalf("NewQP: %v", err)
	}
	return &end{t: t, dev: dev, cq: cq, qp: qp.(*sim.QP)}
}

// connect connects a (active) and b (passive) the way rsock does.
func connect(t *testing.T, a, b *end) {
	t.Helper()
	ctx := t.Context()
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

// newPair returns two connected ends using p.
func newPair(t *testing.T, p *sim.Provider, cfg endConfig) (a, b *end) {
	t.Helper()
	a, b = newEnd(t, p, cfg), newEnd(t, p, cfg)
	connect(t, a, b)
	return a, b
}

func (e *end) alloc(size int, access verbs.Access) *sim.MR {
	e.t.Helper()
	mr, err := e.dev.AllocMR(size, access)
	if err != nil {
		e.t.Fatalf("AllocMR: %v", err)
	}
	return mr.(*sim.MR)
}

const (
	localWrite  = verbs.AccessLocalWrite
	remoteWrite = verbs.AccessLocalWrite | verbs.AccessRemoteWrite
)

// recvs posts n RECVs of size bytes each, ids first.., in slots of mr.
func (e *end) recvs(mr verbs.MR, first, n, size int) {
	e.t.Helper()
	for i := first; i < first+n; i++ {
		if err := e.qp.PostRecv(&verbs.RecvWR{ID: uint64(i), Local: verbs.SGE{MR: mr, Offset: i * size, Length: size}}); err != nil {
			e.t.Fatalf("PostRecv %d: %v", i, err)
		}
	}
}

func (e *end) post(wr verbs.SendWR) {
	e.t.Helper()
	if err := e.qp.PostSend(&wr); err != nil {
		e.t.Fatalf("PostSend(%v %d): %v", wr.Op, wr.ID, err)
	}
}

// sendU64 posts a signaled inline SEND carrying v.
func (e *end) sendU64(id, v uint64) {
	e.t.Helper()
	e.post(verbs.SendWR{ID: id, Op: verbs.OpSend, Inline: binary.LittleEndian.AppendUint64(nil, v), Signaled: true})
}

// poll waits for n completions on the end's CQ.
func (e *end) poll(n int) []verbs.Completion {
	e.t.Helper()
	wc, err := pollN(e.cq, n)
	if err != nil {
		e.t.Fatal(err)
	}
	return wc
}

// bells holds each test CQ's notification channel (capacity 1), which
// its notify function signals.
var bells sync.Map

// newCQ creates a CQ whose notifications signal its channel in bells.
func newCQ(dev *sim.Device, depth int) (*sim.CQ, error) {
	ch := make(chan struct{}, 1)
	cq, err := dev.NewCQ(depth, func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	bells.Store(cq, ch)
	return cq.(*sim.CQ), nil
}

// pollN waits for n completions, with Arm, a poll after it, and the CQ's
// notification; it gives up after hangGuard.
func pollN(cq *sim.CQ, n int) ([]verbs.Completion, error) {
	ch, _ := bells.Load(cq)
	guard := time.NewTimer(hangGuard)
	defer guard.Stop()
	out := make([]verbs.Completion, 0, n)
	buf := make([]verbs.Completion, 32)
	armed := false
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		if err != nil {
			return out, err
		}
		out = append(out, buf[:k]...)
		switch {
		case k > 0:
			armed = false
		case !armed:
			if err := cq.Arm(); err != nil {
				return out, err
			}
			armed = true
		default:
			select {
			case <-ch.(chan struct{}):
			case <-guard.C:
				return out, fmt.Errorf("%d of %d completions within %v", len(out), n, hangGuard)
			}
			armed = false
		}
	}
	return out, nil
}

// empty fails if the end's CQ holds a visible completion.
func (e *end) empty() {
	e.t.Helper()
	var wc [4]verbs.Completion
	if n, err := e.cq.Poll(wc[:]); n != 0 || err != nil {
		e.t.Fatalf("unexpected completions %+v, err %v", wc[:n], err)
	}
}

// status checks one completion's id and status.
func status(t *testing.T, c verbs.Completion, id uint64, want verbs.Status) {
	t.Helper()
	if c.ID != id || c.Status != want {
		t.Errorf("completion %+v (%v), want id %d with %v", c, c.Status, id, want)
	}
}

// eventually retries f until it returns nil, for effects that happen on
// another goroutine.
func eventually(t *testing.T, f func() error) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
}

func isQPState(err error) error {
	if errors.Is(err, verbs.ErrQPState) {
		return nil
	}
	return errors.New("want ErrQPState, got " + errString(err))
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}
