package stream

import (
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs/shm"
)

// The same over shm, whose queue tells whether a poll would find anything
// (verbs.Peeker).
func TestLockstepWriterNeedsNoNotificationShm(t *testing.T) {
	testLockstep(t, shm.New())
}
