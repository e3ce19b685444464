package rsock

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/rdmanet/rdmanet/internal/rsockenv"
	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

// tcpOnly allows only the TCP fallback.
func tcpOnly() *Config { return &Config{Transports: []string{"tcp"}} }

// listen starts an rsock listener on loopback and closes it at the end.
func listen(t testing.TB, cfg *Config) *Listener {
	t.Helper()
	lc := ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	return ln.(*Listener)
}

// pipe dials ln and accepts the other end.
func pipe(t testing.TB, ln *Listener, cfg *Config) (client, server *Conn) {
	t.Helper()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	d := Dialer{Config: cfg, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	// A hang guard: a server that failed after the client switched (and
	// aborted the connection) hands nothing to Accept.
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		awaitSettled(t, c.(*Conn), r.c.(*Conn))
		return c.(*Conn), r.c.(*Conn)
	case <-time.After(time.Minute):
		c.Close()
		info, _ := InfoOf(c)
		t.Fatalf("dialled, but nothing accepted within a minute (client: %+v)", info)
		return nil, nil
	}
}

// awaitSettled waits until a switching connection's upgrade has run its
// course on both ends (the client's end decides whether there is one), so
// that tests of a transport's data path run on it.
func awaitSettled(t testing.TB, c, s *Conn) {
	t.Helper()
	awaitSettledEnd(t, c)
	if c.Info().Transport == "tcp" {
		return // no ring: the server's end may never hear of an upgrade
	}
	awaitSettledEnd(t, s)
}

// awaitSettledEnd waits until x's end of a switching connection has
// settled (a plain one has nothing to wait for).
func awaitSettledEnd(t testing.TB, x *Conn) {
	t.Helper()
	if _, err := settleWithin(x, time.Minute); err != nil {
		t.Fatalf("the upgrade did not settle within a minute: %+v", x.Info())
	}
}

// settleWithin is WaitSettled for at most d.
func settleWithin(c net.Conn, d time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return WaitSettled(ctx, c)
}

func TestNettestTCPFallback(t *testing.T) {
	// Nothing accelerated is registered in this test binary unless a sim
	// test registered it; force the decline path by allowing only tcp on
	// the server while the client offers what it has.
	ln := listen(t, tcpOnly())
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		c, s := pipe(t, ln, nil)
		assert.Equal(t, "tcp", TransportOf(c))
		assert.Equal(t, "tcp", TransportOf(s))
		return c, s, func() { c.Close(); s.Close() }, nil
	})
}

func TestNettestTCPFallbackSwapped(t *testing.T) {
	ln := listen(t, tcpOnly())
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		c, s := pipe(t, ln, nil)
		return s, c, func() { c.Close(); s.Close() }, nil
	})
}

// echo copies everything back until EOF.
func echo(c net.Conn) {
	defer c.Close()
	_, _ = io.Copy(c, c)
}

func TestPlainClientAgainstListener(t *testing.T) {
	ln := listen(t, nil)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			assert.Equal(t, "tcp", TransportOf(c))
			info, _ := InfoOf(c)
			assert.Contains(t, info.Reason, "does not speak rsock")
			go echo(c)
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	msg := "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	_, err = c.Write([]byte(msg))
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, msg, string(got), "the sniffed bytes must be replayed")
}

func TestPlainClientServerSpeaksFirst(t *testing.T) {
	ln := listen(t, &Config{SniffTimeout: 50 * time.Millisecond})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("220 hello\r\n"))
		line, _ := bufio.NewReader(c).ReadString('\n')
		_, _ = c.Write([]byte("got " + line))
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	banner, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "220 hello\r\n", banner)
	_, err = c.Write([]byte("QUIT\r\n"))
	require.NoError(t, err)
	reply, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "got QUIT\r\n", reply)
}

func TestStockHTTPClientAgainstListener(t *testing.T) {
	ln := listen(t, nil)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "hello "+r.URL.Path)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String() + "/x")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, "hello /x", string(body))
}

// plainServer runs handler on each connection of a plain TCP listener.
func plainServer(t *testing.T, handler func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	forgetEarly(ln.Addr().String()) // the port may have been an rsock listener's
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handler(c)
		}
	}()
	return ln.Addr().String()
}

// simOffer makes Dial offer something so that it sends a hello: the tests
// that probe plain servers need one. It registers sim if not yet there.
func dialProbing(t *testing.T, addr string, cfg *Config) (*Conn, error) {
	t.Helper()
	registerSim(t)
	if cfg == nil {
		cfg = &Config{}
	}
	cfg.Transports = []string{"sim", "tcp"}
	d := Dialer{Config: cfg, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*Conn), nil
}

