package shm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// link returns the link e's QP is bound to.
func (e *end) link() *link {
	e.qp.cmu.Lock()
	defer e.qp.cmu.Unlock()
	return e.qp.link
}

// waitFor fails the test unless cond holds within 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// returned expects err from ch within 10 s.
func returned(t *testing.T, ch chan error, why string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("no return: %s", why)
		return nil
	}
}

// leading starts b's WaitDirect and waits until it reads the link's
// eventfd itself.
func leading(t *testing.T, b *end) chan error {
	t.Helper()
	if err := b.cq.ArmDirect(); err != nil {
		t.Fatal(err)
	}
	l := b.link()
	waitFor(t, "b owns its link", func() bool { return l.owner.Load() == b.cq })
	ch := make(chan error, 1)
	go func() { ch <- b.cq.WaitDirect() }()
	waitFor(t, "b's WaitDirect leads", func() bool { return b.cq.reading.Load() == l })
	return ch
}

// ownerRounds makes rounds round trips a -> b with b's WaitDirect
// leading (ch is the one in progress) and returns the next one, leading.
func ownerRounds(t *testing.T, a, b *end, ch chan error, rounds int) chan error {
	t.Helper()
	for i := range rounds {
		sendInline(t, a, uint64(i), []byte{byte(i)})
		if err := returned(t, ch, "WaitDirect for its own ring"); err != nil {
			t.Fatalf("WaitDirect: %v", err)
		}
		c := pollN(t, b.cq, 1)[0]
		if c.Err() != nil {
			t.Fatalf("completion %+v", c)
		}
		if err := b.qp.PostRecv(&verbs.RecvWR{ID: c.ID, Local: verbs.SGE{MR: b.mrs[0], Offset: int(c.ID) * 64, Length: 64}}); err != nil {
			t.Fatal(err)
		}
		drain(t, a.cq)
		ch = leading(t, b)
	}
	return ch
}

// TestLeadOwnRing: a CQ armed direct, alone armed on its link, waits on the
// link's direct eventfd in WaitDirect and is woken by its own ring without the
// dispatcher: every wake-up of the round trips is the leader's, and
// the role does not move while the CQ keeps arming direct.
func TestLeadOwnRing(t *testing.T) {
	a, b := pair(t, 8)
	b.postRecvs(t, 8, 64)
	l := b.link()
	ch := leading(t, b)
	all, led, moves := l.wakeups.Load(), l.leadWakeups.Load(), l.moves.Load()
	const rounds = 50
	ownerRounds(t, a, b, ch, rounds)
	if got := l.leadWakeups.Load() - led; got < rounds {
		t.Errorf("the leader read the eventfd %d times for %d rings", got, rounds)
	}
	if d := (l.wakeups.Load() - all) - (l.leadWakeups.Load() - led); d != 0 {
		t.Errorf("the dispatcher read the eventfd %d times while b owned the link", d)
	}
	if m := l.moves.Load() - moves; m != 0 {
		t.Errorf("the reader role moved %d times while only b armed", m)
	}
}

