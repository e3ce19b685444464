package rsock

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// Tests of the switching protocol (switching.go, upgrade.go): connections
// that start on TCP and move to a ring.

func swCfg(tr string, after time.Duration) *Config {
	return &Config{Transports: []string{tr, "tcp"}, RingSize: 64 << 10, UpgradeAfter: after}
}

// growCfg is swCfg with rings that start at 4 KiB and grow to 64 KiB
// under load (shm's start at 64 KiB), so transfers run across a ring
// move.
func growCfg(tr string, after time.Duration) *Config {
	cfg := swCfg(tr, after)
	cfg.RingStart = 4 << 10
	return cfg
}

// dialAccept dials ln and accepts the other end, without waiting for an
// upgrade.
func dialAccept(t testing.TB, ln *Listener, cfg *Config) (client, server *Conn) {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			c = nil
		}
		ch <- c
	}()
	d := Dialer{Config: cfg, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	select {
	case s := <-ch:
		require.NotNil(t, s)
		return c.(*Conn), s.(*Conn)
	case <-time.After(time.Minute):
		t.Fatal("dialled, but nothing accepted within a minute")
		return nil, nil
	}
}

// TestSwitchNettest runs nettest.TestConn on switching connections: with
// the upgrade settled before the test (the ring's data path), and with the
// upgrade happening during it (at once, or after 200 us); on sim also
// with rings that start small and grow during the test.
func TestSwitchNettest(t *testing.T) {
	registerSim(t)
	for _, tr := range []string{"sim", "shm", "sim/grow"} {
		for _, after := range []time.Duration{time.Nanosecond, 200 * time.Microsecond} {
			for _, settle := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/after=%v/settled=%v", tr, after, settle), func(t *testing.T) {
					cfg := swCfg(tr, after)
					if tr == "sim/grow" {
						tr, cfg = "sim", growCfg("sim", after)
					}
					ln := listen(t, cfg)
					nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
						c, s := dialAccept(t, ln, cfg)
						if settle {
							awaitSettled(t, c, s)
							if TransportOf(c) != tr || TransportOf(s) != tr {
								return nil, nil, nil, fmt.Errorf("not on %s: %s / %s", tr, c.Info().Reason, s.Info().Reason)
							}
						}
						return c, s, func() { c.Close(); s.Close() }, nil
					})
				})
			}
		}
	}
}

// TestSwitchHashedTransfer: both directions stream hashed bytes at once,
// with random write and read sizes and deadlines moving, while the
// connection upgrades; every byte arrives once, in order, and both
// directions end on the ring.
func TestSwitchHashedTransfer(t *testing.T) {
	registerSim(t)
	sizes := []int{1, 5000, 300 << 10, 4 << 20}
	for _, tr := range []string{"sim", "shm", "sim/grow"} {
		for i, size := range sizes {
			after := []time.Duration{time.Nanosecond, 50 * time.Microsecond, time.Millisecond, 3 * time.Millisecond}[i]
			t.Run(fmt.Sprintf("%s/size=%d/after=%v", tr, size, after), func(t *testing.T) {
				cfg := swCfg(tr, after)
				if tr == "sim/grow" {
					tr, cfg = "sim", growCfg("sim", after)
				}
				cfg.UpgradeBytes = 1 + size/3
				ln := listen(t, cfg)
				c, s := dialAccept(t, ln, cfg)
				defer c.Close()
				defer s.Close()
				hashedBothWays(t, c, s, size, uint64(size*10))
				awaitSettled(t, c, s)
				for _, x := range []*Conn{c, s} {
					info := x.Info()
					assert.Equal(t, tr, info.Transport, info.Reason)
					assert.Len(t, info.Switches, 2, "%+v", info.Switches)
					assert.Equal(t, uint64(size), info.BytesWritten)
					assert.Equal(t, uint64(size), info.BytesRead)
				}
			})
		}
	}
}

// hashedBothWays streams size hashed bytes from c to s and from s to c at
// once, and checks what arrives.
func hashedBothWays(t *testing.T, c, s *Conn, size int, seed uint64) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for dir, p := range [][2]*Conn{{c, s}, {s, c}} {
		wg.Add(2)
		seed := seed + uint64(dir)
		go func() { defer wg.Done(); errs <- hashedWrite(p[0], size, seed) }()
		go func() { defer wg.Done(); errs <- hashedRead(p[1], size, seed) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// hashedWrite writes size bytes of the stream seed in random pieces, with
// a write deadline moved before each.
func hashedWrite(c net.Conn, size int, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 2))
	data := streamBytes(size, seed)
	for len(data) > 0 {
		n := 1 + rng.IntN(min(len(data), 100_000))
		if err := c.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			return err
		}
		k, err := c.Write(data[:n])
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if k != n {
			return fmt.Errorf("short write %d of %d", k, n)
		}
		data = data[n:]
	}
	return nil
}

