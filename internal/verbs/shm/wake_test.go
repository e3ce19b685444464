package shm

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// cpuTime is the CPU time this process has used.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parkWindow is how long expectParked watches a WaitDirect.
const parkWindow = 200 * time.Millisecond

// expectParked checks that the WaitDirect reporting to waits stays parked
// for parkWindow: it does not return, and does not spin inside (over the
// window the process uses far less CPU than a busy loop would: all of it).
func expectParked(t *testing.T, waits chan error, what string) {
	t.Helper()
	before := cpuTime(t)
	select {
	case err := <-waits:
		t.Fatalf("WaitDirect returned (%v) with nothing to wake it (%s)", err, what)
	case <-time.After(parkWindow):
	}
	if used := cpuTime(t) - before; used > parkWindow/2 {
		t.Fatalf("WaitDirect used %v of CPU in %v while nothing woke it (%s): it spins", used, parkWindow, what)
	}
}

// expectWake checks that the WaitDirect reporting to waits returns nil
// within 10 s.
func expectWake(t *testing.T, waits chan error, why string) {
	t.Helper()
	if err := returned(t, waits, "WaitDirect "+why); err != nil {
		t.Fatalf("WaitDirect: %v", err)
	}
}

// TestWakeDirectUsedUp: WakeDirect wakes one WaitDirect (the one in
// progress or the next), and then WaitDirect parks again: a wake-up left
// behind would turn every later WaitDirect into a busy loop, which the
// contract's "spurious wake-ups are allowed" would hide from the
// conformance suite.
func TestWakeDirectUsedUp(t *testing.T) {
	e := openEnd(t, 8)
	waits := make(chan error, 16)
	waitOnce := func() { waits <- e.cq.WaitDirect() }
	e.cq.WakeDirect() // before the wait: latched
	go waitOnce()
	expectWake(t, waits, "for a WakeDirect before it")
	for i := range 3 {
		go waitOnce()
		expectParked(t, waits, fmt.Sprintf("round %d", i))
		e.cq.WakeDirect()
		expectWake(t, waits, "for a WakeDirect")
	}
	go waitOnce()
	expectParked(t, waits, "after the rounds")
	if err := e.cq.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_ = returned(t, waits, "Close did not unblock WaitDirect")
	e.cq = nil
}

// TestWakeDirectUsedUpLeading is TestWakeDirectUsedUp for a WaitDirect
// that reads its link's eventfd (the CQ owns the link): there WakeDirect
// sets a read deadline in the past on that file, which must not be left
// to make later WaitDirects spin.
func TestWakeDirectUsedUpLeading(t *testing.T) {
	_, b := pair(t, 8)
	for i := range 4 {
		ch := leading(t, b)
		expectParked(t, ch, fmt.Sprintf("round %d", i))
		b.cq.WakeDirect()
		expectWake(t, ch, "for a WakeDirect")
	}
}

// TestWaitDirectStaleDeadline: the interleaving in which a WakeDirect
// stores woken before a WaitDirect takes it but sets its deadline after
// that WaitDirect reset it leaves a past deadline with woken clear (on
// the link's eventfd file that an owner's WaitDirect reads; the same
// holds after a kick of a reader that had already left). The next
// WaitDirect must park (not spin on the deadline) and still return for a
// real notification. Before the fix (d198f2a), the CQ's eventfd
// version looped on ErrDeadlineExceeded without ever reading the eventfd,
// which hung nettest's ConcurrentMethods in CI.
func TestWaitDirectStaleDeadline(t *testing.T) {
	a, b := pair(t, 8)
	b.postRecvs(t, 8, 64)
	if err := b.cq.ArmDirect(); err != nil {
		t.Fatal(err)
	}
	l := b.link()
	waitFor(t, "b owns its link", func() bool { return l.owner.Load() == b.cq })
	if err := l.lfile.SetReadDeadline(aLongTimeAgo); err != nil {
		t.Fatalf("SetReadDeadline: %v", err)
	}
	waits := make(chan error, 1)
	go func() { waits <- b.cq.WaitDirect() }()
	expectParked(t, waits, "on a stale deadline")
	sendInline(t, a, 1, []byte{1})
	expectWake(t, waits, "for its ring after a stale deadline")
}

// TestWaitDirectNotificationBeforeWait: a peer's notification that the
// runtime saw before WaitDirect began (the runtime forgets such readiness
// when a wait starts, and WaitDirect never reads the eventfd) still ends
// the wait: the owner's WaitDirect drains the bell page before it parks.
func TestWaitDirectNotificationBeforeWait(t *testing.T) {
	a, b := pair(t, 8)
	b.postRecvs(t, 1, 64)
	if err := b.cq.ArmDirect(); err != nil {
		t.Fatalf("ArmDirect: %v", err)
	}
	sendInline(t, a, 1, []byte("ring"))
	// Idle Ps wait in the netpoller, which takes the eventfd's edge at
	// once; give it time anyway.
	time.Sleep(50 * time.Millisecond)
	waits := make(chan error, 1)
	go func() { waits <- b.cq.WaitDirect() }()
	select {
	case err := <-waits:
		if err != nil {
			t.Fatalf("WaitDirect: %v", err)
		}
	case <-time.After(5 * time.Second):
		b.cq.WakeDirect()
		<-waits
		t.Fatal("WaitDirect missed a notification sent between ArmDirect and the wait")
	}
	if got := pollN(t, b.cq, 1); got[0].Status != verbs.StatusSuccess {
		t.Fatalf("completion: %+v", got[0])
	}
}
