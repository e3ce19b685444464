//go:build linux

package shm

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The notification path of shm, over one link's doorbell and dispatcher:
// the CQ contract on a CQ shared by QPs of one link (verbstest's Notify
// checks it with one QP for every provider), what an unarmed CQ costs its
// senders, and no lost notification under load.

// hangGuard bounds the waits of these tests; it is never a timing
// assertion.
const hangGuard = 30 * time.Second

// waitOne returns the next completion of cq: it polls, and if nothing is
// there arms, polls again and waits for the notification (the way rsock's
// engine waits).
func waitOne(t testing.TB, cq *CQ) verbs.Completion {
	t.Helper()
	var wc [1]verbs.Completion
	for {
		n, err := cq.Poll(wc[:])
		if err != nil {
			t.Fatalf("Poll: %v", err)
		}
		if n == 1 {
			return wc[0]
		}
		if err := cq.Arm(); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if n, err = cq.Poll(wc[:]); err != nil || n == 1 {
			if err != nil {
				t.Fatalf("Poll: %v", err)
			}
			return wc[0]
		}
		if !notified(cq, hangGuard) {
			t.Fatalf("no notification within %v", hangGuard)
		}
	}
}

// TestNotifyStress: QP pairs on one link (so the rings of many QPs go
// through one bell page and one dispatcher) ping-pong, each side waiting
// for its notification whenever a poll finds nothing. A lost ring shows as
// a missing notification.
func TestNotifyStress(t *testing.T) {
	for _, n := range []int{1, 4, 16, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			const rounds = 300
			var wg sync.WaitGroup
			for i := range n {
				a, b := pair(t, 8)
				for _, e := range []*end{a, b} {
					e.postRecvs(t, 8, 64)
				}
				if a.qp.link != pairLink(t, a, b) {
					t.Fatal("the pair does not share the link")
				}
				wg.Go(func() { pingSide(t, a, i, rounds, true) })
				wg.Go(func() { pingSide(t, b, i, rounds, false) })
			}
			wg.Wait()
		})
	}
}

// pairLink is the link a's QP is on (b's is the same link seen from the
// other end, in this one process: a link to itself).
func pairLink(t testing.TB, a, b *end) *link {
	t.Helper()
	if a.qp.link == nil || b.qp.link == nil {
		t.Fatal("a QP without a link")
	}
	return a.qp.link
}

// pingSide runs one side of a ping-pong of rounds messages: the active
// side sends first; every message carries its round number plus i.
func pingSide(t *testing.T, e *end, i, rounds int, active bool) {
	slots := e.mrs[len(e.mrs)-1]
	send := func(r int) bool {
		if err := e.qp.PostSend(&verbs.SendWR{ID: uint64(r), Op: verbs.OpSend, Inline: []byte{byte(r + i)}, Signaled: true}); err != nil {
			t.Errorf("pair %d: PostSend: %v", i, err)
			return false
		}
		return true
	}
	recv := func(r int) bool {
		c := waitOne(t, e.cq)
		for c.Op != verbs.OpRecv { // a send completion of ours
			c = waitOne(t, e.cq)
		}
		if c.Err() != nil || slots.Bytes()[int(c.ID)*64] != byte(r+i) {
			t.Errorf("pair %d round %d: %+v", i, r, c)
			return false
		}
		if err := e.qp.PostRecv(&verbs.RecvWR{ID: c.ID, Local: verbs.SGE{MR: slots, Offset: int(c.ID) * 64, Length: 64}}); err != nil {
			t.Errorf("pair %d: PostRecv: %v", i, err)
			return false
		}
		return true
	}
	for r := range rounds {
		if active {
			if !send(r) || !recv(r) {
				return
			}
		} else if !recv(r) || !send(r) {
			return
		}
	}
}

// TestRingBeforeDispatcherParks: a ring that comes before the link's
// dispatcher is parked on its eventfd (the dispatcher never reads the
// counter, and the runtime forgets readiness when its RawConn.Read starts)
// still
// notifies: the dispatcher drains the bell page each time it wakes, and
// the page's armed word makes the producer write the eventfd again only
// after a drain. Here the rings come in bursts on many QPs at once, so
// that some always land while the dispatcher is busy draining.
func TestRingBeforeDispatcherParks(t *testing.T) {
	const n, rounds = 8, 200
	ends := make([][2]*end, n)
	for i := range ends {
		a, b := pair(t, 8)
		b.postRecvs(t, 8, 64)
		ends[i] = [2]*end{a, b}
	}
	for r := range rounds {
		for _, p := range ends {
			if err := p[1].cq.Arm(); err != nil {
				t.Fatal(err)
			}
			if wc := drain(t, p[1].cq); len(wc) != 0 {
				t.Fatalf("completions before the burst: %+v", wc)
			}
		}
		for _, p := range ends {
			sendInline(t, p[0], uint64(r), []byte{byte(r)})
		}
		for i, p := range ends {
			if !notified(p[1].cq, hangGuard) {
				t.Fatalf("round %d: QP %d was not notified", r, i)
			}
			c := pollN(t, p[1].cq, 1)[0]
			slots := p[1].mrs[len(p[1].mrs)-1]
			if err := p[1].qp.PostRecv(&verbs.RecvWR{ID: c.ID, Local: verbs.SGE{MR: slots, Offset: int(c.ID) * 64, Length: 64}}); err != nil {
				t.Fatal(err)
			}
			drain(t, p[0].cq)
		}
	}
}

