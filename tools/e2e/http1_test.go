package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestHTTP1KeepAlive(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		s := startHTTP(t, tc, tc.name, commonMux(), nil)
		c := newHTTPClient(t, tc)
		n := scaled(200, 20)
		for i := range n {
			if got := get(t, c.Client, s.url+"/hello"); got != "hello over HTTP/1.1\n" {
				t.Fatalf("request %d: %q", i, got)
			}
		}
		// Bodies in both directions on the same connection too.
		upload(t, c.Client, s.url, 1, 300<<10)
		download(t, c.Client, s.url, 2, 300<<10)
		if d, a := c.dials.Load(), s.conns.Load(); d != 1 || a != 1 {
			t.Fatalf("%d requests took %d client dials and %d server connections, want 1 and 1", n+2, d, a)
		}
	})
}

// bigTransfer is the size of the HTTP/1.1 upload and download. 64 MiB
// each way takes about 2s on sim under -race, so it is not shortened on a
// host; at the small scale, 4 MiB is still many times any ring.
var bigTransfer = scaled[int64](64<<20, 4<<20)

func TestHTTP1BigTransfers(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		s := startHTTP(t, tc, tc.name, commonMux(), nil)
		c := newHTTPClient(t, tc)
		t.Logf("%d MiB each way", bigTransfer>>20)
		upload(t, c.Client, s.url, 3, bigTransfer)
		download(t, c.Client, s.url, 4, bigTransfer)
		if d := c.dials.Load(); d != 1 {
			t.Errorf("%d dials, want 1", d)
		}
	})
}

func TestHTTP1ConcurrentClients(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		clients := scaled(200, 20)
		// Every client's first request waits in the handler until all
		// of them arrived: 200 (20 at the small scale) connections are
		// open and busy at once.
		b := newBarrier(clients)
		mux := commonMux()
		mux.HandleFunc("GET /together", func(w http.ResponseWriter, r *http.Request) {
			if err := b.wait(r.Context()); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprint(w, "together")
		})
		s := startHTTP(t, tc, tc.name, mux, nil)
		var wg sync.WaitGroup
		errs := make(chan error, clients)
		for i := range clients {
			c := newHTTPClient(t, tc) // its own Transport: its own connection
			wg.Go(func() {
				if err := clientRun(c, s.url, uint64(1000+i)); err != nil {
					b.abort()
					errs <- fmt.Errorf("client %d: %w", i, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		reportErrors(t, "", collect(errs))
		if a := s.conns.Load(); a != int64(clients) {
			t.Errorf("the server saw %d connections, want %d", a, clients)
		}
	})
}

// clientRun is one of the concurrent clients: the rendezvous, then a few
// requests with bodies on the same connection.
func clientRun(c *httpClient, base string, seed uint64) error {
	fetch := func(method, url string, body io.Reader) (string, error) {
		req, _ := http.NewRequest(method, url, body)
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, b)
		}
		return string(b), err
	}
	if got, err := fetch("GET", base+"/together", nil); err != nil || got != "together" {
		return fmt.Errorf("rendezvous: %q, %v", got, err)
	}
	const n = 16 << 10
	for range 3 {
		got, err := fetch("POST", base+"/upload", io.LimitReader(data(seed), n))
		if err != nil {
			return err
		}
		if want := fmt.Sprintf("%d %s", n, dataSum(seed, n)); got != want {
			return fmt.Errorf("upload: %q, want %q", got, want)
		}
		got, err = fetch("GET", fmt.Sprintf("%s/download?n=%d&seed=%d", base, n, seed), nil)
		if err != nil {
			return err
		}
		if sha([]byte(got)) != dataSum(seed, n) {
			return errors.New("download differs")
		}
	}
	if d := c.dials.Load(); d != 1 {
		return fmt.Errorf("%d dials, want 1", d)
	}
	c.tr.CloseIdleConnections()
	return nil
}

func TestHTTP1LargeHeaders(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		const size = 64 << 10
		mux := commonMux()
		mux.HandleFunc("GET /headers", func(w http.ResponseWriter, r *http.Request) {
			in := r.Header.Get("X-Big")
			// Send it back in a response header, and its hash in the body.
			w.Header().Set("X-Big-Back", in)
			fmt.Fprintf(w, "%d %s", len(in), sha([]byte(in)))
		})
		s := startHTTP(t, tc, tc.name, mux, func(srv *http.Server) { srv.MaxHeaderBytes = 256 << 10 })
		c := newHTTPClient(t, tc)
		big := strings.Repeat("0123456789abcdef", size/16)
		for range 3 { // keep-alive after a big header, too
			req, _ := http.NewRequest("GET", s.url+"/headers", nil)
			req.Header.Set("X-Big", big)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %s", resp.Status, body)
			}
			if want := fmt.Sprintf("%d %s", size, sha([]byte(big))); string(body) != want {
				t.Fatalf("the server got %q, want %q", body, want)
			}
			if resp.Header.Get("X-Big-Back") != big {
				t.Fatalf("the response header has %d bytes, want the %d sent", len(resp.Header.Get("X-Big-Back")), size)
			}
		}
		if d := c.dials.Load(); d != 1 {
			t.Errorf("%d dials, want 1", d)
		}

		// Past MaxHeaderBytes: 431, and the server closes the connection
		// gracefully (CloseWrite, then waits) so the client reads it.
		req, _ := http.NewRequest("GET", s.url+"/headers", nil)
		req.Header.Set("X-Big", strings.Repeat(big, 8))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("a 512 KiB header: %v, want a 431 response", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("a 512 KiB header: %s, want 431", resp.Status)
		}
	})
}

