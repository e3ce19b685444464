//go:build cgo && linux

package rsock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"
	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

// The verbs tests need an RDMA device and an address on one of its ports:
// the Soft-RoCE harness (test/softroce, run by make test) sets SOFTROCE_IP
// in its guest; on a host with a real device, set RSOCK_TEST_VERBS_IP. The
// transport is pinned to verbs (no tcp), so a fallback cannot pass, and
// where RSOCK_REQUIRE_VERBS is set (the VM) a missing device fails.

func verbsIP(t testing.TB) string {
	t.Helper()
	ip := os.Getenv("RSOCK_TEST_VERBS_IP")
	if ip == "" {
		ip = os.Getenv("SOFTROCE_IP")
	}
	if ip == "" {
		verbstest.Unavailable(t, "no RDMA address to test verbs on: set RSOCK_TEST_VERBS_IP (make test runs these in the Soft-RoCE VM)")
	}
	d, err := ibverbs.New().Open(verbs.OpenOptions{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, GIDIndex: -1})
	if err != nil {
		verbstest.Unavailable(t, fmt.Sprintf("verbs unavailable for %s: %v", ip, err))
	}
	d.Close()
	return ip
}

// verbsCfg pins the transport to verbs. The probe and sniff timeouts are
// raised from 1s and 200ms: in the emulated guest (QEMU TCG, under -race)
// registering a connection's memory takes longer than a real NIC does, and
// a slow answer must not be mistaken for a plain server.
func verbsCfg() *Config { return verbsRing(0, 0) }

func verbsRing(size, credits int) *Config {
	return &Config{Transports: []string{"verbs"}, RingSize: size, Credits: credits, ProbeTimeout: 30 * time.Second, SniffTimeout: 30 * time.Second}
}

func listenVerbs(t testing.TB, cfg *Config) *Listener {
	t.Helper()
	ip := verbsIP(t)
	ln, err := (&ListenConfig{Config: cfg}).Listen(context.Background(), "tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln.(*Listener)
}

func verbsPipe(t testing.TB, ln *Listener, cfg *Config) (*Conn, *Conn, error) {
	c, s := pipe(t, ln, cfg)
	if TransportOf(c) != "verbs" || TransportOf(s) != "verbs" {
		c.Close()
		s.Close()
		return nil, nil, fmt.Errorf("not on verbs: client %q (%s), server %q (%s)", TransportOf(c), c.Info().Reason, TransportOf(s), s.Info().Reason)
	}
	return c, s, nil
}

func onVerbs(t *testing.T, busyPoll time.Duration) (*Listener, *Config) {
	cfg := verbsRing(64<<10, 0)
	cfg.BusyPoll = busyPoll
	return listenVerbs(t, cfg), cfg
}

// Fewer round trips than on the host: Soft-RoCE under emulation is slow.
func TestVerbsStress(t *testing.T) { stress(t, "verbs", 1000, onVerbs) }

func TestVerbsOneWakeupPerMessage(t *testing.T) {
	ln, cfg := onVerbs(t, -1)
	oneWakeupPerMessage(t, ln, cfg, "verbs")
}

func TestVerbsBusyPollHits(t *testing.T) {
	ln, cfg := onVerbs(t, time.Millisecond)
	busyPollHits(t, ln, cfg, "verbs")
}

func TestNettestVerbs(t *testing.T) {
	ln := listenVerbs(t, verbsCfg())
	for _, swapped := range []bool{false, true} {
		t.Run(fmt.Sprintf("swapped=%v", swapped), func(t *testing.T) {
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				c, s, err := verbsPipe(t, ln, verbsCfg())
				if err != nil {
					return nil, nil, nil, err
				}
				stop := func() { c.Close(); s.Close() }
				if swapped {
					return s, c, stop, nil
				}
				return c, s, stop, nil
			})
		})
	}
}

