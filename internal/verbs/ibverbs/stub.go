//go:build !cgo || !linux

package ibverbs

import (
	"fmt"
	"net/netip"
	"runtime"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Built reports whether this binary can use libibverbs (built with cgo on
// Linux); the library and a device are still looked for at run time.
const Built = false

// Provider is the ibverbs provider. This binary was built without cgo (or
// not for Linux), so it is always unavailable.
type Provider struct{}

// New returns the ibverbs provider.
func New() *Provider { return &Provider{} }

// Name is "ibverbs".
func (*Provider) Name() string { return "ibverbs" }

// Load reports why libibverbs cannot be used by this binary.
func Load() error {
	_, err := (*Provider)(nil).Open(verbs.OpenOptions{})
	return err
}

// LoadCM reports why the connection manager cannot be used by this binary.
func LoadCM() error { return Load() }

// CMDevice reports why the connection manager cannot be used by this binary.
func CMDevice(netip.Addr) (string, error) { return "", Load() }

// CMRejected is 0: this binary rejects no rdma_cm requests.
func CMRejected() uint64 { return 0 }

// Open always fails with an error wrapping verbs.ErrUnavailable.
func (*Provider) Open(verbs.OpenOptions) (verbs.Device, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("%w: ibverbs: not supported on %s", verbs.ErrUnavailable, runtime.GOOS)
	}
	return nil, fmt.Errorf("%w: ibverbs: this binary was built without cgo (CGO_ENABLED=0)", verbs.ErrUnavailable)
}
