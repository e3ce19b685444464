package verbstest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// testRemoteAccess: WRITEs the peer must refuse fail with StatusRemoteAccess
// and leave the QP unable to execute later requests (iWARP: the WRITE may
// complete, and the QP then becomes unusable; see localWriter).
func (s *suite) testRemoteAccess(t *testing.T) {
	cases := []struct {
		name   string
		target func(pr *pair) (addr uint64, rkey uint32)
	}{
		{"PastEnd", func(pr *pair) (uint64, uint32) {
			dst := pr.dst
			return dst.Addr() + uint64(len(dst.Bytes())) - 4, dst.RKey()
		}},
		{"BeforeStart", func(pr *pair) (uint64, uint32) {
			dst := pr.dst
			return dst.Addr() - 4, dst.RKey()
		}},
		{"WrongRKey", func(pr *pair) (uint64, uint32) {
			dst := pr.dst
			return dst.Addr(), dst.RKey() ^ 0xa5a5a5a5
		}},
		{"NoRemoteWrite", func(pr *pair) (uint64, uint32) {
			dst := pr.alloc(pr.b, 4096, localWrite)
			return dst.Addr(), dst.RKey()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr := s.newPair(t, defaultConfig)
			src := pr.alloc(pr.a, 8, localWrite)
			addr, rkey := tc.target(pr)
			pr.postSend(pr.a, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Local: verbs.SGE{MR: src, Length: 8}, RemoteAddr: addr, RKey: rkey, Signaled: true})
			c := pr.one(pr.a.cq)
			if l, ok := pr.a.qp.(localWriter); ok && l.WriteCompletesLocally() && c.ID == 1 && c.Status == verbs.StatusSuccess {
				// iWARP: the WRITE's completion is local; the peer's
				// refusal ends the connection.
				pr.expectUnusableSoon(pr.a)
				return
			}
			if c.ID != 1 || c.Status != verbs.StatusRemoteAccess {
				t.Fatalf("refused WRITE completed with %+v (%v), want StatusRemoteAccess", c, c.Status)
			}
			pr.expectUnusable(pr.a)
		})
	}
}

// localWriter is implemented by QPs whose WRITE completions are local
// (ibverbs on iWARP, where RDMAP does not acknowledge WRITEs): a WRITE the
// peer refuses may complete successfully, and the QP moves to the error
// state when the peer ends the connection.
type localWriter interface {
	WriteCompletesLocally() bool
}

// expectUnusableSoon checks that sd's QP moves to the error state: SENDs
// are posted until one is refused with ErrQPState or completes with an
// error, waiting for each completion at most 100 ms (a post the peer
// never sees may not complete before the QP's error is known), within
// the suite's timeout.
func (pr *pair) expectUnusableSoon(sd *side) {
	pr.t.Helper()
	src := pr.alloc(sd, 8, localWrite)
	wc := make([]verbs.Completion, 1)
	for id := uint64(2); pr.ctx.Err() == nil; id++ {
		err := sd.qp.PostSend(&verbs.SendWR{ID: id, Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: 8}, Signaled: true})
		switch {
		case errors.Is(err, verbs.ErrQPState):
			return
		case errors.Is(err, verbs.ErrQueueFull):
		case err != nil:
			pr.t.Fatalf("post on a QP the peer refused: %v, want ErrQPState or an error completion", err)
		}
		ctx, cancel := context.WithTimeout(pr.ctx, 100*time.Millisecond)
		for ctx.Err() == nil {
			n, err := sd.cq.Poll(wc)
			if err != nil {
				pr.t.Fatalf("Poll: %v", err)
			}
			if n == 1 && wc[0].Status != verbs.StatusSuccess {
				cancel()
				return
			}
			if n == 0 {
				runtime.Gosched()
			}
		}
		cancel()
	}
	pr.t.Fatal("the QP still takes work after the peer refused a WRITE")
}

// expectUnusable checks that a post on sd's QP, now in the error state,
// fails with ErrQPState or completes as flushed.
func (pr *pair) expectUnusable(sd *side) {
	pr.t.Helper()
	src := pr.alloc(sd, 8, localWrite)
	err := sd.qp.PostSend(&verbs.SendWR{ID: 2, Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: 8}, Signaled: true})
	switch {
	case errors.Is(err, verbs.ErrQPState):
	case err != nil:
		pr.t.Errorf("post on a QP in the error state: %v, want ErrQPState or a flushed completion", err)
	default:
		if c := pr.one(sd.cq); c.ID != 2 || c.Status != verbs.StatusFlushed {
			pr.t.Errorf("post on a QP in the error state completed with %+v (%v), want StatusFlushed", c, c.Status)
		}
	}
}

