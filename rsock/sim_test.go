package rsock

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

var (
	simOnce sync.Once
	simProv = sim.New()
)

// registerSim makes the in-process sim provider available as "sim".
func registerSim(t testing.TB) {
	simOnce.Do(func() { transport.Register("sim", simProv) })
}

// withFaults sets sim faults for the rest of the test.
func withFaults(t *testing.T, f sim.Faults) {
	simProv.SetFaults(f)
	t.Cleanup(func() { simProv.SetFaults(sim.Faults{}) })
}

// simCfg is the configuration of the sim tests of the ring itself: the
// ring from Dial on (Dial waits for the upgrade), and no failover (a ring
// failure resets the connection). The upgrade's tests have swCfg.
func simCfg() *Config {
	return &Config{Transports: []string{"sim", "tcp"}, RingSize: 64 << 10, UpgradeAfter: -1, NoFailover: true}
}

func simPipe(t testing.TB, cfg *Config) (client, server *Conn) {
	t.Helper()
	registerSim(t)
	if cfg == nil {
		cfg = simCfg()
	}
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	require.Equal(t, "sim", TransportOf(c), c.Info().Reason)
	require.Equal(t, "sim", TransportOf(s), s.Info().Reason)
	return c, s
}

func TestNettestSim(t *testing.T) {
	registerSim(t)
	nettest.TestConn(t, pipeOn(t, listen(t, simCfg()), simCfg(), "sim"))
}

func TestNettestSimSwapped(t *testing.T) {
	registerSim(t)
	nettest.TestConn(t, swap(pipeOn(t, listen(t, simCfg()), simCfg(), "sim")))
}

func TestNettestSimSmallRingFaults(t *testing.T) {
	// The smallest ring and few credits force wrap-around and credit
	// stalls constantly; faults delay and reorder completions.
	registerSim(t)
	withFaults(t, sim.Faults{Delay: 50 * time.Microsecond, Reorder: true, LossRate: 0.01, RetransmitDelay: 100 * time.Microsecond})
	cfg := &Config{Transports: []string{"sim"}, RingSize: 4096, Credits: 4}
	ln := listen(t, cfg)
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		c, s := pipe(t, ln, cfg)
		return c, s, func() { c.Close(); s.Close() }, nil
	})
}

// TestNettestSimGrowingFaults: rings that start at 4 KiB grow to 64 KiB
// during nettest's transfers while faults delay, reorder and lose
// packets (sim retransmits), with the upgrade in the background and with
// Dial waiting for it.
func TestNettestSimGrowingFaults(t *testing.T) {
	registerSim(t)
	withFaults(t, sim.Faults{Delay: 50 * time.Microsecond, Reorder: true, LossRate: 0.01, RetransmitDelay: 100 * time.Microsecond})
	for _, waits := range []bool{false, true} {
		t.Run(fmt.Sprintf("dialWaits=%v", waits), func(t *testing.T) {
			cfg := growCfg("sim", time.Nanosecond)
			if waits {
				cfg = &Config{Transports: []string{"sim"}, RingSize: 64 << 10, RingStart: 4 << 10, Credits: 4}
			}
			ln := listen(t, cfg)
			var grown atomic.Uint64
			defer func() { t.Logf("ring moves seen by the servers: %d", grown.Load()) }()
			nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
				c, s := dialAccept(t, ln, cfg)
				awaitSettled(t, c, s)
				return c, s, func() { grown.Add(s.Info().RingGrows); c.Close(); s.Close() }, nil
			})
		})
	}
}

func TestNettestDeclined(t *testing.T) {
	// The client offers sim, the server allows only tcp: both carry on
	// over the bootstrap connection after the decline.
	registerSim(t)
	ln := listen(t, tcpOnly())
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		c, s := pipe(t, ln, simCfg())
		if c.Info().Code != CodeDeclined {
			return nil, nil, nil, errors.New("not declined: " + c.Info().Reason)
		}
		return c, s, func() { c.Close(); s.Close() }, nil
	})
}

