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

// TestCompletionErrorVendor: a failed completion's error names the
// device's vendor syndrome, in hex, when the device reported one, and
// says nothing of it when it did not.
func TestCompletionErrorVendor(t *testing.T) {
	for _, tc := range []struct {
		c    Completion
		want string
	}{
		{Completion{Op: OpWrite, Status: StatusRetryExceeded}, "verbs: WRITE completed with transport retry exceeded"},
		{Completion{Op: OpWrite, Status: StatusRetryExceeded, Vendor: 0x81}, "verbs: WRITE completed with transport retry exceeded (vendor error 0x81)"},
		{Completion{Op: OpRecv, Status: StatusFlushed, Vendor: 0xf9}, "verbs: RECV completed with flushed (vendor error 0xf9)"},
		{Completion{Op: OpSend, Status: StatusFatal, Vendor: 0xdeadbeef}, "verbs: SEND completed with fatal error (vendor error 0xdeadbeef)"},
	} {
		err := tc.c.Err()
		if assert.Error(t, err) {
			assert.Equal(t, tc.want, err.Error())
			var ce *CompletionError
			if assert.True(t, errors.As(err, &ce)) {
				assert.Equal(t, tc.c.Vendor, ce.Vendor)
			}
		}
	}
	assert.NoError(t, (&Completion{Op: OpSend, Vendor: 0x12}).Err(), "a successful completion is no error")
}
