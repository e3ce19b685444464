package stream

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// At most spinSlots calls spin at once; a slot given back is free again.
func TestSpinSlots(t *testing.T) {
	for range spinSlots {
		if !takeSpinSlot() {
			t.Fatal("a free slot was refused")
		}
	}
	if takeSpinSlot() {
		t.Fatalf("slot %d of %d granted", spinSlots+1, spinSlots)
	}
	spinning.Add(-1)
	if !takeSpinSlot() {
		t.Fatal("a slot given back was refused")
	}
	spinning.Add(-spinSlots)
	if n := spinning.Load(); n != 0 {
		t.Fatalf("%d slots still taken", n)
	}
}

// A call signalled while parked counts as woken until it runs, and no call
// starts spinning meanwhile; of the signal and the call, whichever clears
// parked first counts, so each wake-up is counted once and uncounted once.
func TestWokenHoldsSpinners(t *testing.T) {
	e := new(entry).init(evRead, nil)
	e.parked.Store(true)
	e.signal()
	e.signal() // again before the call ran: counted once
	if n := woken.Load(); n != 1 {
		t.Fatalf("woken %d after a parked call was signalled, want 1", n)
	}
	if takeSpinSlot() {
		t.Fatal("a spinning slot was granted while a woken call waits for a core")
	}
	if e.parked.CompareAndSwap(true, false) { // what the call does when it runs
		t.Fatal("the signal did not clear parked")
	}
	woken.Add(-1)
	if !takeSpinSlot() {
		t.Fatal("a slot was refused once the woken call ran")
	}
	spinning.Add(-1)
	e.parked.Store(true)
	if !e.parked.CompareAndSwap(true, false) { // the call leaves by its deadline
		t.Fatal("parked was cleared without a signal")
	}
	e.signal() // late: the call is not parked, nothing is counted
	if n := woken.Load(); n != 0 {
		t.Fatalf("woken %d after a signal to a call that left by itself, want 0", n)
	}
}

