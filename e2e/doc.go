// Package e2e holds rsock's end-to-end suites: stock net/http (HTTP/1.1,
// h2c, HTTP/2 over TLS) and grpc-go servers and clients whose connections
// come from rsock, and plain clients (a stock http.Client, a grpc-go client
// without rsock's dialer, curl) against rsock servers.
//
// Every suite runs once per transport in the table in transports_test.go
// ("sim", "shm", "verbs", "tcp"); a transport whose provider is not
// registered in the test binary is skipped with the reason. Each suite
// checks with rsock.TransportOf, on both ends, that the transport it is
// named after carried it, so a silent fallback to TCP fails instead of
// passing. RSOCK_E2E_TRANSPORTS=sim,tcp restricts the run to some rows.
//
// The package has no code of its own besides its tests.
package e2e
