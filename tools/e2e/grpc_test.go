package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdmanet/rdmanet/tools/examples/grpc/service"
)

// checkedListener counts the connections it accepts and records those
// over the wrong transport.
type checkedListener struct {
	net.Listener
	want     string
	accepted atomic.Int64
	mu       sync.Mutex
	wrong    []string
}

func (l *checkedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
		if err := checkTransport(c, l.want); err != nil {
			l.mu.Lock()
			l.wrong = append(l.wrong, err.Error())
			l.mu.Unlock()
		}
	}
	return c, err
}

// grpcServer is a stock grpc.Server serving the example's TestService on
// an rsock listener.
type grpcServer struct {
	addr string
	ln   *checkedListener
	srv  *grpc.Server
	done chan error // Serve's result
}

// startGRPC serves the example service, with hooks, on a new rsock
// listener of the transport. The server side must see want.
func startGRPC(t *testing.T, tc transportCase, want string, hooks service.Hooks) *grpcServer {
	t.Helper()
	return serveGRPC(t, tc.listen(t), want, hooks)
}

// serveGRPC serves the example service, with hooks, on an rsock listener,
// whose connections must run over want.
func serveGRPC(t *testing.T, rln net.Listener, want string, hooks service.Hooks) *grpcServer {
	t.Helper()
	ln := &checkedListener{Listener: rln, want: want}
	s := &grpcServer{addr: ln.Addr().String(), ln: ln, done: make(chan error, 1)}
	s.srv = service.NewServer(&service.Service{Hooks: hooks}, nil)
	go func() { s.done <- s.srv.Serve(ln) }()
	t.Cleanup(func() {
		s.srv.Stop()
		ln.mu.Lock()
		defer ln.mu.Unlock()
		reportErrors(t, "server side: ", ln.wrong)
	})
	return s
}

// grpcClient is a ClientConn to addr that dials with rsock, through
// grpc.WithContextDialer, and refuses connections over the wrong transport.
func grpcClient(t *testing.T, tc transportCase, addr string, opts ...grpc.DialOption) (testpb.TestServiceClient, *atomic.Int64) {
	c, _, dials := grpcClientConn(t, tc, addr, opts...)
	return c, dials
}

func grpcClientConn(t *testing.T, tc transportCase, addr string, opts ...grpc.DialOption) (testpb.TestServiceClient, *grpc.ClientConn, *atomic.Int64) {
	t.Helper()
	dials := new(atomic.Int64)
	opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		c, err := tc.dial(ctx, a)
		if err == nil {
			dials.Add(1)
		}
		return c, err
	}))
	cc, err := service.NewClient(addr, nil, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return testpb.NewTestServiceClient(cc), cc, dials
}

// callCheck collects what a call says about its transports: the server's
// HeaderTransport and, for rsock clients, the client side's Info.
type callCheck struct {
	header metadata.MD
	peer   peer.Peer
}

func (cc *callCheck) opts() []grpc.CallOption {
	return []grpc.CallOption{grpc.Header(&cc.header), grpc.Peer(&cc.peer)}
}

// check fails unless the server side ran over server and, if client is not
// "", the client side over client.
func (cc *callCheck) check(server, client string) error {
	if got := cc.header.Get(service.HeaderTransport); len(got) != 1 || got[0] != server {
		return fmt.Errorf("server side over %q, want %q", got, server)
	}
	if client == "" {
		return nil
	}
	info, _ := cc.peer.AuthInfo.(service.Info)
	if info.Transport != client {
		return fmt.Errorf("client side over %q (%s), want %q", info.Transport, info.Reason, client)
	}
	return nil
}

func payloadOf(b []byte) *testpb.Payload { return &testpb.Payload{Body: b} }

func dataBytes(seed uint64, n int) []byte {
	b := make([]byte, n)
	io.ReadFull(data(seed), b)
	return b
}

