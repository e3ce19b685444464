// Package verbstest is the conformance suite every verbs provider passes.
//
// A provider's tests call Run with the provider and the options its devices
// need. Every subtest uses fresh devices, CQs and QPs, connected with the
// same sequence rsock uses: the passive side connects first, then the active
// side, then the passive side calls Established. The two Connect calls are
// never concurrent, so providers that do side exchanges in Connect must not
// need them to be. RECVs may be posted on a new QP before any Connect (the
// INIT state).
//
// Every blocking step is bounded: each subtest has a context with a generous
// timeout (a hang guard, never a timing assertion); when it expires every
// wait of the subtest returns, and the subtest fails.
package verbstest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Timeout bounds each subtest. It only guards against hangs.
var Timeout = 2 * time.Minute

// Run runs the conformance suite against p. Devices are opened with opts. If
// the provider reports verbs.ErrUnavailable, the suite is skipped (failed
// where RequireEnv is set).
func Run(t *testing.T, p verbs.Provider, opts verbs.OpenOptions) {
	dev, err := p.Open(opts)
	if errors.Is(err, verbs.ErrUnavailable) {
		Unavailable(t, fmt.Sprintf("provider %s unavailable: %v", p.Name(), err))
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if got := dev.Provider(); got != p.Name() {
		t.Errorf("Device.Provider() = %q, Provider.Name() = %q", got, p.Name())
	}
	if err := dev.Close(); err != nil {
		t.Fatalf("Device.Close: %v", err)
	}
	closedDevice(t, dev)

	s := &suite{p: p, opts: opts}
	t.Run("AllocMR", s.testAllocMR)
	t.Run("WriteThenSend", s.testWriteThenSend)
	t.Run("SendRecv", s.testSendRecv)
	t.Run("RecvBeforeConnect", s.testRecvBeforeConnect)
	t.Run("Inline", s.testInline)
	t.Run("Chain", s.testChain)
	t.Run("Signaled", s.testSignaled)
	t.Run("RemoteAccess", s.testRemoteAccess)
	t.Run("CloseFlushesRecvs", s.testCloseFlushesRecvs)
	t.Run("Notify", s.testNotify)
	t.Run("Peek", s.testPeek)
	t.Run("Limits", s.testLimits)
	t.Run("Concurrent", s.testConcurrent)
	t.Run("ClosedPeer", s.testClosedPeer)
}

type suite struct {
	p    verbs.Provider
	opts verbs.OpenOptions
}

// config sizes a pair.
type config struct {
	sendDepth, recvDepth, maxInline, cqDepth int
	// remote is the size of pair.dst, registered on b before the QPs
	// connect: a peer may write only regions registered by then
	// (verbs.MR).
	remote int
	// beforeConnect, if set, runs once both QPs exist, before any Connect.
	beforeConnect func(pr *pair)
}

var defaultConfig = config{sendDepth: 64, recvDepth: 64, maxInline: 64, cqDepth: 1024, remote: 64 << 10}

// side is one end of a pair.
type side struct {
	dev verbs.Device
	cq  verbs.CQ
	qp  verbs.QP
	mrs []verbs.MR
}

// pair is two connected QPs on two devices: a is the active side, b the
// passive one.
type pair struct {
	t      *testing.T
	ctx    context.Context
	cancel context.CancelFunc
	a, b   *side
	dst    verbs.MR // b's remote-writable region of config.remote bytes
}

// openDevice opens a device closed at the end of the test.
func (s *suite) openDevice(t *testing.T) verbs.Device {
	t.Helper()
	dev, err := s.p.Open(s.opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	return dev
}

// newPair opens, creates and connects two sides. Everything is released at
// the end of the test: QPs, then CQs, then MRs, then devices.
func (s *suite) newPair(t *testing.T, cfg config) *pair {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	pr := &pair{t: t, ctx: ctx, cancel: cancel, a: &side{}, b: &side{}}
	t.Cleanup(pr.release)
	for _, sd := range []*side{pr.a, pr.b} {
		var err error
		if sd.dev, err = s.p.Open(s.opts); err != nil {
			t.Fatalf("Open: %v", err)
		}
		if sd.cq, err = newCQ(sd.dev, cfg.cqDepth); err != nil {
			t.Fatalf("NewCQ(%d): %v", cfg.cqDepth, err)
		}
		sd.qp, err = sd.dev.NewQP(verbs.QPAttr{
			CQ:        sd.cq,
			SendDepth: cfg.sendDepth,
			RecvDepth: cfg.recvDepth,
			MaxInline: cfg.maxInline,
		})
		if err != nil {
			t.Fatalf("NewQP: %v", err)
		}
	}
	if cfg.remote > 0 {
		pr.dst = pr.alloc(pr.b, cfg.remote, remoteWrite)
	}
	if cfg.beforeConnect != nil {
		cfg.beforeConnect(pr)
	}
	if err := pr.b.qp.Connect(ctx, pr.a.qp.Info(), false); err != nil {
		t.Fatalf("passive Connect: %v", err)
	}
	if err := pr.a.qp.Connect(ctx, pr.b.qp.Info(), true); err != nil {
		t.Fatalf("active Connect: %v", err)
	}
	if err := pr.b.qp.Established(ctx); err != nil {
		t.Fatalf("Established: %v", err)
	}
	return pr
}

func (pr *pair) release() {
	pr.cancel()
	for _, sd := range []*side{pr.a, pr.b} {
		if sd.qp != nil {
			_ = sd.qp.Close()
		}
	}
	for _, sd := range []*side{pr.a, pr.b} {
		if sd.cq != nil {
			_ = sd.cq.Close()
		}
	}
	for _, sd := range []*side{pr.a, pr.b} {
		for _, mr := range sd.mrs {
			_ = mr.Close()
		}
		if sd.dev != nil {
			_ = sd.dev.Close()
		}
	}
}

// fail reports an error from any goroutine and aborts the pair, which
// unblocks every goroutine waiting on it.
func (pr *pair) fail(format string, args ...any) {
	pr.t.Helper()
	pr.t.Errorf(format, args...)
	pr.cancel()
}

// alloc allocates an MR on sd, released with the pair.
func (pr *pair) alloc(sd *side, size int, access verbs.Access) verbs.MR {
	pr.t.Helper()
	mr, err := sd.dev.AllocMR(size, access)
	if err != nil {
		pr.t.Fatalf("AllocMR(%d, %v): %v", size, access, err)
	}
	sd.mrs = append(sd.mrs, mr)
	return mr
}

const (
	localWrite  = verbs.AccessLocalWrite
	remoteWrite = verbs.AccessLocalWrite | verbs.AccessRemoteWrite
)

// bell latches and counts the notifications of a CQ: its ring is the
// notify function the CQ was created with.
type bell struct {
	ch chan struct{} // capacity 1
	n  atomic.Int64
}

func (b *bell) ring() {
	b.n.Add(1)
	select {
	case b.ch <- struct{}{}:
	default:
	}
}

// bells maps each CQ the suite created to its bell.
var bells sync.Map

// newCQ creates a CQ on dev whose notifications ring a bell (bellOf).
func newCQ(dev verbs.Device, depth int) (verbs.CQ, error) {
	b := &bell{ch: make(chan struct{}, 1)}
	cq, err := dev.NewCQ(depth, b.ring)
	if err == nil {
		bells.Store(cq, b)
	}
	return cq, err
}

func bellOf(cq verbs.CQ) *bell {
	b, _ := bells.Load(cq)
	return b.(*bell)
}

// pollN returns once n completions were polled from cq, waiting for its
// notifications with Arm and a poll after it. It fails when ctx is done or
// the CQ fails.
func pollN(ctx context.Context, cq verbs.CQ, n int) ([]verbs.Completion, error) {
	b := bellOf(cq)
	out := make([]verbs.Completion, 0, n)
	buf := make([]verbs.Completion, min(n, 64))
	poll := func() (int, error) {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		return k, err
	}
	for len(out) < n {
		if k, err := poll(); err != nil || k > 0 {
			if err != nil {
				return out, pollErr(ctx, "Poll", err, len(out), n)
			}
			continue
		}
		if err := cq.Arm(); err != nil {
			return out, pollErr(ctx, "Arm", err, len(out), n)
		}
		if k, err := poll(); err != nil || k > 0 {
			if err != nil {
				return out, pollErr(ctx, "Poll", err, len(out), n)
			}
			continue
		}
		select {
		case <-b.ch:
		case <-ctx.Done():
			return out, pollErr(ctx, "wait", ctx.Err(), len(out), n)
		}
	}
	return out, nil
}

// spin polls cq without arming it until one completion comes.
func (pr *pair) spin(cq verbs.CQ) verbs.Completion {
	pr.t.Helper()
	var wc [1]verbs.Completion
	for {
		n, err := cq.Poll(wc[:])
		switch {
		case err != nil:
			pr.t.Fatalf("Poll: %v", err)
		case n == 1:
			return wc[0]
		case pr.ctx.Err() != nil:
			pr.t.Fatal("no completion within the suite's timeout")
		}
		runtime.Gosched()
	}
}

// ring waits for a notification of b.
func (pr *pair) ring(b *bell) {
	pr.t.Helper()
	select {
	case <-b.ch:
	case <-pr.ctx.Done():
		pr.t.Fatal("no notification within the suite's timeout")
	}
}

func pollErr(ctx context.Context, op string, err error, got, want int) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%d of %d completions, then aborted (%v): %s: %w", got, want, context.Cause(ctx), op, err)
	}
	return fmt.Errorf("%d of %d completions: %s: %w", got, want, op, err)
}

