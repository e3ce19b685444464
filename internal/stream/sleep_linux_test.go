package stream

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/verbs/shm"
)

// shm's queues sleep in the kernel (verbs.Sleeper); sim's do not.
var shmProv = shm.New()

// awaitCond polls cond until it holds, failing the test after hangGuard.
func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(hangGuard); !cond(); time.Sleep(20 * time.Microsecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, hangGuard)
		}
	}
}

// readAsync reads n bytes from c on a goroutine.
func readAsync(c *Conn, n int) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := io.ReadFull(c, make([]byte, n))
		done <- err
	}()
	return done
}

// A parked Read on shm sleeps in the kernel, and the peer's message wakes
// it there.
func TestSleepingReadWokenByRing(t *testing.T) {
	if len(sleepSlots) == 0 {
		t.Skip("GOMAXPROCS 1: no call sleeps")
	}
	a, b := newPairOn(t, shmProv, eventOnly)
	done := readAsync(a, 5)
	awaitCond(t, "the Read sleeps", a.rd.e.asleep.Load)
	_, err := b.Write([]byte("hello"))
	require.NoError(t, err)
	require.NoError(t, <-done)
}

// A Read that sleeps maxSleep is woken by the reaper and parks, giving its
// slot back; the peer's message then reaches it through the notification.
func TestSleepingReadReaped(t *testing.T) {
	if len(sleepSlots) == 0 {
		t.Skip("GOMAXPROCS 1: no call sleeps")
	}
	a, b := newPairOn(t, shmProv, eventOnly)
	done := readAsync(a, 5)
	awaitCond(t, "the Read sleeps", a.rd.e.asleep.Load)
	awaitCond(t, "the reaper wakes it", func() bool { return !a.rd.e.asleep.Load() && a.rd.e.parked.Load() })
	for i := range sleepSlots {
		require.NotSame(t, &a.rd.e, sleepSlots[i].e.Load(), "a parked Read holds a sleeping slot")
	}
	_, err := b.Write([]byte("hello"))
	require.NoError(t, err)
	require.NoError(t, <-done)
}

// A Read whose deadline is nearer than maxSleep parks at once, and ends
// at its deadline.
func TestReadNearDeadlineDoesNotSleep(t *testing.T) {
	a, _ := newPairOn(t, shmProv, eventOnly)
	a.rd.dl.Set(time.Now().Add(maxSleep / 2))
	slept := false
	withHook(t, &testHookParking, func(c *Conn) {
		for i := range sleepSlots {
			slept = slept || sleepSlots[i].e.Load() == &c.rd.e
		}
	})
	_, err := a.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.False(t, slept)
}