func TestDeclinedConnHasNoHandshakeDeadline(t *testing.T) {
	registerSim(t)
	ln := listen(t, &Config{Transports: []string{"tcp"}, HandshakeTimeout: 50 * time.Millisecond})
	c, s := pipe(t, ln, &Config{Transports: []string{"sim", "tcp"}, HandshakeTimeout: 50 * time.Millisecond})
	defer c.Close()
	defer s.Close()
	time.Sleep(100 * time.Millisecond)
	roundTrip(t, c, s, []byte("after the handshake's deadline"))
	roundTrip(t, s, c, []byte("both ways"))
}

func TestDeclineFallsBackOnSameConnection(t *testing.T) {
	registerSim(t)
	ln := listen(t, tcpOnly())
	c, s := pipe(t, ln, simCfg())
	defer c.Close()
	defer s.Close()
	ci := c.Info()
	assert.Equal(t, "tcp", ci.Transport)
	assert.True(t, ci.Fallback)
	assert.Equal(t, CodeDeclined, ci.Code, ci.Reason)
	roundTrip(t, c, s, []byte("over the bootstrap"))
}

func roundTrip(t *testing.T, a, b net.Conn, msg []byte) {
	t.Helper()
	go func() { _, _ = a.Write(msg) }()
	got := make([]byte, len(msg))
	_, err := io.ReadFull(b, got)
	require.NoError(t, err)
	require.Equal(t, msg, got)
}

// streamCheck sends size random bytes from w to r in random-sized writes
// and checks them byte for byte by hash.
func streamCheck(t *testing.T, w, r net.Conn, size int, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	want := sha256.Sum256(data)
	errc := make(chan error, 1)
	go func() {
		rest := data
		for len(rest) > 0 {
			n := 1 + rng.IntN(min(len(rest), 200_000))
			if _, err := w.Write(rest[:n]); err != nil {
				errc <- err
				return
			}
			rest = rest[n:]
		}
		errc <- nil
	}()
	h := sha256.New()
	buf := make([]byte, 37_000)
	got := 0
	for got < size {
		n, err := r.Read(buf[:1+rand.IntN(len(buf)-1)])
		h.Write(buf[:n])
		got += n
		require.NoError(t, err)
	}
	require.NoError(t, <-errc)
	require.Equal(t, want[:], h.Sum(nil))
}

func TestSimStreamIntegrityUnderFaults(t *testing.T) {
	registerSim(t)
	withFaults(t, sim.Faults{Delay: 20 * time.Microsecond, Reorder: true, LossRate: 0.02, RetransmitDelay: 50 * time.Microsecond})
	c, s := simPipe(t, &Config{Transports: []string{"sim"}, RingSize: 8192, Credits: 4})
	defer c.Close()
	defer s.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); streamCheck(t, s, c, 1<<20, 2) }() // both directions at once
	streamCheck(t, c, s, 1<<20, 1)
	wg.Wait()
	assert.Positive(t, c.Info().CreditStalls, "a small ring must make the writer wait")
}

func TestSimEOFAndHalfClose(t *testing.T) {
	c, s := simPipe(t, nil)
	defer s.Close()
	_, err := c.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, c.CloseWrite())
	got, err := io.ReadAll(s)
	require.NoError(t, err)
	assert.Equal(t, "last words", string(got))
	// The other direction still works after the half-close.
	roundTrip(t, s, c, []byte("reply"))
	_, err = c.Write([]byte("x"))
	assert.ErrorIs(t, err, syscall.EPIPE)
	require.NoError(t, c.Close())
	_, err = s.Write([]byte("to nobody"))
	// The peer closed: writes fail (broken pipe), possibly after the
	// goodbye arrives.
	require.Eventually(t, func() bool {
		_, err = s.Write([]byte("to nobody"))
		return err != nil
	}, 2*time.Second, time.Millisecond)
	assert.ErrorIs(t, err, syscall.EPIPE)
}

func TestSimCloseUnblocksAndErrClosed(t *testing.T) {
	c, s := simPipe(t, nil)
	defer s.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		errc <- err
	}()
	// Close while the Read waits (not before it started).
	require.Eventually(t, func() bool { return c.ring().Waiting() == 1 }, 5*time.Second, 100*time.Microsecond)
	require.NoError(t, c.Close())
	select {
	case err := <-errc:
		assert.ErrorIs(t, err, net.ErrClosed)
		var oe *net.OpError
		assert.True(t, errors.As(err, &oe))
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Read")
	}
	_, err := c.Write([]byte("x"))
	assert.ErrorIs(t, err, net.ErrClosed)
	assert.ErrorIs(t, c.Close(), net.ErrClosed)
	// The peer sees EOF.
	n, err := s.Read(make([]byte, 1))
	assert.Equal(t, 0, n)
	assert.Equal(t, io.EOF, err)
}

