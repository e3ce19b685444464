package rsock

import (
	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs/shm"
)

// The transports built into every Linux binary. (verbs registers from its
// own file, where cgo is allowed.)
func init() {
	transport.Register("shm", shm.New())
}
