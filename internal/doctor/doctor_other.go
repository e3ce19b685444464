//go:build !linux

package doctor

import (
	"fmt"
	"io"
	"runtime"

	"github.com/rdmanet/rdmanet/internal/transport"
)

// platform reports that this platform has no accelerated transport, and
// checks that rsock runs here on TCP by a connection to this process.
func platform(w io.Writer, o Options) {
	fmt.Fprintf(w, "\ntransports on %s\n", runtime.GOOS)
	for _, name := range []string{"verbs", "shm"} {
		fmt.Fprintf(w, "  %s: %v\n", name, transport.Absent(name))
	}
	fmt.Fprintln(w, "  tcp: rsock runs on TCP here; each connection's ConnInfo.Reason says why")
	fmt.Fprintln(w, "\nself-test (a connection to this process)")
	selfTest(w, "", "127.0.0.1", o.Timeout)
}