// testCloseFlushesRecvs: closing a QP completes its RECVs as flushed.
func (s *suite) testCloseFlushesRecvs(t *testing.T) {
	const n = 10
	pr := s.newPair(t, defaultConfig)
	rbuf := pr.alloc(pr.b, n*64, localWrite)
	for i := range n {
		pr.postRecv(pr.b, rbuf, i, 64)
	}
	if err := pr.b.qp.Close(); err != nil {
		t.Fatalf("QP.Close: %v", err)
	}
	wc, err := pollN(pr.ctx, pr.b.cq, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range wc {
		if c.ID != uint64(i) || c.Status != verbs.StatusFlushed {
			t.Errorf("completion %d after Close: %+v (%v), want id %d flushed", i, c, c.Status, i)
		}
	}
	if extra, err := drain(pr.b.cq); len(extra) > 0 {
		t.Errorf("%d completions more than RECVs posted: %+v (%v)", len(extra), extra, err)
	}
	_ = pr.b.qp.Close() // must not panic
}

// notifyPair is a pair with four RECVs posted on b, and b's CQ's bell.
func (s *suite) notifyPair(t *testing.T) (*pair, *bell) {
	pr := s.newPair(t, defaultConfig)
	rbuf := pr.alloc(pr.b, 64*4, localWrite)
	for i := range 4 {
		pr.postRecv(pr.b, rbuf, i, 64)
	}
	return pr, bellOf(pr.b.cq)
}

// sendOne sends one byte from a to b and waits for a's send completion.
func (pr *pair) sendOne(id uint64, solicited bool) {
	pr.t.Helper()
	pr.postSend(pr.a, verbs.SendWR{ID: id, Op: verbs.OpSend, Inline: []byte{byte(id)}, Signaled: true, Solicited: solicited})
	expectOK(pr.t, pr.one(pr.a.cq), verbs.OpSend, id)
}

// testNotify: notify is called once per Arm, for a completion that comes
// after it; never without an Arm or after Disarm; Arm fails after Close.
// The negative checks are deterministic: a completion polled while unarmed
// is followed by an armed one, whose notification must be the only one.
func (s *suite) testNotify(t *testing.T) {
	t.Run("Wake", func(t *testing.T) {
		pr, b := s.notifyPair(t)
		send := func(id uint64) { pr.sendOne(id, false) }
		// Unarmed: the completion comes, no notification.
		send(1)
		expectOK(t, pr.spin(pr.b.cq), verbs.OpRecv, 0)
		// Armed, then disarmed: no notification either.
		if err := pr.b.cq.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		pr.b.cq.Disarm()
		send(2)
		expectOK(t, pr.spin(pr.b.cq), verbs.OpRecv, 1)
		// Armed: one notification for two completions. (They are taken
		// without arming again: a provider may deliver the second after
		// the notification, and an Arm would then rightly fire again.)
		if err := pr.b.cq.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if n, err := pr.b.cq.Poll(make([]verbs.Completion, 1)); n != 0 || err != nil {
			t.Fatalf("Poll after Arm with nothing sent: %d, %v", n, err)
		}
		send(3)
		send(4)
		pr.ring(b)
		expectOK(t, pr.spin(pr.b.cq), verbs.OpRecv, 2)
		expectOK(t, pr.spin(pr.b.cq), verbs.OpRecv, 3)
		if n := b.n.Load(); n != 1 {
			t.Errorf("%d notifications, want exactly 1 (one per Arm, none unarmed or disarmed)", n)
		}
	})

	t.Run("Solicited", func(t *testing.T) {
		pr, b := s.notifyPair(t)
		send := pr.sendOne
		// Armed for solicited completions: an unsolicited SEND does not
		// fire it, the solicited one after it does (once).
		if err := pr.b.cq.ArmSolicited(); err != nil {
			t.Fatalf("ArmSolicited: %v", err)
		}
		send(1, false)
		expectOK(t, pr.spin(pr.b.cq), verbs.OpRecv, 0)
		send(2, true)
		pr.ring(b)
		expectOK(t, pr.one(pr.b.cq), verbs.OpRecv, 1)
		if n := b.n.Load(); n != 1 {
			t.Errorf("%d notifications, want 1: for the solicited SEND only", n)
		}
		// Arm after ArmSolicited: any completion fires it.
		if err := pr.b.cq.ArmSolicited(); err != nil {
			t.Fatalf("ArmSolicited: %v", err)
		}
		if err := pr.b.cq.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		send(3, false)
		pr.ring(b)
		expectOK(t, pr.one(pr.b.cq), verbs.OpRecv, 2)
	})

	t.Run("LocalCompletion", func(t *testing.T) {
		pr := s.newPair(t, defaultConfig)
		rbuf := pr.alloc(pr.b, 64, localWrite)
		pr.postRecv(pr.b, rbuf, 0, 64)
		b := bellOf(pr.a.cq)
		if err := pr.a.cq.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		pr.postSend(pr.a, verbs.SendWR{ID: 5, Op: verbs.OpSend, Inline: []byte{5}, Signaled: true})
		pr.ring(b)
		expectOK(t, pr.one(pr.a.cq), verbs.OpSend, 5)
	})

	t.Run("Overrun", func(t *testing.T) {
		// More signaled completions than the CQ holds, none polled: the
		// CQ fails, and says so to Poll or Arm, and to an armed waiter
		// through notify, however the provider learns it.
		cfg := defaultConfig
		cfg.cqDepth = 4
		pr := s.newPair(t, cfg)
		dst := pr.dst
		src := pr.alloc(pr.a, 8, localWrite)
		wr := verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: src, Length: 8}, RemoteAddr: dst.Addr(), RKey: dst.RKey(), Signaled: true}
		for i := range cfg.sendDepth {
			wr.ID = uint64(i)
			if err := pr.a.qp.PostSend(&wr); err != nil {
				if i <= cfg.cqDepth {
					t.Fatalf("PostSend %d: %v", i, err)
				}
				break // the overrun moved the QP to error
			}
		}
		b := bellOf(pr.a.cq)
		buf := make([]verbs.Completion, 1)
		for {
			n, err := pr.a.cq.Poll(buf)
			if err == nil && n == 0 {
				if err = pr.a.cq.Arm(); err == nil {
					if n, err = pr.a.cq.Poll(buf); err == nil && n == 0 {
						pr.ring(b) // the overrun, or a completion
						continue
					}
				}
			}
			if err != nil {
				t.Logf("overrun reported: %v", err)
				return
			}
		}
	})

	t.Run("Close", func(t *testing.T) {
		dev := s.openDevice(t)
		cq, err := newCQ(dev, 16)
		if err != nil {
			t.Fatalf("NewCQ: %v", err)
		}
		if err := cq.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if err := cq.Close(); err != nil {
			t.Fatalf("CQ.Close: %v", err)
		}
		if _, err := cq.Poll(make([]verbs.Completion, 1)); !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("Poll after Close: %v, want ErrClosed", err)
		}
		if err := cq.Arm(); !errors.Is(err, verbs.ErrClosed) {
			t.Errorf("Arm after Close: %v, want ErrClosed", err)
		}
		cq.Disarm()    // must not panic
		_ = cq.Close() // must not panic
	})
}