// waitErr waits up to a second for a blocked call's error.
func waitErr(t *testing.T, errc <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(time.Second):
		t.Fatalf("%s still blocked after a second", what)
		return nil
	}
}

func TestSimQPErrorUnblocksBothSides(t *testing.T) {
	c, s := simPipe(t, nil)
	defer c.Close()
	defer s.Close()
	rd := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, s); rd <- err }()
	wr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			if _, err := c.Write(buf); err != nil {
				wr <- err
				return
			}
		}
	}()
	// Mid-stream: bytes have arrived.
	require.Eventually(t, func() bool { return s.Info().BytesRead > 0 }, 5*time.Second, 100*time.Microsecond)
	c.ring().QP().(*sim.QP).ForceError()
	err := waitErr(t, wr, "client Write")
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	// The server learns through the bootstrap connection.
	err = waitErr(t, rd, "server Read")
	assert.ErrorIs(t, err, syscall.ECONNRESET)
}

func TestSimPeerVanishes(t *testing.T) {
	c, s := simPipe(t, nil)
	defer s.Close()
	rd := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, s); rd <- err }()
	wr := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Write(make([]byte, 32<<10)); err != nil {
				wr <- err
				return
			}
		}
	}()
	_, _ = c.Write([]byte("some data"))
	// The peer process dies: its bootstrap socket closes with no goodbye
	// and its queue pair stops answering.
	c.ring().QP().(*sim.QP).Stall(true)
	boot := c.tcp
	boot.SetLinger(0)
	boot.Close()
	err := waitErr(t, rd, "server Read")
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	assert.Contains(t, err.Error(), "vanished")
	err = waitErr(t, wr, "server Write")
	assert.Error(t, err)
	c.ring().QP().(*sim.QP).Stall(false)
	c.Close()
}

// TestSimCloseKeepsTheRingUntilThePeerHasIt: where a send completes once
// the local transport took it (iWARP; sim's LocalCompletion), an orderly
// Close waits, and keeps its queue pair, until the peer has read its
// goodbye and has what the ring carried: the peer reads every byte, then
// EOF. Tearing it down at the final message's completion lost the message
// in flight, and the peer's receives failed (the two-host soft-iWARP
// flake).
func TestSimCloseKeepsTheRingUntilThePeerHasIt(t *testing.T) {
	withFaults(t, sim.Faults{LocalCompletion: true})
	c, s := simPipe(t, nil)
	defer c.Close()
	closed := make(chan error, 1)
	var once sync.Once
	testHookGoodbye.set(func(w *swConn) {
		if w != c.w {
			return
		}
		// The goodbye has arrived and the ring's messages have not. A
		// Close that does not wait for the peer returns now, and has
		// released the queue pair; one that waits cannot return before
		// this hook does (bounded, so that it is not a deadlock).
		once.Do(func() {
			select {
			case err := <-closed:
				closed <- err
				t.Error("Close returned before the peer had what the ring carried")
			case <-time.After(500 * time.Millisecond):
			}
			c.ring().QP().(*sim.QP).Stall(false)
		})
	})
	t.Cleanup(func() { testHookGoodbye.set(nil) })
	// Only the peer's end of the bootstrap, not the linger's bound, may
	// end the closer's wait.
	linger := lingerTimeout.Swap(int64(time.Hour))
	t.Cleanup(func() { lingerTimeout.Store(linger) })
	c.ring().QP().(*sim.QP).Stall(true)
	data := bytes.Repeat([]byte("last words "), 100)
	_, err := s.Write(data)
	require.NoError(t, err)
	go func() { closed <- s.Close() }()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	got, err := io.ReadAll(c)
	require.NoError(t, err, "want every byte, then EOF")
	assert.Equal(t, data, got)
	assert.NoError(t, <-closed)
	select {
	case <-s.w.Goodbye(nil): // the same channel Close waited for
	default:
		t.Error("Close returned before the peer ended the bootstrap")
	}
}

