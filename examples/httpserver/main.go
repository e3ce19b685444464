// Command httpserver is a stock net/http server on rsock.Listen, and a
// client whose stock http.Client dials with rsock. It is what `make demo`
// runs.
//
//	httpserver -listen 127.0.0.1:8080          serve until interrupted
//	httpserver -get http://127.0.0.1:8080/hello  one request through rsock
//	httpserver -demo                            server and client in one run
//
// Every connection's transport ("verbs", "shm" or "tcp") is logged with the
// reason it was chosen; RSOCK_* variables tune rsock (see the README).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/rdmanet/rdmanet/rsock"
)

func main() {
	listen := flag.String("listen", "", "serve on this address")
	get := flag.String("get", "", "GET this URL through rsock and print the body")
	demo := flag.Bool("demo", false, "run a server and a client against it, and report the transports")
	flag.Parse()
	logger := log.New(os.Stderr, "", log.Ltime|log.Lmicroseconds)
	var err error
	switch {
	case *demo:
		err = runDemo(os.Stdout, logger)
	case *listen != "":
		err = serve(*listen, logger)
	case *get != "":
		err = fetch(*get)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		logger.Fatal(err)
	}
}

func serve(addr string, logger *log.Logger) error {
	ln, err := rsock.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger.Printf("serving on %s", ln.Addr())
	srv := NewServer(logger)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// NewClient returns a stock http.Client whose connections are dialled with
// rsock. Each new connection is reported to onConn, if not nil.
func NewClient(cfg *rsock.Config, onConn func(addr string, c net.Conn)) *http.Client {
	d := &rsock.Dialer{Timeout: 10 * time.Second, Config: cfg}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err == nil && onConn != nil {
				onConn(addr, c)
			}
			return c, err
		},
		MaxIdleConnsPerHost: 16,
	}
	return &http.Client{Transport: tr}
}

func fetch(url string) error {
	resp, err := NewClient(nil, func(addr string, c net.Conn) {
		info, _ := rsock.InfoOf(c)
		log.Printf("client: connected to %s over %s (%s)", addr, info.Transport, info.Reason)
	}).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}

// runDemo starts the server on a loopback port, makes requests to it
// through rsock, prints what carried them, and times the same requests
// against the same handler served by plain net/http over TCP loopback.
func runDemo(out io.Writer, logger *log.Logger) error {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := NewServer(logger)
	go srv.Serve(ln)
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "rsock demo: stock net/http server on rsock.Listen at %s\n", ln.Addr())

	var conns []string
	var first rsock.ConnInfo
	client := NewClient(nil, func(addr string, c net.Conn) {
		info, _ := rsock.InfoOf(c)
		if len(conns) == 0 {
			first = info
		}
		msg := fmt.Sprintf("client: connected to %s over %s (%s)", addr, info.Transport, info.Reason)
		logger.Print(msg)
		conns = append(conns, msg)
	})
	defer client.CloseIdleConnections()

	body, err := getString(client, base+"/hello")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "GET /hello -> %s", body)

	up := strings.Repeat("rsock", 1<<18)
	resp, err := client.Post(base+"/upload", "application/octet-stream", strings.NewReader(up))
	if err != nil {
		return err
	}
	sum, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Fprintf(out, "POST /upload (%d bytes) -> %s", len(up), sum)

	// The same keep-alive requests over plain net/http on TCP loopback.
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	psrv := &http.Server{Handler: Handler(), ReadHeaderTimeout: 10 * time.Second}
	go psrv.Serve(pln)
	defer psrv.Close()
	plain := &http.Client{Transport: &http.Transport{}}
	defer plain.CloseIdleConnections()
	const n, rounds = 200, 5
	var rs, ps []time.Duration
	for range rounds { // alternate, so both see the same machine
		d, err := timeRequests(client, base+"/hello", n)
		if err != nil {
			return err
		}
		rs = append(rs, d)
		if d, err = timeRequests(plain, "http://"+pln.Addr().String()+"/hello", n); err != nil {
			return err
		}
		ps = append(ps, d)
	}
	r, p := median(rs), median(ps)
	fmt.Fprintf(out, "%d keep-alive GET /hello, median of %d rounds: rsock over %s %v per request, plain TCP %v per request (%.2fx)\n",
		n, rounds, first.Transport, r.Round(100*time.Nanosecond), p.Round(100*time.Nanosecond), float64(r)/float64(p))

	fmt.Fprintln(out, "connections:")
	for _, c := range conns {
		fmt.Fprintf(out, "  %s\n", c)
	}
	if first.Transport == "tcp" {
		fmt.Fprintln(out, "note: this run used TCP, not an accelerated transport; the reason is above.")
	}
	return nil
}

// timeRequests returns the mean time of n GETs of url.
func timeRequests(c *http.Client, url string, n int) (time.Duration, error) {
	start := time.Now()
	for range n {
		if _, err := getString(c, url); err != nil {
			return 0, err
		}
	}
	return time.Since(start) / time.Duration(n), nil
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func getString(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}