// testPeek: for a CQ that can tell whether a poll would find anything
// (verbs.Peeker), Pending is false on an empty queue, true once a
// completion is there (within the suite's timeout: it is a hint, but one
// that must not stay wrong), and false again after Poll took it.
func (s *suite) testPeek(t *testing.T) {
	pr := s.newPair(t, defaultConfig)
	pk, ok := pr.b.cq.(verbs.Peeker)
	if !ok {
		t.Skip("the provider's CQ does not implement verbs.Peeker")
	}
	if pk.Pending() {
		t.Fatal("Pending on an empty queue")
	}
	rbuf := pr.alloc(pr.b, 64, localWrite)
	pr.postRecv(pr.b, rbuf, 0, 64)
	if pk.Pending() {
		t.Fatal("Pending after PostRecv alone")
	}
	pr.postSend(pr.a, verbs.SendWR{ID: 1, Op: verbs.OpSend, Inline: []byte{1}})
	for !pk.Pending() {
		if pr.ctx.Err() != nil {
			t.Fatal("Pending stayed false with a completion in the queue")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := pollN(pr.ctx, pr.b.cq, 1); err != nil {
		t.Fatal(err)
	}
	if pk.Pending() {
		t.Fatal("Pending after Poll took the only completion")
	}
}

// testLimits: queue depths, local bounds and peer information are checked
// synchronously.
func (s *suite) testLimits(t *testing.T) {
	const depth, extra = 8, 256
	t.Run("SendQueueFull", func(t *testing.T) {
		cfg := defaultConfig
		cfg.sendDepth = depth
		pr := s.newPair(t, cfg)
		dst := pr.dst
		src := pr.alloc(pr.a, 8, localWrite)
		wr := verbs.SendWR{Op: verbs.OpWrite, Local: verbs.SGE{MR: src, Length: 8}, RemoteAddr: dst.Addr(), RKey: dst.RKey(), Signaled: true}
		posted := 0
		for ; posted < depth+extra; posted++ {
			wr.ID = uint64(posted)
			err := pr.a.qp.PostSend(&wr)
			if errors.Is(err, verbs.ErrQueueFull) {
				break
			}
			if err != nil {
				t.Fatalf("PostSend %d: %v", posted, err)
			}
		}
		switch {
		case posted < depth:
			t.Fatalf("ErrQueueFull after %d posts, SendDepth is %d", posted, depth)
		case posted == depth+extra:
			t.Fatalf("no ErrQueueFull after %d posts with SendDepth %d and nothing polled", posted, depth)
		}
		wc, err := pollN(pr.ctx, pr.a.cq, posted)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range wc {
			expectOK(t, c, verbs.OpWrite, uint64(i))
		}
		wr.ID = 1000 // polling freed the queue
		pr.postSend(pr.a, wr)
		expectOK(t, pr.one(pr.a.cq), verbs.OpWrite, 1000)
	})

	t.Run("RecvQueueFull", func(t *testing.T) {
		cfg := defaultConfig
		cfg.recvDepth = depth
		pr := s.newPair(t, cfg)
		rbuf := pr.alloc(pr.b, (depth+extra)*8, localWrite)
		posted := 0
		for ; posted < depth+extra; posted++ {
			err := pr.b.qp.PostRecv(&verbs.RecvWR{ID: uint64(posted), Local: verbs.SGE{MR: rbuf, Offset: posted * 8, Length: 8}})
			if errors.Is(err, verbs.ErrQueueFull) {
				break
			}
			if err != nil {
				t.Fatalf("PostRecv %d: %v", posted, err)
			}
		}
		if posted < depth || posted == depth+extra {
			t.Fatalf("ErrQueueFull after %d RECVs (RecvDepth %d, limit of the test %d)", posted, depth, depth+extra)
		}
	})

	t.Run("LocalBounds", func(t *testing.T) {
		pr := s.newPair(t, defaultConfig)
		src := pr.alloc(pr.a, 4096, localWrite)
		rbuf := pr.alloc(pr.b, 4096, localWrite)
		for _, sge := range []verbs.SGE{
			{MR: src, Offset: 4092, Length: 8},
			{MR: src, Offset: -1, Length: 4},
			{MR: src, Offset: 0, Length: 4097},
			{MR: src, Offset: 4097, Length: 0},
			{MR: src, Offset: 0, Length: -1},
		} {
			err := pr.a.qp.PostSend(&verbs.SendWR{ID: 1, Op: verbs.OpSend, Local: sge, Signaled: true})
			if !errors.Is(err, verbs.ErrBounds) {
				t.Errorf("PostSend with %d bytes at %d of a 4096-byte MR: %v, want ErrBounds", sge.Length, sge.Offset, err)
			}
			sge.MR = rbuf
			err = pr.b.qp.PostRecv(&verbs.RecvWR{ID: 1, Local: sge})
			if !errors.Is(err, verbs.ErrBounds) {
				t.Errorf("PostRecv with %d bytes at %d of a 4096-byte MR: %v, want ErrBounds", sge.Length, sge.Offset, err)
			}
		}
		// Refused posts have no effect.
		pr.postRecv(pr.b, rbuf, 7, 8)
		binary.LittleEndian.PutUint64(src.Bytes(), 42)
		pr.postSend(pr.a, verbs.SendWR{ID: 3, Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: 8}, Signaled: true})
		if c := pr.one(pr.b.cq); expectOK(t, c, verbs.OpRecv, 7) && binary.LittleEndian.Uint64(rbuf.Bytes()[56:]) != 42 {
			t.Error("SEND after refused posts: wrong payload")
		}
		expectOK(t, pr.one(pr.a.cq), verbs.OpSend, 3)
	})

	t.Run("SendTooLong", func(t *testing.T) {
		pr := s.newPair(t, defaultConfig)
		l, ok := pr.a.qp.(SendLimiter)
		if !ok {
			t.Skip("the provider does not limit SEND sizes")
		}
		limit := l.MaxSend()
		src := pr.alloc(pr.a, limit+1, localWrite)
		rbuf := pr.alloc(pr.b, limit+1, localWrite)
		pr.postRecv(pr.b, rbuf, 0, limit+1)
		err := pr.a.qp.PostSend(&verbs.SendWR{ID: 1, Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: limit + 1}, Signaled: true})
		if err == nil {
			t.Fatalf("PostSend of %d bytes with MaxSend %d succeeded", limit+1, limit)
		}
		// A refused post has no effect.
		fill(src.Bytes(), 5)
		pr.postSend(pr.a, verbs.SendWR{ID: 2, Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: limit}, Signaled: true})
		if c := pr.one(pr.b.cq); expectOK(t, c, verbs.OpRecv, 0) && (c.Len != limit || !bytes.Equal(rbuf.Bytes()[:limit], src.Bytes()[:limit])) {
			t.Errorf("SEND of MaxSend (%d) bytes after a refused one: Len %d or payload wrong", limit, c.Len)
		}
		expectOK(t, pr.one(pr.a.cq), verbs.OpSend, 2)
	})

	t.Run("GarbageInfo", func(t *testing.T) {
		dev := s.openDevice(t)
		cq, err := newCQ(dev, 64)
		if err != nil {
			t.Fatalf("NewCQ: %v", err)
		}
		defer func() { _ = cq.Close() }()
		newQP := func() verbs.QP {
			qp, err := dev.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 4, RecvDepth: 4})
			if err != nil {
				t.Fatalf("NewQP: %v", err)
			}
			return qp
		}
		qp, other := newQP(), newQP()
		defer func() { _ = qp.Close() }()
		defer func() { _ = other.Close() }()
		info := other.Info()
		random := make([]byte, 4096+len(info))
		fill(random, rand.Uint64())
		ctx, cancel := context.WithTimeout(t.Context(), Timeout)
		defer cancel()
		for _, garbage := range [][]byte{nil, {}, {0}, []byte("hello"), info[:len(info)/2], random} {
			for _, active := range []bool{false, true} {
				err := qp.Connect(ctx, garbage, active)
				if !errors.Is(err, verbs.ErrPeerInfo) {
					t.Errorf("Connect(%d bytes of garbage, active %v): %v, want ErrPeerInfo", len(garbage), active, err)
				}
			}
		}
	})
}