// fourCalls makes a call of each kind with messages of size bytes and
// checks their content and transports (server side over server, client side
// over client unless "").
func fourCalls(ctx context.Context, c testpb.TestServiceClient, size, count int, server, client string) error {
	{ // unary
		var cc callCheck
		body := dataBytes(11, size)
		resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: int32(size), Payload: payloadOf(body)}, cc.opts()...)
		if err != nil {
			return fmt.Errorf("unary: %w", err)
		}
		if resp.GetServerId() != service.Sum(body) {
			return errors.New("unary: the server's hash of the request differs")
		}
		if service.Sum(resp.GetPayload().GetBody()) != service.Sum(service.Pattern(size)) {
			return errors.New("unary: the response differs")
		}
		if resp.GetHostname() != server {
			return fmt.Errorf("unary: the handler saw %q, want %q", resp.GetHostname(), server)
		}
		if err := cc.check(server, client); err != nil {
			return fmt.Errorf("unary: %w", err)
		}
	}
	{ // server streaming
		var cc callCheck
		req := &testpb.StreamingOutputCallRequest{}
		for range count {
			req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: int32(size)})
		}
		stream, err := c.StreamingOutputCall(ctx, req, cc.opts()...)
		if err != nil {
			return fmt.Errorf("server streaming: %w", err)
		}
		n := 0
		for ; ; n++ {
			resp, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("server streaming: message %d: %w", n, err)
			}
			if service.Sum(resp.GetPayload().GetBody()) != service.Sum(service.Pattern(size)) {
				return fmt.Errorf("server streaming: message %d differs", n)
			}
		}
		if n != count {
			return fmt.Errorf("server streaming: %d messages, want %d", n, count)
		}
		if err := cc.check(server, client); err != nil {
			return fmt.Errorf("server streaming: %w", err)
		}
	}
	{ // client streaming
		var cc callCheck
		stream, err := c.StreamingInputCall(ctx, cc.opts()...)
		if err != nil {
			return fmt.Errorf("client streaming: %w", err)
		}
		body := dataBytes(12, size)
		for range count {
			if err := stream.Send(&testpb.StreamingInputCallRequest{Payload: payloadOf(body)}); err != nil {
				return fmt.Errorf("client streaming: %w", err)
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			return fmt.Errorf("client streaming: %w", err)
		}
		if got := int(resp.GetAggregatedPayloadSize()); got != count*size {
			return fmt.Errorf("client streaming: the server counted %d bytes, want %d", got, count*size)
		}
		if err := cc.check(server, client); err != nil {
			return fmt.Errorf("client streaming: %w", err)
		}
	}
	{ // bidi: requests go out while echoes come back
		var cc callCheck
		stream, err := c.FullDuplexCall(ctx, cc.opts()...)
		if err != nil {
			return fmt.Errorf("bidi: %w", err)
		}
		sent := make(chan error, 1)
		go func() {
			for i := range count {
				if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: payloadOf(dataBytes(uint64(100+i), size))}); err != nil {
					sent <- err
					return
				}
			}
			sent <- stream.CloseSend()
		}()
		for i := range count {
			resp, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("bidi: echo %d: %w", i, err)
			}
			if service.Sum(resp.GetPayload().GetBody()) != service.Sum(dataBytes(uint64(100+i), size)) {
				return fmt.Errorf("bidi: echo %d differs", i)
			}
		}
		if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
			return fmt.Errorf("bidi: after the last echo: %v, want EOF", err)
		}
		if err := <-sent; err != nil {
			return fmt.Errorf("bidi: sending: %w", err)
		}
		if err := cc.check(server, client); err != nil {
			return fmt.Errorf("bidi: %w", err)
		}
	}
	return nil
}