// TestVerbsStreamIntegrity: random write sizes, 8 MiB through the default
// ring and 2 MiB through a 4 KiB ring (wrap-around at many offsets), both
// directions at once, concurrent writers on separate connections.
func TestVerbsStreamIntegrity(t *testing.T) {
	// Sizes are kept small enough for the emulated guest (QEMU TCG moves
	// a few MB/s under -race): a 4 KiB ring wraps 512 times in 2 MiB.
	for _, tc := range []struct {
		cfg  *Config
		size int
	}{
		{verbsRing(4096, 4), 2 << 20},
		{verbsCfg(), 8 << 20},
	} {
		cfg, size := tc.cfg, tc.size
		t.Run(fmt.Sprintf("ring=%d", cfg.RingSize), func(t *testing.T) {
			ln := listenVerbs(t, cfg)
			const conns = 3
			var cs, ss [conns]*Conn
			for i := range conns {
				var err error
				cs[i], ss[i], err = verbsPipe(t, ln, cfg)
				require.NoError(t, err)
				t.Cleanup(func() { cs[i].Close(); ss[i].Close() })
			}
			var wg sync.WaitGroup
			for i := range conns {
				wg.Add(2)
				go func() { defer wg.Done(); streamCheck(t, cs[i], ss[i], size>>(2*i), uint64(10+i)) }()
				go func() { defer wg.Done(); streamCheck(t, ss[i], cs[i], 256<<10, uint64(20+i)) }()
			}
			wg.Wait()
		})
	}
}

// TestVerbsPeerQPDestroyed destroys one side's queue pair mid-stream: both
// sides' blocked calls fail, and closing returns the file descriptors.
func TestVerbsPeerQPDestroyed(t *testing.T) {
	ln := listenVerbs(t, verbsCfg())
	// One connection first, so that process-lifetime resources (the device
	// context and its async reader) exist before the baseline.
	c0, s0, err := verbsPipe(t, ln, verbsCfg())
	require.NoError(t, err)
	c0.Close()
	s0.Close()
	fds := countFDs(t)

	c, s, err := verbsPipe(t, ln, verbsCfg())
	require.NoError(t, err)
	writeErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				writeErr <- err
				return
			}
		}
	}()
	readErr := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, s)
		if err == nil {
			err = io.EOF
		}
		readErr <- err
	}()
	time.Sleep(200 * time.Millisecond) // mid-stream
	require.NoError(t, s.ring().QP().Close())

	guard := time.After(60 * time.Second) // a hang guard, not a timing assertion
	for i, ch := range []chan error{readErr, writeErr} {
		select {
		case err := <-ch:
			require.Error(t, err)
			t.Logf("side %d: %v", i, err)
		case <-guard:
			t.Fatalf("side %d still blocked after its peer's QP was destroyed", i)
		}
	}
	c.Close()
	s.Close()
	require.Eventually(t, func() bool { return countFDs(t) <= fds }, time.Minute, 50*time.Millisecond, "fds not back to %d", fds)
}

// TestVerbsNoLeaks: open, use and close connections; goroutines and fds
// return to the baseline (the device context, opened once per process, is
// part of it).
func TestVerbsNoLeaks(t *testing.T) {
	cfg := verbsRing(4096, 4)
	ln := listenVerbs(t, cfg)
	c, s, err := verbsPipe(t, ln, cfg)
	require.NoError(t, err)
	c.Close()
	s.Close()
	checkNoLeaks(t, 25, func(i int) {
		c, s, err := verbsPipe(t, ln, cfg)
		require.NoError(t, err)
		roundTrip(t, c, s, []byte{byte(i)})
		c.Close()
		s.Close()
	})
}

// TestVerbsFork starts child processes (os/exec) while data moves through
// registered memory: the transfer stays byte-exact (the regions are
// MADV_DONTFORK, and libibverbs' fork support is initialised).
func TestVerbsFork(t *testing.T) {
	ln := listenVerbs(t, verbsCfg())
	c, s, err := verbsPipe(t, ln, verbsCfg())
	require.NoError(t, err)
	defer c.Close()
	defer s.Close()
	stop := make(chan struct{})
	forked := make(chan int, 1)
	go func() {
		n := 0
		defer func() { forked <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := exec.Command("true").Run(); err != nil {
				t.Errorf("child %d: %v", n, err)
				return
			}
			n++
		}
	}()
	streamCheck(t, c, s, 4<<20, 3)
	streamCheck(t, s, c, 4<<20, 4)
	close(stop)
	n := <-forked
	assert.Positive(t, n, "no child was started during the transfer")
	t.Logf("%d children started during the transfer", n)
}

