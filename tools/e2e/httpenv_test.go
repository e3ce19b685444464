package e2e

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/rsock"
)

// httpServer is a stock http.Server on an rsock listener that checks the
// transport of every connection it accepts and of every request it serves.
type httpServer struct {
	tc   transportCase
	want string // the transport the server side must see
	ln   net.Listener
	srv  *http.Server
	url  string // http://host:port

	conns     atomic.Int64 // connections accepted (StateNew)
	used      atomic.Int64 // connections that served a request (their first StateActive)
	mu        sync.Mutex
	wrongConn []string          // connections over the wrong transport
	active    map[net.Conn]bool // connections seen active, under mu
}

type connKey struct{}

// startHTTP serves h on a new rsock listener of the transport. The server
// side must see want (tc.name for rsock clients, "tcp" for plain ones).
// setup, if not nil, may change the server before it starts. Requests over
// the wrong transport fail with 500 and an explanation.
func startHTTP(t *testing.T, tc transportCase, want string, h http.Handler, setup func(*http.Server)) *httpServer {
	t.Helper()
	s := newHTTPServer(t, tc, want, h, setup)
	ln := tc.listen(t)
	s.serve(t, ln, ln, "http://")
	return s
}

func newHTTPServer(t *testing.T, tc transportCase, want string, h http.Handler, setup func(*http.Server)) *httpServer {
	s := &httpServer{tc: tc, want: want}
	s.srv = &http.Server{
		Handler:           s.checked(h),
		ReadHeaderTimeout: hangGuard,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateActive {
				s.mu.Lock()
				if !s.active[c] {
					if s.active == nil {
						s.active = map[net.Conn]bool{}
					}
					s.active[c] = true
					s.used.Add(1)
				}
				s.mu.Unlock()
			}
			if st != http.StateNew {
				return
			}
			s.conns.Add(1)
			if err := checkTransport(c, want); err != nil {
				s.mu.Lock()
				s.wrongConn = append(s.wrongConn, err.Error())
				s.mu.Unlock()
			}
		},
	}
	if setup != nil {
		setup(s.srv)
	}
	return s
}

// serve serves on served, which is ln or a listener wrapping it.
func (s *httpServer) serve(t *testing.T, ln, served net.Listener, scheme string) {
	s.ln, s.url = ln, scheme+ln.Addr().String()
	go s.srv.Serve(served)
	t.Cleanup(func() {
		s.srv.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		reportErrors(t, "server side: ", s.wrongConn)
	})
}

// checked serves h only on connections over the wanted transport.
func (s *httpServer) checked(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		if c == nil {
			http.Error(w, "no connection in the request's context", http.StatusInternalServerError)
			return
		}
		if err := checkTransport(c, s.want); err != nil {
			http.Error(w, "server side: "+err.Error(), http.StatusInternalServerError)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// httpClient is a stock http.Client whose Transport dials with rsock and
// refuses connections over the wrong transport. dials counts connections.
type httpClient struct {
	*http.Client
	tr    *http.Transport
	dials atomic.Int64
}

func newHTTPClient(t *testing.T, tc transportCase) *httpClient {
	c := &httpClient{}
	c.tr = &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := tc.dial(ctx, addr)
			if err == nil {
				c.dials.Add(1)
			}
			return conn, err
		},
		MaxIdleConnsPerHost:   256,
		ResponseHeaderTimeout: hangGuard,
		ExpectContinueTimeout: hangGuard,
	}
	c.Client = &http.Client{Transport: c.tr, Timeout: 2 * hangGuard}
	t.Cleanup(c.tr.CloseIdleConnections)
	return c
}

