package e2e

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/rsock"
)

// firstBytesListener records the first bytes the application reads from
// each accepted connection.
type firstBytesListener struct {
	net.Listener
	mu    sync.Mutex
	heads [][]byte
}

func (l *firstBytesListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &firstBytesConn{Conn: c, l: l}, nil
}

type firstBytesConn struct {
	net.Conn
	l    *firstBytesListener
	once sync.Once
}

func (c *firstBytesConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.once.Do(func() {
			c.l.mu.Lock()
			c.l.heads = append(c.l.heads, bytes.Clone(b[:n]))
			c.l.mu.Unlock()
		})
	}
	return n, err
}

func (c *firstBytesConn) NetConn() net.Conn { return c.Conn }

// delayingProxy forwards connections to target; the client-to-server bytes
// of the first connection are held back for delay, as a stalled client
// process or a slow network would.
func delayingProxy(t *testing.T, target string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			go func() { io.Copy(c, s); c.Close() }()
			go func(first bool) {
				if first {
					time.Sleep(delay)
				}
				io.Copy(s, c)
				s.(*net.TCPConn).CloseWrite()
			}(i == 0)
		}
	}()
	return ln.Addr().String()
}

// TestSlowHelloDoesNotPoisonProbeCache is the regression test for a
// misbehaviour the concurrent suites ran into under load (-race, -cpu 1,
// 200 simultaneous dials on sim): an rsock client whose magic arrived after
// the listener's SniffTimeout was handed to Accept as plain TCP, the
// application read the hello as data (net/http answered 400), and the
// client took that answer for a plain server's and remembered the verdict
// for ProbeCacheTTL, sending every later dial from the process to TCP.
// Now the listener declines a late hello on the same connection (the
// application never sees it) and the dialer caches a verdict only after two
// probes in a row agree.
func TestSlowHelloDoesNotPoisonProbeCache(t *testing.T) {
	sim := transportCase{name: "sim", provider: "sim"}
	if why := sim.unavailable(); why != "" {
		t.Skip(why)
	}
	const sniff = 100 * time.Millisecond
	lc := &rsock.ListenConfig{Config: &rsock.Config{Transports: []string{"sim", "tcp"}, SniffTimeout: sniff}}
	rln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &firstBytesListener{Listener: rln}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	// The first connection's hello is late: 4x the sniff timeout.
	addr := delayingProxy(t, rln.Addr().String(), 4*sniff)
	d := &rsock.Dialer{Timeout: 30 * time.Second, Config: &rsock.Config{Transports: []string{"sim", "tcp"}}}
	c1, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	info1, _ := rsock.InfoOf(c1)
	t.Logf("late hello: %s (%s)", info1.Transport, info1.Reason)
	c1.Close()

	// The second connection is prompt: it should get sim.
	c2, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := checkTransport(c2, "sim"); err != nil {
		t.Errorf("a prompt dial after one late hello: %v", err)
	}

	// The server read c1's bytes before it answered them, which was
	// before the first Dial returned.
	ln.mu.Lock()
	defer ln.mu.Unlock()
	for _, h := range ln.heads {
		if bytes.HasPrefix(h, []byte(handshake.Magic)) {
			t.Errorf("the application read rsock's handshake as its data: %q", h[:min(len(h), 32)])
		}
	}
}