// hashedRead reads size bytes in random pieces and checks them against
// the stream seed.
func hashedRead(c net.Conn, size int, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 3))
	want := sha256.Sum256(streamBytes(size, seed))
	h := sha256.New()
	buf := make([]byte, 70_000)
	for got := 0; got < size; {
		if err := c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
			return err
		}
		n, err := c.Read(buf[:1+rng.IntN(len(buf)-1)])
		h.Write(buf[:n])
		got += n
		if err != nil {
			return fmt.Errorf("read after %d of %d bytes: %w", got, size, err)
		}
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		return fmt.Errorf("the %d bytes read differ from those written", size)
	}
	return nil
}

func streamBytes(size int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestSwitchCloseWriteRacesUpgrade: CloseWrite at different points of the
// upgrade; the peer reads everything, then EOF, and can still answer.
func TestSwitchCloseWriteRacesUpgrade(t *testing.T) {
	registerSim(t)
	for i, after := range []time.Duration{time.Nanosecond, 20 * time.Microsecond, 100 * time.Microsecond, time.Millisecond, 5 * time.Millisecond} {
		t.Run(fmt.Sprint(after), func(t *testing.T) {
			cfg := swCfg("sim", after)
			ln := listen(t, cfg)
			c, s := dialAccept(t, ln, cfg)
			defer c.Close()
			defer s.Close()
			msg := streamBytes(1000*(i+1), uint64(i))
			_, err := c.Write(msg)
			require.NoError(t, err)
			require.NoError(t, c.CloseWrite())
			_ = s.SetReadDeadline(time.Now().Add(time.Minute))
			got, err := io.ReadAll(s)
			require.NoError(t, err)
			require.Equal(t, msg, got)
			_, err = s.Write([]byte("answer"))
			require.NoError(t, err)
			require.NoError(t, s.CloseWrite())
			_ = c.SetReadDeadline(time.Now().Add(time.Minute))
			got, err = io.ReadAll(c)
			require.NoError(t, err)
			require.Equal(t, "answer", string(got))
			_, err = c.Write([]byte("x"))
			assert.ErrorIs(t, err, syscall.EPIPE)
		})
	}
}

// TestDialWaitsForUpgrade: with UpgradeAfter negative, Dial returns
// with both directions on the ring, and the listener's end follows.
func TestDialWaitsForUpgrade(t *testing.T) {
	registerSim(t)
	ln := listen(t, swCfg("sim", time.Millisecond))
	c, s := pipe(t, ln, swCfg("sim", -1))
	defer c.Close()
	defer s.Close()
	assert.True(t, receivable(Settled(c)), "Dial returned before the upgrade ran its course")
	assert.Equal(t, "sim", TransportOf(c), c.Info().Reason)
	info := c.Info()
	require.Len(t, info.Switches, 2, "both directions moved")
	go func() { _, _ = io.Copy(s, s) }()
	echoTrip(t, c, "over the ring")
	if _, err := settleWithin(s, 10*time.Second); err != nil {
		t.Fatal("the server's end did not settle")
	}
	assert.Equal(t, "sim", TransportOf(s))
}

// TestDialWaitsNoTransport: a Dial that may not fall back fails with
// ErrNoTransport when the server takes no transport it offers, and one
// that may returns the connection on TCP, saying why.
func TestDialWaitsNoTransport(t *testing.T) {
	registerSim(t)
	ln := listen(t, &Config{Transports: []string{"shm", "tcp"}})
	d := Dialer{Config: &Config{Transports: []string{"sim"}}}
	_, err := d.Dial("tcp", ln.Addr().String())
	require.ErrorIs(t, err, ErrNoTransport)
	stale, err := ln.Accept() // the server's end, which stays on TCP
	require.NoError(t, err)
	stale.Close()

	c, s := pipe(t, ln, swCfg("sim", -1))
	defer c.Close()
	defer s.Close()
	assert.Equal(t, "tcp", TransportOf(c))
	assert.True(t, c.Info().Fallback)
	go func() { _, _ = io.Copy(s, s) }()
	echoTrip(t, c, "over tcp")
}

// TestVersion1ClientDeclined: a listener answers a version-1 hello with
// Decline{version} and closes the connection, so that an older client
// dials again plainly.
func TestVersion1ClientDeclined(t *testing.T) {
	ln := listen(t, nil)
	raw := dialRaw(t, ln)
	hello := []byte(handshake.Magic)
	hello = append(hello, 1, byte(handshake.TypeHello), 0, 3, 0, 0, 0)
	_, err := raw.Write(hello)
	require.NoError(t, err)
	require.NoError(t, raw.SetReadDeadline(time.Now().Add(10*time.Second)))
	m, err := handshake.Read(raw)
	require.NoError(t, err)
	d, ok := m.(*handshake.Decline)
	require.True(t, ok, "answered %v", m.Type())
	assert.Equal(t, handshake.DeclineVersion, d.Code)
	_, err = raw.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
}

// busyPipe connects a switching pair over sim, upgrading at once, through
// a listener whose endpoint-setup places are all taken: the client's first
// offer is declined ("server busy"). release frees the places.
func busyPipe(t *testing.T) (c, s *Conn, ln *Listener, release func()) {
	registerSim(t)
	cfg := swCfg("sim", time.Nanosecond)
	ln = listen(t, cfg)
	release = takeSetups(ln)
	c, s = pipe(t, ln, cfg)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s, ln, release
}

// TestSwitchBusyServerDeclines: an upgrade past the listener's setup
// places is declined; the connection stays on TCP, visibly, and works.
func TestSwitchBusyServerDeclines(t *testing.T) {
	noReupgrade(t) // TestSwitchBusyServerOffersAgain: what follows
	c, s, ln, release := busyPipe(t)
	release()
	info := c.Info()
	assert.Equal(t, "tcp", info.Transport)
	assert.True(t, info.Fallback)
	assert.Equal(t, CodeDeclined, info.Code)
	assert.Contains(t, info.Reason, "server busy")
	require.Len(t, info.Switches, 1)
	assert.Equal(t, "tcp", info.Switches[0].To)
	assert.Equal(t, uint64(1), ln.Stats().Busy)
	go func() { _, _ = io.Copy(s, s) }()
	echoTrip(t, c, "over tcp")
}

// TestSwitchBusyServerOffersAgain: a client whose offer a busy server
// declined offers again after the backoff, is declined again while the
// server stays busy, and moves to the ring once it has room. The first
// decline settled the connection; the switch log shows every attempt.
func TestSwitchBusyServerOffersAgain(t *testing.T) {
	registerSim(t)
	reupgradeScale.Store(100) // 1 ms, 2 ms, 4 ms, ...
	t.Cleanup(func() { reupgradeScale.Store(1) })
	c, s, ln, release := busyPipe(t)
	go func() { _, _ = io.Copy(s, s) }()
	select {
	case <-Settled(c):
	default:
		t.Fatal("the decline did not settle the connection")
	}
	assert.Equal(t, CodeDeclined, c.Info().Code)
	require.Eventually(t, func() bool { return ln.Stats().Busy >= 3 }, 10*time.Second, time.Millisecond, "offers while busy: %d", ln.Stats().Busy)
	echoTrip(t, c, "still over tcp")
	release()
	require.Eventually(t, func() bool { return bothDirectionsOnRing(c) && bothDirectionsOnRing(s) }, 10*time.Second, time.Millisecond, "not on the ring: %+v", c.Info())
	echoTrip(t, c, "over the ring")
	info := c.Info()
	assert.Equal(t, "sim", info.Transport)
	assert.Equal(t, CodeAgreed, info.Code)
	var declined, moved int
	for _, e := range info.Switches {
		switch {
		case e.From == "tcp" && e.To == "tcp":
			declined++
			assert.Contains(t, e.Cause, "server busy")
		case e.From == "tcp" && e.To == "sim":
			moved++
		}
	}
	assert.GreaterOrEqual(t, declined, 3, "%+v", info.Switches)
	assert.Equal(t, 2, moved, "%+v", info.Switches)
}

// TestSwitchOffersAgainOnlyWhenBusy: after an upgrade that ended without a
// ring, the client offers again (after the backoff) only if the server
// said it was busy; not after a server that could not prepare its side, a
// connect that failed, or a policy. A server played by hand answers the
// first offer and reports a second.
func TestSwitchOffersAgainOnlyWhenBusy(t *testing.T) {
	registerSim(t)
	reupgradeScale.Store(100) // 1 ms
	t.Cleanup(func() { reupgradeScale.Store(1) })
	for _, tc := range []struct {
		name   string
		answer handshake.Message
		again  bool
		code   string
	}{
		{"busy", &handshake.Decline{Code: handshake.DeclineResources, Reason: "server busy"}, true, CodeDeclined},
		{"unavailable", &handshake.Decline{Code: handshake.DeclineUnavailable, Reason: "sim: out of memory"}, false, CodeDeclined},
		{"connect failed", &handshake.Accept{Transport: handshake.TransportShm}, false, CodeConnectFail},
		{"policy", &handshake.Decline{Code: handshake.DeclinePolicy, Reason: "not here"}, false, CodeDeclined},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, second := serveByHand(t, func(raw net.Conn) error {
				for offers := 0; ; {
					_, m, err := handshake.Next(raw)
					if err != nil {
						return err
					}
					switch m.(type) {
					case *handshake.UpgradeOffer:
						if offers++; offers == 2 {
							return nil
						}
						if err := handshake.Write(raw, tc.answer); err != nil {
							return err
						}
					case *handshake.Confirm:
					default:
						return fmt.Errorf("got %T", m)
					}
				}
			})
			over := make(chan struct{}, 1)
			testHookUpgradeOver.set(func(w *swConn) {
				if w.raw.RemoteAddr().String() == addr { // not an earlier case's
					wake(over)
				}
			})
			defer testHookUpgradeOver.set(nil)
			c, err := (&Dialer{Config: swCfg("sim", time.Nanosecond)}).Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			select {
			case <-over:
			case <-time.After(10 * time.Second):
				t.Fatal("the first upgrade did not end")
			}
			w := c.(*Conn).w
			w.mu.Lock()
			setbacks := w.setbacks
			w.mu.Unlock()
			assert.Equal(t, tc.code, c.(*Conn).Info().Code)
			if !tc.again {
				assert.Zero(t, setbacks, "no new upgrade is armed")
				return
			}
			assert.Equal(t, 1, setbacks)
			select {
			case err := <-second:
				require.NoError(t, err, "the second offer")
			case <-time.After(10 * time.Second):
				t.Fatal("no second offer")
			}
		})
	}
}

