package stream

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

var simProv = sim.New()

// hangGuard bounds waits in these tests; it is never a timing assertion.
const hangGuard = 30 * time.Second

// newPair connects two Conns over the sim provider, the way rsock does:
// the passive side connects first, the active side second, then the
// passive side's Established; a net.Pipe is the bootstrap.
func newPair(t *testing.T, opts Options) (a, b *Conn) {
	t.Helper()
	return newPairOn(t, simProv, opts)
}

// newPairOn is newPair over provider p.
func newPairOn(t *testing.T, p verbs.Provider, opts Options) (a, b *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	ea, err := NewEndpoint(p, verbs.OpenOptions{GIDIndex: -1}, opts)
	require.NoError(t, err)
	eb, err := NewEndpoint(p, verbs.OpenOptions{GIDIndex: -1}, opts)
	require.NoError(t, err)
	require.NoError(t, eb.Connect(ctx, ea.Info(), false))
	require.NoError(t, ea.Connect(ctx, eb.Info(), true))
	require.NoError(t, eb.Established(ctx))
	pa, pb := net.Pipe()
	a, err = ea.Start(eb.Ring(), NetBootstrap(pa), deadline.New(), deadline.New())
	require.NoError(t, err)
	b, err = eb.Start(ea.Ring(), NetBootstrap(pb), deadline.New(), deadline.New())
	require.NoError(t, err)
	go a.Watch(pa)
	go b.Watch(pb)
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() {
			_ = a.Close(-1)
			close(done)
		}()
		_ = b.Close(-1)
		<-done
	})
	return a, b
}

var eventOnly = Options{RingSize: 64 << 10, Credits: 16}

// readFull reads len(want) bytes from c and compares them.
func readFull(t *testing.T, c *Conn, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, want), "read other bytes than written")
}

// withHook sets one of the engine's test hooks for the rest of the test.
func withHook(t *testing.T, hook *atomic.Pointer[func(*Conn)], fn func(*Conn)) {
	hook.Store(&fn)
	t.Cleanup(func() { hook.Store(nil) })
}

// A message that arrives after a Read checked for data and before it
// parked wakes it: the poller arms the queue and polls before it parks,
// and the notification after the Arm reaches its channel. The hook sends
// the message at exactly that point (sim delivers it inside the peer's
// Write), every time; the read deadline turns a lost wake-up into a
// failure instead of a hang.
func TestNoLostWakeupBeforePark(t *testing.T) {
	a, b := newPair(t, eventOnly)
	const n = 200
	withHook(t, &testHookParking, func(c *Conn) {
		if c == b {
			if _, err := a.Write([]byte{42}); err != nil {
				t.Errorf("peer Write in the hook: %v", err)
			}
		}
	})
	require.NoError(t, b.SetReadDeadline(time.Now().Add(hangGuard)))
	for range n {
		readFull(t, b, []byte{42})
	}
	st := b.Stats()
	require.Equal(t, uint64(n), st.Wakeups.Load(), "each Read parks once and is woken once")
	require.Zero(t, st.Background.Load(), "a notification went to background progress while a Read was parked")
}

// A message that comes while the poller lets go of its role (after it
// stopped being the poller, before it polled and armed for whoever comes
// next) is not lost: the leaving poller polls after it let go. Here every
// park and every leave of b's poller sends a byte, so Reads race both.
func TestNoLostWakeupHandOff(t *testing.T) {
	a, b := newPair(t, eventOnly)
	send := func(c *Conn) {
		if c == b {
			if _, err := a.Write([]byte{7}); err != nil {
				t.Errorf("peer Write in the hook: %v", err)
			}
		}
	}
	withHook(t, &testHookParking, send)
	withHook(t, &testHookLeaving, send)
	require.NoError(t, b.SetReadDeadline(time.Now().Add(hangGuard)))
	for range 300 {
		readFull(t, b, []byte{7})
	}
}

