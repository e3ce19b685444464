//go:build linux && !rsock_tcponly

package transport

import (
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/shm"
)

// The transports built into every Linux binary. verbs loads libibverbs at
// run time (dlopen): a binary built without cgo, or run on a host without
// libibverbs or an RDMA device, reports verbs unavailable with the reason
// (ConnInfo.Reason) and uses the next transport.
func init() {
	Register("shm", shm.New())
	Register("verbs", ibverbs.New())
}

// offPlatform is empty: Linux has every transport.
var offPlatform map[string]error
