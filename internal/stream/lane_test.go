//go:build linux

package stream

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/shm"
)

// The lane (verbs.Laner, shm's): a parked poller waits for its queue's
// notification in the netpoller itself. These tests hold the lane for
// longer than hangGuard, so a wake-up the lane wait misses shows as a
// hang, not as a 10 ms delay.

var shmProv = shm.New()

// newShmPair is newPair over shm, in this process.
func newShmPair(t *testing.T, opts Options) (a, b *Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	ea, err := NewEndpoint(shmProv, verbs.OpenOptions{}, opts)
	require.NoError(t, err)
	eb, err := NewEndpoint(shmProv, verbs.OpenOptions{}, opts)
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
			_ = a.Close()
			close(done)
		}()
		_ = b.Close()
		<-done
	})
	require.NotNil(t, a.lane, "shm's CQ is a verbs.Laner")
	return a, b
}

func holdLane(t *testing.T) {
	old := laneHold
	laneHold = time.Hour
	t.Cleanup(func() { laneHold = old })
}

// readAsync starts a 1-byte Read of c and returns its outcome's channel.
func readAsync(c *Conn) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		done <- err
	}()
	return done
}

func await(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(hangGuard):
		t.Fatal("the Read parked on the lane was not woken")
		return nil
	}
}

// onLane runs fn once, in the Read's goroutine, when the Read is about to
// wait on its lane: after its last check, so whatever fn does can reach
// the Read only through the lane or its interruption.
func onLane(t *testing.T, fn func(*Conn)) {
	fired := false
	withHook(t, &testHookLane, func(c *Conn) {
		if !fired {
			fired = true
			fn(c)
		}
	})
}

// A Read parked on the lane is woken by the peer's message with no
// notification (no dispatcher between), also when the message came after
// its last check and before its wait began (the netpoller forgets that
// edge; the lane's word in shared memory does not).
func TestLaneWakesWithoutNotification(t *testing.T) {
	holdLane(t)
	a, b := newShmPair(t, eventOnly)
	before := a.stats.Notifications.Load()
	onLane(t, func(*Conn) {
		_, err := b.Write([]byte{1})
		require.NoError(t, err)
		time.Sleep(time.Millisecond) // an idle scheduler polls the netpoller: the edge is delivered now
	})
	require.NoError(t, await(t, readAsync(a)))
	require.Equal(t, before, a.stats.Notifications.Load(), "the Read was woken through the dispatcher")

	parked := make(chan struct{})
	onLane(t, func(*Conn) { close(parked) })
	done := readAsync(a)
	<-parked
	_, err := b.Write([]byte{2})
	require.NoError(t, err)
	require.NoError(t, await(t, done))
	require.Equal(t, before, a.stats.Notifications.Load(), "the Read was woken through the dispatcher")
}

// Moving the read deadline, letting it pass, and Close each end a Read
// parked on the lane, also when they come after its last check.
func TestLaneInterrupted(t *testing.T) {
	holdLane(t)
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, a *Conn)
		want error
	}{
		{"DeadlineMoved", func(t *testing.T, a *Conn) { a.rd.dl.Set(time.Unix(1, 0)) }, os.ErrDeadlineExceeded},
		{"DeadlinePassing", func(t *testing.T, a *Conn) { a.rd.dl.Set(time.Now().Add(20 * time.Millisecond)) }, os.ErrDeadlineExceeded},
		{"Close", func(t *testing.T, a *Conn) { go a.Close() }, net.ErrClosed},
		{"Abort", func(t *testing.T, a *Conn) { // no final message comes back on the ring
			require.NoError(t, a.SetLinger(0))
			go a.Close()
		}, net.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := newShmPair(t, eventOnly)
			onLane(t, func(*Conn) { tc.do(t, a) })
			require.ErrorIs(t, await(t, readAsync(a)), tc.want)
		})
		t.Run(tc.name+"Parked", func(t *testing.T) {
			a, _ := newShmPair(t, eventOnly)
			parked := make(chan struct{})
			onLane(t, func(*Conn) { close(parked) })
			done := readAsync(a)
			<-parked
			tc.do(t, a)
			require.ErrorIs(t, await(t, done), tc.want)
		})
	}
}

// One parked call per link holds the lane: a second connection's Read
// parks as usual and is woken by its notification, and the lane holder
// still by its lane.
func TestLaneOnePerLink(t *testing.T) {
	holdLane(t)
	a1, b1 := newShmPair(t, eventOnly)
	a2, b2 := newShmPair(t, eventOnly)
	onLane1, parked2 := make(chan struct{}), make(chan struct{})
	var once1, once2 sync.Once
	withHook(t, &testHookLane, func(c *Conn) {
		if c != a1 {
			t.Errorf("a second call took the lane")
		}
		once1.Do(func() { close(onLane1) })
	})
	withHook(t, &testHookParking, func(c *Conn) {
		if c == a2 {
			once2.Do(func() { close(parked2) })
		}
	})
	done1 := readAsync(a1)
	<-onLane1
	n1, n2 := a1.stats.Notifications.Load(), a2.stats.Notifications.Load()
	done2 := readAsync(a2)
	<-parked2
	_, err := b2.Write([]byte{2})
	require.NoError(t, err)
	require.NoError(t, await(t, done2))
	require.Equal(t, n2+1, a2.stats.Notifications.Load(), "the second Read was not woken by its notification")
	_, err = b1.Write([]byte{1})
	require.NoError(t, err)
	require.NoError(t, await(t, done1))
	require.Equal(t, n1, a1.stats.Notifications.Load(), "the lane holder was woken through the dispatcher")
}

// A Read parked on the lane for longer than laneHold loses it to a newer
// parked Read of another connection of the link, and parks as usual;
// nothing is lost either way.
func TestLaneTakenOver(t *testing.T) {
	old := laneHold
	laneHold = 0
	t.Cleanup(func() { laneHold = old })
	a1, b1 := newShmPair(t, eventOnly)
	a2, b2 := newShmPair(t, eventOnly)
	for i := range 50 {
		parked := make(chan struct{})
		onLane(t, func(*Conn) { close(parked) })
		done1 := readAsync(a1)
		<-parked
		done2 := readAsync(a2) // takes the lane over, or finds it free
		_, err := b2.Write([]byte{byte(i)})
		require.NoError(t, err)
		require.NoError(t, await(t, done2))
		_, err = b1.Write([]byte{byte(i)})
		require.NoError(t, err)
		require.NoError(t, await(t, done1))
	}
}
