// Command grpc is a stock grpc-go server on rsock.Listen, and a client whose
// grpc.ClientConn dials with rsock through grpc.WithContextDialer. The
// service is gRPC's own interop TestService (no protoc needed); the client
// makes a unary, a server-streaming, a client-streaming and a bidi call, and
// shows a deadline and a cancellation reaching the server.
//
//	grpc -listen 127.0.0.1:50051     serve until interrupted
//	grpc -connect 127.0.0.1:50051    run the calls against a server, through rsock
//	grpc -demo                       server and client in one run
//
// The transport of every connection ("verbs", "shm" or "tcp", with the
// reason) is logged on both sides and named in each call's response header;
// RSOCK_* variables tune rsock (see the top-level README).
package main

import (
	"context"
	"expvar"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rdmanet/rdmanet/rsock"
	"github.com/rdmanet/rdmanet/rsock/rsockdebug"
	"github.com/rdmanet/rdmanet/tools/examples/grpc/service"
)

func main() {
	listen := flag.String("listen", "", "serve on this address")
	connect := flag.String("connect", "", "run the example calls against the server at this address")
	demo := flag.Bool("demo", false, "run a server and a client against it, and report the transports")
	debug := flag.String("debug", "", "serve the rsock debug page (/debug/rsock) and expvar (/debug/vars) over plain HTTP on this address")
	flag.Parse()
	logger := log.New(os.Stderr, "", log.Ltime|log.Lmicroseconds)
	if *debug != "" {
		rsock.PublishExpvar()
		mux := http.NewServeMux()
		mux.Handle("/debug/rsock", rsockdebug.Handler())
		mux.Handle("/debug/vars", expvar.Handler())
		go func() { logger.Println(http.ListenAndServe(*debug, mux)) }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch {
	case *demo:
		err = runDemo(ctx, os.Stdout, logger)
	case *listen != "":
		err = serve(ctx, *listen, logger)
	case *connect != "":
		err = runClient(ctx, *connect, os.Stdout, logger.Printf)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		logger.Fatal(err)
	}
}

// serve runs the server until ctx ends, then stops it gracefully (in-flight
// calls finish, for at most 5 seconds).
func serve(ctx context.Context, addr string, logger *log.Logger) error {
	ln, err := rsock.Listen("tcp", addr)
	if err != nil {
		return err
	}
	logger.Printf("serving gRPC on %s", ln.Addr())
	srv := service.NewServer(logEnds(logger.Printf), logger.Printf)
	go func() {
		<-ctx.Done()
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			srv.Stop()
		}
	}()
	return srv.Serve(ln)
}

func runClient(ctx context.Context, addr string, out io.Writer, logf func(string, ...any)) error {
	d := &rsock.Dialer{Timeout: 10 * time.Second}
	dialed := make(chan net.Conn, 1)
	dial := func(ctx context.Context, a string) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", a)
		if err == nil {
			select {
			case dialed <- c:
			default:
			}
		}
		return c, err
	}
	cc, err := service.NewClient(addr, d, logf, grpc.WithContextDialer(dial))
	if err != nil {
		return err
	}
	defer cc.Close()
	if err := awaitUpgrade(ctx, cc, dialed, out); err != nil {
		return err
	}
	return runCalls(ctx, cc, out)
}

// awaitUpgrade connects cc with a health check and waits until the
// connection's transport has settled: it starts on TCP and moves to its
// ring in the background once it has lived a millisecond (rsock's
// upgrade), and the calls that follow should show where it stays.
func awaitUpgrade(ctx context.Context, cc *grpc.ClientConn, dialed <-chan net.Conn, out io.Writer) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(cctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("health check: %w", err)
	}
	var c net.Conn
	select {
	case c = <-dialed:
	case <-cctx.Done():
		return fmt.Errorf("no connection: %w", cctx.Err())
	}
	if _, err := rsock.WaitSettled(cctx, c); err != nil {
		return fmt.Errorf("the connection's transport did not settle: %w", err)
	}
	info, _ := rsock.InfoOf(c)
	fmt.Fprintf(out, "%-17s %s, the connection now over %s (%s)\n", "health:", resp.GetStatus(), info.Transport, info.Reason)
	if info.Transport == "tcp" {
		fmt.Fprintf(out, "note: this run used TCP, not an accelerated transport: %s\n", info.Reason)
	}
	return nil
}

// logEnds returns a Service that logs the calls whose context ended
// before their handler returned: the server's view of a client's deadline
// or cancellation.
func logEnds(logf func(string, ...any)) *service.Service {
	return &service.Service{Hooks: service.Hooks{Exit: func(ctx context.Context, method string) {
		if err := ctx.Err(); err != nil {
			logf("grpc server: %s ended: %v", method, err)
		}
	}}}
}

// runDemo starts the server on a loopback port, runs the calls against it
// through rsock, and prints what carried them.
func runDemo(ctx context.Context, out io.Writer, logger *log.Logger) error {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var conns []string
	logf := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		logger.Print(msg)
		mu.Lock()
		conns = append(conns, msg)
		mu.Unlock()
	}
	srv := service.NewServer(logEnds(logf), logf)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(out, "rsock demo: stock grpc-go server on rsock.Listen at %s\n", ln.Addr())

	err = runClient(ctx, ln.Addr().String(), out, logf)
	srv.GracefulStop()
	if serr := <-served; err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintln(out, "log:")
	for _, c := range conns {
		fmt.Fprintf(out, "  %s\n", c)
	}
	return nil
}