// TestVerbsUnavailableFallsBack: where verbs cannot serve the connection
// (no libibverbs, no device, or, as here, a loopback address no RDMA port
// holds), Dial falls back to TCP and says why. It runs on every host.
func TestVerbsUnavailableFallsBack(t *testing.T) {
	cfg := &Config{Transports: []string{"verbs", "tcp"}}
	ln := listen(t, cfg) // 127.0.0.1
	c, s := pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	assert.Equal(t, "tcp", TransportOf(c))
	assert.Equal(t, "tcp", TransportOf(s))
	assert.True(t, c.Info().Fallback, "a fallback must be marked as one")
	assert.Contains(t, c.Info().Reason, "verbs: ", "the reason names the transport passed over")
	t.Logf("reason: %s", c.Info().Reason)

	// Without tcp, the same dial fails with the reason.
	_, err := (&Dialer{Config: verbsCfg(), Timeout: 10 * time.Second}).Dial("tcp", ln.Addr().String())
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoTransport), "%v", err)
	assert.Contains(t, err.Error(), "verbs")
}

// TestVerbsTwoHosts runs across two Soft-RoCE guests (make test runs the
// harness's two-host mode): the server guest echoes what the client guest
// sends, checked byte for byte, over verbs on both ends. Eight connections
// end at once, each with the server's Close: when that Close tore its
// queue pair down at its final send's completion, soft-iWARP lost the
// message in flight in 3 of 8 runs (TestSimCloseKeepsTheRingUntilThePeerHasIt).
func TestVerbsTwoHosts(t *testing.T) {
	role := os.Getenv("SOFTROCE_ROLE")
	if role != "server" && role != "client" {
		t.Skip("not in the Soft-RoCE two-host mode (SOFTROCE_ROLE is " + role + ")")
	}
	ip := verbsIP(t)
	const port = "7471"
	const conns = 8
	if role == "server" {
		ln, err := (&ListenConfig{Config: verbsCfg()}).Listen(context.Background(), "tcp", net.JoinHostPort(ip, port))
		require.NoError(t, err)
		defer ln.Close()
		var wg sync.WaitGroup
		for range conns {
			c, err := ln.Accept()
			require.NoError(t, err)
			// Accept hands the connection over on TCP; the client's Dial
			// waits for the ring (no tcp), and so does this end.
			awaitSettledEnd(t, c.(*Conn))
			require.Equal(t, "verbs", TransportOf(c), c.(*Conn).Info().Reason)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, err := io.Copy(c, c)
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
		return
	}
	peer := net.JoinHostPort(os.Getenv("SOFTROCE_PEER_IP"), port)
	dial := func() (net.Conn, error) {
		return (&Dialer{Config: verbsCfg(), Timeout: 10 * time.Second}).Dial("tcp", peer)
	}
	first, err := dial() // the server guest may still be booting
	for end := time.Now().Add(90 * time.Second); err != nil && time.Now().Before(end); {
		time.Sleep(200 * time.Millisecond)
		first, err = dial()
	}
	require.NoError(t, err)
	cs := []net.Conn{first}
	for len(cs) < conns {
		c, err := dial()
		require.NoError(t, err)
		cs = append(cs, c)
	}
	var wg sync.WaitGroup
	for i, c := range cs {
		require.Equal(t, "verbs", TransportOf(c), c.(*Conn).Info().Reason)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			echoCheck(t, c.(*Conn), 4<<20>>(i%2), uint64(30+i))
		}()
	}
	wg.Wait()
}

// echoCheck writes size random bytes to c while reading them back (an echo
// server), and compares.
func echoCheck(t *testing.T, c *Conn, size int, seed uint64) {
	t.Helper()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(seed + uint64(i)*7)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	if len(got) != size || !bytes.Equal(got, data) {
		t.Fatalf("echo: got %d bytes, want %d, or different bytes", len(got), size)
	}
}

