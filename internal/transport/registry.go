// Package transport maps rsock's transport names to the verbs providers
// built into the binary. Providers register themselves from their own
// packages (or, for the in-process sim provider, from tests), so the rsock
// package never imports cgo or test code.
package transport

import (
	"sync"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

var (
	mu        sync.RWMutex
	providers = map[string]verbs.Provider{}
)

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