// handlers common to the suites.
func commonMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello over HTTP/%d.%d\n", r.ProtoMajor, r.ProtoMinor)
	})
	// GET /rsock: the transport of the request's connection and why.
	mux.HandleFunc("GET /rsock", func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(net.Conn)
		info, _ := rsock.InfoOf(c)
		fmt.Fprintf(w, "%s (%s)", info.Transport, info.Reason)
	})
	// POST /upload: "<size> <sha256>" of the body.
	mux.HandleFunc("POST /upload", func(w http.ResponseWriter, r *http.Request) {
		n, sum, err := hashReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintf(w, "%d %s", n, sum)
	})
	// GET /download?n=BYTES&seed=SEED: n bytes of data(seed).
	mux.HandleFunc("GET /download", func(w http.ResponseWriter, r *http.Request) {
		n, err1 := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		seed, err2 := strconv.ParseUint(r.URL.Query().Get("seed"), 10, 64)
		if err1 != nil || err2 != nil || n < 0 {
			http.Error(w, "bad n or seed", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		_, _ = io.CopyN(w, data(seed), n)
	})
	return mux
}

// get fetches url and returns the body, failing the test on any error or
// a status other than 200.
func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading body: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

// upload POSTs n bytes of data(seed) to /upload and checks the server's
// count and hash.
func upload(t *testing.T, c *http.Client, base string, seed uint64, n int64) {
	t.Helper()
	resp, err := c.Post(base+"/upload", "application/octet-stream", io.LimitReader(data(seed), n))
	if err != nil {
		t.Fatalf("upload of %d bytes: %v", n, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload of %d bytes: %s: %s", n, resp.Status, b)
	}
	if want := fmt.Sprintf("%d %s", n, dataSum(seed, n)); string(b) != want {
		t.Fatalf("upload of %d bytes: server got %q, want %q", n, b, want)
	}
}

// download GETs n bytes of data(seed) from /download and checks them.
func download(t *testing.T, c *http.Client, base string, seed uint64, n int64) {
	t.Helper()
	resp, err := c.Get(fmt.Sprintf("%s/download?n=%d&seed=%d", base, n, seed))
	if err != nil {
		t.Fatalf("download of %d bytes: %v", n, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("download of %d bytes: %s", n, resp.Status)
	}
	got, sum, err := hashReader(resp.Body)
	if err != nil {
		t.Fatalf("download of %d bytes: after %d: %v", n, got, err)
	}
	if got != n || sum != dataSum(seed, n) {
		t.Fatalf("download: got %d bytes with SHA-256 %s, want %d with %s", got, sum, n, dataSum(seed, n))
	}
}

func sha(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// reportErrors reports up to 10 of errs, those caused by a barrier's
// abort last, and how many more there were.
func reportErrors(t testing.TB, prefix string, errs []string) {
	t.Helper()
	aborted := func(e string) int {
		if strings.Contains(e, abortedMsg) {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(errs, func(a, b string) int { return cmp.Compare(aborted(a), aborted(b)) })
	for i, e := range errs {
		if i == 10 {
			t.Errorf("%s... and %d more", prefix, len(errs)-i)
			return
		}
		t.Errorf("%s%s", prefix, e)
	}
}

// collect drains errs (closed by the sender) for reportErrors.
func collect(errs <-chan error) []string {
	var out []string
	for err := range errs {
		out = append(out, err.Error())
	}
	return out
}

const abortedMsg = "another participant failed"

// barrier releases its waiters once n have arrived, or fails them all
// once one participant gave up (abort), so that one failure does not
// leave the rest waiting for the hang guard.
type barrier struct {
	n         int64
	arrived   atomic.Int64
	all       chan struct{}
	abortOnce sync.Once
	aborted   chan struct{}
}

func newBarrier(n int) *barrier {
	return &barrier{n: int64(n), all: make(chan struct{}), aborted: make(chan struct{})}
}

// wait returns nil once all n arrived, or an error.
func (b *barrier) wait(ctx context.Context) error {
	if b.arrived.Add(1) == b.n {
		close(b.all)
	}
	select {
	case <-b.all:
		return nil
	case <-b.aborted:
		return errors.New(abortedMsg)
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(hangGuard):
		return fmt.Errorf("hang guard: only %d of %d arrived", b.arrived.Load(), b.n)
	}
}

// abort fails every current and future wait that has not been released.
func (b *barrier) abort() { b.abortOnce.Do(func() { close(b.aborted) }) }
