package rsock_test

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"time"

	"github.com/rdmanet/rdmanet/rsock"
)

// echoServer accepts connections on ln until it is closed, and echoes
// what each one sends.
func echoServer(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// Listen and Dial replace net.Listen and net.Dial. The connection starts
// on TCP and moves to a ring (shm between processes of one host, verbs
// between hosts) in the background, where one can be had.
func Example() {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go echoServer(ln)

	c, err := rsock.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "hello, rsock")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(line)
	// Output: hello, rsock
}

// A stock net/http server serves an rsock listener, and an http.Client
// dials through an rsock Dialer. Plain HTTP clients (curl, a browser)
// reach the same listener over TCP.
func Example_http() {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", r.URL.Path)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	d := &rsock.Dialer{Timeout: 10 * time.Second}
	tr := &http.Transport{DialContext: d.DialContext}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: time.Minute}

	resp, err := client.Get("http://" + ln.Addr().String() + "/rsock")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(resp.Status, ": ", string(body))
	// Output: 200 OK: hello from /rsock
}

// crypto/tls runs over rsock connections as over any net.Conn: the
// server wraps the listener, the client wraps its connection. TransportOf
// and InfoOf look through the *tls.Conn.
func Example_tls() {
	// A throwaway self-signed certificate for "rsock.example".
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		DNSNames:     []string{"rsock.example"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		log.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		log.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)

	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go echoServer(tls.NewListener(ln, &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
	}))

	raw, err := rsock.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	c := tls.Client(raw, &tls.Config{RootCAs: roots, ServerName: "rsock.example"})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Fprintln(c, "hello over TLS")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(line)
	fmt.Println("TLS 1.3:", c.ConnectionState().Version == tls.VersionTLS13)
	_, isRsock := rsock.InfoOf(c)
	fmt.Println("an rsock connection underneath:", isRsock)
	// Output:
	// hello over TLS
	// TLS 1.3: true
	// an rsock connection underneath: true
}

// InfoOf says which transport carries a connection and why. Here both
// ends' Config allows only TCP, so the answer does not depend on the host
// (or on RSOCK_TRANSPORTS: a field set in code wins).
func ExampleInfoOf() {
	cfg := &rsock.Config{Transports: []string{"tcp"}}
	lc := &rsock.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()

	d := &rsock.Dialer{Config: cfg}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	// The client speaks first, as HTTP clients do: the listener sees at
	// once that it is not an rsock client.
	fmt.Fprintln(c, "hello")
	s, err := ln.Accept()
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()

	info, _ := rsock.InfoOf(c)
	fmt.Println("client:", rsock.TransportOf(c), info.Code, info.Fallback)
	info, _ = rsock.InfoOf(s)
	fmt.Println("server:", rsock.TransportOf(s), info.Code, info.Fallback)
	// Output:
	// client: tcp tcp-only false
	// server: tcp plain-client false
}

// WaitSettled waits, within a deadline, for a connection's upgrade to its
// ring to run its course. Where no ring can be had (no shm or verbs on
// this host, or the server declined) the connection settles on TCP, and
// InfoOf's Reason says why.
func ExampleWaitSettled() {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	go echoServer(ln)
	c, err := rsock.Dial("tcp", ln.Addr().String())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// The upgrade itself gives up after Config.HandshakeTimeout (5 s by
	// default); the deadline bounds the wait whatever happens.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	transport, err := rsock.WaitSettled(ctx, c)
	if err != nil {
		fmt.Println("not settled:", err)
		return
	}
	switch transport {
	case "verbs", "shm", "tcp":
		fmt.Println("settled")
	default:
		fmt.Println("settled on", transport)
	}

	// A connection rsock did not make has nothing to wait for.
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	transport, err = rsock.WaitSettled(ctx, a)
	fmt.Printf("%q %v\n", transport, err)
	// Output:
	// settled
	// "" <nil>
}
