package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
	"github.com/rdmanet/rdmanet/rsock"
)

// transportCase is one transport the suites run on.
type transportCase struct {
	// name is the transport: what rsock.TransportOf must report on both
	// ends of every connection of the suite.
	name string
	// provider is the name the transport's verbs provider registers under
	// in internal/transport; "" for tcp, which needs none.
	provider string
	// host is the IP address the row's servers listen on and its clients
	// dial: loopback, or verbsHost for verbs.
	host string
}

// loopback is where every row but verbs listens, and where the tests that
// are not per transport listen.
const loopback = "127.0.0.1"

// verbsHost is the address of a netdev under an RDMA device, which the
// verbs row needs (no RDMA port serves 127.0.0.1): RSOCK_TEST_VERBS_IP,
// else SOFTROCE_IP, which the Soft-RoCE guest (test/softroce) sets; "" if
// neither is set. rsock's own verbs tests (verbsIP in rsock/verbs_test.go)
// read the same variables.
func verbsHost() string {
	if ip := os.Getenv("RSOCK_TEST_VERBS_IP"); ip != "" {
		return ip
	}
	return os.Getenv("SOFTROCE_IP")
}

// transportCases is every transport the suites know. To add one, register
// its provider in TestMain (or import the package that registers it) and
// add a row; a row whose provider is not registered is skipped.
var transportCases = []transportCase{
	{name: "sim", provider: "sim", host: loopback},
	{name: "shm", provider: "shm", host: loopback},
	{name: "verbs", provider: "verbs", host: verbsHost()},
	{name: "tcp", host: loopback},
}

func TestMain(m *testing.M) {
	// The in-process provider is test-only: it registers here, not in
	// the library. shm and verbs are registered by the library
	// itself (internal/transport/builtin_linux.go).
	transport.Register("sim", sim.New())
	if _, err := smallScale(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(2)
	}
	// Before counting goroutines: the ibverbs provider keeps the device
	// context it opens, and the goroutine reading its events, for the
	// life of the process, so they belong to the baseline.
	verbsReason = verbsUnavailable()
	base := runtime.NumGoroutine()
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	if code == 0 && !goroutinesSettle(base) {
		code = 1
	}
	os.Exit(code)
}

// goroutinesSettle waits (up to the hang guard) for the goroutines to
// return to base, the count before the tests. Every server, listener,
// client and connection the suites made is closed by then, so goroutines
// left over are leaks (in rsock or in the suites); it prints them.
func goroutinesSettle(base int) bool {
	deadline := time.Now().Add(hangGuard)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "e2e: %d goroutines left after the tests, %d before:\n", runtime.NumGoroutine(), base)
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// config allows the transport and TCP fallback, in that order, as a
// deployment would: a transport that fails to connect falls back, and the
// TransportOf checks turn that into a failure.
//
// SniffTimeout and ProbeTimeout, rsock's two timing heuristics, are raised
// from 200ms and 1s to generous bounds: under -race on a loaded two-core
// machine, hundreds of simultaneous handshakes starve goroutines for longer
// than that, and a late hello then falls back to TCP (and poisons the
// dialer's probe cache; see TestSlowHelloDoesNotPoisonProbeCache). Every
// plain client in the suites speaks first, so nothing waits for these.
// HandshakeTimeout is raised from 5s to the dialer's own timeout: in the
// Soft-RoCE guest (QEMU without KVM, -race, on a shared host) a verbs
// handshake allocates and registers its rings and connects queue pairs,
// and the 20 simultaneous ones of TestHTTP1ConcurrentClients share two
// emulated CPUs: they take 6 to 16s in all, depending on the host's load,
// and none of them is done after 5s.
func (tc transportCase) config() *rsock.Config {
	cfg := &rsock.Config{
		Transports:       []string{tc.name, "tcp"},
		SniffTimeout:     hangGuard / 4,
		ProbeTimeout:     hangGuard / 4,
		HandshakeTimeout: dialTimeout,
	}
	if tc.name == "tcp" {
		cfg.Transports = []string{"tcp"}
	}
	return cfg
}

// selected reports whether RSOCK_E2E_TRANSPORTS, if set, names the
// transport.
func selected(name string) bool {
	only := os.Getenv("RSOCK_E2E_TRANSPORTS")
	return only == "" || slices.Contains(strings.Split(only, ","), name)
}

// unavailable says why the transport cannot run here, or "".
func (tc transportCase) unavailable() string {
	if !selected(tc.name) {
		return "not in RSOCK_E2E_TRANSPORTS=" + os.Getenv("RSOCK_E2E_TRANSPORTS")
	}
	if tc.provider == "" {
		return ""
	}
	if _, ok := transport.Lookup(tc.provider); !ok {
		return fmt.Sprintf("no %q provider is registered in this test binary (not built in yet)", tc.provider)
	}
	if tc.name == "verbs" {
		return verbsReason
	}
	return ""
}

// verbsReason is why the verbs row cannot run here, or "": TestMain
// checks once with verbsUnavailable.
var verbsReason string

