// Command httpserver is a stock net/http server on rsock.Listen, and a
// client whose stock http.Client dials with rsock. It is what `make demo`
// runs.
//
//	httpserver -listen 127.0.0.1:8080          serve until interrupted
//	httpserver -get http://127.0.0.1:8080/hello  one request through rsock
//	httpserver -demo                            a server process and a client against it
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
	case os.Getenv(demoServerEnv) == "1":
		err = demoServer(os.Stdin, os.Stdout, logger)
	case *demo:
		err = runDemo(os.Stdout, logger, demoServerCmd())
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
