package deadline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

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
	require.Nil(t, d.timer, "no waiter: no timer")
	require.False(t, d.Expired())
	d.Set(time.Now().Add(time.Millisecond))
	require.Nil(t, d.timer)
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
	require.NotNil(t, d.timer, "a waiter arms the timer")
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
	require.Nil(t, d.timer)
	d.Set(time.Now().Add(10 * time.Millisecond))
	require.NotNil(t, d.timer)
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
		require.Nil(t, d.timer)
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
