// Package clients runs clients and servers written by others, unmodified,
// over rsock: go-redis against a tidwall/redcon server, fasthttp's client
// against a fasthttp server, and hashicorp/yamux sessions multiplexing
// streams both ways over one connection, each on shm at the default policy
// (connections upgrade while in use) and over the TCP fallback. Each check
// compares the bytes exactly and fails, rather than hangs, when a call
// does not return.
//
// It is a module of its own so that these libraries never enter the
// builds of rsock's users.
package clients
