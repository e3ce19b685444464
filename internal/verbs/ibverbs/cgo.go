//go:build cgo && linux

package ibverbs

/*
#cgo LDFLAGS: -ldl
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// lib is libibverbs, loaded once per process on first use.
var lib struct {
	once sync.Once
	err  error
}

// load opens libibverbs.so.1. Its absence makes the provider unavailable.
func load() error {
	lib.once.Do(func() {
		var buf [512]C.char
		if C.rs_load(&buf[0], C.size_t(len(buf))) != 0 {
			lib.err = fmt.Errorf("%w: ibverbs: cannot load libibverbs: %s", verbs.ErrUnavailable, C.GoString(&buf[0]))
		}
	})
	return lib.err
}

// errnoErr makes an error of an errno value returned by the shim.
func errnoErr(op string, e C.int) error {
	return fmt.Errorf("ibverbs: %s: %w", op, syscall.Errno(e))
}

// Built reports whether this binary can use libibverbs (built with cgo on
// Linux); the library and a device are still looked for at run time.
const Built = true