// settle waits until a drain of the shared QPs' link that is in progress
// has fired every CQ it rings: the dispatcher drains and fires with the
// link's mu held. With a notification received, every ring made before
// the one that sent it has then been fired.
func (s *sharedCQ) settle() {
	l := s.qps[0].link
	l.mu.Lock()
	//lint:ignore SA2001 an empty critical section: a barrier
	l.mu.Unlock()
}

// barrier arms the shared CQ, sends one message to QP 0 (whose RECV id
// is want), waits for the notification and the completion, and returns
// the number of notifications so far once the link's dispatcher has
// fired everything rung before.
func (s *sharedCQ) barrier(t *testing.T, want uint64) int64 {
	t.Helper()
	if err := s.cq.Arm(); err != nil {
		t.Fatal(err)
	}
	if wc := drain(t, s.cq); len(wc) != 0 {
		t.Fatalf("completions before the barrier's message: %+v", wc)
	}
	sendInline(t, s.clients[0], 99, []byte{99})
	if !notified(s.cq, hangGuard) {
		t.Fatal("no notification for the barrier's message")
	}
	if c := pollN(t, s.cq, 1)[0]; c.Err() != nil || c.ID != want {
		t.Fatalf("barrier's completion: %+v, want RECV %d", c, want)
	}
	s.settle()
	return bellOf(s.cq).n.Load()
}

// sendAll sends one message from every client and polls the n receive
// completions.
func (s *sharedCQ) sendAll(t *testing.T) {
	t.Helper()
	for i, c := range s.clients {
		sendInline(t, c, uint64(i), []byte{byte(i)})
	}
	if wc := pollN(t, s.cq, len(s.clients)); len(wc) != len(s.clients) {
		t.Fatalf("%d completions, want %d", len(wc), len(s.clients))
	}
}

// TestOneNotifyPerArm: one Arm, messages on every QP of the CQ (each inbox
// asked to ring): notify is called once; the next Arm gets the next one.
func TestOneNotifyPerArm(t *testing.T) {
	const n, recvs = 4, 2
	s := newSharedCQ(t, n, recvs)
	if err := s.cq.Arm(); err != nil {
		t.Fatal(err)
	}
	if wc := drain(t, s.cq); len(wc) != 0 {
		t.Fatalf("completions before anything was sent: %+v", wc)
	}
	for i, v := range s.sleeping() {
		if v != armAll {
			t.Fatalf("QP %d's inbox sleeping %d after Arm, want %d", i, v, armAll)
		}
	}
	s.sendAll(t)
	if !notified(s.cq, hangGuard) {
		t.Fatal("no notification")
	}
	if got := s.barrier(t, 1); got != 2 {
		t.Errorf("%d notifications for two Arms, want 2", got)
	}
}

// TestUnarmedCostsNothing: without an Arm, or after Disarm, messages make
// no notification and the senders ring nobody (no eventfd write).
func TestUnarmedCostsNothing(t *testing.T) {
	const n, recvs = 4, 3
	s := newSharedCQ(t, n, recvs)
	l := s.qps[0].link
	eventfdWrites(t, l)

	s.sendAll(t) // never armed
	if w := eventfdWrites(t, l); w != 0 {
		t.Errorf("%d eventfd writes for messages to an unarmed CQ, want 0", w)
	}

	if err := s.cq.Arm(); err != nil {
		t.Fatal(err)
	}
	s.cq.Disarm()
	for i, v := range s.sleeping() {
		if v != 0 {
			t.Fatalf("QP %d's inbox sleeping %d after Disarm, want 0", i, v)
		}
	}
	s.sendAll(t)
	if w := eventfdWrites(t, l); w != 0 {
		t.Errorf("%d eventfd writes for messages to a disarmed CQ, want 0", w)
	}

	if got := s.barrier(t, 2); got != 1 {
		t.Errorf("%d notifications, want 1: the barrier's only", got)
	}
}