func TestGRPCCallTypes(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		s := startGRPC(t, tc, tc.name, service.Hooks{})
		c, dials := grpcClient(t, tc, s.addr)
		if err := fourCalls(testContext(t), c, 64<<10, scaled(16, 4), tc.name, tc.name); err != nil {
			t.Fatal(err)
		}
		if err := fourCalls(testContext(t), c, 0, 3, tc.name, tc.name); err != nil {
			t.Fatalf("empty messages: %v", err)
		}
		if d, a := dials.Load(), s.ln.accepted.Load(); d != 1 || a != 1 {
			t.Errorf("%d dials and %d accepted connections, want 1 and 1", d, a)
		}
	})
}

func TestGRPCLargeMessages(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		s := startGRPC(t, tc, tc.name, service.Hooks{})
		c, _ := grpcClient(t, tc, s.addr)
		// 4 MiB payloads: above gRPC's default 4 MiB receive limit with
		// framing, which NewServer and NewClient raise to 16 MiB. The
		// small scale keeps the size and sends fewer of them.
		if err := fourCalls(testContext(t), c, 4<<20, scaled(3, 1), tc.name, tc.name); err != nil {
			t.Fatal(err)
		}
	})
}

func TestGRPCConcurrentRPCs(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		rpcs := scaled(1000, 100)
		// Every UnaryCall waits in the server until all have arrived:
		// 1,000 (100 at the small scale) streams are in flight at once
		// on one connection.
		b := newBarrier(rpcs)
		s := startGRPC(t, tc, tc.name, service.Hooks{
			Enter: func(ctx context.Context, method string) error {
				if method != "UnaryCall" {
					return nil
				}
				if err := b.wait(ctx); err != nil {
					return status.Error(codes.Unavailable, err.Error())
				}
				return nil
			},
		})
		c, dials := grpcClient(t, tc, s.addr)
		ctx := testContext(t)
		// One call first: the client learns the server's stream limit.
		if _, err := c.EmptyCall(ctx, &testpb.Empty{}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, rpcs)
		for i := range rpcs {
			wg.Go(func() {
				body := dataBytes(uint64(i), 1024)
				var cc callCheck
				resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 1024, Payload: payloadOf(body)}, cc.opts()...)
				switch {
				case err != nil:
					b.abort()
					errs <- fmt.Errorf("rpc %d: %w", i, err)
				case resp.GetServerId() != service.Sum(body):
					errs <- fmt.Errorf("rpc %d: the server's hash differs", i)
				default:
					if err := cc.check(tc.name, tc.name); err != nil {
						errs <- fmt.Errorf("rpc %d: %w", i, err)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		reportErrors(t, "", collect(errs))
		if d, a := dials.Load(), s.ln.accepted.Load(); d != 1 || a != 1 {
			t.Errorf("%d dials and %d accepted connections, want 1 and 1", d, a)
		}
	})
}

// heldService returns hooks under which the calls of method wait in the
// server until their context ends; entered receives each such call's
// deadline (zero if none), exited its context (ended).
func heldService(method string) (service.Hooks, chan time.Time, chan context.Context) {
	entered := make(chan time.Time, 16)
	exited := make(chan context.Context, 16)
	return service.Hooks{
		Enter: func(ctx context.Context, m string) error {
			if m != method {
				return nil
			}
			dl, _ := ctx.Deadline()
			entered <- dl
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		},
		Exit: func(ctx context.Context, m string) {
			if m == method {
				exited <- ctx
			}
		},
	}, entered, exited
}

// ended waits for a handler to return with its call's context, then for
// that context to end, and returns its error (nil if it did not end
// within the hang guard). grpc-go can fail a handler's Send or Recv on a
// call the client ended a moment before it cancels the call's context.
func ended(t *testing.T, exited <-chan context.Context, what string) error {
	t.Helper()
	ctx := waitFor(t, exited, what)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-waitTimeout():
		return nil
	}
}

// readyClient is grpcClient with its connection up: an EmptyCall first,
// so that a short deadline measures the call, not the dial (in the
// Soft-RoCE guest a verbs dial takes longer than the deadlines below).
func readyClient(t *testing.T, tc transportCase, addr string) testpb.TestServiceClient {
	t.Helper()
	c, _ := grpcClient(t, tc, addr)
	if _, err := c.EmptyCall(testContext(t), &testpb.Empty{}); err != nil {
		t.Fatalf("the first call: %v", err)
	}
	return c
}

