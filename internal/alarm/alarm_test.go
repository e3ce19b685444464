package alarm

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestAlarms: every alarm not stopped fires once, no sooner than its
// delay; stopped ones never fire; the clock serves alarms set after it
// went idle, and alarms of different delays side by side.
func TestAlarms(t *testing.T) {
	c := New(time.Millisecond)
	for round := range 3 {
		var mu sync.Mutex
		fired := map[int]int{}
		var wg sync.WaitGroup
		var alarms []*Alarm
		for i := range 50 {
			if i%2 == 0 {
				wg.Add(1)
			}
			d := time.Duration(1+i%3) * time.Millisecond
			set := time.Now()
			alarms = append(alarms, c.Set(d, func() {
				mu.Lock()
				defer mu.Unlock()
				fired[i]++
				assert.GreaterOrEqual(t, time.Since(set), d, "alarm %d fired early", i)
				if i%2 == 0 {
					wg.Done()
				}
			}))
		}
		for i, a := range alarms {
			if i%2 == 1 {
				require.True(t, a.Stop(), "round %d: alarm %d", round, i)
			}
		}
		all := make(chan struct{})
		go func() { wg.Wait(); close(all) }()
		wait(t, all)
		// One more alarm, due after all of them: once it has fired, a
		// stopped one that fired would have been counted.
		last := make(chan struct{})
		c.Set(5*time.Millisecond, func() { close(last) })
		wait(t, last)
		mu.Lock()
		for i := range 50 {
			assert.Equal(t, 1-i%2, fired[i], "round %d: alarm %d", round, i)
		}
		mu.Unlock()
		for i, a := range alarms {
			assert.False(t, a.Stop(), "alarm %d: fired or stopped already", i)
		}
		c.mu.Lock()
		assert.True(t, c.next.IsZero(), "round %d: a clock with no alarms ticks on", round)
		assert.Empty(t, c.alarms)
		c.mu.Unlock()
	}
}

// TestAlarmSooner: an alarm due before the one the clock waits for fires
// on time, not after it.
func TestAlarmSooner(t *testing.T) {
	c := New(time.Millisecond)
	late := c.Set(time.Hour, func() { t.Error("an alarm an hour away fired") })
	defer late.Stop()
	done := make(chan struct{})
	c.Set(time.Millisecond, func() { close(done) })
	wait(t, done)
}

// TestAlarmNeverLater: an alarm set while the clock waits for an earlier
// one never moves the clock's run later, whatever its delay.
func TestAlarmNeverLater(t *testing.T) {
	c := New(time.Hour)
	first := c.Set(time.Hour, func() {})
	defer first.Stop()
	c.mu.Lock()
	next := c.next
	c.mu.Unlock()
	second := c.Set(2*time.Hour, func() {})
	defer second.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.Equal(t, next, c.next)
}

// TestAlarmPeriod: the timer runs at most once a period: after a run, an
// alarm due sooner than a period later waits for the period's end (or a
// Set), and the timer is not touched for it.
func TestAlarmPeriod(t *testing.T) {
	c := New(time.Hour)
	ran := make(chan struct{})
	c.Set(time.Millisecond, func() { close(ran) }) // the clock is idle: its timer runs on time
	wait(t, ran)
	a := c.Set(time.Nanosecond, func() { t.Error("an alarm fired before the period's end with no Set after it") })
	defer a.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.Equal(t, c.ran.Add(time.Hour), c.next, "the timer runs a period after its last run")
}

// TestAlarmFiredBySet: an alarm due while the timer waits for its period
// fires at the next Set, without the timer.
func TestAlarmFiredBySet(t *testing.T) {
	c := New(time.Hour)
	ran := make(chan struct{})
	c.Set(time.Millisecond, func() { close(ran) })
	wait(t, ran) // the timer has run: it runs again only in an hour
	fired := make(chan struct{})
	c.Set(time.Millisecond, func() { close(fired) })
	// The alarm read the clock before set: it is due by set+1ms.
	set := time.Now()
	for time.Since(set) < time.Millisecond {
		runtime.Gosched()
	}
	later := c.Set(time.Hour, func() {})
	defer later.Stop()
	wait(t, fired)
}

// TestAlarmBlocked: a callback that blocks delays no other alarm, even one
// due at the same time.
func TestAlarmBlocked(t *testing.T) {
	c := New(time.Millisecond)
	release := make(chan struct{})
	defer close(release)
	c.Set(time.Millisecond, func() { <-release })
	done := make(chan struct{})
	c.Set(time.Millisecond, func() { close(done) })
	wait(t, done)
}

// TestAlarmSetFromCallback: a callback may set the next alarm (the clock's
// lock is not held while callbacks run).
func TestAlarmSetFromCallback(t *testing.T) {
	c := New(time.Millisecond)
	done := make(chan struct{})
	c.Set(time.Millisecond, func() {
		c.Set(time.Millisecond, func() { close(done) })
	})
	wait(t, done)
}

func wait(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("alarms due long ago have not fired")
	}
}

// TestStoppedAlarmsDoNotPileUp: alarms set far ahead and stopped, as a
// connection's first step is when it closes early, leave no lasting trace
// while the clock waits for a live one: the list stays near the live
// alarms' count, and a live alarm among them still fires.
func TestStoppedAlarmsDoNotPileUp(t *testing.T) {
	c := New(time.Millisecond)
	far := c.Set(time.Hour, func() { t.Error("an alarm an hour away fired") })
	for range 100_000 { // the clock does not run meanwhile: it waits for far
		c.Set(time.Hour, func() {}).Stop()
	}
	c.mu.Lock()
	n := len(c.alarms)
	c.mu.Unlock()
	assert.LessOrEqual(t, n, 2*sweepAt, "alarms held after 100,000 were stopped")
	fired := make(chan struct{})
	c.Set(time.Millisecond, func() { close(fired) })
	wait(t, fired)
	assert.True(t, far.Stop(), "the live alarm an hour away was dropped")
}
