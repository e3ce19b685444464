package rsock

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNoteRemembersOneWakeUp(t *testing.T) {
	n := newNote()
	assert.False(t, receivable(n), "never woken")
	n.wake()
	n.wake()
	assert.True(t, receivable(n), "a wake before any wait is remembered")
	assert.False(t, receivable(n), "two wakes before a wait leave one wake-up")
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