func TestGRPCDeadline(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		t.Run("unary", func(t *testing.T) {
			hooks, entered, exited := heldService("UnaryCall")
			s := startGRPC(t, tc, tc.name, hooks)
			c := readyClient(t, tc, s.addr)
			ctx, cancel := context.WithTimeout(testContext(t), 500*time.Millisecond)
			defer cancel()
			want, _ := ctx.Deadline()
			_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("got %v, want DeadlineExceeded", err)
			}
			// The deadline reached the server (grpc-timeout), and its
			// context ended.
			if dl := waitFor(t, entered, "the call reaching the server"); dl.IsZero() || dl.After(want.Add(time.Second)) {
				t.Errorf("the server's deadline is %v, want about %v", dl, want)
			}
			if err := ended(t, exited, "the server seeing the deadline"); err == nil {
				t.Error("the call's context on the server never ended")
			} else {
				t.Logf("server side: %v", err)
			}
		})
		t.Run("server-streaming", func(t *testing.T) {
			exited := make(chan context.Context, 1)
			s := startGRPC(t, tc, tc.name, service.Hooks{Exit: func(ctx context.Context, m string) {
				if m == "StreamingOutputCall" {
					exited <- ctx
				}
			}})
			c := readyClient(t, tc, s.addr)
			ctx, cancel := context.WithTimeout(testContext(t), 500*time.Millisecond)
			defer cancel()
			req := &testpb.StreamingOutputCallRequest{}
			for range 1000 { // 1000 messages, one every 50ms
				req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: 100, IntervalUs: 50000})
			}
			stream, err := c.StreamingOutputCall(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			for err == nil {
				_, err = stream.Recv()
			}
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("got %v, want DeadlineExceeded", err)
			}
			if err := ended(t, exited, "the server seeing the deadline"); err == nil {
				t.Error("the call's context on the server never ended")
			}
		})
	})
}

func TestGRPCCancel(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		t.Run("unary", func(t *testing.T) {
			hooks, entered, exited := heldService("UnaryCall")
			s := startGRPC(t, tc, tc.name, hooks)
			c, _ := grpcClient(t, tc, s.addr)
			ctx, cancel := context.WithCancel(testContext(t))
			errc := make(chan error, 1)
			go func() {
				_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
				errc <- err
			}()
			waitFor(t, entered, "the call reaching the server")
			cancel()
			if err := waitFor(t, errc, "the cancelled call returning"); status.Code(err) != codes.Canceled {
				t.Fatalf("got %v, want Canceled", err)
			}
			if err := ended(t, exited, "the server seeing the cancellation"); !errors.Is(err, context.Canceled) {
				t.Fatalf("the server's context ended with %v, want context.Canceled", err)
			}
		})
		t.Run("bidi", func(t *testing.T) {
			exited := make(chan context.Context, 1)
			s := startGRPC(t, tc, tc.name, service.Hooks{Exit: func(ctx context.Context, m string) { exited <- ctx }})
			c, _ := grpcClient(t, tc, s.addr)
			ctx, cancel := context.WithCancel(testContext(t))
			stream, err := c.FullDuplexCall(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: payloadOf([]byte("ping"))}); err != nil {
					t.Fatal(err)
				}
				if _, err := stream.Recv(); err != nil {
					t.Fatalf("echo %d: %v", i, err)
				}
			}
			cancel()
			if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
				t.Fatalf("after cancel: %v, want Canceled", err)
			}
			if err := ended(t, exited, "the server seeing the cancellation"); !errors.Is(err, context.Canceled) {
				t.Fatalf("the server's context ended with %v, want context.Canceled", err)
			}
		})
	})
}

