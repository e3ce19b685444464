package shm

import (
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

// TestWakeDirectUsedUp: WakeDirect wakes one WaitDirect (the one in
// progress or the next), and then WaitDirect parks again: a wake-up left
// behind would turn every later WaitDirect into a busy loop, which the
// contract's "spurious wake-ups are allowed" would hide from the
// conformance suite.
func TestWakeDirectUsedUp(t *testing.T) {
	e := openEnd(t, 8)
	waits := make(chan error, 16)
	waitOnce := func() { waits <- e.cq.WaitDirect() }
	expectWake := func(why string) {
		t.Helper()
		select {
		case err := <-waits:
			if err != nil {
				t.Fatalf("WaitDirect: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("WaitDirect did not return %s", why)
		}
	}
	// Parked, not returning and not spinning inside: over the window, the
	// process uses far less CPU than a busy loop would (all of it).
	const window = 200 * time.Millisecond
	expectParked := func() {
		t.Helper()
		before := cpuTime(t)
		select {
		case err := <-waits:
			t.Fatalf("WaitDirect returned (%v) with nothing to wake it", err)
		case <-time.After(window):
		}
		if used := cpuTime(t) - before; used > window/2 {
			t.Fatalf("WaitDirect used %v of CPU in %v while nothing woke it: it spins", used, window)
		}
	}
	e.cq.WakeDirect() // before the wait: latched
	go waitOnce()
	expectWake("for a WakeDirect before it")
	for range 3 {
		go waitOnce()
		expectParked()
		e.cq.WakeDirect()
		expectWake("for a WakeDirect")
	}
	go waitOnce()
	expectParked()
	if err := e.cq.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-waits:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not unblock WaitDirect")
	}
	e.cq = nil
}

// TestWakeDirectUsedUpLeading is TestWakeDirectUsedUp for a WaitDirect
// that reads its link's eventfd (the CQ owns the link): there WakeDirect
// sets a read deadline in the past on that file, which must not be left
// to make later WaitDirects spin.
func TestWakeDirectUsedUpLeading(t *testing.T) {
	_, b := pair(t, 8)
	const window = 200 * time.Millisecond
	for i := range 4 {
		ch := leading(t, b)
		before := cpuTime(t)
		select {
		case err := <-ch:
			t.Fatalf("round %d: WaitDirect returned (%v) with nothing to wake it", i, err)
		case <-time.After(window):
		}
		if used := cpuTime(t) - before; used > window/2 {
			t.Fatalf("round %d: WaitDirect used %v of CPU in %v while nothing woke it: it spins", i, used, window)
		}
		b.cq.WakeDirect()
		if err := returned(t, ch, "WaitDirect for a WakeDirect"); err != nil {
			t.Fatalf("WaitDirect: %v", err)
		}
	}
}

// TestWaitDirectStaleDeadline: the interleaving in which a WakeDirect
// stores woken before a WaitDirect takes it but sets its deadline after
// that WaitDirect reset it leaves a past deadline with woken clear (on
// the link's eventfd file that an owner's WaitDirect reads; the same
// holds after a kick of a reader that had already left). The next
// WaitDirect must park (not spin on the deadline) and still return for a
// real notification. Before main's fix (d198f2a), the CQ's eventfd
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
	before := cpuTime(t)
	go func() { waits <- b.cq.WaitDirect() }()
	const window = 200 * time.Millisecond
	select {
	case err := <-waits:
		t.Fatalf("WaitDirect returned (%v) with nothing to wake it", err)
	case <-time.After(window):
	}
	if used := cpuTime(t) - before; used > window/2 {
		t.Fatalf("WaitDirect used %v of CPU in %v on a stale deadline: it spins", used, window)
	}
	sendInline(t, a, 1, []byte{1})
	select {
	case err := <-waits:
		if err != nil {
			t.Fatalf("WaitDirect: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WaitDirect missed its ring after a stale deadline")
	}
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