// TestLeadShared: while b owns the link, another CQ on the link, b2,
// arms. For Wait, b keeps the link and b2 is rung through the wait
// doorbell's dispatcher. For WaitDirect, b keeps the link too unless its
// WaitDirect has been parked there for takeOver (idle): b2's inbox asks
// the peer for the wait doorbell, whose dispatcher rings b2's WaitDirect.
// If b is idle, b2 takes the link, and b's WaitDirect returns so that its
// caller arms again, as a non-owner. Each Arm makes its changes before it
// returns, so the ring that follows it is not lost, and b is still woken
// for its own ring.
func TestLeadShared(t *testing.T) {
	for _, tc := range []struct {
		name    string
		direct  bool // b2 arms direct
		running bool // b's WaitDirect leads while b2 arms
		idle    bool // and has been parked for takeOver
		takes   bool // b2 takes the link
	}{
		{name: "wait", running: true},
		{name: "wait,b-armed", running: false},
		{name: "direct,b-armed", direct: true},
		{name: "direct,b-busy", direct: true, running: true},
		{name: "direct,b-idle", direct: true, running: true, idle: true, takes: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, 8)
			a2, b2 := pair(t, 8)
			b.postRecvs(t, 8, 64)
			b2.postRecvs(t, 8, 64)
			l := b.link()
			if b2.link() != l {
				t.Fatal("the two pairs do not share a link")
			}
			var ch chan error
			if tc.running {
				ch = leading(t, b)
			} else {
				if err := b.cq.ArmDirect(); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "b owns its link", func() bool { return l.owner.Load() == b.cq })
			}
			if l.disp.Load() {
				t.Fatal("the dispatcher waits though only b is armed")
			}
			// The owner's park started now (busy) or long ago (idle),
			// whatever the machine's speed.
			if tc.idle {
				l.leadSince.Store(monoNow() - int64(time.Hour))
			} else {
				l.leadSince.Store(monoNow() + int64(time.Hour))
			}
			takeovers := l.takeovers.Load()
			arm, wait := b2.cq.Arm, b2.cq.Wait
			if tc.direct {
				arm, wait = b2.cq.ArmDirect, b2.cq.WaitDirect
			}
			if err := arm(); err != nil {
				t.Fatal(err)
			}
			want, sleeping := b.cq, uint32(armWait)
			if tc.takes {
				want, sleeping = b2.cq, armDirect
			}
			if o := l.owner.Load(); o != want {
				t.Fatalf("owner %p after b2 armed; b is %p, b2 %p", o, b.cq, b2.cq)
			}
			if n := l.takeovers.Load() - takeovers; n != map[bool]uint64{false: 0, true: 1}[tc.takes] {
				t.Fatalf("%d takeovers", n)
			}
			if got := b2.qp.in.hdr.sleeping.Load(); got != sleeping {
				t.Fatalf("b2's inbox asks for doorbell value %d, want %d", got, sleeping)
			}
			if l.disp.Load() {
				t.Fatal("the direct dispatcher waits though the link has an owner")
			}
			if tc.takes {
				// b's WaitDirect returns at once; its caller arms again and
				// is a non-owner now.
				if err := returned(t, ch, "WaitDirect of the owner replaced"); err != nil {
					t.Fatalf("WaitDirect: %v", err)
				}
				if err := b.cq.ArmDirect(); err != nil {
					t.Fatal(err)
				}
				if got := b.qp.in.hdr.sleeping.Load(); got != armWait {
					t.Fatalf("b's inbox asks for doorbell value %d after it lost the link", got)
				}
				ch = make(chan error, 1)
				go func() { ch <- b.cq.WaitDirect() }()
			}
			woke := make(chan error, 1)
			go func() { woke <- wait() }()
			sendInline(t, a2, 1, []byte{1})
			if err := returned(t, woke, "the wait of b2"); err != nil {
				t.Fatalf("wait: %v", err)
			}
			pollN(t, b2.cq, 1)
			if !tc.running {
				ch = make(chan error, 1)
				go func() { ch <- b.cq.WaitDirect() }()
			}
			sendInline(t, a, 2, []byte{2})
			if err := returned(t, ch, "WaitDirect of b"); err != nil {
				t.Fatalf("WaitDirect: %v", err)
			}
			pollN(t, b.cq, 1)
		})
	}
}

