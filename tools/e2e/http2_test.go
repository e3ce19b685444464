package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// h2cSetup serves over HTTP/1.1 and h2c (HTTP/2 without TLS, with prior
// knowledge), with room for many concurrent streams.
func h2cSetup(srv *http.Server) {
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1000}
}

// h2cClient speaks only h2c with prior knowledge.
func h2cClient(t *testing.T, tc transportCase) *httpClient {
	c := newHTTPClient(t, tc)
	c.tr.Protocols = new(http.Protocols)
	c.tr.Protocols.SetUnencryptedHTTP2(true)
	return c
}

// protoMux adds GET /proto: the protocol and TLS state the server saw.
func protoMux() *http.ServeMux {
	mux := commonMux()
	mux.HandleFunc("GET /proto", func(w http.ResponseWriter, r *http.Request) {
		alpn := "none"
		if r.TLS != nil {
			alpn = r.TLS.NegotiatedProtocol
		}
		fmt.Fprintf(w, "%s alpn=%s", r.Proto, alpn)
	})
	return mux
}

func TestHTTP2Cleartext(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		s := startHTTP(t, tc, tc.name, protoMux(), h2cSetup)
		c := h2cClient(t, tc)
		for i := range scaled(100, 20) {
			if got := get(t, c.Client, s.url+"/proto"); got != "HTTP/2.0 alpn=none" {
				t.Fatalf("request %d: the server saw %q", i, got)
			}
		}
		upload(t, c.Client, s.url, 7, scaled[int64](8<<20, 1<<20))
		download(t, c.Client, s.url, 8, scaled[int64](8<<20, 1<<20))
		// Every request went over one connection. (Not the dial count:
		// net/http's HTTP/2 pool may dial a spare at the first request
		// and close it unused; seen here, 2 of 150 runs under load. See
		// TestPlainHTTPClient.)
		if u := s.used.Load(); u != 1 {
			t.Fatalf("%d connections served the requests (%d client dials), want 1", u, c.dials.Load())
		}
		// An HTTP/1.1 client on the same server still works.
		c1 := newHTTPClient(t, tc)
		if got := get(t, c1.Client, s.url+"/proto"); got != "HTTP/1.1 alpn=none" {
			t.Fatalf("HTTP/1.1 client: the server saw %q", got)
		}
	})
}

// selfSigned returns a server certificate for the IP address host and a
// pool that trusts it.
func selfSigned(t testing.TB, host string) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	ip := net.ParseIP(host)
	if ip == nil {
		t.Fatalf("selfSigned: %q is not an IP address", host)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "rsock e2e"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{ip},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// startTLS serves h with crypto/tls over an rsock listener: the stock
// tls.NewListener around rsock's, ALPN offering h2 and http/1.1.
func startTLS(t *testing.T, tc transportCase, h http.Handler) (*httpServer, *x509.CertPool) {
	t.Helper()
	cert, pool := selfSigned(t, tc.host)
	s := newHTTPServer(t, tc, tc.name, h, func(srv *http.Server) {
		srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: 1000}
	})
	ln := tc.listen(t)
	s.serve(t, ln, tlsListener(ln, cert), "https://")
	return s, pool
}

// tlsListener is crypto/tls's own listener around ln, offering h2 and
// http/1.1 by ALPN.
func tlsListener(ln net.Listener, cert tls.Certificate) net.Listener {
	return tls.NewListener(ln, &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
	})
}

// tlsClient dials with rsock and runs crypto/tls on top, offering protos
// by ALPN.
func tlsClient(t *testing.T, tc transportCase, pool *x509.CertPool, protos ...string) *httpClient {
	c := newHTTPClient(t, tc)
	dial := c.tr.DialContext
	c.tr.DialContext = nil
	c.tr.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: tc.host, NextProtos: protos})
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		// TransportOf looks through *tls.Conn to the rsock conn.
		if err := checkTransport(conn, tc.name); err != nil {
			conn.Close()
			return nil, err
		}
		return conn, nil
	}
	c.tr.ForceAttemptHTTP2 = true
	return c
}

