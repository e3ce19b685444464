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
// Every row but verbs listens on 127.0.0.1. No RDMA port serves loopback:
// the verbs row listens on, and dials, the IP address of the netdev under
// an RDMA device, RSOCK_TEST_VERBS_IP or else SOFTROCE_IP (which the
// Soft-RoCE guest of test/softroce sets: 10.0.0.1). Without either, or if
// no RDMA device serves that address, the verbs row is skipped with the
// reason. In the guest:
//
//	RSOCK_E2E_TRANSPORTS=verbs e2e.test -test.skip '^TestCurl'
//
// The guest has no curl and no go tool, which TestCurl and
// TestCurlAgainstExampleServer need (without curl they skip themselves
// too).
//
// RSOCK_E2E_SCALE=full|small sets the sizes and counts of the suites:
// full (64 MiB HTTP/1.1 transfers, 200 concurrent HTTP/1.1 clients, 500
// concurrent HTTP/2 streams, 1,000 concurrent RPCs, ...) on a host, small
// (4 MiB, 20 clients, 50 streams, 100 RPCs, ...) by default where
// SOFTROCE_IP is set: the guest runs under QEMU without KVM, 20 to 50
// times slower than the host. The small scale keeps every test and every
// assertion, and what each test is about (a transfer much larger than a
// ring, many connections or streams busy at once, a gRPC message above
// the default 4 MiB limit); only the volume shrinks.
//
// The package has no code of its own besides its tests.
package e2e