// TestVerbsRegisteredBytes: a verbs connection at the default settings
// registers (pins) its ring, its state-message buffers and a staging
// buffer of the peer's ring size, at the starting ring size while idle
// and at the full size once a transfer filled the rings; ConnInfo says
// so, whether the upgrade runs in the background or Dial waits for it
// (no tcp).
func TestVerbsRegisteredBytes(t *testing.T) {
	slots := int64(DefaultCredits * 64)
	small, full := int64(DefaultRingStart), int64(DefaultRingSize)
	for _, tc := range []struct {
		name       string
		transports []string
		client     int64 // the client's ring while idle
	}{
		{"default", []string{"verbs", "tcp"}, small},
		{"dial waits", []string{"verbs"}, small},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := verbsCfg()
			cfg.Transports = tc.transports
			ln := listenVerbs(t, cfg)
			var c, s *Conn
			if tc.name == "default" {
				c, s = onRing(t, ln, cfg)
			} else {
				var err error
				c, s, err = verbsPipe(t, ln, cfg)
				require.NoError(t, err)
				t.Cleanup(func() { c.Close(); s.Close() })
				awaitSettled(t, c, s)
			}
			idle := tc.client + slots + small
			assert.Equal(t, idle, c.Info().Registered)
			assert.Equal(t, idle, s.Info().Registered)
			t.Logf("%s: registered (pinned) per idle verbs connection: %d KiB", tc.name, idle>>10)

			hashedBothWays(t, c, s, 2<<20, 31)
			for _, x := range []*Conn{c, s} {
				assert.Equal(t, 2*full+slots, x.Info().Registered, "grown, with the old rings released")
			}
			t.Logf("%s: after 2 MiB each way: %d KiB, ring moves %d and %d", tc.name, c.Info().Registered>>10, c.Info().RingGrows, s.Info().RingGrows)
		})
	}
}

// TestVerbsMemlockBudget: a process that reaches RLIMIT_MEMLOCK (a client
// opening connections until the host refuses to pin more) loses the ring
// on the connections over the limit, never the connections: each of them
// continues on TCP with the reason, and every connection carries data.
// It runs where the device counts pinned memory against the limit for
// this process (soft-iWARP does even for root; rxe exempts CAP_IPC_LOCK,
// and the test then skips, saying so).
func TestVerbsMemlockBudget(t *testing.T) {
	ip := verbsIP(t)
	var old unix.Rlimit
	require.NoError(t, unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old))
	const limit = 6 << 20
	require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: limit, Max: old.Max}))
	t.Cleanup(func() { _ = unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old) })

	// Does the limit bind here? Registering twice the limit must fail.
	d, err := ibverbs.New().Open(verbs.OpenOptions{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, GIDIndex: -1})
	require.NoError(t, err)
	mr, err := d.AllocMR(2*limit, verbs.AccessLocalWrite)
	if err == nil {
		mr.Close()
		d.Close()
		t.Skipf("the device on %s pins past RLIMIT_MEMLOCK for this process (CAP_IPC_LOCK): no budget to reach", ip)
	}
	d.Close()
	t.Logf("registering %d bytes with RLIMIT_MEMLOCK at %d: %v", 2*limit, limit, err)

	// Rings that start small and cannot grow: a connection pins 132 KiB
	// per end, and the registrations for the larger rings fail. The
	// stream goes on in the small rings, and says so.
	ibverbs.DrainPools()
	small := &Config{Transports: []string{"verbs", "tcp"}, ProbeTimeout: 30 * time.Second, SniffTimeout: 30 * time.Second}
	{
		require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: 1 << 20, Max: old.Max}))
		ln := listenVerbs(t, small)
		c, s := onRing(t, ln, small)
		hashedBothWays(t, c, s, 1<<20, 41)
		for _, x := range []*Conn{c, s} {
			info := x.Info()
			assert.Equal(t, "verbs", info.Transport)
			assert.Zero(t, info.RingGrows)
			assert.Positive(t, info.RingGrowFailures, "the refused registration is counted")
			assert.Equal(t, int64(2*DefaultRingStart+DefaultCredits*64), info.Registered)
		}
		c.Close()
		s.Close()
		ln.Close()
		require.NoError(t, unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: limit, Max: old.Max}))
	}

	// Rings that start full: each connection pins about 4 MiB in this
	// process, so the second already passes the limit.
	cfg := &Config{Transports: []string{"verbs", "tcp"}, RingStart: DefaultRingSize, ProbeTimeout: 30 * time.Second, SniffTimeout: 30 * time.Second}
	ln, err := (&ListenConfig{Config: cfg}).Listen(context.Background(), "tcp", net.JoinHostPort(ip, "0"))
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	const conns = 6
	byTransport := map[string]int{}
	for i := range conns {
		c, s := pipe(t, ln.(*Listener), cfg)
		t.Cleanup(func() { c.Close(); s.Close() })
		tr := TransportOf(c)
		require.Equal(t, tr, TransportOf(s), "client and server agree")
		byTransport[tr]++
		if tr == "tcp" {
			reason := c.Info().Reason
			assert.Contains(t, reason, "cannot allocate memory", "connection %d: the reason names the refused registration", i)
			t.Logf("connection %d on tcp: %s", i, reason)
		}
		msg := []byte(fmt.Sprintf("connection %d", i))
		_, err := c.Write(msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(s, got)
		require.NoError(t, err)
		require.Equal(t, msg, got)
	}
	t.Logf("connections by transport: %v", byTransport)
	assert.Positive(t, byTransport["verbs"], "the first connection fits under the limit")
	assert.Positive(t, byTransport["tcp"], "later ones pass it")
}

