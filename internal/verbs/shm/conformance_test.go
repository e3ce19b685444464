//go:build linux

package shm_test

import (
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/shm"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

// TestConformance runs the verbs conformance suite. Both devices of every
// pair live in this process, but they still exchange file descriptors over
// the rendezvous socket and share memory only through memfd mappings.
func TestConformance(t *testing.T) {
	verbstest.Run(t, shm.New(), verbs.OpenOptions{GIDIndex: -1})
}