// However calls end (woken, by a deadline, by Close), the count of woken
// calls comes back to zero: a leak would stop busy-polling for good.
func TestWokenBalances(t *testing.T) {
	opts := eventOnly
	opts.BusyPoll = 20 * time.Microsecond
	var wg sync.WaitGroup
	for range 8 {
		a, b := newPair(t, opts)
		wg.Go(func() {
			echo := make(chan struct{})
			go func() {
				defer close(echo)
				buf := make([]byte, 64)
				for range 200 {
					if _, err := b.Read(buf); err != nil {
						t.Error(err)
						return
					}
					if _, err := b.Write(buf[:1]); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			buf := make([]byte, 64)
			for range 200 {
				if _, err := a.Write(buf); err != nil {
					t.Error(err)
					break
				}
				if _, err := a.Read(buf[:1]); err != nil {
					t.Error(err)
					break
				}
			}
			<-echo
			_ = b.SetReadDeadline(time.Now().Add(time.Millisecond))
			if _, err := b.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("Read past its deadline: %v", err)
			}
			done := make(chan error, 1)
			go func() { _, err := a.Read(buf); done <- err }()
			_ = b.Close(-1)
			if err := <-done; err == nil {
				t.Error("Read across the peer's Close returned no error")
			}
			_ = a.Close(-1)
		})
	}
	wg.Wait()
	if n := woken.Load(); n != 0 {
		t.Fatalf("woken %d once every call returned, want 0", n)
	}
}

// The open window is spinPerPark parks, bounded by BusyPoll, and 0 with
// busy-polling off; the park cost follows its samples, up and down, and
// one huge sample (a descheduled process) moves it by at most
// maxParkSample/8.
func TestSpinWindow(t *testing.T) {
	defer parkCost.Store(parkCost.Load())
	const us = int64(time.Microsecond)

	parkCost.Store(10 * us)
	if w := spinWindow(0); w != 0 {
		t.Fatalf("busy-poll off: window %v", w)
	}
	if w := spinWindow(-1); w != 0 {
		t.Fatalf("busy-poll negative: window %v", w)
	}
	if w, want := spinWindow(time.Second), time.Duration(spinPerPark*10*us); w != want {
		t.Fatalf("window %v at a park cost of 10us, want %v", w, want)
	}
	if w := spinWindow(15 * time.Microsecond); w != 15*time.Microsecond {
		t.Fatalf("window %v, want BusyPoll's bound 15us", w)
	}

	for range 100 {
		recordWake(30 * us)
	}
	if c := parkCost.Load(); c < 29*us || c > 30*us {
		t.Fatalf("park cost %v after 100 samples of 30us", time.Duration(c))
	}
	for range 100 {
		recordWake(2 * us)
	}
	if c := parkCost.Load(); c < 2*us || c > 3*us {
		t.Fatalf("park cost %v after 100 samples of 2us: it does not come down", time.Duration(c))
	}
	before := parkCost.Load()
	recordWake(int64(time.Hour))
	if c := parkCost.Load(); c-before > maxParkSample/8 {
		t.Fatalf("one sample of an hour moved the park cost from %v to %v", time.Duration(before), time.Duration(c))
	}
	recordWake(-5 * us) // a clock that went back counts as 0
	if c := parkCost.Load(); c < 0 {
		t.Fatalf("park cost %v", time.Duration(c))
	}
}

// A parked call that is signalled leaves the time of its signal for
// parkCost; a signal to a call that is not parked leaves none.
func TestParkCostSampled(t *testing.T) {
	e := new(entry).init(evRead, nil)
	e.parked.Store(true)
	e.signal()
	if e.sigAt.Load() == 0 {
		t.Fatal("the signal of a parked call left no time")
	}
	woken.Add(-1) // what the call does when it runs
	e.sigAt.Store(0)
	e.signal() // not parked
	if e.sigAt.Load() != 0 {
		t.Fatal("a signal to a call that was not parked left a time")
	}
	drain(e.ch)
}

// A ping-pong whose calls park (busy-polling off) feeds parkCost: the
// waiter's wake-ups are measured.
func TestParkCostFromWaits(t *testing.T) {
	defer parkCost.Store(parkCost.Load())
	parkCost.Store(0)
	a, b := newPair(t, eventOnly)
	defer a.Close(-1)
	defer b.Close(-1)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 8)
		for range 50 {
			if _, err := b.Read(buf); err != nil {
				done <- err
				return
			}
			if _, err := b.Write(buf[:1]); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	buf := make([]byte, 8)
	for range 50 {
		if _, err := a.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Read(buf[:1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if parkCost.Load() == 0 {
		t.Fatal("50 round trips of parked calls left no sample of a wake-up")
	}
}

// A spinner hands its P to a goroutine of its process that waits for one,
// and spins on: with one P, this goroutine, runnable again at each turn,
// runs while a Read spins (its window 10 s here), and the Read ends by a
// poll, not a wake-up. Without the hand-on this goroutine would run only
// when the runtime preempted the spinner, and the hook would never fire.
func TestSpinnerHandsOnItsP(t *testing.T) {
	if !canSpin {
		t.Skip("this runtime does not count runnable goroutines (Go 1.26)")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer SetParkCost(10 * time.Second)()
	opts := eventOnly
	opts.BusyPoll = 10 * time.Second
	a, b := newPair(t, opts)
	var yielded, parked atomic.Bool
	withHook(t, &testHookYield, func(c *Conn) {
		if c == b {
			yielded.Store(true)
		}
	})
	withHook(t, &testHookParking, func(c *Conn) {
		if c == b {
			parked.Store(true)
		}
	})
	read := make(chan error, 1)
	go func() {
		_, err := b.Read(make([]byte, 1))
		read <- err
	}()
	for end := time.Now().Add(5 * time.Second); !yielded.Load(); {
		if time.Now().After(end) {
			t.Fatal("a spinning Read kept its P from a goroutine that waited for it")
		}
		runtime.Gosched()
	}
	_, err := a.Write([]byte{1})
	require.NoError(t, err)
	require.NoError(t, <-read)
	require.False(t, parked.Load(), "the Read parked")
	require.Equal(t, uint64(1), b.Stats().SpinHits.Load())
}