// rawSwitchClient opens a switching connection to ln by hand and returns
// the socket after the server's Upgrade, and the server's Conn.
func rawSwitchClient(t *testing.T, ln *Listener) (net.Conn, *Conn) {
	t.Helper()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { raw.Close() })
	require.NoError(t, handshake.Write(raw, switchHello([]string{"sim"})))
	_ = raw.SetReadDeadline(time.Now().Add(time.Minute))
	m, err := handshake.Read(raw)
	require.NoError(t, err)
	require.IsType(t, &handshake.Upgrade{}, m)
	s, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return raw, s.(*Conn)
}

// switchHello is the Hello of a client at the default settings.
func switchHello(names []string) *handshake.Hello {
	s, err := (*Config)(nil).resolve()
	if err != nil {
		panic(err)
	}
	return s.switchHello(names)
}

func frame(t *testing.T, m handshake.Message) []byte {
	b, err := handshake.Append(nil, m)
	require.NoError(t, err)
	return b
}

// TestSwitchHostilePeer: a client that breaks the switching protocol's
// rules gets its connection reset (the server reads the valid data first,
// then an error matching ECONNRESET); nothing panics or hangs, and the
// listener serves the next client.
func TestSwitchHostilePeer(t *testing.T) {
	registerSim(t)
	data := &handshake.Data{Payload: []byte("12345")}
	cases := []struct {
		name   string
		frames []handshake.Message
		raw    []byte // after the frames
		want   string // in the error
	}{
		{"switch cursor short of the data", []handshake.Message{data, &handshake.Switch{Cursor: 3}}, nil, "switch"},
		{"switch cursor past the data", []handshake.Message{data, &handshake.Switch{Cursor: 1 << 40}}, nil, "switch"},
		{"switch without an agreed ring", []handshake.Message{data, &handshake.Switch{Cursor: 5}}, nil, "without an agreed ring"},
		{"fin cursor wrong", []handshake.Message{data, &handshake.Fin{Cursor: 4}}, nil, "fin at 4"},
		{"goodbye cursor wrong", []handshake.Message{data, &handshake.Goodbye{FinalProd: 10}}, nil, "does not match"},
		{"accept from the client", []handshake.Message{data, &handshake.Accept{Transport: handshake.TransportSim}}, nil, "without an offer"},
		{"confirm without an accept", []handshake.Message{data, &handshake.Confirm{}}, nil, "without an accept"},
		{"a second hello", []handshake.Message{data, &handshake.Hello{Offers: []handshake.Offer{{Transport: handshake.TransportSim}}}}, nil, "unexpected hello"},
		{"resume", []handshake.Message{data, &handshake.Resume{Cursor: 0}}, nil, "resume at 0 without a failover"},
		{"truncated data frame", []handshake.Message{data}, func() []byte {
			var hb [handshake.HeaderLen]byte
			handshake.PutDataHeader(&hb, 100)
			return append(hb[:], "short"...)
		}(), "vanished"},
		{"garbage", []handshake.Message{data}, []byte("GET / HTTP/1.1\r\n\r\n"), "bootstrap"},
		{"an offer with a bad ring", []handshake.Message{data, &handshake.UpgradeOffer{Offer: handshake.Offer{Transport: handshake.TransportSim}}}, nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln := listen(t, swCfg("sim", time.Nanosecond))
			raw, s := rawSwitchClient(t, ln)
			var out []byte
			for _, m := range tc.frames {
				out = append(out, frame(t, m)...)
			}
			_, err := raw.Write(append(out, tc.raw...))
			require.NoError(t, err)
			if tc.want == "vanished" {
				raw.Close() // the payload never comes
			}
			if tc.want == "" {
				// A bad offer is declined, not fatal: the connection
				// stays on TCP and says why.
				m, err := handshake.Read(raw)
				require.NoError(t, err)
				require.IsType(t, &handshake.Decline{}, m)
				got := make([]byte, 5)
				_ = s.SetReadDeadline(time.Now().Add(time.Minute))
				_, err = io.ReadFull(s, got)
				require.NoError(t, err)
				assert.Equal(t, "12345", string(got))
				// The server records its decline once it is sent:
				// Settled is when the outcome is final.
				awaitSettledEnd(t, s)
				assert.Equal(t, CodeDeclined, s.Info().Code)
				return
			}
			_ = s.SetReadDeadline(time.Now().Add(time.Minute))
			got, err := io.ReadAll(s)
			if tc.want == "vanished" {
				// A Read that reads the socket itself hands on a Data
				// payload as it arrives, as TCP does; the cut shows as
				// the reset that follows.
				assert.Contains(t, []string{"12345", "12345short"}, string(got))
			} else {
				assert.Equal(t, "12345", string(got))
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, syscall.ECONNRESET)
			assert.Contains(t, err.Error(), tc.want)
			_, err = s.Write([]byte("x"))
			assert.Error(t, err)
			// The listener serves the next client.
			c2, s2 := pipe(t, ln, swCfg("sim", time.Nanosecond))
			defer c2.Close()
			defer s2.Close()
			assert.Equal(t, "sim", TransportOf(c2), c2.Info().Reason)
		})
	}
}