// TestLeadOthersArmed: an owner shares its link with an idle connection
// armed for Wait (rsockperf's control connection, an HTTP server's idle
// keep-alive connections): the owner's rings wake the owner alone (no
// hand-off, and no dispatcher wakes for them), and a ring of the idle one
// still wakes it.
func TestLeadOthersArmed(t *testing.T) {
	a, b := pair(t, 8)
	a2, b2 := pair(t, 8)
	b.postRecvs(t, 8, 64)
	b2.postRecvs(t, 8, 64)
	l := b.link()
	if err := b2.cq.Arm(); err != nil {
		t.Fatal(err)
	}
	idle := make(chan error, 1)
	go func() { idle <- b2.cq.Wait() }()
	ch := leading(t, b)
	handoffs, all, led := l.handoffs.Load(), l.wakeups.Load(), l.leadWakeups.Load()
	const rounds = 50
	ch = ownerRounds(t, a, b, ch, rounds)
	if n := l.handoffs.Load() - handoffs; n != 0 {
		t.Errorf("%d of %d rings of the owner were taken by the dispatcher", n, rounds)
	}
	if got := l.leadWakeups.Load() - led; got < rounds {
		t.Errorf("the owner woke %d times for %d rings", got, rounds)
	}
	if d := (l.wakeups.Load() - all) - (l.leadWakeups.Load() - led); d != 0 {
		t.Errorf("dispatchers woke %d times for the owner's %d rings", d, rounds)
	}
	sendInline(t, a2, 1, []byte{1})
	if err := returned(t, idle, "Wait of the idle connection while the owner waits"); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	b.cq.WakeDirect()
	if err := returned(t, ch, "WaitDirect for WakeDirect"); err != nil {
		t.Fatalf("WaitDirect: %v", err)
	}
}

// TestLeadBecomesOwnerParked: b's WaitDirect parks on its channel while
// another CQ owns the link (armed direct, not waiting); when that one
// leaves, b owns the link and nobody else waits on the eventfd, so the
// parked WaitDirect must come and wait on it. (It was found missing by the
// conformance suite's Route.)
func TestLeadBecomesOwnerParked(t *testing.T) {
	a, b := pair(t, 8)
	_, b2 := pair(t, 8)
	b.postRecvs(t, 8, 64)
	l := b.link()
	if err := b2.cq.ArmDirect(); err != nil {
		t.Fatal(err)
	}
	if err := b.cq.ArmDirect(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan error, 1)
	go func() { ch <- b.cq.WaitDirect() }()
	time.Sleep(20 * time.Millisecond) // parked on its channel
	if l.owner.Load() != b2.cq || b.cq.reading.Load() != nil {
		t.Fatal("b leads though another CQ owns its link")
	}
	if err := b2.qp.Close(); err != nil {
		t.Fatal(err)
	}
	if l.owner.Load() != b.cq {
		t.Fatal("b does not own the link once it is the only CQ armed")
	}
	waitFor(t, "b's parked WaitDirect leads", func() bool { return b.cq.reading.Load() == l })
	sendInline(t, a, 1, []byte{1})
	if err := returned(t, ch, "WaitDirect for its ring after it became the owner"); err != nil {
		t.Fatalf("WaitDirect: %v", err)
	}
}

