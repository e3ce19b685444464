package deadline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pending reports whether a timer is pending, and how many were armed.
func pending(d *Deadline) (bool, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.timer != nil, d.gen
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A deadline nobody waits on arms no timer, and still expires on time.
func TestUnwaitedExpires(t *testing.T) {
	d := New()
	require.False(t, d.Expired(), "disarmed")
	d.Set(time.Now().Add(time.Hour))
	_, armed := pending(d)
	require.Zero(t, armed, "no waiter: no timer")
	require.False(t, d.Expired())
	d.Set(time.Now().Add(time.Millisecond))
	_, armed = pending(d)
	require.Zero(t, armed)
	require.Nil(t, d.cancel, "no waiter: no channel")
	require.Eventually(t, d.Expired, 5*time.Second, time.Millisecond)
	// The first waiter after the time finds the channel closed.
	require.True(t, closed(d.Wait()), "expired before Wait: closed at once")
}

// A waiter that comes before the deadline is woken when it passes.
func TestWaiterWoken(t *testing.T) {
	d := New()
	d.Set(time.Now().Add(20 * time.Millisecond))
	ch := d.Wait()
	require.False(t, closed(ch))
	_, armed := pending(d)
	require.Equal(t, uint64(1), armed, "a waiter arms the timer")
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken")
	}
	require.True(t, d.Expired())
}

// Once waited on, later deadlines arm timers at once: a waiter that holds
// the channel from before a Set is woken by the new deadline.
func TestWaitedStaysArmed(t *testing.T) {
	d := New()
	ch := d.Wait() // disarmed: nothing to arm yet
	_, armed := pending(d)
	require.Zero(t, armed)
	d.Set(time.Now().Add(10 * time.Millisecond))
	_, armed = pending(d)
	require.Equal(t, uint64(1), armed)
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken by a deadline set after it began")
	}
}

func TestSetMoves(t *testing.T) {
	for _, waited := range []bool{false, true} {
		d := New()
		if waited {
			d.Wait()
		}
		d.Set(time.Now().Add(-time.Second))
		require.True(t, d.Expired(), "past: expired at once")
		require.True(t, closed(d.Wait()))
		d.Set(time.Now().Add(time.Hour))
		require.False(t, d.Expired(), "moved into the future")
		require.False(t, closed(d.Wait()))
		d.Set(time.Time{})
		require.False(t, d.Expired(), "disarmed")
		require.False(t, closed(d.Wait()))
	}
}

// Zero Set with a Wait racing: run under -race.
func TestConcurrent(t *testing.T) {
	d := New()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			select {
			case <-d.Wait():
			default:
			}
			_ = d.Expired()
		}
	}()
	for i := range 1000 {
		d.Set(time.Now().Add(time.Duration(i%3-1) * time.Microsecond))
	}
	<-done
}

// The first Waits race: each gets the one channel, never a missing one.
func TestFirstWaitsRace(t *testing.T) {
	for range 100 {
		var d Deadline
		d.Set(time.Now().Add(time.Hour))
		chs := make(chan (<-chan struct{}), 4)
		for range 4 {
			go func() { chs <- d.Wait() }()
		}
		first := <-chs
		for range 3 {
			require.Equal(t, first, <-chs)
		}
		d.Set(time.Now().Add(-time.Second))
		require.True(t, closed(first), "the waiters' channel closes at expiry")
	}
}

// A deadline moved later keeps its pending timer, which fires early,
// arms itself once for the rest, and then closes the channel no earlier
// than the last deadline set. One moved earlier arms a timer of its own.
func TestMovedLaterKeepsTimer(t *testing.T) {
	d := New()
	ch := d.Wait()
	d.Set(time.Now().Add(5 * time.Millisecond))
	var last time.Time
	for i := range 100 {
		last = time.Now().Add(20*time.Millisecond + time.Duration(i)*100*time.Microsecond)
		d.Set(last)
	}
	_, armed := pending(d)
	require.Equal(t, uint64(1), armed, "moving the deadline later arms no timer")
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not woken")
	}
	require.False(t, time.Now().Before(last), "closed before the last deadline")
	_, armed = pending(d)
	require.Equal(t, uint64(2), armed, "the early timer armed one for the rest")

	d.Set(time.Now().Add(time.Hour))
	d.Set(time.Now().Add(time.Millisecond))
	_, armed = pending(d)
	require.Equal(t, uint64(4), armed, "moved earlier: a timer of its own")
	select {
	case <-d.Wait():
	case <-time.After(5 * time.Second):
		t.Fatal("the deadline moved earlier did not fire")
	}
	p, _ := pending(d)
	require.False(t, p, "a timer that expired the deadline is done")
}

// BenchmarkSetAfterWait moves a deadline that has been waited on later,
// as a server that sets one per request does.
func BenchmarkSetAfterWait(b *testing.B) {
	d := New()
	d.Wait()
	b.ReportAllocs()
	for b.Loop() {
		d.Set(time.Now().Add(30 * time.Second))
	}
}