// countingReader counts the bytes read from it.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

func TestHTTP1ExpectContinue(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		mux := commonMux()
		mux.HandleFunc("POST /refuse", func(w http.ResponseWriter, r *http.Request) {
			// Answers without reading the body: no 100 Continue is
			// sent, so the client never sends the body.
			http.Error(w, "not this one", http.StatusForbidden)
		})
		s := startHTTP(t, tc, tc.name, mux, nil)
		c := newHTTPClient(t, tc) // ExpectContinueTimeout: the hang guard

		post := func(path string, n int64) (*http.Response, string, *countingReader, bool) {
			t.Helper()
			body := &countingReader{r: io.LimitReader(data(5), n)}
			var got100 atomic.Bool
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				Got100Continue: func() { got100.Store(true) },
			})
			req, _ := http.NewRequestWithContext(ctx, "POST", s.url+path, body)
			req.ContentLength = n
			req.Header.Set("Expect", "100-continue")
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("POST %s: %v", path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp, string(b), body, got100.Load()
		}

		n := scaled[int64](4<<20, 1<<20)
		resp, got, body, got100 := post("/upload", n)
		if resp.StatusCode != http.StatusOK || got != fmt.Sprintf("%d %s", n, dataSum(5, n)) {
			t.Fatalf("upload with Expect: %s %q", resp.Status, got)
		}
		if !got100 {
			t.Error("the client did not get 100 Continue")
		}
		if body.n.Load() != n {
			t.Errorf("the client sent %d body bytes, want %d", body.n.Load(), n)
		}

		resp, _, body, got100 = post("/refuse", n)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("refused upload: %s, want 403", resp.Status)
		}
		if got100 {
			t.Error("got 100 Continue from a handler that did not read the body")
		}
		if sent := body.n.Load(); sent != 0 {
			t.Errorf("the client sent %d body bytes to a server that refused them", sent)
		}

		// The server still works (on this or a new connection).
		if got := get(t, c.Client, s.url+"/hello"); got != "hello over HTTP/1.1\n" {
			t.Fatalf("after Expect: %q", got)
		}
	})
}

// holdMux serves GET /hold: it reports each arrival on arrived, then waits
// for release (or the request's end, reported on ended), then sends 1 MiB.
func holdMux(arrived chan<- struct{}, release <-chan struct{}, ended chan<- error) *http.ServeMux {
	mux := commonMux()
	mux.HandleFunc("GET /hold", func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			ended <- r.Context().Err()
			return
		}
		w.Header().Set("Content-Length", fmt.Sprint(1<<20))
		_, _ = io.CopyN(w, data(6), 1<<20)
	})
	return mux
}