// Two calls wait on one Conn at once: a Read (nothing to read) and a
// Write (no room). Whichever is the poller, the other is woken by what
// the poller's progress found, and the role moves on when one leaves.
func TestReadAndWriteWaitTogether(t *testing.T) {
	opts := Options{RingSize: 4096, Credits: 4}
	a, b := newPair(t, opts)
	big := bytes.Repeat([]byte("x"), 64<<10) // 16 rings
	var wg sync.WaitGroup
	wg.Go(func() { // a's Read waits while a's Write fills b's ring
		got := make([]byte, 3)
		if _, err := io.ReadFull(a, got); err != nil || string(got) != "end" {
			t.Errorf("a Read: %q, %v", got, err)
		}
	})
	wg.Go(func() {
		if _, err := a.Write(big); err != nil {
			t.Errorf("a Write: %v", err)
		}
	})
	readFull(t, b, big)
	_, err := b.Write([]byte("end"))
	require.NoError(t, err)
	wg.Wait()
}

// The peer's small writes while nothing here reads: each consumes one of
// our receive buffers; background progress posts them again and returns
// the credits, so the peer writes on until the ring is full, as a socket
// buffer would take it. Nothing here calls into the Conn meanwhile.
func TestBackgroundProgress(t *testing.T) {
	opts := Options{RingSize: 64 << 10, Credits: 4}
	a, b := newPair(t, opts)
	require.NoError(t, a.SetWriteDeadline(time.Now().Add(hangGuard)))
	const n = 200 // 50 times the credits, far below the ring
	for i := range n {
		_, err := a.Write([]byte{byte(i)})
		require.NoError(t, err)
	}
	require.NotZero(t, b.Stats().Background.Load(), "the peer's writes completed without background progress here")
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i)
	}
	readFull(t, b, want)
}

// In event mode (no busy-poll), a ping-pong costs one wake-up per message:
// the parked Read is woken by the queue's notification itself, and no
// notification goes to background progress while it waits.
func TestOneWakeupPerMessage(t *testing.T) {
	a, b := newPair(t, eventOnly)
	const n = 500
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 64)
		for range n {
			if _, err := io.ReadFull(b, buf); err != nil {
				t.Error(err)
				return
			}
			if _, err := b.Write(buf); err != nil {
				t.Error(err)
				return
			}
		}
	})
	buf := make([]byte, 64)
	for range n {
		_, err := a.Write(buf)
		require.NoError(t, err)
		_, err = io.ReadFull(a, buf)
		require.NoError(t, err)
	}
	wg.Wait()
	for _, c := range []*Conn{a, b} {
		st := c.Stats()
		t.Logf("wake-ups %d, notifications %d, background %d for %d messages in", st.Wakeups.Load(), st.Notifications.Load(), st.Background.Load(), n)
		// A message that lands between one call leaving and the next
		// parking goes to background progress instead; with two such
		// races per message, this would be 2n.
		require.LessOrEqual(t, st.Wakeups.Load()+st.Background.Load(), uint64(n)*5/4)
	}
}

// Close waits for its final message's acknowledgement like any blocked
// call: woken by the notification of its completion, which sim delays
// here. The peer then reads EOF, not a reset (an unacknowledged final
// message turns the goodbye into an abort after a second).
func TestCloseWaitsForAck(t *testing.T) {
	simProv.SetFaults(sim.Faults{Delay: 2 * time.Millisecond})
	t.Cleanup(func() { simProv.SetFaults(sim.Faults{}) })
	a, b := newPair(t, eventOnly)
	_, err := a.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, a.Close(-1))
	got, err := io.ReadAll(b)
	require.NoError(t, err, "the peer's Read after an orderly close")
	require.Equal(t, "last words", string(got))
}