func TestDialPlainServers(t *testing.T) {
	cases := []struct {
		name    string
		handler func(net.Conn)
		reason  string
		verdict bool // an answer: remembered after two probes; silence or a close is not
	}{
		{"echo", echo, "echoed", true},
		{"speaks-first", func(c net.Conn) {
			defer c.Close()
			_, _ = c.Write([]byte("220 smtp ready\r\n"))
			_, _ = io.Copy(io.Discard, c)
		}, "magic", true},
		{"closes", func(c net.Conn) {
			buf := make([]byte, 1)
			_, _ = c.Read(buf)
			c.Close()
		}, "ended", false},
		{"silent", func(c net.Conn) {
			defer c.Close()
			_, _ = io.Copy(io.Discard, c)
		}, "did not answer", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr := plainServer(t, tc.handler)
			t.Cleanup(func() { plainServers.forget("tcp " + addr) })
			c, err := dialProbing(t, addr, &Config{ProbeTimeout: 200 * time.Millisecond})
			require.NoError(t, err)
			defer c.Close()
			info := c.Info()
			assert.Equal(t, "tcp", info.Transport)
			assert.True(t, info.Fallback)
			assert.Contains(t, info.Reason, tc.reason)
			// One probe is not a verdict: the second dial probes again;
			// after two answers in a row the third does not. Silence and
			// a close are never a verdict.
			c2, err := dialProbing(t, addr, &Config{ProbeTimeout: 200 * time.Millisecond})
			require.NoError(t, err)
			defer c2.Close()
			assert.NotContains(t, c2.Info().Reason, "remembered")
			c3, err := dialProbing(t, addr, &Config{ProbeTimeout: 200 * time.Millisecond})
			require.NoError(t, err)
			defer c3.Close()
			if tc.verdict {
				assert.Contains(t, c3.Info().Reason, "remembered")
			} else {
				assert.Contains(t, c3.Info().Reason, tc.reason)
				assert.False(t, plainServers.known("tcp "+addr))
			}
		})
	}
	// The redialled connection works end to end.
	addr := plainServer(t, echo)
	t.Cleanup(func() { plainServers.forget("tcp " + addr) })
	c, err := dialProbing(t, addr, nil)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	assert.Equal(t, "ping", string(got))
}

func TestDialPlainServerWithoutFallback(t *testing.T) {
	addr := plainServer(t, echo)
	t.Cleanup(func() { plainServers.forget("tcp " + addr) })
	registerSim(t)
	d := Dialer{Config: &Config{Transports: []string{"sim"}}}
	_, err := d.Dial("tcp", addr)
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrNoTransport)
	var oe *net.OpError
	assert.True(t, errors.As(err, &oe))
}