func TestHTTP1GracefulShutdown(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		const inFlight = 8
		arrived := make(chan struct{}, inFlight)
		release := make(chan struct{})
		ended := make(chan error, inFlight)
		s := startHTTP(t, tc, tc.name, holdMux(arrived, release, ended), nil)
		c := newHTTPClient(t, tc)

		results := make(chan error, inFlight)
		for range inFlight {
			go func() {
				resp, err := c.Get(s.url + "/hold")
				if err != nil {
					results <- err
					return
				}
				defer resp.Body.Close()
				n, sum, err := hashReader(resp.Body)
				switch {
				case err != nil:
					results <- fmt.Errorf("reading: %w", err)
				case resp.StatusCode != http.StatusOK || n != 1<<20 || sum != dataSum(6, 1<<20):
					results <- fmt.Errorf("%s, %d bytes", resp.Status, n)
				default:
					results <- nil
				}
			}()
		}
		for i := range inFlight {
			waitFor(t, arrived, fmt.Sprintf("request %d reaching the handler", i))
		}

		shutdown := make(chan error, 1)
		go func() { shutdown <- s.srv.Shutdown(testContext(t)) }()
		// Shutdown closes the listener at once: new connections fail.
		waitUntil(t, func() bool {
			conn, err := tc.dial(testContext(t), s.ln.Addr().String())
			if err == nil {
				conn.Close()
			}
			return err != nil
		}, "the listener closing")
		select {
		case err := <-shutdown:
			t.Fatalf("Shutdown returned (%v) with %d requests in flight", err, inFlight)
		default:
		}

		close(release)
		for i := range inFlight {
			if err := waitFor(t, results, fmt.Sprintf("in-flight request %d", i)); err != nil {
				t.Errorf("an in-flight request failed during Shutdown: %v", err)
			}
		}
		if err := waitFor(t, shutdown, "Shutdown returning"); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		select {
		case err := <-ended:
			t.Errorf("a handler's context ended during a graceful shutdown: %v", err)
		default:
		}
	})
}

func TestHTTP1Close(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		const inFlight = 8
		arrived := make(chan struct{}, inFlight)
		release := make(chan struct{}) // never closed
		ended := make(chan error, inFlight)
		s := startHTTP(t, tc, tc.name, holdMux(arrived, release, ended), nil)
		c := newHTTPClient(t, tc)

		results := make(chan error, inFlight)
		for range inFlight {
			go func() {
				resp, err := c.Get(s.url + "/hold")
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil {
						err = fmt.Errorf("got a whole response: %s", resp.Status)
						results <- err
						return
					}
				}
				results <- nil // failed, as it should
			}()
		}
		for i := range inFlight {
			waitFor(t, arrived, fmt.Sprintf("request %d reaching the handler", i))
		}
		if err := s.srv.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		// Every in-flight request fails promptly (well within the hang
		// guard; the clients' own timeout is twice that), and every
		// handler sees its request's context end.
		for i := range inFlight {
			if err := waitFor(t, results, fmt.Sprintf("in-flight request %d failing", i)); err != nil {
				t.Error(err)
			}
		}
		for i := range inFlight {
			if err := waitFor(t, ended, fmt.Sprintf("handler %d seeing its context end", i)); !errors.Is(err, context.Canceled) {
				t.Errorf("handler %d: context ended with %v, want context.Canceled", i, err)
			}
		}
	})
}

// waitUntil polls cond until it holds, failing the test after the hang
// guard.
func waitUntil(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("hang guard: %s did not happen within %v", what, hangGuard)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHTTP1ClientGoesAway: a client that abandons a request (its context
// ends, and the Transport closes the connection) ends the handler's
// context on the server, which notices the closed connection.
func TestHTTP1ClientGoesAway(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		arrived := make(chan struct{}, 1)
		ended := make(chan error, 1)
		s := startHTTP(t, tc, tc.name, holdMux(arrived, nil, ended), nil)
		c := newHTTPClient(t, tc)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/hold", nil)
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		waitFor(t, arrived, "the request reaching the handler")
		cancel()
		if err := waitFor(t, errc, "the cancelled request returning"); !errors.Is(err, context.Canceled) {
			t.Fatalf("the client got %v, want context.Canceled", err)
		}
		if err := waitFor(t, ended, "the handler seeing the client go"); !errors.Is(err, context.Canceled) {
			t.Fatalf("the handler's context ended with %v, want context.Canceled", err)
		}
	})
}
