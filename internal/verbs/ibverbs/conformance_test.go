package ibverbs_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

// deviceOptions names the device to test: the Soft-RoCE harness sets
// SOFTROCE_DEV, SOFTROCE_PORT and SOFTROCE_GID_INDEX; elsewhere
// RSOCK_DEVICE, RSOCK_PORT and RSOCK_GID_INDEX do. With neither, the
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
	return o
}

// TestConformance runs the verbs conformance suite on a real device. Both
// QPs of every pair are on the same device, connected through the GID.
func TestConformance(t *testing.T) {
	verbstest.Run(t, ibverbs.New(), deviceOptions())
}