// TestVerbsSwitchHashedTransfer: on the switching protocol, a connection
// upgrades to verbs in the middle of hashed transfers in both directions;
// every byte arrives once and in order, and both directions end on verbs.
func TestVerbsSwitchHashedTransfer(t *testing.T) {
	for _, tc := range []struct {
		size  int
		after time.Duration
	}{{300 << 10, time.Nanosecond}, {4 << 20, 2 * time.Millisecond}} {
		t.Run(fmt.Sprintf("size=%d/after=%v", tc.size, tc.after), func(t *testing.T) {
			cfg := verbsRing(64<<10, 0)
			cfg.UpgradeAfter = tc.after
			cfg.UpgradeBytes = tc.size / 3
			ln := listenVerbs(t, cfg)
			c, s := dialAccept(t, ln, cfg)
			defer c.Close()
			defer s.Close()
			hashedBothWays(t, c, s, tc.size, uint64(tc.size))
			awaitSettled(t, c, s)
			for _, x := range []*Conn{c, s} {
				info := x.Info()
				assert.Equal(t, "verbs", info.Transport, info.Reason)
				assert.Len(t, info.Switches, 2, "%+v", info.Switches)
			}
		})
	}
}

// TestVerbsFailover forces a queue pair into the error state in the
// middle of hash-checked transfers both ways: each completes over TCP,
// and both ends' ConnInfo shows the moves.
func TestVerbsFailover(t *testing.T) {
	noReupgrade(t)
	for i, victim := range []string{"client", "server"} {
		t.Run(victim, func(t *testing.T) {
			cfg := verbsRing(64<<10, 0)
			cfg.UpgradeAfter = time.Nanosecond
			cfg.Transports = []string{"verbs", "tcp"} // failover needs tcp
			ln := listenVerbs(t, cfg)
			c, s := onRing(t, ln, cfg)
			x := map[string]*Conn{"client": c, "server": s}[victim]
			const size = 4 << 20
			errs := make(chan error, 4)
			for dir, p := range [][2]*Conn{{c, s}, {s, c}} {
				w := net.Conn(p[0])
				if dir == 0 {
					w = &triggerConn{Conn: p[0], at: size/3 + i*4099, fire: func() { breakRing(x) }}
				}
				go func() { errs <- hashedWrite(w, size, uint64(dir+10*i)) }()
				go func() { errs <- hashedRead(p[1], size, uint64(dir+10*i)) }()
			}
			for range 4 {
				require.NoError(t, <-errs)
			}
			byteEachWay(t, c, s)
			assertFailedOver(t, c, "verbs")
			assertFailedOver(t, s, "verbs")
			t.Logf("client: %+v", c.Info().Switches)
		})
	}
	t.Run("pause", func(t *testing.T) {
		cfg := verbsRing(64<<10, 0)
		cfg.UpgradeAfter = time.Nanosecond
		cfg.Transports = []string{"verbs", "tcp"}
		d := failoverPause(t, listenVerbs(t, cfg), cfg, 20)
		t.Logf("failover pause over %d failovers: p50 %v, p90 %v, max %v", len(d), d[len(d)/2], d[len(d)*9/10], d[len(d)-1])
	})
}

