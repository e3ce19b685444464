package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/rdmanet/rdmanet/rsock"
)

// demoServerEnv makes this program the demo's server process.
const demoServerEnv = "RSOCK_DEMO_SERVER"

// demoServerCmd re-executes this program as the demo's server process:
// shm is a transport between processes, so the demo measures it between
// two, as a deployment would use it.
func demoServerCmd() *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), demoServerEnv+"=1")
	return cmd
}

// demoServer serves the handler twice on loopback ports, on rsock.Listen
// and on plain net.Listen, prints "ready RSOCK PLAIN" on out, and serves
// until in closes (the demo's client exits or closes the pipe).
func demoServer(in io.Reader, out io.Writer, logger *log.Logger) error {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ln.Close()
		return err
	}
	srv := NewServer(logger)
	psrv := &http.Server{Handler: Handler(), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	go psrv.Serve(pln)
	fmt.Fprintf(out, "ready %s %s\n", ln.Addr(), pln.Addr())
	_, _ = io.Copy(io.Discard, in)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return errors.Join(srv.Shutdown(ctx), psrv.Shutdown(ctx))
}

// startDemoServer starts cmd as the demo's server process and returns the
// addresses it serves on, and a stop function that ends it.
func startDemoServer(cmd *exec.Cmd) (rsockAddr, plainAddr string, stop func(), err error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", "", nil, err
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr // its connection log
	}
	if err := cmd.Start(); err != nil {
		return "", "", nil, fmt.Errorf("starting the demo server: %w", err)
	}
	stop = func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 3 || f[0] != "ready" {
		stop()
		return "", "", nil, fmt.Errorf("the demo server did not start (said %q): %v", line, err)
	}
	return f[1], f[2], stop, nil
}

// runDemo starts the server process (cmd), makes requests to it through
// rsock, prints what carried them, and times the same requests against the
// same handler served by plain net/http over TCP loopback in that process.
func runDemo(out io.Writer, logger *log.Logger, cmd *exec.Cmd) error {
	addr, plainAddr, stop, err := startDemoServer(cmd)
	if err != nil {
		return err
	}
	defer stop()
	base := "http://" + addr
	fmt.Fprintf(out, "rsock demo: stock net/http server on rsock.Listen at %s (process %d)\n", addr, cmd.Process.Pid)

	var conns []string
	var dialed []net.Conn
	var dialedAt time.Time
	client := NewClient(nil, func(addr string, c net.Conn) {
		info, _ := rsock.InfoOf(c)
		msg := fmt.Sprintf("client: connected to %s over %s (%s)", addr, info.Transport, info.Reason)
		logger.Print(msg)
		conns = append(conns, msg)
		if len(dialed) == 0 {
			dialedAt = time.Now()
		}
		dialed = append(dialed, c)
	})
	defer client.CloseIdleConnections()

	body, err := getString(client, base+"/hello")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "GET /hello -> %s", body)
	if len(dialed) == 0 {
		return fmt.Errorf("the client dialed no connection")
	}
	// A connection starts on TCP and moves to its ring in the background
	// once it has lived a millisecond (rsock's upgrade): wait for that,
	// and ask again.
	if err := awaitSettled(dialed[0], 10*time.Second); err != nil {
		return err
	}
	first, _ := rsock.InfoOf(dialed[0])
	if sw := upgradeOf(first, dialedAt); sw != "" {
		fmt.Fprintf(out, "%s\n", sw)
	}
	if body, err = getString(client, base+"/hello"); err != nil {
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
	plain := &http.Client{Transport: &http.Transport{}}
	defer plain.CloseIdleConnections()
	const n, rounds = 500, 5
	var rs, ps []time.Duration
	for range rounds { // alternate, so both see the same machine
		d, err := timeRequests(client, base+"/hello", n)
		if err != nil {
			return err
		}
		rs = append(rs, d)
		if d, err = timeRequests(plain, "http://"+plainAddr+"/hello", n); err != nil {
			return err
		}
		ps = append(ps, d)
	}
	r, p := median(rs), median(ps)
	fmt.Fprintf(out, "%d keep-alive GET /hello between two processes, median of %d rounds: rsock over %s %v per request, plain TCP %v per request (%.2fx the time)\n",
		n, rounds, first.Transport, r.Round(100*time.Nanosecond), p.Round(100*time.Nanosecond), float64(r)/float64(p))

	fmt.Fprintln(out, "connections:")
	for i, c := range conns {
		fmt.Fprintf(out, "  %s\n", c)
		if info, _ := rsock.InfoOf(dialed[i]); info.Transport != "" {
			fmt.Fprintf(out, "    now over %s (%s)\n", info.Transport, info.Reason)
		}
	}
	if first.Transport == "tcp" {
		fmt.Fprintln(out, "note: this run used TCP, not an accelerated transport; the reason is above.")
	}
	return nil
}

// awaitSettled waits until c's transport has settled (rsock.Settled), for
// at most d.
func awaitSettled(c net.Conn, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if _, err := rsock.WaitSettled(ctx, c); err != nil {
		return fmt.Errorf("the connection's transport did not settle in %v", d)
	}
	return nil
}

// upgradeOf describes the upgrade in info's switch history: when (after
// dialed) and where each direction moved from TCP to the ring, or "" if
// none did.
func upgradeOf(info rsock.ConnInfo, dialed time.Time) string {
	var parts []string
	for _, sw := range info.Switches {
		if sw.From == "tcp" && sw.To != "tcp" {
			parts = append(parts, fmt.Sprintf("%s %s->%s %v after Dial (%s)", sw.Direction, sw.From, sw.To, sw.At.Sub(dialed).Round(10*time.Microsecond), sw.Cause))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "upgrade: " + strings.Join(parts, ", ")
}