func TestGRPCGracefulStop(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		entered := make(chan struct{}, 1)
		release := make(chan struct{})
		s := startGRPC(t, tc, tc.name, service.Hooks{
			Enter: func(ctx context.Context, m string) error {
				if m == "UnaryCall" {
					entered <- struct{}{}
					select {
					case <-release:
					case <-ctx.Done():
						return status.FromContextError(ctx.Err()).Err()
					}
				}
				return nil
			},
		})
		c, _ := grpcClient(t, tc, s.addr)
		type result struct {
			resp *testpb.SimpleResponse
			err  error
		}
		results := make(chan result, 1)
		go func() {
			resp, err := c.UnaryCall(testContext(t), &testpb.SimpleRequest{ResponseSize: 1 << 20})
			results <- result{resp, err}
		}()
		waitFor(t, entered, "the call reaching the server")

		stopped := make(chan struct{})
		go func() { s.srv.GracefulStop(); close(stopped) }()
		// GracefulStop closes the listener at once.
		waitUntil(t, func() bool {
			conn, err := tc.dial(testContext(t), s.addr)
			if err == nil {
				conn.Close()
			}
			return err != nil
		}, "the listener closing")
		select {
		case <-stopped:
			t.Fatal("GracefulStop returned with a call in flight")
		default:
		}

		close(release)
		r := waitFor(t, results, "the in-flight call")
		if r.err != nil {
			t.Fatalf("the in-flight call failed during GracefulStop: %v", r.err)
		}
		if service.Sum(r.resp.GetPayload().GetBody()) != service.Sum(service.Pattern(1<<20)) {
			t.Fatal("the in-flight call's response differs")
		}
		waitFor(t, stopped, "GracefulStop returning")
		if err := waitFor(t, s.done, "Serve returning"); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

func TestGRPCReconnect(t *testing.T) {
	forEachTransport(t, func(t *testing.T, tc transportCase) {
		s1 := startGRPC(t, tc, tc.name, service.Hooks{})
		addr := s1.addr
		c, conn, dials := grpcClientConn(t, tc, addr, grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 10 * time.Second,
		}))
		ctx := testContext(t)
		call := func() error {
			var cc callCheck
			opts := append(cc.opts(), grpc.WaitForReady(true))
			body := []byte("after a restart")
			resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: payloadOf(body)}, opts...)
			if err != nil {
				return err
			}
			if resp.GetServerId() != service.Sum(body) {
				return errors.New("the server's hash differs")
			}
			return cc.check(tc.name, tc.name)
		}
		if err := call(); err != nil {
			t.Fatal(err)
		}

		s1.srv.Stop()
		waitFor(t, s1.done, "the first server stopping")
		// Until the client sees its connection end, a call may still go
		// out on it and fail (Unavailable, even with WaitForReady): wait
		// for the channel to go idle (or fail). Not merely "not Ready":
		// the channel may report Ready only after the first call.
		for st := conn.GetState(); st != connectivity.Idle && st != connectivity.TransientFailure; st = conn.GetState() {
			wctx, cancel := context.WithTimeout(ctx, hangGuard)
			changed := conn.WaitForStateChange(wctx, st)
			cancel()
			if !changed {
				t.Fatalf("hang guard: the client stayed %v after the server stopped", st)
			}
		}
		// A new server on the same port (the old listener is closed).
		var ln net.Listener
		waitUntil(t, func() bool {
			var err error
			ln, err = tc.tryListen(addr)
			return err == nil
		}, "listening again on "+addr)
		t.Cleanup(func() { ln.Close() })
		s2 := serveGRPC(t, ln, tc.name, service.Hooks{})

		// WaitForReady: the call waits for the ClientConn to reconnect.
		if err := call(); err != nil {
			t.Fatalf("after the restart: %v", err)
		}
		if a := s2.ln.accepted.Load(); a != 1 {
			t.Errorf("the new server accepted %d connections, want 1", a)
		}
		if d := dials.Load(); d != 2 {
			t.Errorf("%d successful dials, want 2", d)
		}
	})
}