// TestVerbsEndpointPool: a closed connection's endpoints (protection
// domain and registered memory) are pooled, and the next connection on the
// device reuses them on both sides; its bytes arrive intact in the reused
// (zeroed) ring. Without the pool nothing is reused.
func TestVerbsEndpointPool(t *testing.T) {
	for _, tc := range []struct {
		pool   int
		reused uint64
	}{{-1, 0}, {2, 2}} {
		t.Run(fmt.Sprintf("pool=%d", tc.pool), func(t *testing.T) {
			ibverbs.DrainPools()
			t.Cleanup(ibverbs.DrainPools)
			cfg := verbsCfg()
			cfg.EndpointPool = tc.pool
			ln := listenVerbs(t, cfg)
			c, s, err := verbsPipe(t, ln, cfg)
			require.NoError(t, err)
			hashedBothWays(t, c, s, 100<<10, 1)
			c.Close()
			s.Close()
			if tc.pool > 0 {
				require.Eventually(t, func() bool { return ibverbs.Pooled().Idle == 2 }, 10*time.Second, time.Millisecond,
					"both ends' endpoints pooled: %+v", ibverbs.Pooled())
			}
			before := ibverbs.Pooled()
			c, s, err = verbsPipe(t, ln, cfg)
			require.NoError(t, err)
			defer c.Close()
			defer s.Close()
			assert.Equal(t, before.Reused+tc.reused, ibverbs.Pooled().Reused)
			hashedBothWays(t, c, s, 100<<10, 2)
		})
	}
}

// TestVerbsThousandConnections opens 1,000 verbs connections at once (both
// ends in this process, at a 16 KiB ring so that they fit the guest's
// memory), checks that each carries a byte each way, and reports the
// process's fds, OS threads, goroutines and pinned bytes per connection.
func TestVerbsThousandConnections(t *testing.T) {
	const n = 1000
	// Per connection, both ends here: two sockets, and two CQs, each with
	// a completion channel and the dup the netpoller waits on.
	lim, err := raiseNofile(8*n + 512)
	require.NoError(t, err, "RLIMIT_NOFILE %d", lim.Cur)
	cfg := verbsRing(16<<10, 0)
	ln := listenVerbs(t, cfg)
	before := collectStats()
	goroutines := runtime.NumGoroutine()
	pairs := make([][2]*Conn, 0, n)
	t.Cleanup(func() {
		for _, p := range pairs {
			p[0].Close()
			p[1].Close()
		}
	})
	start := time.Now()
	for i := range n {
		c, s, err := verbsPipe(t, ln, cfg)
		require.NoError(t, err, "connection %d", i)
		pairs = append(pairs, [2]*Conn{c, s})
	}
	t.Logf("%d connections set up one at a time in %v", n, time.Since(start).Round(time.Millisecond))
	after := collectStats()
	var pinned int64
	one := make([]byte, 1)
	for i, p := range pairs {
		for _, dir := range [][2]*Conn{{p[0], p[1]}, {p[1], p[0]}} {
			one[0] = byte(i)
			_, err := dir[0].Write(one)
			require.NoError(t, err)
			_, err = io.ReadFull(dir[1], one)
			require.NoError(t, err)
			require.Equal(t, byte(i), one[0])
		}
		pinned += p[0].Info().Registered + p[1].Info().Registered
	}
	per := func(k string) float64 { return float64(after[k]-before[k]) / n }
	t.Logf("%d verbs connections open (both ends here): fds %d -> %d (%.2f per connection, %.2f sockets), OS threads %d -> %d, goroutines %d -> %d (%.1f per connection), pinned %d KiB per end at a 16 KiB ring",
		n, before["fds"], after["fds"], per("fds"), per("fd_socket"), before["threads"], after["threads"],
		goroutines, runtime.NumGoroutine(), float64(runtime.NumGoroutine()-goroutines)/n, pinned/(2*n)>>10)
	assert.Less(t, after["threads"], 100, "parked connections hold no OS thread")
}

