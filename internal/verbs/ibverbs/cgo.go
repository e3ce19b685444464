//go:build cgo && linux

package ibverbs

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// lib is libibverbs, loaded once per process on first use.
var lib struct {
	once sync.Once
	err  error
}

// libName is the library loaded: the soname of libibverbs' ABI 1.
const libName = "libibverbs.so.1"

// Load reports whether libibverbs can be loaded here, and why not.
func Load() error { return load() }

// load opens libibverbs once per process. Its absence makes the provider
// unavailable.
func load() error {
	lib.once.Do(func() { lib.err = loadLib(libName) })
	return lib.err
}

// loadLib dlopens name and resolves the calls rsock makes.
func loadLib(name string) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var buf [512]C.char
	if C.rs_load(cname, &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("%w: ibverbs: cannot load %s: %s", verbs.ErrUnavailable, name, C.GoString(&buf[0]))
	}
	return nil
}

// pollable makes a library's event descriptor readable in the Go
// netpoller: it sets the descriptor non-blocking (so that the library's
// read says EAGAIN when there is nothing; a duplicate shares the open
// file and with it the flag) and returns a duplicate as a file, whose
// RawConn waits for readiness. Closing the file leaves fd to its owner.
func pollable(fd C.int, name string) (*os.File, syscall.RawConn, error) {
	if e := C.rs_set_nonblock(fd); e != 0 {
		return nil, nil, errnoErr(name+" non-blocking", e)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ibverbs: dup %s: %w", name, err)
	}
	// After the flag: os.NewFile puts only a non-blocking descriptor in
	// the netpoller.
	f := os.NewFile(uintptr(dup), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("ibverbs: %s: %w", name, err)
	}
	return f, rc, nil
}

// errnoErr makes an error of an errno value returned by the shim.
func errnoErr(op string, e C.int) error {
	return fmt.Errorf("ibverbs: %s: %w", op, syscall.Errno(e))
}

// Built reports whether this binary can use libibverbs (built with cgo on
// Linux); the library and a device are still looked for at run time.
const Built = true