func TestSimStalledPeerWriteDeadline(t *testing.T) {
	c, s := simPipe(t, &Config{Transports: []string{"sim"}, RingSize: 4096, Credits: 4})
	defer c.Close()
	defer s.Close()
	s.ring().QP().(*sim.QP).Stall(true)
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(100*time.Millisecond)))
	n, err := c.Write(make([]byte, 64<<10))
	assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.True(t, errors.As(err, &ne))
	assert.True(t, ne.Timeout())
	assert.Less(t, n, 64<<10)
	// Un-stall; the conn stays usable: the written prefix arrives intact.
	s.ring().QP().(*sim.QP).Stall(false)
	require.NoError(t, c.SetWriteDeadline(time.Time{}))
	got := make([]byte, n)
	_, err = io.ReadFull(s, got)
	require.NoError(t, err)
	assert.Equal(t, make([]byte, n), got)
	roundTrip(t, c, s, []byte("still usable"))
}

// inject posts a forged state message on c's queue pair, bypassing the
// protocol, as a hostile peer would.
func inject(t *testing.T, c *Conn, m ring.Msg) {
	t.Helper()
	var b [ring.MsgLen]byte
	m.Marshal(b[:])
	require.NoError(t, c.ring().QP().PostSend(&verbs.SendWR{Op: verbs.OpSend, Inline: b[:], Signaled: true}))
}

func TestSimHostilePeerCursors(t *testing.T) {
	ring64k := uint64(64 << 10)
	cases := map[string]ring.Msg{
		"prod beyond granted space": {Seq: 1, Prod: ring64k + 1},
		"cons beyond what was sent": {Seq: 1, Cons: 1},
		"credits never granted":     {Seq: 1, Posted: 1 << 40},
		"wrong sequence":            {Seq: 7},
		"unknown version":           {},
		// Ring growth (docs/protocol.md §3.11).
		"grow to a smaller ring":       {Flags: ring.FlagGrow, Seq: 1, SizeLog: 12},
		"grow past the peer's limit":   {Flags: ring.FlagGrow, Seq: 1, SizeLog: 30, Addr: 1 << 20},
		"grow with FIN before FIN":     {Flags: ring.FlagGrow | ring.FlagFIN, Seq: 1, SizeLog: 20},
		"moved without a grow":         {Flags: ring.FlagMoved, Seq: 1},
		"grow whose ring wraps memory": {Flags: ring.FlagGrow, Seq: 1, SizeLog: 20, Addr: ^uint64(0) - 100},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			c, s := simPipe(t, nil)
			defer c.Close()
			defer s.Close()
			rd := make(chan error, 1)
			go func() { _, err := s.Read(make([]byte, 10)); rd <- err }()
			if name == "unknown version" {
				b := make([]byte, ring.MsgLen)
				b[0] = 99
				require.NoError(t, c.ring().QP().PostSend(&verbs.SendWR{Op: verbs.OpSend, Inline: b}))
			} else {
				if m.Posted == 0 {
					m.Posted = DefaultCredits
				}
				inject(t, c, m)
			}
			err := waitErr(t, rd, "Read after a hostile message")
			assert.ErrorIs(t, err, syscall.ECONNRESET)
			assert.True(t, errors.Is(err, ring.ErrProtocol) || errors.Is(err, ring.ErrMsgFormat), "%v", err)
		})
	}
}