// TestVerbsPortDown: the ring's netdev taken down while the bootstrap
// connections stay up (they are local, on the loopback route) fails every
// connection on the port over to TCP once the port error's grace has
// passed, with the bytes exact both ways and the reason naming the port.
// A connection dialled while the port is down settles on TCP and says
// why; once the port is up, new connections take verbs again.
func TestVerbsPortDown(t *testing.T) {
	netdev := os.Getenv("SOFTROCE_NETDEV")
	if netdev == "" {
		verbstest.Unavailable(t, "no netdev to take down (SOFTROCE_NETDEV: make test runs this in the Soft-RoCE VM)")
	}
	link := func(state string) error {
		out, err := exec.Command("ip", "link", "set", netdev, state).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip link set %s %s: %v: %s", netdev, state, err, out)
		}
		return nil
	}
	noReupgrade(t)
	cfg := verbsRing(64<<10, 0)
	cfg.UpgradeAfter = time.Nanosecond
	cfg.Transports = []string{"verbs", "tcp"} // failover needs tcp
	ln := listenVerbs(t, cfg)
	const conns = 16
	var ends []*Conn
	for range conns {
		c, s := onRing(t, ln, cfg)
		ends = append(ends, c, s)
	}
	t.Cleanup(func() { assert.NoError(t, link("up")) })

	// Every direction streams until all ends are on TCP, so that the
	// port goes down under load, then half-closes; its reader checks the
	// bytes up to EOF.
	midway, stop := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 2*len(ends))
	for i := 0; i < len(ends); i += 2 {
		for dir, p := range [][2]*Conn{{ends[i], ends[i+1]}, {ends[i+1], ends[i]}} {
			w := net.Conn(p[0])
			if i == 0 && dir == 0 {
				w = &triggerConn{Conn: p[0], at: 64 << 10, fire: func() { close(midway) }}
			}
			seed, wrote := uint64(i+dir), make(chan int, 1)
			go func() { errs <- streamUntil(w, p[0], seed, stop, wrote) }()
			go func() { errs <- checkStream(p[1], seed, wrote) }()
		}
	}
	<-midway
	// The port's state in sysfs dates the event: the command itself may
	// take seconds in the emulated guest.
	wentDown := make(chan time.Time, 1)
	go func() {
		state := filepath.Join("/sys/class/infiniband", os.Getenv("SOFTROCE_DEV"), "ports/1/state")
		for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if b, err := os.ReadFile(state); err == nil && !bytes.Contains(b, []byte("ACTIVE")) {
				wentDown <- time.Now()
				return
			}
		}
		wentDown <- time.Time{}
	}()
	require.NoError(t, link("down"))
	down := <-wentDown
	require.False(t, down.IsZero(), "the port never left ACTIVE")
	// When each end moved, from its switch log: both directions on TCP.
	var moved []time.Duration
	for _, x := range ends {
		for x.Info().Transport != "tcp" {
			require.Less(t, time.Since(down), time.Minute, "still on verbs a minute after the port went down: %+v", x.Info())
			time.Sleep(10 * time.Millisecond)
		}
		var at time.Time
		for _, sw := range x.Info().Switches {
			if sw.From == "verbs" && sw.To == "tcp" && sw.At.After(at) {
				at = sw.At
			}
		}
		moved = append(moved, at.Sub(down))
	}
	slices.Sort(moved)
	t.Logf("ends on TCP after the port went down (its state in sysfs): first %v, median %v, last %v", moved[0].Round(time.Millisecond), moved[len(moved)/2].Round(time.Millisecond), moved[len(moved)-1].Round(time.Millisecond))
	close(stop)
	for range cap(errs) {
		require.NoError(t, <-errs)
	}
	// Ends, and connections with an end, that name the port; ends holds
	// each connection's two ends in turn.
	named, namedConns := 0, 0
	for i := 0; i < len(ends); i += 2 {
		why := [2]string{ends[i].Info().Reason, ends[i+1].Info().Reason}
		n := 0
		for j, r := range why {
			assertFailedOver(t, ends[i+j], "verbs")
			if strings.Contains(r, "port 1 down") {
				n++
			}
		}
		named += n
		if n > 0 {
			namedConns++
		} else {
			t.Logf("neither end names the port: %q; %q", why[0], why[1])
		}
	}
	// An end may fail over on its peer's Resume, but one of each pair
	// asks the device when its work fails, and finds the port down: on
	// rxe, whose sends fail as the netdev closes, before the port's state
	// changes, by the netdev's carrier.
	assert.Equal(t, conns, namedConns, "connections with an end that names the port")
	t.Logf("%d of %d ends name the port, and %d of %d connections at one end at least", named, len(ends), namedConns, conns)
	t.Logf("reason: %s", ends[0].Info().Reason)

	c, s := dialAccept(t, ln, cfg)
	awaitSettled(t, c, s)
	assert.Equal(t, "tcp", TransportOf(c), "dialled while the port is down: %s", c.Info().Reason)
	t.Logf("dialled while down: %s", c.Info().Reason)
	c.Close()
	s.Close()

	require.NoError(t, link("up"))
	for try := 1; ; try++ {
		c, s := dialAccept(t, ln, cfg)
		awaitSettled(t, c, s)
		tr, why := TransportOf(c), c.Info().Reason
		c.Close()
		s.Close()
		if tr == "verbs" {
			t.Logf("verbs again at the %d. connection after the port came up", try)
			break
		}
		require.Less(t, try, 300, "no connection on verbs after the port came up: %s", why)
		time.Sleep(100 * time.Millisecond)
	}
}

