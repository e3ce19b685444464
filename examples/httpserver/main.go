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
// rsock. Each new connection's transport is reported to logf.
func NewClient(cfg *rsock.Config, logf func(format string, args ...any)) *http.Client {
	d := &rsock.Dialer{Timeout: 10 * time.Second, Config: cfg}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err == nil && logf != nil {
				info, _ := rsock.InfoOf(c)
				logf("client: connected to %s over %s (%s)", addr, info.Transport, info.Reason)
			}
			return c, err
		},
		MaxIdleConnsPerHost: 16,
	}
	return &http.Client{Transport: tr}
}

func fetch(url string) error {
	resp, err := NewClient(nil, log.Printf).Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(os.Stdout, resp.Body)
	return err
}

// runDemo starts the server on a loopback port, makes requests to it
// through rsock, and prints what carried them.
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

	var transports []string
	client := NewClient(nil, func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		logger.Print(msg)
		transports = append(transports, msg)
	})
	defer client.CloseIdleConnections()

	body, err := getString(client, base+"/hello")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "GET /hello -> %s", body)

	const n = 200
	start := time.Now()
	for range n {
		if _, err := getString(client, base+"/hello"); err != nil {
			return err
		}
	}
	per := time.Since(start) / n
	fmt.Fprintf(out, "%d keep-alive requests: %v per request\n", n, per)

	up := strings.Repeat("rsock", 1<<18)
	resp, err := client.Post(base+"/upload", "application/octet-stream", strings.NewReader(up))
	if err != nil {
		return err
	}
	sum, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Fprintf(out, "POST /upload (%d bytes) -> %s", len(up), sum)

	fmt.Fprintln(out, "connections:")
	for _, t := range transports {
		fmt.Fprintf(out, "  %s\n", t)
	}
	if len(transports) > 0 && strings.Contains(transports[0], "over tcp") {
		fmt.Fprintln(out, "note: this run used the TCP fallback: no accelerated transport (shm, verbs) is available in this build or on this host; the reason is above.")
	}
	return nil
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