// A receiver that holds lent bytes, or is idle, costs a streaming sender
// no notification per message: its queue is not armed for the sender's
// data announcements, nor for the BLOCKED message of a sender waiting for
// ring space (only the receiver's reading frees space, and its Read
// answers). Counted on the receiver while the sender writes and then
// blocks; removing the solicited arming makes every message notify.
func TestStreamingPeerCostsNoNotifications(t *testing.T) {
	opts := Options{RingSize: 64 << 10, Credits: 16}
	a, b := newPair(t, opts)
	_, err := a.Write([]byte("x"))
	require.NoError(t, err)
	readFull(t, b, []byte("x")) // b is idle now, its ring drained
	before := b.Stats().Notifications.Load()
	chunk := bytes.Repeat([]byte("y"), 4<<10)
	for range 8 { // eight announcements, well within b's credits
		_, err := a.Write(chunk)
		require.NoError(t, err)
	}
	require.Equal(t, before, b.Stats().Notifications.Load(), "data announcements to an idle receiver notified it")
	// Fill b's ring: a blocks for space and says so, unsolicited.
	done := make(chan error, 1)
	go func() {
		_, err := a.Write(bytes.Repeat([]byte("z"), 64<<10))
		done <- err
	}()
	for a.Stats().CreditStalls.Load() == 0 {
		select {
		case err := <-done:
			t.Fatalf("the Write that fills the ring did not block: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	require.Equal(t, before, b.Stats().Notifications.Load(), "a writer blocked for space notified the idle receiver")
	// b's reading answers it.
	got := make([]byte, 8*len(chunk)+64<<10)
	_, err = io.ReadFull(b, got)
	require.NoError(t, err)
	require.NoError(t, <-done)
}

// A lost notification (sim drops every one here) does not stall a
// connection with bytes in flight: the writer's backstop kicks the
// reader's queue, and the parked Read wakes. Without the backstop the
// Read would wait for good (its deadline turns that into a failure).
func TestBackstopLostWakes(t *testing.T) {
	a, b := newPair(t, eventOnly)
	simProv.SetFaults(sim.Faults{LoseWakes: 1})
	t.Cleanup(func() { simProv.SetFaults(sim.Faults{}) })
	for _, c := range []*Conn{a, b} {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(hangGuard)))
	}
	for i, pair := range [][2]*Conn{{a, b}, {b, a}} {
		w, r := pair[0], pair[1]
		msg := []byte{'p', 'i', 'n', 'g', byte('0' + i)}
		read := make(chan error, 1)
		go func() {
			got := make([]byte, len(msg))
			_, err := io.ReadFull(r, got)
			if err == nil && !bytes.Equal(got, msg) {
				err = fmt.Errorf("read %q, want %q", got, msg)
			}
			read <- err
		}()
		require.Eventually(t, func() bool { return r.Waiting() > 0 }, hangGuard, time.Millisecond, "the Read parks")
		_, err := w.Write(msg)
		require.NoError(t, err)
		require.NoError(t, <-read)
		// The backstop counts its kick once Kick returns, and the kick's
		// notification may wake the Read before that: wait for the count.
		require.Eventually(t, func() bool { return w.Stats().Backstops.Load() > 0 }, hangGuard, time.Millisecond, "the writer kicked the reader")
	}
}

// A writer whose Writes never wait (a lockstep loop: each message fits at
// once, and the peer reads it before the next) runs on the credits and
// ring space the peer returns, which only a poll finds. A call leaving a
// queue armed as it would arm it does not arm it again, but still polls
// what may be pending: the writer never runs short of credits, so it
// sends no BLOCKED, which would notify the idle reader and grow its ring.
func TestLockstepWriterNeedsNoNotification(t *testing.T) {
	testLockstep(t, simProv)
}

func testLockstep(t *testing.T, p verbs.Provider) {
	a, b := newPairOn(t, p, Options{RingSize: 64 << 10, Credits: 16, GrowTo: 1 << 20})
	require.NoError(t, b.SetReadDeadline(time.Now().Add(hangGuard)))
	msg := bytes.Repeat([]byte{5}, 1<<10)
	for range 2000 {
		_, err := a.Write(msg)
		require.NoError(t, err)
		readFull(t, b, msg)
	}
	require.Zero(t, a.Stats().CreditStalls.Load(), "the writer ran short of credits or space")
	require.Zero(t, b.Stats().Notifications.Load(), "the idle reader was notified")
	require.Zero(t, b.Stats().RingGrows.Load(), "the reader's ring grew")
}
