//go:build cgo && linux

package ibverbs

import (
	"errors"
	"strings"
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// TestLoadMissingLibrary: a host without libibverbs makes the provider
// unavailable, with the loader's reason, and nothing crashes.
func TestLoadMissingLibrary(t *testing.T) {
	err := loadLib("libibverbs-rsock-test-missing.so.1")
	if !errors.Is(err, verbs.ErrUnavailable) {
		t.Fatalf("loading a missing library: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "libibverbs-rsock-test-missing.so.1") {
		t.Errorf("the reason does not name the library: %v", err)
	}
	t.Logf("reason: %v", err)
}

// TestLoadLibraryWithoutVerbs: a library that loads but is not libibverbs
// (libc has none of its symbols) is refused by name of the missing symbol.
func TestLoadLibraryWithoutVerbs(t *testing.T) {
	err := loadLib("libc.so.6")
	if !errors.Is(err, verbs.ErrUnavailable) || !strings.Contains(err.Error(), "ibv_get_device_list") {
		t.Fatalf("loading libc as libibverbs: %v, want ErrUnavailable naming ibv_get_device_list", err)
	}
}

// TestLoadConnectionManager: without librdmacm (or with a library that is
// not it), the connection manager is unavailable with the reason; iWARP
// devices are then declined, and nothing else changes.
func TestLoadConnectionManager(t *testing.T) {
	err := loadCMLib("librdmacm-rsock-test-missing.so.1")
	if !errors.Is(err, verbs.ErrUnavailable) || !strings.Contains(err.Error(), "librdmacm-rsock-test-missing.so.1") {
		t.Fatalf("loading a missing library: %v, want ErrUnavailable naming it", err)
	}
	err = loadCMLib("libc.so.6")
	if !errors.Is(err, verbs.ErrUnavailable) || !strings.Contains(err.Error(), "rdma_create_event_channel") {
		t.Fatalf("loading libc as librdmacm: %v, want ErrUnavailable naming rdma_create_event_channel", err)
	}
	t.Logf("reason: %v", err)
}