// drain polls cq without blocking until it is empty.
func drain(cq verbs.CQ) ([]verbs.Completion, error) {
	var out []verbs.Completion
	buf := make([]verbs.Completion, 64)
	for {
		k, err := cq.Poll(buf)
		out = append(out, buf[:k]...)
		if err != nil || k == 0 {
			return out, err
		}
	}
}

// one waits for exactly one completion.
func (pr *pair) one(cq verbs.CQ) verbs.Completion {
	pr.t.Helper()
	wc, err := pollN(pr.ctx, cq, 1)
	if err != nil {
		pr.t.Fatal(err)
	}
	return wc[0]
}

// expectOK fails unless c is a successful completion of op with id.
func expectOK(t *testing.T, c verbs.Completion, op verbs.Opcode, id uint64) bool {
	t.Helper()
	if c.Status != verbs.StatusSuccess || c.Op != op || c.ID != id {
		t.Errorf("completion %+v (%v, %v), want %v of id %d with success", c, c.Op, c.Status, op, id)
		return false
	}
	return true
}

// fill writes a pattern derived from seed into b.
func fill(b []byte, seed uint64) {
	r := rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

// SendLimiter is implemented by QPs whose SENDs carry fewer bytes than the
// suite would otherwise send (shm: a SEND travels inline in a shared-memory
// queue entry). The suite keeps its SENDs within MaxSend and checks that a
// longer one is refused when posted.
type SendLimiter interface {
	MaxSend() int
}

// sendLimit returns min(def, the QP's MaxSend) for a SendLimiter, else def.
func sendLimit(qp verbs.QP, def int) int {
	if l, ok := qp.(SendLimiter); ok {
		return min(def, l.MaxSend())
	}
	return def
}

// postRecv posts a RECV for slot i of a buffer MR cut into slots of size n.
func (pr *pair) postRecv(sd *side, mr verbs.MR, i, n int) {
	pr.t.Helper()
	err := sd.qp.PostRecv(&verbs.RecvWR{ID: uint64(i), Local: verbs.SGE{MR: mr, Offset: i * n, Length: n}})
	if err != nil {
		pr.t.Fatalf("PostRecv(%d): %v", i, err)
	}
}

// postSend posts wr and fails the test on error.
func (pr *pair) postSend(sd *side, wr verbs.SendWR) {
	pr.t.Helper()
	if err := sd.qp.PostSend(&wr); err != nil {
		pr.t.Fatalf("PostSend(%v id %d): %v", wr.Op, wr.ID, err)
	}
}

// closedDevice checks that a closed device makes nothing new and says so,
// without hanging.
func closedDevice(t *testing.T, dev verbs.Device) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if cq, err := dev.NewCQ(16, nil); !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("NewCQ on a closed device: %v, want ErrClosed", err)
			if cq != nil {
				_ = cq.Close()
			}
		}
		if mr, err := dev.AllocMR(4096, verbs.AccessRemoteWrite); !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("AllocMR on a closed device: %v, want ErrClosed", err)
			if mr != nil {
				_ = mr.Close()
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(Timeout):
		t.Fatal("NewCQ or AllocMR on a closed device hung")
	}
}