// TestLocalCompletionFires: a local completion (a signaled send's, made
// in PostSend) calls notify inside the post when the CQ is armed, once;
// armed for solicited completions only, a success does not, a failure
// does.
func TestLocalCompletionFires(t *testing.T) {
	a, b := pair(t, 8)
	b.postRecvs(t, 1, 64)
	bl := bellOf(a.cq)
	if err := a.cq.Arm(); err != nil {
		t.Fatal(err)
	}
	sendInline(t, a, 1, []byte{1})
	if got := bl.n.Load(); got != 1 {
		t.Fatalf("%d notifications after an armed signaled send, want 1", got)
	}
	sendInline(t, a, 2, []byte{2}) // no RECV left at b: fails with StatusRNR
	if got := bl.n.Load(); got != 1 {
		t.Fatalf("%d notifications with the Arm used up, want 1", got)
	}
	if wc := drain(t, a.cq); len(wc) != 2 || wc[0].Err() != nil || wc[1].Status != verbs.StatusRNR {
		t.Fatalf("completions %+v, want a success and an RNR", wc)
	}

	c, d := pair(t, 8)
	d.postRecvs(t, 1, 64)
	bl = bellOf(c.cq)
	if err := c.cq.ArmSolicited(); err != nil {
		t.Fatal(err)
	}
	sendInline(t, c, 1, []byte{1})
	if got := bl.n.Load(); got != 0 {
		t.Fatalf("%d notifications for a successful send under ArmSolicited, want 0", got)
	}
	sendInline(t, c, 2, []byte{2}) // RNR
	if got := bl.n.Load(); got != 1 {
		t.Fatalf("%d notifications for a failed send under ArmSolicited, want 1", got)
	}
}

// TestKickOverwrittenWords: the words that ask a producer for a doorbell
// ring (the inbox's sleeping word, the bell page's armed word) live in
// memory the peer can write. Overwritten, an armed CQ is never rung; Kick
// rings it anyway (the engine's lost-notification backstop).
func TestKickOverwrittenWords(t *testing.T) {
	a, b := pair(t, 8)
	b.postRecvs(t, 1, 64)
	if err := b.cq.Arm(); err != nil {
		t.Fatalf("Arm: %v", err)
	}
	b.qp.in.hdr.sleeping.Store(0)
	b.qp.link.own.hdr.armed.Store(0)
	sendInline(t, a, 1, []byte("x"))
	a.qp.Kick()
	if !notified(b.cq, hangGuard) {
		t.Fatalf("no notification within %v", hangGuard)
	}
	if got := drain(t, b.cq); len(got) != 1 || got[0].Op != verbs.OpRecv {
		t.Fatalf("completions %+v, want the one RECV", got)
	}
	drain(t, a.cq)
}

// TestSleep: after ArmSleep, a peer's ring wakes Sleep itself (rung, no
// notification, no eventfd write); Wake ends a Sleep and sends later rings
// to the link (notify); a Sleep after a plain Arm returns at once.
func TestSleep(t *testing.T) {
	a, b := pair(t, 8)
	b.postRecvs(t, 4, 64)
	l := b.qp.link
	eventfdWrites(t, l)
	sleep := func() <-chan bool {
		done := make(chan bool, 1)
		go func() { done <- b.cq.Sleep() }()
		for end := time.Now().Add(hangGuard); b.cq.asleep.Load() == nil; time.Sleep(10 * time.Microsecond) {
			if time.Now().After(end) {
				t.Fatal("Sleep never began to wait")
			}
		}
		return done
	}
	result := func(done <-chan bool) bool {
		select {
		case r := <-done:
			return r
		case <-time.After(hangGuard):
			t.Fatal("Sleep did not return")
			return false
		}
	}

	if err := b.cq.ArmSleep(); err != nil {
		t.Fatal(err)
	}
	done := sleep()
	sendInline(t, a, 1, []byte("ping"))
	if !result(done) {
		t.Error("a ring did not end the Sleep as rung")
	}
	if n := bellOf(b.cq).n.Load(); n != 0 {
		t.Errorf("%d notifications for a ring that woke the Sleep, want 0", n)
	}
	if w := eventfdWrites(t, l); w != 0 {
		t.Errorf("%d eventfd writes for a ring that woke the Sleep, want 0", w)
	}
	if wc := drain(t, b.cq); len(wc) != 1 {
		t.Fatalf("%d completions after the ring, want 1", len(wc))
	}

	if err := b.cq.ArmSleep(); err != nil {
		t.Fatal(err)
	}
	done = sleep()
	b.cq.Wake()
	if result(done) {
		t.Error("Wake ended the Sleep as rung")
	}
	sendInline(t, a, 2, []byte("ping"))
	if !notified(b.cq, hangGuard) {
		t.Error("no notification for a ring after Wake")
	}
	drain(t, b.cq)

	if err := b.cq.Arm(); err != nil {
		t.Fatal(err)
	}
	if b.cq.Sleep() {
		t.Error("a Sleep after a plain Arm reported a ring")
	}
	drain(t, a.cq)
}