func TestDialContextCancelled(t *testing.T) {
	// A server that accepts and says nothing: the probe would wait, the
	// cancelled context must end the dial first.
	addr := plainServer(t, func(c net.Conn) { time.Sleep(5 * time.Second); c.Close() })
	t.Cleanup(func() { plainServers.forget("tcp " + addr) })
	registerSim(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	d := Dialer{Config: &Config{Transports: []string{"sim", "tcp"}, ProbeTimeout: 10 * time.Second}}
	start := time.Now()
	_, err := d.DialContext(ctx, "tcp", addr)
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Less(t, time.Since(start), 5*time.Second)
}

func TestBadNetworkAndConfig(t *testing.T) {
	_, err := Dial("udp", "127.0.0.1:1")
	assert.Error(t, err)
	_, err = Listen("unix", "/tmp/x")
	assert.Error(t, err)
	d := Dialer{Config: &Config{Transports: []string{"carrier-pigeon"}}}
	_, err = d.Dial("tcp", "127.0.0.1:1")
	var ce *ConfigError
	assert.True(t, errors.As(err, &ce), "%v", err)
	rsockenv.Setenv(t, "RSOCK_RING_SIZE", "3000")
	_, err = Dial("tcp", "127.0.0.1:1")
	assert.True(t, errors.As(err, &ce), "%v", err)
	assert.True(t, strings.Contains(err.Error(), "RSOCK_RING_SIZE") || strings.Contains(err.Error(), "RingSize"))
}

// slowOpen is a provider whose Opens after the first `fast` take `delay`:
// a server that prepares its endpoint slowly (a host whose RDMA device
// registers memory in software, under a burst of dials).
type slowOpen struct {
	verbs.Provider
	fast  int32
	delay time.Duration
	opens atomic.Int32
}

func (p *slowOpen) Open(oo verbs.OpenOptions) (verbs.Device, error) {
	if p.opens.Add(1) > p.fast {
		time.Sleep(p.delay)
	}
	return p.Provider.Open(oo)
}

// TestDialSlowServerIsNotPlain: a server that takes longer than the
// client's ProbeTimeout to prepare its endpoint is still an rsock server:
// it answers the magic before it prepares anything, so the dial waits for
// it (within HandshakeTimeout) instead of taking it for a plain server,
// falling back and remembering that.
func TestDialSlowServerIsNotPlain(t *testing.T) {
	registerSim(t)
	slow := &slowOpen{Provider: simProv, fast: 1, delay: 500 * time.Millisecond} // the client's Open is the first
	transport.Register("sim", slow)
	t.Cleanup(func() { transport.Register("sim", simProv) })
	cfg := &Config{Transports: []string{"sim", "tcp"}, RingSize: 64 << 10, ProbeTimeout: 100 * time.Millisecond}
	ln := listen(t, cfg)
	key := "tcp " + ln.Addr().String()
	t.Cleanup(func() { plainServers.forget(key) })
	for i := range 2 { // two misreadings in a row would be remembered
		c, s := pipe(t, ln, cfg)
		assert.Equal(t, "sim", TransportOf(c), "dial %d: %s", i, c.Info().Reason)
		assert.Equal(t, "sim", TransportOf(s), "dial %d: %s", i, s.Info().Reason)
		c.Close()
		s.Close()
		slow.opens.Store(0)
	}
	assert.False(t, plainServers.known(key), "the slow rsock server was remembered as plain")
}

// TestRegistrationRefusedFallsBack: a host that refuses to register the
// staging buffer (its RLIMIT_MEMLOCK reached; here sim's MRLimit lets each
// device register its ring and receive buffers, not the staging) costs the
// connection its ring, not the connection: both sides continue on TCP with
// the reason. The staging is registered before either side switches; it
// used to be registered after, and the connection was aborted.
func TestRegistrationRefusedFallsBack(t *testing.T) {
	registerSim(t)
	cfg := simCfg()
	withFaults(t, sim.Faults{MRLimit: int64(2*cfg.RingSize) - 1})
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	// The server records its decline once it is sent, so the client can
	// read it first: Settled is when the server's outcome is final.
	awaitSettledEnd(t, s)
	for _, x := range []*Conn{c, s} {
		info := x.Info()
		assert.Equal(t, "tcp", TransportOf(x), info.Reason)
		assert.Contains(t, info.Reason, "staging", "the reason names what was refused")
		assert.Contains(t, info.Reason, "MRLimit")
	}
	// The server's own limit (ENOMEM) says so; its client was declined,
	// as for a busy server, and may offer again later.
	assert.Equal(t, CodeLocalLimit, s.Info().Code)
	assert.Equal(t, CodeDeclined, c.Info().Code)
	assert.Contains(t, c.Info().Reason, "resources")
	_, err := c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(s, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))
}

// TestProbeCacheCounts: the cache's size, which lets a lookup in an empty
// cache skip the lock, follows every way an entry comes and goes.
func TestProbeCacheCounts(t *testing.T) {
	p := &probeCache{entries: map[string]probeEntry{}, need: 2}
	size := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		require.Equal(t, len(p.entries), int(p.size.Load()))
		return len(p.entries)
	}
	assert.False(t, p.known("a"))
	assert.False(t, p.add("a", time.Hour), "one strike is no verdict")
	assert.False(t, p.known("a"))
	assert.True(t, p.add("a", time.Hour))
	assert.True(t, p.known("a"))
	assert.Equal(t, 1, size())
	p.forget("a")
	assert.False(t, p.known("a"))
	assert.Equal(t, 0, size())

	p.add("b", -time.Second) // expired already: known drops it
	assert.Equal(t, 1, size())
	assert.False(t, p.known("b"))
	assert.Equal(t, 0, size())

	for i := range maxProbeCache + 1 {
		p.add(strconv.Itoa(i), time.Hour)
	}
	assert.Equal(t, 1, size(), "a full cache is cleared before the next entry")
	assert.False(t, p.known("0"))
}

// TestDialShortPlainReply: a plain server that answers the client's first
// bytes with a reply shorter than the magic ("+OK\r\n", as a line server
// may) is taken for a plain server at once: the reply does not start with
// the magic. It used to be judged only at ProbeTimeout, as a server that
// does not answer (no-answer).
func TestDialShortPlainReply(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go serveAccepted(ln, func(c net.Conn) {
		if _, err := c.Read(make([]byte, 512)); err == nil {
			_, _ = c.Write([]byte("+OK\r\n"))
			_, _ = io.Copy(io.Discard, c)
		}
	})
	key := "tcp " + ln.Addr().String()
	t.Cleanup(func() { plainServers.forget(key) })
	d := Dialer{Config: &Config{Transports: []string{"shm", "tcp"}, ProbeTimeout: 30 * time.Second}, Timeout: time.Minute}
	c, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	info, _ := InfoOf(c)
	assert.Equal(t, CodePlainServer, info.Code, info.Reason)
}