// validOffer is an Offer of a prepared sim endpoint, as an honest client
// makes it, for raw clients.
func validOffer(t *testing.T, raw net.Conn) *handshake.UpgradeOffer {
	t.Helper()
	set, err := swCfg("sim", time.Hour).resolve()
	require.NoError(t, err)
	ep, err := set.newEndpoint("sim", raw, peerRing{max: 64 << 10})
	require.NoError(t, err)
	t.Cleanup(func() { ep.Close() })
	return &handshake.UpgradeOffer{Offer: handshake.Offer{Transport: handshake.TransportSim, Ring: ringOf(ep.Ring()), Info: ep.Info()}}
}

// offerAccepted sends a valid Offer on raw and reads the server's Accept.
func offerAccepted(t *testing.T, raw net.Conn) {
	t.Helper()
	_, err := raw.Write(frame(t, validOffer(t, raw)))
	require.NoError(t, err)
	m, err := handshake.Read(raw)
	require.NoError(t, err)
	require.IsType(t, &handshake.Accept{}, m)
}

// TestSwitchConfirmBounds: a client that was accepted must confirm, and
// send nothing else first: one that sends Data instead, or nothing within
// twice the server's HandshakeTimeout, has its connection reset, and the
// endpoint the server prepared for it released.
func TestSwitchConfirmBounds(t *testing.T) {
	registerSim(t)
	for _, tc := range []struct {
		name string
		then []handshake.Message // after reading the Accept
		want string
	}{
		{"data instead", []handshake.Message{&handshake.Data{Payload: []byte("x")}}, "data between an offer and its confirm"},
		{"silence", nil, "did not confirm sim within 200ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := swCfg("sim", time.Hour)
			cfg.HandshakeTimeout = 100 * time.Millisecond
			ln := listen(t, cfg)
			raw, s := rawSwitchClient(t, ln)
			offerAccepted(t, raw)
			for _, f := range tc.then {
				_, err := raw.Write(frame(t, f))
				require.NoError(t, err)
			}
			_ = s.SetReadDeadline(time.Now().Add(time.Minute))
			_, err := s.Read(make([]byte, 1))
			require.Error(t, err)
			assert.ErrorIs(t, err, syscall.ECONNRESET)
			assert.Contains(t, err.Error(), tc.want)
			m, err := handshake.Read(raw)
			require.NoError(t, err)
			g, ok := m.(*handshake.Goodbye)
			require.True(t, ok, "%v", m.Type())
			assert.True(t, g.Abort)
		})
	}
}

