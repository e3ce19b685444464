package shm

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The notification path of shm, over one link's doorbell and dispatcher.
// (The CQ contract itself, once per Arm and never unarmed, is checked for
// every provider by verbstest's Notify.)

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
// dispatcher is parked on its eventfd (the runtime forgets readiness when
// a wait starts, and the dispatcher never reads the counter) still
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
