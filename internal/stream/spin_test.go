package stream

import (
	"testing"
	"time"
)

// The adaptive window as a state machine: no clocks, the durations are
// given.
func TestSpinCtl(t *testing.T) {
	const max = 10 * time.Microsecond
	const us = time.Microsecond

	// waits runs n waits: a spinning wait takes spinTook, a parked one
	// parkTook. It returns how many spun.
	waits := func(s *spinCtl, n int, spinTook, parkTook time.Duration) (spun int) {
		for range n {
			if w := s.window(max); w > 0 {
				spun++
				s.record(w, spinTook, max)
			} else {
				s.record(0, parkTook, max)
			}
		}
		return spun
	}

	t.Run("Off", func(t *testing.T) {
		var s spinCtl
		if w := s.window(0); w != 0 {
			t.Fatalf("busy-poll off: window %v", w)
		}
	})

	t.Run("PingPong", func(t *testing.T) {
		// Answers within the window: every wait spins.
		var s spinCtl
		if got := waits(&s, 1000, 3*us, 10*us); got != 1000 {
			t.Fatalf("spun %d of 1000 waits", got)
		}
		// A peer that parks answers a little after the window: no miss.
		if got := waits(&s, 1000, missSlack*max, missSlack*max); got != 1000 {
			t.Fatalf("near misses: spun %d of 1000 waits", got)
		}
		// One long wait (a hiccup) does not close it.
		s.record(max, time.Millisecond, max)
		if got := waits(&s, 100, 3*us, 10*us); got != 100 {
			t.Fatalf("after one miss: spun %d of 100 waits", got)
		}
	})

	t.Run("Misses", func(t *testing.T) {
		// Answers after 1 ms: spinLimit misses close the window, then only
		// the probes spin, their gap doubling from firstProbe to
		// probeEvery as they miss.
		var s spinCtl
		if got := waits(&s, spinLimit, time.Millisecond, time.Millisecond); got != spinLimit {
			t.Fatalf("spun %d of the first %d waits", got, spinLimit)
		}
		for gap := firstProbe; gap < probeEvery; gap *= 2 {
			if got := waits(&s, gap, time.Millisecond, time.Millisecond); got != 1 {
				t.Fatalf("spun %d of %d waits with a probe gap of %d, want 1", got, gap, gap)
			}
		}
		if got := waits(&s, 10*probeEvery, time.Millisecond, time.Millisecond); got != 10 {
			t.Fatalf("spun %d of %d waits, want only the %d probes", got, 10*probeEvery, 10)
		}
		// A probe that hits reopens it.
		probed := false
		for range probeEvery {
			if s.window(max) == max {
				probed = true
				break
			}
			s.record(0, time.Millisecond, max)
		}
		if !probed {
			t.Fatalf("no probe in %d waits", probeEvery)
		}
		s.record(max, 3*us, max)
		if got := waits(&s, 100, 3*us, 10*us); got != 100 {
			t.Fatalf("after a probe hit: spun %d of 100 waits", got)
		}
	})
}

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