// TestSwitchOfferRightAfterDecliningConfirm: a client may offer again in
// the same write as the Confirm that declined the last Accept; the
// server answers the new offer instead of taking it for a second upgrade
// at once.
func TestSwitchOfferRightAfterDecliningConfirm(t *testing.T) {
	registerSim(t)
	ln := listen(t, swCfg("sim", time.Hour))
	raw, s := rawSwitchClient(t, ln)
	offerAccepted(t, raw)
	both := append(frame(t, &handshake.Confirm{Code: handshake.DeclineFailed, Reason: "changed my mind"}), frame(t, validOffer(t, raw))...)
	_, err := raw.Write(both)
	require.NoError(t, err)
	m, err := handshake.Read(raw)
	require.NoError(t, err)
	require.IsType(t, &handshake.Accept{}, m, "the second offer is answered")
	// The server's end is still usable: the client's Data after its
	// Confirm reaches it.
	_, err = raw.Write(frame(t, &handshake.Confirm{Code: handshake.DeclineFailed, Reason: "again"}))
	require.NoError(t, err)
	_, err = raw.Write(frame(t, &handshake.Data{Payload: []byte("ok")}))
	require.NoError(t, err)
	got := make([]byte, 2)
	_ = s.SetReadDeadline(time.Now().Add(time.Minute))
	_, err = io.ReadFull(s, got)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(got))
}

