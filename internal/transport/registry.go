// Package transport maps rsock's transport names to the verbs providers
// built into the binary. It registers the providers of this platform
// itself (shm and verbs on Linux: builtin_linux.go); tests register the
// in-process sim provider. The rsock package imports no provider.
package transport

import (
	"errors"
	"sync"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

var (
	mu        sync.RWMutex
	providers = map[string]verbs.Provider{}
)

// errNotBuiltIn is Absent's answer for a transport of this platform that
// is not registered (sim, outside tests).
var errNotBuiltIn = errors.New("not built into this binary")

// Register makes p available under name ("verbs", "shm" or "sim"),
// replacing any earlier registration.
func Register(name string, p verbs.Provider) {
	mu.Lock()
	defer mu.Unlock()
	providers[name] = p
}

// Unregister removes the provider registered under name.
func Unregister(name string) {
	mu.Lock()
	defer mu.Unlock()
	delete(providers, name)
}

// Lookup returns the provider registered under name.
func Lookup(name string) (verbs.Provider, bool) {
	mu.RLock()
	defer mu.RUnlock()
	p, ok := providers[name]
	return p, ok
}

// Absent says why no provider is registered under name: one this
// platform does not have (shm and verbs off Linux: "not available on
// darwin"), or one not built into this binary.
func Absent(name string) error {
	if err := offPlatform[name]; err != nil {
		return err
	}
	return errNotBuiltIn
}
