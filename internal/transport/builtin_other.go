//go:build !linux || rsock_tcponly

package transport

import (
	"fmt"
	"runtime"
)

// Off Linux no accelerated transport is built: shm is made of memfds,
// SCM_RIGHTS, SO_PEERCRED and eventfds, verbs of Linux's libibverbs. rsock
// runs on TCP, and every connection's reason names the platform. The
// rsock_tcponly build tag makes a Linux binary the same, for tests.
var offPlatform = map[string]error{"shm": errNotHere, "verbs": errNotHere}

var errNotHere = fmt.Errorf("not available on %s", platform())

func platform() string {
	if runtime.GOOS == "linux" {
		return "linux, built with rsock_tcponly"
	}
	return runtime.GOOS
}