// TestSwitchHostileServer: a server that switches without an agreed ring
// resets the client's connection.
func TestSwitchHostileServer(t *testing.T) {
	registerSim(t)
	addr := fakeServer(t, func(_ int, c net.Conn) {
		if _, err := handshake.Read(c); err != nil {
			return
		}
		up, _ := handshake.Append(nil, &handshake.Upgrade{Transports: []handshake.Transport{handshake.TransportSim}})
		sw, _ := handshake.Append(nil, &handshake.Switch{Cursor: 0})
		_, _ = c.Write(append(up, sw...))
		_, _ = io.Copy(io.Discard, c)
	})
	d := Dialer{Config: swCfg("sim", time.Hour), Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	assert.Contains(t, err.Error(), "without an agreed ring")
}

// TestSwitchGoodbyeCursor: the goodbye's final cursor counts the bytes
// sent on both paths.
func TestSwitchGoodbyeCursor(t *testing.T) {
	registerSim(t)
	cfg := swCfg("sim", time.Hour)
	ln := listen(t, cfg)
	c, s := dialAccept(t, ln, cfg)
	defer s.Close()
	_, err := c.Write(make([]byte, 1000))
	require.NoError(t, err)
	c.w.kick()
	awaitSettled(t, c, s)
	_, err = c.Write(make([]byte, 500))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	_ = s.SetReadDeadline(time.Now().Add(time.Minute))
	n, err := io.Copy(io.Discard, s)
	require.NoError(t, err)
	assert.Equal(t, int64(1500), n)
}

// TestSwitchWriteThenPeerCloses: a Write whose bytes all went out
// returns without error even when the peer read them, answered and closed
// before the Write returned (it used to report a broken pipe: the frame is
// written from the caller, so the peer can be that quick; the old code
// failed within 50 cycles).
func TestSwitchWriteThenPeerCloses(t *testing.T) {
	cfg := &Config{Transports: []string{"shm"}, UpgradeAfter: time.Millisecond}
	ln := listen(t, cfg)
	served := oneByteEcho(ln)
	d := Dialer{Config: cfg}
	for i := range 500 {
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		var one [1]byte
		if _, err := c.Write(one[:]); err != nil {
			t.Fatal(i, err)
		}
		if _, err := io.ReadFull(c, one[:]); err != nil {
			t.Fatal(i, err)
		}
		c.Close()
		if err := <-served; err != nil {
			t.Fatal(i, err)
		}
	}
}

// TestSwitchWithoutTCP: without tcp among the transports, the connection
// runs on TCP only until its upgrade: an upgrade that fails resets it,
// saying why, and a listener with no common transport refuses the
// dial.
func TestSwitchWithoutTCP(t *testing.T) {
	registerSim(t)
	cfg := &Config{Transports: []string{"sim"}, RingSize: 64 << 10, UpgradeAfter: time.Nanosecond}
	ln := listen(t, cfg)
	release := takeSetups(ln)
	c, s := dialAccept(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := c.Read(make([]byte, 1))
	// Either side may fail it first: each resets with the same reason.
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	assert.Contains(t, err.Error(), "TCP fallback is not allowed")
	assert.Contains(t, err.Error(), "server busy")
	release()

	// A listener without tcp that takes none of the transports offered
	// declines the hello and closes: Dial fails, even for a client that
	// would take TCP.
	shmOnly := listen(t, &Config{Transports: []string{"shm"}})
	for _, dc := range []*Config{cfg, swCfg("sim", time.Nanosecond)} {
		d := Dialer{Config: dc, Timeout: 10 * time.Second}
		_, err = d.Dial("tcp", shmOnly.Addr().String())
		assert.ErrorIs(t, err, ErrNoTransport)
		assert.ErrorContains(t, err, "no common transport")
	}
}

// TestServerWithoutTCPWantsARing: a listener without tcp resets a
// connection whose client offers no upgrade within its HandshakeTimeout.
func TestServerWithoutTCPWantsARing(t *testing.T) {
	registerSim(t)
	ln := listen(t, &Config{Transports: []string{"sim"}, HandshakeTimeout: 100 * time.Millisecond})
	c, s := dialAccept(t, ln, swCfg("sim", time.Hour))
	defer c.Close()
	defer s.Close()
	for _, x := range []*Conn{s, c} {
		_ = x.SetReadDeadline(time.Now().Add(time.Minute))
		_, err := x.Read(make([]byte, 1))
		assert.ErrorIs(t, err, syscall.ECONNRESET)
		assert.ErrorContains(t, err, "no ring within 100ms and TCP is not allowed here")
	}
}

// TestSwitchOfferFlood: clients that answer every Decline with another
// Offer (for a transport the server does not allow) get Declines, and
// past maxOffers on a connection Declines that cost the server nothing
// (DeclinePolicy); the server's upgrade bookkeeping holds (one upgrade at
// a time, each ending its own), and nothing panics.
func TestSwitchOfferFlood(t *testing.T) {
	registerSim(t)
	ln := listen(t, swCfg("sim", time.Hour))
	go drainAccepted(ln)
	offer := frame(t, &handshake.UpgradeOffer{Offer: handshake.Offer{Transport: handshake.TransportShm}})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			raw, err := net.Dial("tcp", ln.Addr().String())
			if !assert.NoError(t, err) {
				return
			}
			defer raw.Close()
			_ = raw.SetDeadline(time.Now().Add(time.Minute))
			_, err = raw.Write(frame(t, switchHello([]string{"sim"})))
			require.NoError(t, err)
			m, err := handshake.Read(raw)
			require.NoError(t, err)
			require.IsType(t, &handshake.Upgrade{}, m)
			for i := range 300 {
				if _, err := raw.Write(offer); err != nil {
					t.Error(err)
					return
				}
				m, err := handshake.Read(raw)
				if !assert.NoError(t, err) || !assert.IsType(t, &handshake.Decline{}, m) {
					return
				}
				// Past maxOffers the server declines without looking.
				d := m.(*handshake.Decline)
				if i < maxOffers {
					assert.Equal(t, handshake.DeclineUnavailable, d.Code, "offer %d: %s", i, d.Reason)
				} else if !assert.Equal(t, handshake.DeclinePolicy, d.Code, "offer %d: %s", i, d.Reason) {
					return
				}
			}
		}()
	}
	wg.Wait()
}