// TestLeadResetKeepsKick: a WaitDirect that was kicked off the link (its
// CQ no longer owns it) must not clear the kick's read deadline on the way
// out: the new owner's WaitDirect may already be reading the file, and a
// kick meant for it would be undone (rsockperf's 64-connection ping-pong
// hung that way, a minute at a time). The owner, kicked, clears it.
func TestLeadResetKeepsKick(t *testing.T) {
	_, b := pair(t, 8)
	_, b2 := pair(t, 8)
	l := b.link()
	if err := b.cq.ArmDirect(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b owns its link", func() bool { return l.owner.Load() == b.cq })
	kick(l.lfile)
	if l.resetLead(b2.cq) {
		t.Fatal("a CQ that does not own the link cleared its deadline")
	}
	// The deadline is still in the past: a read returns at once.
	read := func() chan error {
		ch := make(chan error, 1)
		go func() { ch <- l.lraw.Read(func(uintptr) bool { return false }) }()
		return ch
	}
	if err := returned(t, read(), "a read of lfile with the kick in place"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want ErrDeadlineExceeded", err)
	}
	if !l.resetLead(b.cq) {
		t.Fatal("the owner did not clear the deadline")
	}
	ch := read()
	select {
	case err := <-ch:
		t.Fatalf("a read of lfile after the owner cleared the deadline returned %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	kick(l.lfile)
	if err := returned(t, ch, "the parked read, kicked"); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want ErrDeadlineExceeded", err)
	}
	_ = l.lfile.SetReadDeadline(time.Time{})
}

// TestLeadClose: closing the CQ ends a leading WaitDirect (ErrClosed);
// closing its QP (and so releasing the link) makes it wait on its channel,
// where WakeDirect still reaches it.
func TestLeadClose(t *testing.T) {
	t.Run("CQ", func(t *testing.T) {
		_, b := pair(t, 8)
		ch := leading(t, b)
		if err := b.cq.Close(); err != nil {
			t.Fatal(err)
		}
		if err := returned(t, ch, "WaitDirect after Close"); !errors.Is(err, verbs.ErrClosed) {
			t.Fatalf("WaitDirect after Close: %v, want ErrClosed", err)
		}
		b.cq = nil
	})
	t.Run("QP", func(t *testing.T) {
		a, b := pair(t, 8)
		ch := leading(t, b)
		_ = a.qp.Close()
		_ = b.qp.Close() // b's CQ has no QP left on the link: not the owner
		waitFor(t, "WaitDirect leaves the link", func() bool { return b.cq.reading.Load() == nil })
		if b.cq.lead.Load() != nil {
			t.Fatal("b's CQ still owns a link with no QP of it")
		}
		waitLinks(t)
		b.cq.WakeDirect()
		if err := returned(t, ch, "WaitDirect after WakeDirect"); err != nil {
			t.Fatalf("WaitDirect: %v", err)
		}
	})
}

// TestLeadStress: one, then several connections between the same two
// processes (one link each way) ping-pong, each side waiting in a way drawn at random
// each time (WaitDirect, Wait, or a busy poll after Disarm), so the reader
// role moves between CQs and the dispatchers all the time. A lost wake-up
// hangs a connection and fails the test. With one connection each CQ owns
// its link most of the time (an earlier design, in which the dispatcher
// kept reading the eventfd beside the owner and WakeDirect wrote the
// eventfd to reach the owner, hung here within seconds: the dispatcher
// could take the counter before epoll reported it to the owner's file).
func TestLeadStress(t *testing.T) {
	for _, conns := range []int{1, 4} {
		t.Run(fmt.Sprintf("conns=%d", conns), func(t *testing.T) { leadStress(t, conns, 2000) })
	}
	// Every direct arm takes the link from an owner that waits: the role
	// moves all the time, with rings in flight.
	for _, conns := range []int{4, 16} {
		t.Run(fmt.Sprintf("conns=%d,takeover=always", conns), func(t *testing.T) {
			defer func(d time.Duration) { takeOver = d }(takeOver)
			takeOver = 0
			leadStress(t, conns, 2000)
		})
	}
}

func leadStress(t *testing.T, conns, rounds int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type side struct {
		e    *end
		slot *MR
	}
	var wg sync.WaitGroup
	errc := make(chan error, 2*conns)
	var sides []side
	for c := range conns {
		a, b := pair(t, 16)
		sa, sb := side{a, a.postRecvs(t, 16, 64)}, side{b, b.postRecvs(t, 16, 64)}
		sides = append(sides, sa, sb)
		// await waits for one received message on s.
		await := func(rng *rand.Rand, s side) error {
			wc := make([]verbs.Completion, 4)
			for {
				n, err := s.e.cq.Poll(wc)
				if err != nil {
					return err
				}
				for _, c := range wc[:n] {
					if c.Err() != nil {
						return c.Err()
					}
					if c.Op == verbs.OpRecv {
						return s.e.qp.PostRecv(&verbs.RecvWR{ID: c.ID, Local: verbs.SGE{MR: s.slot, Offset: int(c.ID) * 64, Length: 64}})
					}
				}
				if n > 0 {
					continue
				}
				if ctx.Err() != nil {
					return errors.New("no message: a lost wake-up")
				}
				switch k := rng.IntN(3); k {
				case 0, 1:
					arm, wait := s.e.cq.ArmDirect, s.e.cq.WaitDirect
					if k == 1 {
						arm, wait = s.e.cq.Arm, s.e.cq.Wait
					}
					if err := arm(); err != nil {
						return err
					}
					if !s.e.cq.Pending() {
						if err := wait(); err != nil {
							return err
						}
					}
				default:
					s.e.cq.Disarm()
					for i := 0; i < 100 && !s.e.cq.Pending(); i++ {
						time.Sleep(time.Microsecond)
					}
				}
			}
		}
		run := func(seed uint64, me, peer side, first bool) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 1))
			for i := range rounds {
				if !first || i > 0 {
					if err := await(rng, me); err != nil {
						errc <- err
						return
					}
				}
				if err := me.e.qp.PostSend(&verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Inline: []byte{byte(i)}, Signaled: true}); err != nil {
					errc <- err
					return
				}
				if rng.IntN(8) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				}
			}
		}
		wg.Add(2)
		go run(uint64(2*c), sa, sb, true)
		go run(uint64(2*c+1), sb, sa, false)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		for i, s := range sides {
			logLeadState(t, fmt.Sprintf("side %d", i), s.e)
		}
		t.Fatal("a connection hung: a lost wake-up")
	}
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}

