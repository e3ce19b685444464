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
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
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
}

// transportCases is every transport the suites know. To add one, register
// its provider in TestMain (or import the package that registers it) and
// add a row; a row whose provider is not registered is skipped.
var transportCases = []transportCase{
	{name: "sim", provider: "sim"},
	{name: "shm", provider: "shm"},
	{name: "verbs", provider: "verbs"},
	{name: "tcp"},
}

func TestMain(m *testing.M) {
	// The in-process provider is test-only: it registers here, not in
	// the library. When shm and verbs land, register them here too
	// (unless importing their packages registers them), for example
	//	transport.Register("shm", shm.New())
	// and their rows in transportCases run instead of skipping.
	transport.Register("sim", sim.New())
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
func (tc transportCase) config() *rsock.Config {
	cfg := &rsock.Config{
		Transports:   []string{tc.name, "tcp"},
		SniffTimeout: hangGuard / 4,
		ProbeTimeout: hangGuard / 4,
	}
	if tc.name == "tcp" {
		cfg.Transports = []string{"tcp"}
	}
	return cfg
}

// unavailable says why the transport cannot run here, or "".
func (tc transportCase) unavailable() string {
	if only := os.Getenv("RSOCK_E2E_TRANSPORTS"); only != "" && !slices.Contains(strings.Split(only, ","), tc.name) {
		return "not in RSOCK_E2E_TRANSPORTS=" + only
	}
	if tc.provider == "" {
		return ""
	}
	if _, ok := transport.Lookup(tc.provider); !ok {
		return fmt.Sprintf("no %q provider is registered in this test binary (not built in yet)", tc.provider)
	}
	return ""
}

// forEachTransport runs fn as a subtest per available transport.
func forEachTransport(t *testing.T, fn func(t *testing.T, tc transportCase)) {
	t.Helper()
	for _, tc := range transportCases {
		t.Run(tc.name, func(t *testing.T) {
			if why := tc.unavailable(); why != "" {
				t.Skip(why)
			}
			fn(t, tc)
		})
	}
}

// checkTransport returns an error unless rsock says c (or the conn it
// wraps) runs over want.
func checkTransport(c net.Conn, want string) error {
	got := rsock.TransportOf(c)
	if got == want {
		return nil
	}
	info, _ := rsock.InfoOf(c)
	return fmt.Errorf("connection %s -> %s runs over %q (reason %q), want %q", c.LocalAddr(), c.RemoteAddr(), got, info.Reason, want)
}

// listen returns an rsock listener on a loopback port for the transport,
// closed at the end of the test.
func (tc transportCase) listen(t testing.TB) net.Listener {
	t.Helper()
	return tc.listenAt(t, "127.0.0.1:0")
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
	d := &rsock.Dialer{Timeout: 30 * time.Second, Config: tc.config()}
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

// hangGuard bounds how long a test waits for anything: a generous limit
// that only a hang reaches.
const hangGuard = 60 * time.Second

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
		tcpOnly := transportCase{name: "tcp"}
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