// streamUntil writes the stream seed to w in pieces of random size until
// stop is closed, then sends the count to wrote and half-closes c (w's
// net.Conn, or c itself).
func streamUntil(w net.Conn, c *Conn, seed uint64, stop <-chan struct{}, wrote chan<- int) error {
	rng := rand.New(rand.NewPCG(seed, 2))
	buf, off := make([]byte, 100_000), 0
	for !receivable(stop) {
		b := buf[:1+rng.IntN(len(buf))]
		streamAt(seed, off, b)
		if err := w.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			return err
		}
		n, err := w.Write(b)
		off += n
		if err != nil {
			return fmt.Errorf("write at byte %d: %w", off, err)
		}
	}
	wrote <- off
	return c.CloseWrite()
}

// checkStream reads from c up to EOF and checks every byte against the
// stream seed, and their count against the writer's.
func checkStream(c net.Conn, seed uint64, wrote <-chan int) error {
	buf, want := make([]byte, 70_000), make([]byte, 70_000)
	for off := 0; ; {
		if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
			return err
		}
		n, err := c.Read(buf)
		streamAt(seed, off, want[:n])
		if !bytes.Equal(buf[:n], want[:n]) {
			return fmt.Errorf("the bytes read after %d differ from those written", off)
		}
		off += n
		if err == io.EOF {
			if w := <-wrote; off != w {
				return fmt.Errorf("read %d bytes up to EOF, of %d written", off, w)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("read after %d bytes: %w", off, err)
		}
	}
}

// streamAt fills b with the bytes of the stream seed from offset off.
func streamAt(seed uint64, off int, b []byte) {
	for i := range b {
		x := (seed<<40 ^ uint64(off+i)>>3) + 0x9e3779b97f4a7c15 // splitmix64, one per 8 bytes
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		b[i] = byte((x ^ x>>31) >> (8 * ((off + i) & 7)))
	}
}

func TestVerbsOnePostPerMessage(t *testing.T) {
	ln, cfg := onVerbs(t, 0)
	onePostPerMessage(t, ln, cfg, "verbs")
}
