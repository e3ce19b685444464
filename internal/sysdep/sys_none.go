//go:build !unix && !windows

package sysdep

import (
	"errors"
	"fmt"
	"runtime"
)

// errNone is why the calls of this file fail: this platform has no
// socket calls rsock can make on a descriptor (plan9's RawConn reads are
// not implemented; js and wasip1 have no such sockets), so a switching
// connection cannot run here, and rsock serves plain TCP only.
var errNone = fmt.Errorf("rsock: no socket calls on %s: %w", runtime.GOOS, errors.ErrUnsupported)

type readerSys struct{}

func (readerSys) begin() {}

func (r *Reader) readFD(uintptr) bool {
	r.err = errNone
	return true
}

func (r *Reader) peekFD(uintptr) bool {
	r.peekErr = errNone
	return true
}

// ReadinessFD fails: see errNone.
func ReadinessFD(Readiness) (fd int, release func(), err error) { return -1, nil, errNone }
