// Package service is the gRPC side of examples/grpc, shared with the
// end-to-end suites in e2e/:
//
//   - Service implements gRPC's own interop TestService
//     (google.golang.org/grpc/interop/grpc_testing). Its generated code ships
//     with grpc-go, so nothing here needs protoc.
//   - Creds are transport credentials without security, like
//     insecure.NewCredentials, that record which rsock transport carries each
//     connection (TransportFromContext reads it in a handler) and log it.
//   - NewServer and NewClient put a stock grpc.Server and grpc.ClientConn on
//     rsock: the server is meant for Serve(rsockListener), the client dials
//     with an rsock.Dialer through grpc.WithContextDialer.
package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rdmanet/rdmanet/rsock"
)

const (
	// HeaderTransport is the response header (metadata) in which the server
	// names the rsock transport carrying the call on its side.
	HeaderTransport = "rsock-transport"
	// HeaderDelay is request metadata: a Go duration (such as "2s") that
	// the handler waits, or until the call's context ends, before it
	// answers. Clients use it to show deadlines and cancellation.
	HeaderDelay = "rsock-delay"
	// MaxMsgSize is the message limit NewServer and NewClient set on both
	// sides (gRPC's default receive limit is 4 MiB, just too small for a
	// 4 MiB payload with its framing).
	MaxMsgSize = 16 << 20
)

// Hooks let a test observe and steer the handlers. The zero value does
// nothing.
type Hooks struct {
	// Enter, if set, is called when a handler starts, with the call's
	// context and the method's short name ("UnaryCall", ...). It may block;
	// an error it returns ends the call with that error.
	Enter func(ctx context.Context, method string) error
	// Exit, if set, is called when a handler returns, with the call's
	// context. grpc-go fails a handler's Send or Recv on a call that the
	// client ended (its deadline, a cancellation) a moment before it
	// cancels the context, so to learn how the call ended, wait for
	// ctx.Done() outside the handler rather than read ctx.Err() at once.
	Exit func(ctx context.Context, method string)
}

// Service implements grpc.testing.TestService:
//
//   - EmptyCall returns an empty message.
//   - UnaryCall answers with ResponseSize bytes of Pattern; ServerId is the
//     hex SHA-256 of the request's payload and Hostname the transport that
//     carried the call to the server.
//   - StreamingOutputCall sends one message of Pattern bytes per
//     ResponseParameters entry, each after IntervalUs microseconds.
//   - StreamingInputCall returns the total payload size it received.
//   - FullDuplexCall answers each request as it arrives: with its
//     ResponseParameters like StreamingOutputCall, or, if it has none, by
//     echoing its payload.
//
// ResponseStatus in a request makes the call fail with that status, and
// HeaderDelay metadata delays the first answer. Every wait ends when the
// call's context does, with the matching status (DeadlineExceeded or
// Canceled).
type Service struct {
	testpb.UnimplementedTestServiceServer
	Hooks Hooks
}

func (s *Service) begin(ctx context.Context, method string) error {
	if s.Hooks.Enter != nil {
		if err := s.Hooks.Enter(ctx, method); err != nil {
			return err
		}
	}
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(HeaderDelay); len(v) > 0 {
		d, err := time.ParseDuration(v[0])
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "%s: %v", HeaderDelay, err)
		}
		return wait(ctx, d)
	}
	return nil
}

func (s *Service) end(ctx context.Context, method string) {
	if s.Hooks.Exit != nil {
		s.Hooks.Exit(ctx, method)
	}
}

// wait waits for d or until ctx ends, with ctx's status.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func echoStatus(st *testpb.EchoStatus) error {
	if st == nil || st.Code == 0 {
		return nil
	}
	return status.Error(codes.Code(st.Code), st.Message)
}

func payload(n int32) *testpb.Payload {
	return &testpb.Payload{Body: Pattern(int(max(n, 0)))}
}

// EmptyCall implements TestService.
func (s *Service) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	defer s.end(ctx, "EmptyCall")
	if err := s.begin(ctx, "EmptyCall"); err != nil {
		return nil, err
	}
	return &testpb.Empty{}, nil
}

// UnaryCall implements TestService.
func (s *Service) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	defer s.end(ctx, "UnaryCall")
	if err := s.begin(ctx, "UnaryCall"); err != nil {
		return nil, err
	}
	if err := echoStatus(req.GetResponseStatus()); err != nil {
		return nil, err
	}
	return &testpb.SimpleResponse{
		Payload:  payload(req.GetResponseSize()),
		ServerId: Sum(req.GetPayload().GetBody()),
		Hostname: TransportFromContext(ctx),
	}, nil
}

// StreamingOutputCall implements TestService.
func (s *Service) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	ctx := stream.Context()
	defer s.end(ctx, "StreamingOutputCall")
	if err := s.begin(ctx, "StreamingOutputCall"); err != nil {
		return err
	}
	for _, p := range req.GetResponseParameters() {
		if err := wait(ctx, time.Duration(p.GetIntervalUs())*time.Microsecond); err != nil {
			return err
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: payload(p.GetSize())}); err != nil {
			return err
		}
	}
	return echoStatus(req.GetResponseStatus())
}

// StreamingInputCall implements TestService.
func (s *Service) StreamingInputCall(stream grpc.ClientStreamingServer[testpb.StreamingInputCallRequest, testpb.StreamingInputCallResponse]) error {
	ctx := stream.Context()
	defer s.end(ctx, "StreamingInputCall")
	if err := s.begin(ctx, "StreamingInputCall"); err != nil {
		return err
	}
	var total int
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
		}
		if err != nil {
			return err
		}
		total += len(req.GetPayload().GetBody())
	}
}

