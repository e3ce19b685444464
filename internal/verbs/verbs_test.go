package verbs

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestPeerFault: a step with the peer that a limit of this host refused is
// not blamed on the peer, and keeps its errno; anything else is the peer's.
func TestPeerFault(t *testing.T) {
	for _, tc := range []struct {
		err   error
		local bool
	}{
		{fmt.Errorf("dup: %w", syscall.EMFILE), true},
		{syscall.ENFILE, true},
		{fmt.Errorf("mmap: %w", syscall.ENOMEM), true},
		{fmt.Errorf("%w: mappings", ErrLocalLimit), true},
		{syscall.ECONNREFUSED, false},
		{errors.New("bad secret"), false},
	} {
		err := PeerFault("shm: a step", tc.err)
		assert.Equal(t, tc.local, LocalLimit(err), "%v", err)
		assert.Equal(t, !tc.local, errors.Is(err, ErrPeerInfo), "%v", err)
		assert.Contains(t, err.Error(), "shm: a step")
		if tc.local {
			assert.ErrorIs(t, err, tc.err)
		}
	}
}
