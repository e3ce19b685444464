package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rdmanet/rdmanet/tools/examples/grpc/service"
)

// runCalls makes one call of each kind on cc, then shows a deadline and a
// cancellation, and prints what happened.
func runCalls(ctx context.Context, cc *grpc.ClientConn, out io.Writer) error {
	client := testpb.NewTestServiceClient(cc)
	for _, step := range []struct {
		name string
		run  func(context.Context, testpb.TestServiceClient) (string, error)
	}{
		{"unary", unary},
		{"server-streaming", serverStreaming},
		{"client-streaming", clientStreaming},
		{"bidi", bidi},
		{"deadline", deadline},
		{"cancellation", cancellation},
	} {
		// Each call gets a deadline, as every RPC should.
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		what, err := step.run(cctx, client)
		cancel()
		if err != nil {
			return fmt.Errorf("%s: %w", step.name, err)
		}
		fmt.Fprintf(out, "%-17s %s\n", step.name+":", what)
	}
	return nil
}

func serverTransport(md metadata.MD) string {
	if v := md.Get(service.HeaderTransport); len(v) > 0 {
		return v[0]
	}
	return "?"
}

func unary(ctx context.Context, c testpb.TestServiceClient) (string, error) {
	body := service.Pattern(64 << 10)
	var header metadata.MD
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 64 << 10, Payload: &testpb.Payload{Body: body}}, grpc.Header(&header))
	if err != nil {
		return "", err
	}
	if resp.GetServerId() != service.Sum(body) {
		return "", errors.New("the server's hash of the request differs")
	}
	if service.Sum(resp.GetPayload().GetBody()) != service.Sum(service.Pattern(64<<10)) {
		return "", errors.New("the response payload is not the pattern")
	}
	return fmt.Sprintf("64 KiB up, 64 KiB down, byte-exact (server side over %s)", serverTransport(header)), nil
}

func serverStreaming(ctx context.Context, c testpb.TestServiceClient) (string, error) {
	req := &testpb.StreamingOutputCallRequest{}
	for range 8 {
		req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: 32 << 10, IntervalUs: 2000})
	}
	stream, err := c.StreamingOutputCall(ctx, req)
	if err != nil {
		return "", err
	}
	n := 0
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", err
		}
		if len(resp.GetPayload().GetBody()) != 32<<10 {
			return "", fmt.Errorf("message %d has %d bytes", n, len(resp.GetPayload().GetBody()))
		}
		n++
	}
	header, _ := stream.Header()
	return fmt.Sprintf("%d messages of 32 KiB (server side over %s)", n, serverTransport(header)), nil
}

func clientStreaming(ctx context.Context, c testpb.TestServiceClient) (string, error) {
	stream, err := c.StreamingInputCall(ctx)
	if err != nil {
		return "", err
	}
	body := service.Pattern(256 << 10)
	for range 8 {
		if err := stream.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: body}}); err != nil {
			return "", err
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return "", err
	}
	if resp.GetAggregatedPayloadSize() != 8*256<<10 {
		return "", fmt.Errorf("server counted %d bytes", resp.GetAggregatedPayloadSize())
	}
	header, _ := stream.Header()
	return fmt.Sprintf("8 messages of 256 KiB, server counted %d bytes (server side over %s)", resp.GetAggregatedPayloadSize(), serverTransport(header)), nil
}

func bidi(ctx context.Context, c testpb.TestServiceClient) (string, error) {
	stream, err := c.FullDuplexCall(ctx)
	if err != nil {
		return "", err
	}
	const rounds = 16
	for i := range rounds {
		body := service.Pattern(1 << (i % 16))
		if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: body}}); err != nil {
			return "", err
		}
		resp, err := stream.Recv()
		if err != nil {
			return "", err
		}
		if service.Sum(resp.GetPayload().GetBody()) != service.Sum(body) {
			return "", fmt.Errorf("echo %d differs", i)
		}
	}
	if err := stream.CloseSend(); err != nil {
		return "", err
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("after CloseSend: %v, want EOF", err)
	}
	header, _ := stream.Header()
	return fmt.Sprintf("%d echoes from 1 B to 32 KiB (server side over %s)", rounds, serverTransport(header)), nil
}

// deadline asks the server to take 5s with a 100ms deadline: the call
// fails with DeadlineExceeded, and the server's context ends too.
func deadline(ctx context.Context, c testpb.TestServiceClient) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, service.HeaderDelay, "5s")
	start := time.Now()
	_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
	if status.Code(err) != codes.DeadlineExceeded {
		return "", fmt.Errorf("got %v, want DeadlineExceeded", err)
	}
	return fmt.Sprintf("a 5s call with a 100ms deadline: %v after %v", status.Code(err), time.Since(start).Round(time.Millisecond)), nil
}

// cancellation cancels a server stream after three of its messages.
func cancellation(ctx context.Context, c testpb.TestServiceClient) (string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := &testpb.StreamingOutputCallRequest{}
	for range 1000 {
		req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: 1024, IntervalUs: 10000})
	}
	stream, err := c.StreamingOutputCall(ctx, req)
	if err != nil {
		return "", err
	}
	for range 3 {
		if _, err := stream.Recv(); err != nil {
			return "", err
		}
	}
	cancel()
	for {
		_, err = stream.Recv()
		if err != nil {
			break
		}
	}
	if status.Code(err) != codes.Canceled {
		return "", fmt.Errorf("got %v, want Canceled", err)
	}
	return fmt.Sprintf("a 1000-message stream cancelled after 3 messages: %v", status.Code(err)), nil
}