func TestHostileHellosDoNotHurtListener(t *testing.T) {
	registerSim(t)
	cfg := &Config{Transports: []string{"sim", "tcp"}, HandshakeTimeout: 300 * time.Millisecond, SniffTimeout: 100 * time.Millisecond}
	ln := listen(t, cfg)
	accepted := make(chan net.Conn, 1024)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	valid, err := handshake.Append(nil, &handshake.Hello{Offers: []handshake.Offer{{Transport: handshake.TransportSim, Ring: handshake.RingInfo{Size: 4096, Credits: 8}, Info: []byte("x")}}})
	require.NoError(t, err)
	send := func(b []byte, hold time.Duration) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return
		}
		_, _ = c.Write(b)
		time.Sleep(hold)
		c.Close()
	}
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(3, 4))
	hostile := [][]byte{
		[]byte(handshake.Magic),                           // magic, then silence
		valid[:len(valid)/2],                              // truncated
		append([]byte(handshake.Magic), 1, 1, 0xff, 0xff), // oversized length
		append([]byte(handshake.Magic), 9, 1, 0, 0),       // unknown version
		append([]byte(handshake.Magic), 1, 9, 0, 0),       // unknown type
	}
	for range 40 {
		m := bytes.Clone(valid)
		for range 1 + rng.IntN(4) {
			m[len(handshake.Magic)+rng.IntN(len(m)-len(handshake.Magic))] = byte(rng.Uint32())
		}
		hostile = append(hostile, m)
	}
	// Silent clients hold connections the whole time.
	for range 30 {
		wg.Add(1)
		go func() { defer wg.Done(); send(nil, time.Second) }()
	}
	for _, h := range hostile {
		wg.Add(1)
		go func() { defer wg.Done(); send(h, 500*time.Millisecond) }()
	}
	// Meanwhile a real client is served promptly.
	start := time.Now()
	d := Dialer{Config: cfg, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	tr, _ := settleWithin(c, time.Second)
	assert.Equal(t, "sim", tr, c.(*Conn).Info().Reason)
	assert.Less(t, time.Since(start), time.Second, "a good client waited behind hostile ones")
	wg.Wait()
	// Accept never failed, and is still serving.
	c2, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	c2.Close()
	for len(accepted) > 0 {
		(<-accepted).Close()
	}
	assert.Positive(t, ln.Stats().HandshakeErrors)
}

func countFDs(t testing.TB) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

func TestSimNoLeaks(t *testing.T) {
	registerSim(t)
	cfg := &Config{Transports: []string{"sim", "tcp"}, RingSize: 4096, Credits: 4}
	ln := listen(t, cfg)
	// Warm up lazily created runtime goroutines and fds.
	c, s := pipe(t, ln, cfg)
	c.Close()
	s.Close()
	checkNoLeaks(t, 2000, func(i int) {
		c, s := pipe(t, ln, cfg)
		roundTrip(t, c, s, []byte{byte(i)})
		if i%2 == 0 {
			c.Close()
			s.Close()
		} else {
			s.Close()
			c.Close()
		}
	})
}

// TestSimGrowingNoLeaks: connections whose rings grow, or are growing
// when they close, release every region, goroutine and fd.
func TestSimGrowingNoLeaks(t *testing.T) {
	registerSim(t)
	cfg := &Config{Transports: []string{"sim", "tcp"}, RingSize: 64 << 10, RingStart: 4 << 10, Credits: 4}
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	c.Close()
	s.Close()
	data := make([]byte, 48<<10)
	checkNoLeaks(t, 600, func(i int) {
		c, s := pipe(t, ln, cfg)
		werr := make(chan error, 1)
		go func() { _, err := c.Write(data); werr <- err }()
		if i%2 == 0 {
			// Read it all: the server's ring grows on the way.
			_, err := io.ReadFull(s, make([]byte, len(data)))
			require.NoError(t, err)
			require.NoError(t, <-werr)
			c.Close()
			s.Close()
			return
		}
		// Close while the writer waits for room, and the ring may be
		// growing.
		_, err := io.ReadFull(s, make([]byte, 1))
		require.NoError(t, err)
		s.Close()
		c.Close()
		<-werr
	})
}

// checkNoLeaks runs cycle cycles times (each opening, using and closing
// connections) and checks that goroutines and fds return to what they
// were before (within 2; the caller has warmed up lazily created ones),
// and that every region verbs.AllocMem mapped was unmapped.
func checkNoLeaks(t *testing.T, cycles int, cycle func(i int)) {
	t.Helper()
	settle := func() (int, int, int) {
		time.Sleep(50 * time.Millisecond)
		runtime.GC()
		return runtime.NumGoroutine(), countFDs(t), verbs.LiveMem()
	}
	g0, f0, m0 := settle()
	for i := range cycles {
		cycle(i)
	}
	g, f, m := settle()
	for deadline := time.Now().Add(30 * time.Second); (g > g0+2 || f > f0+2 || m > m0) && time.Now().Before(deadline); {
		g, f, m = settle()
	}
	require.True(t, g <= g0+2 && f <= f0+2 && m <= m0, "goroutines %d -> %d, fds %d -> %d, mapped regions %d -> %d", g0, g, f0, f, m0, m)
	t.Logf("after %d cycles: goroutines %d -> %d, fds %d -> %d, mapped regions %d -> %d", cycles, g0, g, f0, f, m0, m)
}

