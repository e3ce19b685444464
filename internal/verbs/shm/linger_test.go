//go:build linux

package shm

import (
	"bytes"
	"context"
	"testing"
	"time"
)

// setLinger sets linkLinger for one test, after the links of earlier tests
// are gone.
func setLinger(t *testing.T, d time.Duration) {
	t.Helper()
	waitLinks(t)
	old := linkLinger.Load()
	linkLinger.Store(int64(d))
	t.Cleanup(func() {
		waitLinks(t)
		linkLinger.Store(old)
	})
}

// roundTrip sends a message from a to b and checks that it arrives.
func roundTrip(t *testing.T, a, b *end) {
	t.Helper()
	buf := b.postRecvs(t, 1, 64)
	sendInline(t, a, 1, []byte("hello"))
	if c := pollN(t, b.cq, 1)[0]; c.Err() != nil || !bytes.Equal(buf.Bytes()[:5], []byte("hello")) {
		t.Fatalf("got %+v", c)
	}
	pollN(t, a.cq, 1)
}

// lingering reports whether the dialed link l lingers (it has no QP).
func lingering(l *link) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lingering && !l.closing
}

// TestLinkLingers: the dialed link outlives its last QP for linkLinger, so
// the next QP to the same peer process attaches to it instead of dialing;
// unused, it ends after linkLinger, and the accepted side's listener
// reference goes with it.
func TestLinkLingers(t *testing.T) {
	setLinger(t, time.Hour)
	a, b := pair(t, 8)
	first := a.qp.link
	if !first.dialed {
		t.Fatal("the active side's link was not dialed")
	}
	roundTrip(t, a, b)
	a.close()
	b.close()
	if !lingering(first) {
		t.Fatal("the link did not linger after its last QP closed")
	}
	c, d := pair(t, 8)
	if c.qp.link != first {
		t.Fatal("the next QP to the same process dialed a new link")
	}
	if lingering(first) {
		t.Fatal("the link still lingers with a QP on it")
	}
	roundTrip(t, c, d)
	c.close()
	d.close()

	// A short linger ends by itself.
	linkLinger.Store(int64(20 * time.Millisecond))
	e, f := pair(t, 8)
	second := e.qp.link
	e.close()
	f.close()
	deadline := time.Now().Add(10 * time.Second)
	for liveLinks.Load() != 0 || listenerRefs() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d links, %d listener references left after the linger", liveLinks.Load(), listenerRefs())
		}
		time.Sleep(time.Millisecond)
	}
	if !second.closing {
		t.Fatal("the link was released without closing")
	}
}

// TestLingerTakenOver: a linger whose link a new QP took over does not end
// the link when its timer fires.
func TestLingerTakenOver(t *testing.T) {
	setLinger(t, 30*time.Millisecond)
	for range 5 {
		a, b := pair(t, 8)
		a.close()
		b.close()
	}
	a, b := pair(t, 8)
	time.Sleep(100 * time.Millisecond) // every timer so far has fired
	a.qp.link.mu.Lock()
	closing := a.qp.link.closing
	a.qp.link.mu.Unlock()
	if closing {
		t.Fatal("an old linger timer closed a link in use")
	}
	roundTrip(t, a, b)
}

// TestLingerPeerGone: the peer's end of a lingering link going away
// releases it at once, and the next QP dials a new link.
func TestLingerPeerGone(t *testing.T) {
	setLinger(t, time.Hour)
	a, b := pair(t, 8)
	first := a.qp.link
	passive := b.qp.link
	a.close()
	b.close()
	if !lingering(first) {
		t.Fatal("the link did not linger")
	}
	_ = passive.c.Close() // as if the peer process ended
	deadline := time.Now().Add(10 * time.Second)
	for liveLinks.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d links left after the peer's end closed", liveLinks.Load())
		}
		time.Sleep(time.Millisecond)
	}
	c, d := pair(t, 8)
	if c.qp.link == first {
		t.Fatal("a QP attached to a link whose peer had gone")
	}
	roundTrip(t, c, d)
}

func listenerRefs() int {
	rv.mu.Lock()
	defer rv.mu.Unlock()
	return rv.refs
}

// TestFreshLinkThenAttach alternates connections that set up a new link
// with ones that attach to the link the previous one left lingering; each
// active side closes as soon as its Connect returns.
func TestFreshLinkThenAttach(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 100 {
		for _, fresh := range []bool{true, false} {
			if fresh {
				waitLinks(t) // ends the lingering link
			}
			a, b := openEnd(t, 16), openEnd(t, 16)
			if err := b.qp.Connect(ctx, a.qp.Info(), false); err != nil {
				t.Fatalf("%d (fresh %v): passive Connect: %v", i, fresh, err)
			}
			if err := a.qp.Connect(ctx, b.qp.Info(), true); err != nil {
				t.Fatalf("%d (fresh %v): active Connect: %v", i, fresh, err)
			}
			a.close() // before b may have seen Established

			b.close()
		}
	}
}