func TestHTTP2TLS(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		s, pool := startTLS(t, tc, protoMux())

		c := tlsClient(t, tc, pool, "h2", "http/1.1")
		for i := range scaled(50, 10) {
			resp, err := c.Get(s.url + "/proto")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "HTTP/2.0 alpn=h2" || resp.ProtoMajor != 2 || resp.TLS == nil || resp.TLS.NegotiatedProtocol != "h2" {
				t.Fatalf("request %d: server saw %q, client got %s", i, b, resp.Proto)
			}
		}
		upload(t, c.Client, s.url, 9, scaled[int64](8<<20, 1<<20))
		download(t, c.Client, s.url, 10, scaled[int64](8<<20, 1<<20))
		// One connection served them all (not the dial count: as in
		// TestHTTP2Cleartext, the pool may dial a spare and close it).
		if u := s.used.Load(); u != 1 {
			t.Fatalf("%d connections served the requests (%d client dials), want 1", u, c.dials.Load())
		}

		// A client offering only http/1.1 gets HTTP/1.1 over TLS, on a
		// connection of its own.
		c1 := tlsClient(t, tc, pool, "http/1.1")
		if got := get(t, c1.Client, s.url+"/proto"); got != "HTTP/1.1 alpn=http/1.1" {
			t.Fatalf("http/1.1 over TLS: the server saw %q", got)
		}
		if u := s.used.Load(); u != 2 {
			t.Errorf("%d connections served the requests, want 2", u)
		}
	})
}

func TestHTTP2ConcurrentStreams(t *testing.T) {
	for _, mode := range []string{"h2c", "tls"} {
		t.Run(mode, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, tc transportCase) {
				streams := scaled(500, 50)
				// All streams wait in the handler until every one has
				// arrived: 500 (50 at the small scale) are open at once
				// on one connection.
				b := newBarrier(streams)
				mux := protoMux()
				mux.HandleFunc("POST /together", func(w http.ResponseWriter, r *http.Request) {
					in, err := io.ReadAll(r.Body)
					if err != nil {
						http.Error(w, err.Error(), http.StatusBadRequest)
						return
					}
					if err := b.wait(r.Context()); err != nil {
						http.Error(w, err.Error(), http.StatusServiceUnavailable)
						return
					}
					w.Write(in) // echo, after everyone arrived
				})
				var s *httpServer
				var c *httpClient
				if mode == "h2c" {
					s = startHTTP(t, tc, tc.name, mux, h2cSetup)
					c = h2cClient(t, tc)
				} else {
					var pool *x509.CertPool
					s, pool = startTLS(t, tc, mux)
					c = tlsClient(t, tc, pool, "h2")
				}
				// One request first, so the client knows the server's
				// stream limit before the burst.
				if got := get(t, c.Client, s.url+"/proto"); got[:8] != "HTTP/2.0" {
					t.Fatalf("not HTTP/2: %q", got)
				}
				var wg sync.WaitGroup
				errs := make(chan error, streams)
				for i := range streams {
					wg.Go(func() {
						body := make([]byte, 4<<10)
						io.ReadFull(data(uint64(i)), body)
						resp, err := c.Post(s.url+"/together", "application/octet-stream", bytesReader(body))
						if err != nil {
							b.abort()
							errs <- err
							return
						}
						defer resp.Body.Close()
						got, err := io.ReadAll(resp.Body)
						switch {
						case err != nil:
							errs <- err
						case resp.StatusCode != http.StatusOK:
							errs <- fmt.Errorf("stream %d: %s: %s", i, resp.Status, got)
						case resp.ProtoMajor != 2:
							errs <- fmt.Errorf("stream %d: %s", i, resp.Proto)
						case sha(got) != sha(body):
							errs <- fmt.Errorf("stream %d: echo differs", i)
						}
					})
				}
				wg.Wait()
				close(errs)
				reportErrors(t, "", collect(errs))
				// One connection served every stream (not the dial
				// count: under load net/http's HTTP/2 pool dials spares
				// during the burst and closes them unused, as in
				// TestHTTP2Cleartext; seen as 3 dials with one
				// connection serving beside two CPU hogs, and as 71
				// dials in a loaded make test).
				if u := s.used.Load(); u != 1 {
					t.Errorf("%d connections served the streams (%d client dials, %d server connections), want 1", u, c.dials.Load(), s.conns.Load())
				}
			})
		})
	}
}