// TestPendingDetachWaits: Pending reads the attached QPs' inboxes without
// the CQ's lock, so detaching a QP (whose inbox Close then unmaps) must
// wait for a Pending that may still read it. A Pending in progress is
// simulated by counting a reader of the current epoch.
func TestPendingDetachWaits(t *testing.T) {
	a, b := pair(t, 8)
	_ = a
	cq := b.cq
	e := cq.peekEpoch.Load()
	cq.peekers[e&1].Add(1) // a Pending that loaded the current copy
	closed := make(chan struct{})
	go func() { _ = b.qp.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close of a QP returned while a Pending could still read its inbox")
	case <-time.After(50 * time.Millisecond):
	}
	if cq.Pending() { // a new Pending is not held up and sees no QP
		t.Fatal("Pending with no QP attached")
	}
	cq.peekers[e&1].Add(-1)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close of a QP did not return after the Pending left")
	}
}

// TestPendingChurn: Pending spins on a CQ while QPs attached to it
// connect, carry a message and close (unmapping their inboxes).
func TestPendingChurn(t *testing.T) {
	b := openEnd(t, 8)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
					b.cq.Pending()
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	for i := range 50 {
		a := openEnd(t, 8)
		qp, err := b.dev.NewQP(verbs.QPAttr{CQ: b.cq, SendDepth: 8, RecvDepth: 8, MaxInline: 32})
		if err != nil {
			t.Fatal(err)
		}
		e := &end{dev: b.dev, cq: b.cq, qp: qp.(*QP)}
		connect(t, a, e)
		e.postRecvs(t, 1, 64)
		sendInline(t, a, uint64(i), []byte{1})
		waitFor(t, "Pending sees the message", b.cq.Pending)
		pollN(t, b.cq, 1)
		_ = a.qp.Close()
		_ = e.qp.Close()
		for _, mr := range e.mrs {
			_ = mr.Close()
		}
	}
}

// logLeadState logs what a hung wait was waiting for.
func logLeadState(t *testing.T, name string, e *end) {
	l := e.link()
	l.mu.Lock()
	nWait, direct := l.nWait, len(l.direct)
	l.mu.Unlock()
	t.Logf("%s: cq %p intent %d armed %d woken %v lead %v reading %v chan %d; inbox sleeping %d tail %d head %d; link owner %p disp %v nWait %d direct %d armed %d sums %x %x",
		name, e.cq, e.cq.intent.Load(), e.cq.armed.Load(), e.cq.woken.Load(), e.cq.lead.Load() != nil, e.cq.reading.Load() != nil, len(e.cq.direct),
		e.qp.in.hdr.sleeping.Load(), e.qp.in.hdr.tail.Load(), e.qp.head.Load(),
		l.owner.Load(), l.disp.Load(), nWait, direct, l.own.hdr.armed[bellDirect].Load()<<1|l.own.hdr.armed[bellWait].Load(), l.own.hdr.sum[0][0].Load(), l.own.hdr.sum[1][0].Load())
}
