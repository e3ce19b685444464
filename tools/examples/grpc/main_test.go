package main

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/rsockenv"
	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

func TestDemoOverTCP(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "tcp")
	var out bytes.Buffer
	require.NoError(t, runDemo(context.Background(), &out, log.New(io.Discard, "", 0)))
	s := out.String()
	t.Log(s)
	for _, want := range []string{
		"unary:            64 KiB up, 64 KiB down, byte-exact (server side over tcp)",
		"server-streaming: 8 messages of 32 KiB (server side over tcp)",
		"client-streaming: 8 messages of 256 KiB, server counted 2097152 bytes (server side over tcp)",
		"bidi:             16 echoes from 1 B to 32 KiB (server side over tcp)",
		"deadline:         a 5s call with a 100ms deadline: DeadlineExceeded",
		"cancellation:     a 1000-message stream cancelled after 3 messages: Canceled",
		"grpc client: connected to 127.0.0.1:",
		"grpc server: UnaryCall ended: context ",
		"grpc server: StreamingOutputCall ended: context canceled",
		"this run used TCP",
	} {
		assert.Contains(t, s, want)
	}
}

func TestDemoOverShmByDefault(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "")
	var out bytes.Buffer
	require.NoError(t, runDemo(context.Background(), &out, log.New(io.Discard, "", 0)))
	s := out.String()
	assert.Contains(t, s, "unary:            64 KiB up, 64 KiB down, byte-exact (server side over shm)")
	assert.Contains(t, s, "the connection now over shm (shm agreed")
	assert.NotContains(t, s, "this run used TCP")
}

func TestDemoOverSim(t *testing.T) {
	transport.Register("sim", sim.New())
	t.Cleanup(func() { transport.Unregister("sim") })
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "sim,tcp")
	var out bytes.Buffer
	require.NoError(t, runDemo(context.Background(), &out, log.New(io.Discard, "", 0)))
	s := out.String()
	t.Log(s)
	assert.Contains(t, s, "unary:            64 KiB up, 64 KiB down, byte-exact (server side over sim)")
	assert.Contains(t, s, "bidi:             16 echoes from 1 B to 32 KiB (server side over sim)")
	assert.Contains(t, s, "now over sim (sim agreed")
	assert.NotContains(t, s, "now over tcp")
	assert.NotContains(t, s, "this run used TCP")
	assert.NotContains(t, s, "fallback")
}

// TestServerAndClientModes runs -listen and -connect as separate pieces, as
// two processes would.
func TestServerAndClientModes(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "verbs,shm,tcp")
	// Find a free port, then serve on it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, addr, log.New(io.Discard, "", 0)) }()

	var out bytes.Buffer
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The server may not be listening yet: the ClientConn retries.
	require.Eventually(t, func() bool {
		out.Reset()
		return runClient(cctx, addr, &out, nil) == nil
	}, 30*time.Second, 50*time.Millisecond)
	assert.Contains(t, out.String(), "cancellation:")

	stop()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not stop")
	}
}
