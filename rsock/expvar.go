package rsock

import (
	"expvar"
	"sync"
)

var publishOnce sync.Once

// PublishExpvar publishes the process's totals (Totals) as the expvar
// variable "rsock", served with the others at /debug/vars by the expvar
// package's handler. Calling it again does nothing.
func PublishExpvar() {
	publishOnce.Do(func() {
		expvar.Publish("rsock", expvar.Func(func() any { return Totals() }))
	})
}