// testConcurrent: several goroutines post WRITEs and SENDs on one QP while
// others poll and re-post RECVs.
func (s *suite) testConcurrent(t *testing.T) {
	const senders = 4
	perSender := 500
	if testing.Short() {
		perSender = 100
	}
	total := senders * perSender
	cfg := config{sendDepth: 64, recvDepth: 128, maxInline: 64, cqDepth: 1024, remote: 64 << 10}
	pr := s.newPair(t, cfg)
	dst := pr.dst
	rbuf := pr.alloc(pr.b, cfg.recvDepth*8, localWrite)
	src := pr.alloc(pr.a, total*16, localWrite) // WRITE sources, then SEND sources
	spare := pr.alloc(pr.a, cfg.recvDepth*8, localWrite)
	for k := range total {
		binary.LittleEndian.PutUint64(src.Bytes()[k*8:], uint64(k)+1)
		binary.LittleEndian.PutUint64(src.Bytes()[(total+k)*8:], uint64(k))
	}
	for i := range cfg.recvDepth {
		pr.postRecv(pr.b, rbuf, i, 8)
	}
	tokens := func(n int) chan struct{} {
		ch := make(chan struct{}, n)
		for range n {
			ch <- struct{}{}
		}
		return ch
	}
	sq, credits := tokens(cfg.sendDepth), tokens(cfg.recvDepth)
	take := func(ch chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-pr.ctx.Done():
			return false
		}
	}
	useInline := pr.a.qp.MaxInline() >= 8

	var wg sync.WaitGroup
	wg.Go(func() { // send completions
		for done := 0; done < 2*total; {
			wc, err := pollN(pr.ctx, pr.a.cq, 1)
			if err == nil {
				var more []verbs.Completion
				more, err = drain(pr.a.cq)
				wc = append(wc, more...)
			}
			if err != nil {
				pr.fail("send completions: %v", err)
				return
			}
			for _, c := range wc {
				if c.Status != verbs.StatusSuccess {
					pr.fail("send completion %+v (%v)", c, c.Status)
					return
				}
				sq <- struct{}{}
			}
			done += len(wc)
		}
	})
	wg.Go(func() { // receiver
		next := make([]int, senders)
		for range total {
			wc, err := pollN(pr.ctx, pr.b.cq, 1)
			if err != nil {
				pr.fail("receiver: %v", err)
				return
			}
			c := wc[0]
			if c.Status != verbs.StatusSuccess || c.Op != verbs.OpRecv || c.Len != 8 {
				pr.fail("receive completion %+v (%v)", c, c.Status)
				return
			}
			slot := int(c.ID)
			k := int(binary.LittleEndian.Uint64(rbuf.Bytes()[slot*8:]))
			g, seq := k/perSender, k%perSender
			if k < 0 || g >= senders || seq != next[g] {
				pr.fail("message %d (sender %d, #%d) out of order", k, g, seq)
				return
			}
			next[g]++
			if v := binary.LittleEndian.Uint64(dst.Bytes()[k*8:]); v != uint64(k)+1 {
				pr.fail("message %d arrived before the WRITE posted before it (%d)", k, v)
				return
			}
			err = pr.b.qp.PostRecv(&verbs.RecvWR{ID: c.ID, Local: verbs.SGE{MR: rbuf, Offset: slot * 8, Length: 8}})
			if err != nil {
				pr.fail("re-post RECV: %v", err)
				return
			}
			credits <- struct{}{}
		}
	})
	wg.Go(func() { // RECVs on the sending QP, concurrent with its sends
		for i := range cfg.recvDepth {
			err := pr.a.qp.PostRecv(&verbs.RecvWR{ID: uint64(i), Local: verbs.SGE{MR: spare, Offset: i * 8, Length: 8}})
			if err != nil {
				pr.fail("PostRecv on the sending QP: %v", err)
				return
			}
		}
	})
	for g := range senders {
		wg.Go(func() {
			for seq := range perSender {
				k := g*perSender + seq
				// Two send-queue slots (WRITE and SEND), then a credit.
				for _, ch := range []chan struct{}{sq, sq, credits} {
					if !take(ch) {
						return
					}
				}
				write := verbs.SendWR{ID: uint64(2 * k), Op: verbs.OpWrite, RemoteAddr: dst.Addr() + uint64(k*8), RKey: dst.RKey(), Signaled: true}
				send := verbs.SendWR{ID: uint64(2*k + 1), Op: verbs.OpSend, Signaled: true}
				if useInline && seq%2 == 0 {
					write.Inline = src.Bytes()[k*8 : k*8+8]
					send.Inline = src.Bytes()[(total+k)*8 : (total+k)*8+8]
				} else {
					write.Local = verbs.SGE{MR: src, Offset: k * 8, Length: 8}
					send.Local = verbs.SGE{MR: src, Offset: (total + k) * 8, Length: 8}
				}
				for _, wr := range []*verbs.SendWR{&write, &send} {
					if err := pr.a.qp.PostSend(wr); err != nil {
						pr.fail("sender %d: PostSend %v %d: %v", g, wr.Op, k, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// testClosedPeer: a SEND to a closed QP completes with an error.
func (s *suite) testClosedPeer(t *testing.T) {
	pr := s.newPair(t, defaultConfig)
	rbuf := pr.alloc(pr.b, 64, localWrite)
	src := pr.alloc(pr.a, 8, localWrite)
	pr.postRecv(pr.b, rbuf, 0, 8)
	send := verbs.SendWR{ID: 1, Op: verbs.OpSend, Local: verbs.SGE{MR: src, Length: 8}, Signaled: true}
	pr.postSend(pr.a, send)
	expectOK(t, pr.one(pr.b.cq), verbs.OpRecv, 0)
	expectOK(t, pr.one(pr.a.cq), verbs.OpSend, 1)

	if err := pr.b.qp.Close(); err != nil {
		t.Fatalf("QP.Close: %v", err)
	}
	send.ID = 2
	if err := pr.a.qp.PostSend(&send); err != nil {
		t.Logf("PostSend to a closed peer failed at once: %v", err)
		return
	}
	c := pr.one(pr.a.cq)
	if c.ID != 2 || c.Status == verbs.StatusSuccess {
		t.Errorf("SEND to a closed peer completed with %+v (%v), want an error", c, c.Status)
	}
}
