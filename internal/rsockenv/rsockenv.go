// Package rsockenv is the process's RSOCK_* environment variables, read
// once: at the first Get, or at Reload. Resolving a Config so costs no
// environment lookups per Dial, and every Dial and Listen of a process
// sees the same values, as the runtime's GOGC and GOMAXPROCS are read
// once. A later change to the environment (os.Setenv) is seen only after
// Reload.
package rsockenv

import (
	"os"
	"slices"
	"strings"
	"sync/atomic"
)

// prefix starts the name of every variable the package keeps.
const prefix = "RSOCK_"

// Vars is one reading of the variables.
type Vars struct {
	m map[string]string
}

var current atomic.Pointer[Vars]

// Load returns the variables as read at the first Load or Get, or at the
// last Reload. Two Loads return the same *Vars until a Reload.
func Load() *Vars {
	if v := current.Load(); v != nil {
		return v
	}
	v := read()
	if current.CompareAndSwap(nil, v) {
		return v
	}
	return current.Load()
}

// Get returns the value of the variable name ("" if unset), from Load.
func Get(name string) string { return Load().Get(name) }

// Get returns the value of the variable name in v ("" if unset).
func (v *Vars) Get(name string) string { return v.m[name] }

// Environ returns v's variables as "NAME=value", sorted by name.
func (v *Vars) Environ() []string {
	out := make([]string, 0, len(v.m))
	for k, val := range v.m {
		out = append(out, k+"="+val)
	}
	slices.Sort(out)
	return out
}

// Reload reads the environment again, for Loads from now on.
func Reload() { current.Store(read()) }

func read() *Vars {
	v := &Vars{m: map[string]string{}}
	for _, kv := range os.Environ() {
		if k, val, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, prefix) {
			v.m[k] = val
		}
	}
	return v
}

// TB is what Setenv needs of a *testing.T or *testing.B.
type TB interface {
	Setenv(key, value string)
	Cleanup(func())
}

// Setenv sets the variable name for the rest of the test t (t.Setenv)
// and reloads, and reloads again once t has restored it: a test's way to
// change what rsock reads from the environment.
func Setenv(t TB, name, value string) {
	t.Cleanup(Reload) // runs after t.Setenv's own cleanup restores the value
	t.Setenv(name, value)
	Reload()
}
