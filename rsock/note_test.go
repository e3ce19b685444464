package rsock

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNoteRemembersOneWakeUp(t *testing.T) {
	var n note
	assert.False(t, receivable(n.C()), "never woken")

	var m note
	m.wake()
	m.wake()
	assert.True(t, receivable(m.C()), "a wake before any wait is remembered")
	assert.False(t, receivable(m.C()), "two wakes before a wait leave one wake-up")

	var k note
	ch := k.C()
	k.wake()
	assert.True(t, receivable(ch), "a wake after C reaches its channel")
	assert.False(t, receivable(ch))
}

// TestNoteLosesNoWakeUp races wakers against a waiter that makes the
// note's channel: each round's waiter must see every count its wakers
// reached, or the test hangs (the deadline fails it).
func TestNoteLosesNoWakeUp(t *testing.T) {
	const rounds, wakers = 2000, 3
	deadline := time.After(time.Minute)
	for range rounds {
		var n note
		var count atomic.Int32
		var wg sync.WaitGroup
		for range wakers {
			wg.Go(func() {
				count.Add(1)
				n.wake()
			})
		}
		for count.Load() < wakers {
			select {
			case <-n.C():
			case <-deadline:
				require.FailNow(t, "a wake-up was lost")
			}
		}
		wg.Wait()
	}
}

// receivable reports whether ch is closed or holds a value.
func receivable(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
