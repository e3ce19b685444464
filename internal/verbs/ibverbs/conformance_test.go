//go:build cgo && linux

package ibverbs_test

import (
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

// deviceOptions names the device to test: the Soft-RoCE harness sets
// SOFTROCE_DEV, SOFTROCE_PORT, SOFTROCE_GID_INDEX and SOFTROCE_IP;
// elsewhere RSOCK_DEVICE, RSOCK_PORT, RSOCK_GID_INDEX and
// RSOCK_TEST_VERBS_IP do. With neither, the
// first device's port 1 is tried, which on a host without RDMA devices
// reports the provider unavailable and the suite skips with the reason.
func deviceOptions() verbs.OpenOptions {
	o := verbs.OpenOptions{GIDIndex: -1}
	pick := func(names ...string) string {
		for _, n := range names {
			if v := os.Getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	o.Device = pick("SOFTROCE_DEV", "RSOCK_DEVICE")
	o.Port, _ = strconv.Atoi(pick("SOFTROCE_PORT", "RSOCK_PORT"))
	if o.Port == 0 {
		o.Port = 1
	}
	if g, err := strconv.Atoi(pick("SOFTROCE_GID_INDEX", "RSOCK_GID_INDEX")); err == nil {
		o.GIDIndex = g
	} else {
		o.GIDIndex = 0
	}
	// Both QPs of a pair are on this host: the device's own IP is the
	// local and the remote address (the connection manager, for iWARP,
	// connects by IP).
	// RSOCK_VERBS_CM=1 connects every pair through rdma_cm, on RoCE too.
	o.ConnectionManager, _ = strconv.ParseBool(os.Getenv("RSOCK_VERBS_CM"))
	if ip := net.ParseIP(pick("SOFTROCE_IP", "RSOCK_TEST_VERBS_IP")); ip != nil {
		o.LocalAddr = &net.TCPAddr{IP: ip}
		o.RemoteAddr = &net.TCPAddr{IP: ip}
	}
	return o
}

// TestConformance runs the verbs conformance suite on a real device. Both
// QPs of every pair are on the same device, connected through the GID.
func TestConformance(t *testing.T) {
	verbstest.Run(t, ibverbs.New(), deviceOptions())
}