// verbsUnavailable says why verbs cannot run on the verbs row's host, or
// "": without an RDMA address, or where no RDMA device serves it, the row
// would only fall back to TCP and fail its transport checks. It opens the
// device with the provider rsock registered (ibverbs), as rsock will, and
// only if the row is selected and that provider is registered (if not,
// unavailable says so).
func verbsUnavailable() string {
	p, ok := transport.Lookup("verbs")
	if !ok || !selected("verbs") {
		return ""
	}
	host := verbsHost()
	if host == "" {
		return "no RDMA address: set RSOCK_TEST_VERBS_IP; make test runs the verbs rows in the Soft-RoCE VM"
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return fmt.Sprintf("the RDMA address %q is not an IP address", host)
	}
	d, err := p.Open(verbs.OpenOptions{LocalAddr: &net.TCPAddr{IP: ip}, GIDIndex: -1})
	if err != nil {
		return fmt.Sprintf("verbs unavailable for %s: %v", host, err)
	}
	d.Close()
	return ""
}

// forEachTransport runs fn as a subtest per available transport.
func forEachTransport(t *testing.T, fn func(t *testing.T, tc transportCase)) {
	t.Helper()
	for _, tc := range transportCases {
		t.Run(tc.name, func(t *testing.T) {
			if why := tc.unavailable(); why != "" {
				if tc.name == "verbs" && selected("verbs") {
					verbstest.Unavailable(t, why) // a failure where RSOCK_REQUIRE_VERBS is set
				}
				t.Skip(why)
			}
			fn(t, tc)
		})
	}
}

// checkTransport returns an error unless rsock says c (or the conn it
// wraps) runs over want once its transport has settled (rsock.Settled:
// a connection on the switching protocol starts on TCP and upgrades by
// its policy).
func checkTransport(c net.Conn, want string) error {
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	got, err := rsock.WaitSettled(ctx, c)
	if err != nil {
		info, _ := rsock.InfoOf(c)
		return fmt.Errorf("connection %s -> %s: the transport did not settle within %v (on %q, reason %q)", c.LocalAddr(), c.RemoteAddr(), settleTimeout, info.Transport, info.Reason)
	}
	if got == want {
		return nil
	}
	info, _ := rsock.InfoOf(c)
	return fmt.Errorf("connection %s -> %s runs over %q (reason %q), want %q", c.LocalAddr(), c.RemoteAddr(), got, info.Reason, want)
}

// settleTimeout bounds the wait for a connection's upgrade.
const settleTimeout = time.Minute

// listen returns an rsock listener for the transport on a free port of
// its host, closed at the end of the test.
func (tc transportCase) listen(t testing.TB) net.Listener {
	t.Helper()
	return tc.listenAt(t, net.JoinHostPort(tc.host, "0"))
}

// tryListen returns an rsock listener of the transport at addr.
func (tc transportCase) tryListen(addr string) (net.Listener, error) {
	lc := &rsock.ListenConfig{Config: tc.config()}
	return lc.Listen(context.Background(), "tcp", addr)
}

func (tc transportCase) listenAt(t testing.TB, addr string) net.Listener {
	t.Helper()
	ln, err := tc.tryListen(addr)
	if err != nil {
		t.Fatalf("rsock listen %s: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dial dials addr with rsock and fails unless the connection runs over
// the transport.
func (tc transportCase) dial(ctx context.Context, addr string) (net.Conn, error) {
	d := &rsock.Dialer{Timeout: dialTimeout, Config: tc.config()}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := checkTransport(c, tc.name); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// smallScale reports whether the suites run at the small scale, from
// RSOCK_E2E_SCALE: "full" (the default) or "small" (the default where
// SOFTROCE_IP is set: in the Soft-RoCE guest, which QEMU emulates without
// KVM, everything runs some 20 to 50 times slower than on the host).
func smallScale() (bool, error) {
	switch v := os.Getenv("RSOCK_E2E_SCALE"); v {
	case "full":
		return false, nil
	case "small":
		return true, nil
	case "":
		return os.Getenv("SOFTROCE_IP") != "", nil
	default:
		return false, fmt.Errorf("RSOCK_E2E_SCALE=%q: want full or small", v)
	}
}

// scaled is full, or small at the small scale. The small sizes and counts
// keep each test's meaning (a transfer of many ring buffers, many
// connections or streams open at once, a message above gRPC's default
// limit) and every assertion; only the volume shrinks.
func scaled[T ~int | ~int64](full, small T) T {
	if s, _ := smallScale(); s {
		return small
	}
	return full
}

// hangGuard bounds how long a test waits for anything: a generous limit
// that only a hang reaches.
const hangGuard = 60 * time.Second

// dialTimeout bounds an rsock dial, handshake included.
const dialTimeout = hangGuard / 2

// testContext is a context that ends at the hang guard or the end of the
// test.
func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*hangGuard)
	t.Cleanup(cancel)
	return ctx
}

// waitFor waits for ch to be closed or to yield, failing the test after the
// hang guard.
func waitFor[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangGuard):
		t.Fatalf("hang guard: %s did not happen within %v", what, hangGuard)
		panic("unreachable")
	}
}

// waitTimeout is a channel that fires after the hang guard.
func waitTimeout() <-chan time.Time { return time.After(hangGuard) }

// TestTransportCheckCatchesFallback proves the suites' transport checks
// bite: a client that wants an accelerated transport from a server that
// only allows TCP falls back, and dial reports that instead of passing.
func TestTransportCheckCatchesFallback(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		if tc.name == "tcp" {
			t.Skip("tcp cannot fall back to itself")
		}
		// On the row's host, where the transport would work.
		tcpOnly := transportCase{name: "tcp", host: tc.host}
		ln := tcpOnly.listen(t)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		c, err := tc.dial(testContext(t), ln.Addr().String())
		if err == nil {
			c.Close()
			t.Fatal("a connection that fell back to tcp passed the check")
		}
		t.Logf("caught, as it should be: %v", err)
	})
}