// FullDuplexCall implements TestService.
func (s *Service) FullDuplexCall(stream grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	ctx := stream.Context()
	defer s.end(ctx, "FullDuplexCall")
	if err := s.begin(ctx, "FullDuplexCall"); err != nil {
		return err
	}
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := echoStatus(req.GetResponseStatus()); err != nil {
			return err
		}
		params := req.GetResponseParameters()
		if len(params) == 0 {
			if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
				return err
			}
			continue
		}
		for _, p := range params {
			if err := wait(ctx, time.Duration(p.GetIntervalUs())*time.Microsecond); err != nil {
				return err
			}
			if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: payload(p.GetSize())}); err != nil {
				return err
			}
		}
	}
}

// Pattern returns n bytes of a fixed pattern that does not repeat within
// 16 MiB, so a lost, duplicated or shifted chunk shows.
func Pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i) + 3*byte(i>>8) + 5*byte(i>>16)
	}
	return b
}

// Sum is the hex SHA-256 of b.
func Sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Info is the credentials.AuthInfo of a connection made with Creds. A
// handler gets it with peer.FromContext, or just the transport with
// TransportFromContext.
type Info struct {
	credentials.CommonAuthInfo
	// Transport is what rsock.TransportOf said of the connection at its
	// handshake: "verbs", "shm" or "tcp", or "" for a connection rsock did
	// not make. A connection that starts on TCP may move to a ring later
	// (rsock's upgrade); TransportFromContext says where it is now.
	Transport string
	// Reason is rsock's reason for the transport (ConnInfo.Reason).
	Reason string

	conn net.Conn
}

// AuthType implements credentials.AuthInfo.
func (Info) AuthType() string { return "insecure" }

// ValidateAuthority allows any :authority, as insecure credentials do.
func (Info) ValidateAuthority(string) error { return nil }

// TransportFromContext returns the rsock transport that carries the
// connection of the call in ctx (a handler's context) now, or "" if it is
// not known.
func TransportFromContext(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(Info); ok {
			if info.conn != nil {
				return rsock.TransportOf(info.conn)
			}
			return info.Transport
		}
	}
	return ""
}

// Creds returns transport credentials without security (no TLS), like
// insecure.NewCredentials, whose AuthInfo is an Info naming the rsock
// transport of the connection. logf, if not nil, is told of each connection
// and its transport.
func Creds(logf func(format string, args ...any)) credentials.TransportCredentials {
	return creds{logf: logf}
}

type creds struct {
	logf func(format string, args ...any)
}

func infoOf(c net.Conn) Info {
	info := Info{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	if ci, ok := rsock.InfoOf(c); ok {
		info.Transport, info.Reason, info.conn = ci.Transport, ci.Reason, c
	} else {
		info.Reason = "not an rsock connection"
	}
	return info
}

func describe(info Info) string {
	if info.Transport == "" {
		return "plain net.Conn (" + info.Reason + ")"
	}
	return info.Transport + " (" + info.Reason + ")"
}

func (c creds) ClientHandshake(_ context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := infoOf(conn)
	if c.logf != nil {
		c.logf("grpc client: connected to %s over %s", authority, describe(info))
	}
	return conn, info, nil
}

func (c creds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := infoOf(conn)
	if c.logf != nil {
		c.logf("grpc server: connection from %s over %s", conn.RemoteAddr(), describe(info))
	}
	return conn, info, nil
}

func (creds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (c creds) Clone() credentials.TransportCredentials { return c }

func (creds) OverrideServerName(string) error { return nil }

// transportHeader sends HeaderTransport with every call's response headers.
func transportHeader(ctx context.Context) metadata.MD {
	return metadata.Pairs(HeaderTransport, TransportFromContext(ctx))
}

func unaryHeader(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	_ = grpc.SetHeader(ctx, transportHeader(ctx))
	return handler(ctx, req)
}

func streamHeader(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	_ = ss.SetHeader(transportHeader(ss.Context()))
	return handler(srv, ss)
}

// NewServer returns a stock grpc.Server serving svc (nil: a Service
// without hooks) and the standard health service, with Creds(logf), message
// limits of MaxMsgSize, and HeaderTransport on every response. Further
// options are appended. Serve it on an rsock listener:
//
//	ln, _ := rsock.Listen("tcp", ":50051")
//	srv.Serve(ln)
func NewServer(svc *Service, logf func(format string, args ...any), opts ...grpc.ServerOption) *grpc.Server {
	if svc == nil {
		svc = &Service{}
	}
	all := []grpc.ServerOption{
		grpc.Creds(Creds(logf)),
		grpc.MaxRecvMsgSize(MaxMsgSize),
		grpc.MaxSendMsgSize(MaxMsgSize),
		grpc.ChainUnaryInterceptor(unaryHeader),
		grpc.ChainStreamInterceptor(streamHeader),
	}
	srv := grpc.NewServer(append(all, opts...)...)
	testpb.RegisterTestServiceServer(srv, svc)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv
}

// NewClient returns a grpc.ClientConn to addr ("host:port") whose
// connections d dials with rsock, using Creds(logf) and message limits of
// MaxMsgSize. Further options are appended. Like every ClientConn it
// connects lazily, and reconnects as needed.
func NewClient(addr string, d *rsock.Dialer, logf func(format string, args ...any), opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if d == nil {
		d = &rsock.Dialer{}
	}
	dial := func(ctx context.Context, a string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", a)
	}
	all := []grpc.DialOption{
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(Creds(logf)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMsgSize), grpc.MaxCallSendMsgSize(MaxMsgSize)),
	}
	// passthrough: hand addr to the dialer as it is, without DNS.
	return grpc.NewClient("passthrough:///"+addr, append(all, opts...)...)
}