// TestSwitchLargeWriteDuringUpgrade: a Write of 16 MiB to an echo server
// runs while the connection upgrades; the client's upgrade must not wait
// for the Write (which waits for ring room, which needs the server's
// Switch handled) before it ends. Every byte comes back.
func TestSwitchLargeWriteDuringUpgrade(t *testing.T) {
	registerSim(t)
	cfg := swCfg("sim", time.Hour)
	ln := listen(t, cfg)
	c, s := dialAccept(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	go func() { _, _ = io.Copy(s, s) }()
	const size = 16 << 20
	msg := streamBytes(size, 7)
	werr := make(chan error, 1)
	go func() { _, err := c.Write(msg); werr <- err }()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	got := make([]byte, size)
	_, err := io.ReadFull(c, got[:1<<20])
	require.NoError(t, err)
	c.w.kick()
	_, err = io.ReadFull(c, got[1<<20:])
	require.NoError(t, err)
	require.True(t, bytes.Equal(msg, got))
	require.NoError(t, <-werr)
	awaitSettled(t, c, s)
	assert.Equal(t, "sim", TransportOf(c))
}

// TestSwitchSlowReaderDuringUpgrade: while the server's application does
// not read for longer than HandshakeTimeout, the client's Confirm waits
// behind unread Data; the server waits for it instead of giving up, and
// the connection neither resets nor loses a byte.
func TestSwitchSlowReaderDuringUpgrade(t *testing.T) {
	registerSim(t)
	cfg := swCfg("sim", time.Hour)
	cfg.HandshakeTimeout = 300 * time.Millisecond
	ln := listen(t, cfg)
	c, s := dialAccept(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	c.w.kick()
	const size = 8 << 20
	msg := streamBytes(size, 3)
	werr := make(chan error, 1)
	go func() { _, err := c.Write(msg); werr <- err }()
	// The server's reader stops at its queue's bound with the Confirm
	// (or the Offer) behind it; the application reads nothing for three
	// handshake timeouts.
	time.Sleep(3 * cfg.HandshakeTimeout)
	_ = s.SetReadDeadline(time.Now().Add(time.Minute))
	got, err := io.ReadAll(io.LimitReader(s, size))
	require.NoError(t, err)
	require.True(t, bytes.Equal(msg, got), "read %d of %d bytes", len(got), size)
	require.NoError(t, <-werr)
}

// TestSwitchCloseReadBeforeTheRing: CloseRead on TCP carries over to the
// ring installed later: the peer's Writes into it do not stall.
func TestSwitchCloseReadBeforeTheRing(t *testing.T) {
	registerSim(t)
	cfg := swCfg("sim", time.Hour)
	ln := listen(t, cfg)
	c, s := dialAccept(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	require.NoError(t, s.CloseRead())
	_, err := c.Write(make([]byte, 1<<20))
	require.NoError(t, err)
	c.w.kick()
	awaitSettled(t, c, s)
	require.Equal(t, "sim", TransportOf(c))
	_ = c.SetWriteDeadline(time.Now().Add(time.Minute))
	_, err = c.Write(make([]byte, 1<<20))
	require.NoError(t, err)
}

// TestSwitchTinyFramesAreBounded: a peer that sends one-byte Data frames
// to an application that does not read fills the receive queue with at
// most recvQueue/entryCost of them before the reader stops; then every
// byte is read in order.
func TestSwitchTinyFramesAreBounded(t *testing.T) {
	registerSim(t)
	ln := listen(t, swCfg("sim", time.Hour))
	raw, s := rawSwitchClient(t, ln)
	const frames = 20000
	var out []byte
	for i := range frames {
		out = append(out, frame(t, &handshake.Data{Payload: []byte{byte(i)}})...)
	}
	werr := make(chan error, 1)
	go func() { _, err := raw.Write(out); werr <- err }()
	deadline := time.Now().Add(time.Minute)
	for !s.w.parked.Load() {
		require.True(t, time.Now().Before(deadline), "the reader never stopped for room")
		time.Sleep(time.Millisecond)
	}
	s.w.mu.Lock()
	held := len(s.w.rq)
	s.w.mu.Unlock()
	assert.LessOrEqual(t, held, recvQueue/entryCost+1)
	_ = s.SetReadDeadline(time.Now().Add(time.Minute))
	got := make([]byte, frames)
	_, err := io.ReadFull(s, got)
	require.NoError(t, err)
	for i, b := range got {
		require.Equal(t, byte(i), b, "byte %d", i)
	}
	require.NoError(t, <-werr)
}

// TestSettled: Settled is closed at once for connections that cannot
// change transport (not rsock's, plain TCP); on the switching protocol it
// closes once the upgrade ran (the transport then is the ring's), or when
// the connection ends before any upgrade.
func TestSettled(t *testing.T) {
	registerSim(t)
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	assert.True(t, closed(Settled(a)), "not an rsock conn")

	v1 := swCfg("sim", -1)
	c, s := pipe(t, listen(t, v1), v1)
	assert.True(t, closed(Settled(c)))
	assert.True(t, closed(Settled(s)))
	c.Close()
	s.Close()

	now := swCfg("sim", time.Nanosecond)
	ln := listen(t, now)
	d := Dialer{Config: now, Timeout: 10 * time.Second}
	cc, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer cc.Close()
	tr, err := settleWithin(cc, time.Minute)
	require.NoError(t, err, "no upgrade within a minute: %+v", cc.(*Conn).Info())
	assert.Equal(t, "sim", tr)

	later := swCfg("sim", time.Hour)
	later.UpgradeBytes = 1 << 30
	ln2 := listen(t, later)
	d2 := Dialer{Config: later, Timeout: 10 * time.Second}
	lc, err := d2.Dial("tcp", ln2.Addr().String())
	require.NoError(t, err)
	assert.False(t, closed(Settled(lc)), "on TCP until an upgrade an hour away")
	lc.Close()
	assert.True(t, closed(Settled(lc)), "the connection ended")
}

// TestWaitSettled: WaitSettled returns at once for a connection that
// cannot change transport, with nil even for a context already done; for
// one that has settled likewise, with its transport; and for one still
// upgrading, ctx's error once ctx is done, with the transport it is on.
func TestWaitSettled(t *testing.T) {
	registerSim(t)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	tr, err := WaitSettled(done, a)
	assert.Equal(t, "", tr)
	assert.NoError(t, err)

	v1 := swCfg("sim", -1)
	c, s := pipe(t, listen(t, v1), v1)
	defer c.Close()
	defer s.Close()
	tr, err = WaitSettled(done, c)
	assert.Equal(t, "sim", tr)
	assert.NoError(t, err)

	later := swCfg("sim", time.Hour)
	later.UpgradeBytes = 1 << 30
	ln := listen(t, later)
	d := Dialer{Config: later, Timeout: 10 * time.Second}
	lc, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer lc.Close()
	tr, err = settleWithin(lc, 10*time.Millisecond)
	assert.Equal(t, "tcp", tr)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// serveByHand plays a switching server by hand for one connection: it
// reads the client's magic and Hello, answers Upgrade with sim, and runs f
// on the connection, which it then closes (orderly). It returns the
// address to dial, and a channel that gets f's error, or the handshake's.
func serveByHand(t *testing.T, f func(raw net.Conn) error) (string, <-chan error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	forgetEarly(ln.Addr().String()) // the port may have been an rsock listener's
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			raw, err := ln.Accept()
			if err != nil {
				return err
			}
			defer raw.Close()
			if _, err = io.ReadFull(raw, make([]byte, len(handshake.Magic))); err == nil {
				_, err = handshake.ReadAfterMagic(raw) // the Hello
			}
			if err == nil {
				err = handshake.Write(raw, &handshake.Upgrade{Flags: handshake.UpgradeGrow, Transports: []handshake.Transport{handshake.TransportSim}})
			}
			if err != nil {
				return err
			}
			return f(raw)
		}()
	}()
	return ln.Addr().String(), done
}

// TestNoUpgradeAfterThePeerEnded: a client whose server ended the
// connection before the upgrade's time prepares no endpoint when the time
// comes: the connection stays on TCP, and its reason says no offer was made.
func TestNoUpgradeAfterThePeerEnded(t *testing.T) {
	registerSim(t)
	addr, served := serveByHand(t, func(net.Conn) error { return nil }) // closes after the Upgrade
	over := make(chan struct{}, 1)
	testHookUpgradeOver.set(func(w *swConn) {
		if w.raw.RemoteAddr().String() == addr {
			wake(over)
		}
	})
	defer testHookUpgradeOver.set(nil)
	c, err := (&Dialer{Config: swCfg("sim", time.Hour)}).Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, <-served)
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the server's end")
	c.(*Conn).w.kick() // the policy's time
	select {
	case <-over:
	case <-time.After(10 * time.Second):
		t.Fatal("the upgrade did not end")
	}
	info := c.(*Conn).Info()
	assert.Equal(t, "tcp", info.Transport)
	assert.Contains(t, info.Reason, "before the upgrade began")
}

// TestUpgradeEndsWhenThePeerCloses: a server that closes the connection
// (orderly, at a frame boundary) while the client's Offer waits for its
// answer ends that upgrade: the connection settles on TCP, and Reads see
// the end. (An http.Server shutting down closes connections it never
// served this way; the client waited for the answer until its own Close.)
func TestUpgradeEndsWhenThePeerCloses(t *testing.T) {
	registerSim(t)
	// The connection's orderly close when f returns: no answer to the Offer.
	addr, served := serveByHand(t, func(raw net.Conn) error {
		_, m, err := handshake.Next(raw)
		if _, ok := m.(*handshake.UpgradeOffer); err == nil && !ok {
			err = fmt.Errorf("got %T, want the client's offer", m)
		}
		return err
	})
	cfg := swCfg("sim", time.Nanosecond)
	c, err := (&Dialer{Config: cfg}).Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, <-served)
	awaitSettledEnd(t, c.(*Conn))
	info := c.(*Conn).Info()
	assert.Equal(t, "tcp", info.Transport)
	assert.Equal(t, CodeDeclined, info.Code)
	assert.Contains(t, info.Reason, "closed the connection before it answered")
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
}

// wake signals ch (capacity 1) without blocking.
func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