// TestSimRingGrows: with rings that start small, a connection holds the
// small rings until a transfer fills them, then moves both directions to
// the full rings at exact cursors; the hash-checked stream is intact and
// ConnInfo shows the moves and the memory held.
func TestSimRingGrows(t *testing.T) {
	registerSim(t)
	for _, tc := range []struct {
		name string
		cfg  *Config
	}{
		{"switching", growCfg("sim", time.Nanosecond)},
		{"dial waits", &Config{Transports: []string{"sim"}, RingSize: 64 << 10, RingStart: 4 << 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ln := listen(t, tc.cfg)
			var c, s *Conn
			if tc.name == "switching" {
				c, s = onRing(t, ln, tc.cfg)
			} else {
				c, s = pipe(t, ln, tc.cfg)
				t.Cleanup(func() { c.Close(); s.Close() })
				awaitSettled(t, c, s)
			}
			slots := int64(DefaultCredits * 64)
			small, full := int64(4<<10), int64(64<<10)
			assert.Equal(t, small+slots+small, c.Info().Registered, "client: its ring and staging for the server's")
			assert.Equal(t, small+slots+small, s.Info().Registered)

			hashedBothWays(t, c, s, 1<<20, 21)
			awaitGrown(t, c, s, full+slots+full)
		})
	}
}

// awaitGrown carries hash-checked streams each way until the rings of c
// and s have both moved, and each side holds registered bytes: a move is
// asked for during a transfer and completes beside the traffic that
// follows, not by itself (an idle peer reads a GROW at its next call).
func awaitGrown(t *testing.T, c, s *Conn, registered int64) {
	t.Helper()
	grown := func(x *Conn) bool { i := x.Info(); return i.RingGrows == 2 && i.Registered == registered }
	for i := uint64(0); !grown(c) || !grown(s); i++ {
		if i == 256 {
			ci, si := c.Info(), s.Info()
			t.Fatalf("moves %d and %d, registered %d and %d bytes, want 2 and %d", ci.RingGrows, si.RingGrows, ci.Registered, si.Registered, registered)
		}
		hashedBothWays(t, c, s, 64<<10, 1000+i)
	}
}

// TestRingSizesNegotiated: sides with different RingSizes tell each other
// (RingMax): each ring grows to the smaller of the two, the transfer is
// intact, and neither side holds a peer ring larger than its own.
func TestRingSizesNegotiated(t *testing.T) {
	registerSim(t)
	small, large := 64<<10, 1<<20
	for _, tc := range []struct {
		name           string
		client, server int
	}{{"small client", small, large}, {"small server", large, small}} {
		t.Run(tc.name, func(t *testing.T) {
			scfg := growCfg("sim", time.Nanosecond)
			scfg.RingSize = tc.server
			ccfg := growCfg("sim", time.Nanosecond)
			ccfg.RingSize = tc.client
			c, s := dialAccept(t, listen(t, scfg), ccfg)
			t.Cleanup(func() { c.Close(); s.Close() })
			byteEachWay(t, c, s)
			awaitSettled(t, c, s)
			require.Equal(t, "sim", TransportOf(c), c.Info().Reason)
			hashedBothWays(t, c, s, 2<<20, 41)
			awaitGrown(t, c, s, int64(small)+int64(DefaultCredits*64)+int64(small)) // rings of the smaller size, each side
		})
	}
}

// TestShmHostileGrow: a GROW to a side that maps the peer's ring (shm) is
// a protocol violation: mapped rings never grow.
func TestShmHostileGrow(t *testing.T) {
	cfg := &Config{Transports: []string{"shm"}, RingSize: 64 << 10}
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	rd := make(chan error, 1)
	go func() { _, err := s.Read(make([]byte, 10)); rd <- err }()
	inject(t, c, ring.Msg{Flags: ring.FlagGrow, Seq: 1, SizeLog: 20, Posted: DefaultCredits})
	err := waitErr(t, rd, "Read after a GROW to a mapped ring")
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	assert.ErrorIs(t, err, ring.ErrProtocol)
}
