package clients

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
	"golang.org/x/sync/errgroup"

	"github.com/rdmanet/rdmanet/rsock"
)

// bodyLenHeader is the header in which the echo handler reports the length
// of the body it received.
const bodyLenHeader = "X-Body-Len"

// fasthttpServer serves an echo handler on an rsock listener with cfg,
// until the test ends: a POST's body comes back as the response's body,
// with its length in bodyLenHeader. Its read and write timeouts make
// fasthttp set deadlines on the connection for every request.
func fasthttpServer(t *testing.T, cfg *rsock.Config) *recordingListener {
	t.Helper()
	lc := rsock.ListenConfig{Config: cfg}
	inner, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := &recordingListener{Listener: inner}
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if !ctx.IsPost() {
				ctx.Error("POST only", fasthttp.StatusMethodNotAllowed)
				return
			}
			body := ctx.PostBody()
			ctx.Response.Header.Set(bodyLenHeader, strconv.Itoa(len(body)))
			ctx.SetContentType("application/octet-stream")
			ctx.SetBody(body)
		},
		ReadTimeout:  10 * time.Second,
		WriteTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.ShutdownWithContext(ctx); err != nil {
			t.Errorf("fasthttp server shutdown: %v", err)
		}
		assert.NoError(t, <-served, "Serve")
		for _, c := range ln.conns() {
			c.Close()
		}
	})
	return ln
}

// fasthttpClient is a HostClient for addr whose connections come from d.
func fasthttpClient(t *testing.T, addr string, d *dialRecorder, maxConns int) *fasthttp.HostClient {
	c := &fasthttp.HostClient{
		Addr: addr,
		Dial: func(addr string) (net.Conn, error) {
			return d.DialContext(context.Background(), "tcp", addr)
		},
		MaxConns:                  maxConns,
		MaxConnWaitTimeout:        30 * time.Second, // wait for a free connection rather than fail
		ReadTimeout:               10 * time.Second,
		WriteTimeout:              10 * time.Second,
		MaxIdemponentCallAttempts: 1, // a failure must show, not be retried away
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// randomBytes returns n bytes from rng.
func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, (n+7)&^7)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b[:n]
}

// requireSettledOn waits, for at most 30 s each, for every one of conns to
// settle, and checks that it is on transport tr; side names the end in
// the messages.
func requireSettledOn(t *testing.T, tr, side string, conns []net.Conn) {
	t.Helper()
	require.NotEmpty(t, conns, "%s: no connections", side)
	for _, c := range conns {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		got, err := rsock.WaitSettled(ctx, c)
		cancel()
		if err != nil {
			t.Fatalf("%s: a connection's upgrade did not settle in 30 s: %+v", side, mustInfo(c))
		}
		assert.Equal(t, tr, got, "%s: %+v", side, mustInfo(c))
	}
}

// TestFastHTTP runs fasthttp's HostClient against a fasthttp server, both
// on rsock: 8 workers share at most 4 connections for 40 POSTs each, with
// bodies of 1 B to 256 KiB that the server echoes. Both ends set read and
// write deadlines on the connection around every request, which the
// connection must honour across its upgrade. Every body must come back
// byte for byte, no call may hang, and every connection must end up on
// the subtest's transport at both ends.
func TestFastHTTP(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			cfg := suiteConfig(tr)
			ln := fasthttpServer(t, cfg)
			dialed := &dialRecorder{d: rsock.Dialer{Config: cfg, Timeout: 10 * time.Second}}
			addr := ln.Addr().String()
			client := fasthttpClient(t, addr, dialed, 4)

			const workers, rounds = 8, 40
			var g errgroup.Group
			for w := range workers {
				g.Go(func() error {
					rng := rand.New(rand.NewPCG(uint64(w), 39))
					req := fasthttp.AcquireRequest()
					defer fasthttp.ReleaseRequest(req)
					resp := fasthttp.AcquireResponse()
					defer fasthttp.ReleaseResponse(resp)
					for i := range rounds {
						k := rng.IntN(18)
						size := 1<<k + rng.IntN(1<<k+1) // 1 B to 256 KiB, spread over the powers of two
						body := randomBytes(rng, size)
						req.Reset()
						resp.Reset()
						req.SetRequestURI(fmt.Sprintf("http://%s/echo/%d/%d", addr, w, i))
						req.Header.SetMethod(fasthttp.MethodPost)
						req.SetBody(body)
						if err := client.Do(req, resp); err != nil {
							return fmt.Errorf("POST %d.%d (%d B): %w", w, i, size, err)
						}
						if sc := resp.StatusCode(); sc != fasthttp.StatusOK {
							return fmt.Errorf("POST %d.%d (%d B): status %d: %q", w, i, size, sc, resp.Body())
						}
						if got := string(resp.Header.Peek(bodyLenHeader)); got != strconv.Itoa(size) {
							return fmt.Errorf("POST %d.%d: the server read %q bytes of %d", w, i, got, size)
						}
						if got := resp.Body(); !bytes.Equal(got, body) {
							return fmt.Errorf("POST %d.%d: %d bytes back for %d, or different bytes", w, i, len(got), size)
						}
					}
					return nil
				})
			}
			waitGroup(t, &g, 2*time.Minute)

			assert.LessOrEqual(t, client.ConnsCount(), 4, "at most 4 connections")
			requireSettledOn(t, tr, "server side", ln.conns())
			requireSettledOn(t, tr, "client side", dialed.conns())
		})
	}
}
