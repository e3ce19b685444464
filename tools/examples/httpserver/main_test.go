package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/rsockenv"
	"github.com/rdmanet/rdmanet/rsock"
	"github.com/rdmanet/rdmanet/rsock/rsockdebug"
)

// TestMain lets the test binary be the demo's server process, as the
// program itself is under make demo.
func TestMain(m *testing.M) {
	if os.Getenv(demoServerEnv) == "1" {
		if err := demoServer(os.Stdin, os.Stdout, log.New(io.Discard, "", 0)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestDemoOverShmByDefault(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "")
	var out bytes.Buffer
	require.NoError(t, runDemo(&out, log.New(io.Discard, "", 0), demoServerCmd()))
	s := out.String()
	assert.Contains(t, s, "hello from rsock over shm")
	assert.Contains(t, s, "now over shm (shm agreed")
	// Each direction switches on its own; the demo lists them in the
	// order they happened, which either side can win.
	assert.Contains(t, s, "upgrade: ")
	assert.Contains(t, s, "send tcp->shm")
	assert.Contains(t, s, "receive tcp->shm")
	assert.Contains(t, s, "rsock over shm")
	assert.Contains(t, s, "plain TCP")
	assert.Contains(t, s, "between two processes")
	assert.NotContains(t, s, "this run used TCP")
}

func TestDemoOverTCP(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_TRANSPORTS", "tcp")
	var out bytes.Buffer
	require.NoError(t, runDemo(&out, log.New(io.Discard, "", 0), demoServerCmd()))
	s := out.String()
	assert.Contains(t, s, "hello from rsock over tcp")
	assert.Contains(t, s, "over tcp (")
	assert.Contains(t, s, "this run used TCP")
	up := strings.Repeat("rsock", 1<<18)
	sum := sha256.Sum256([]byte(up))
	assert.Contains(t, s, hex.EncodeToString(sum[:]))
}

func TestPatternIsContinuous(t *testing.T) {
	var p Pattern
	a := make([]byte, 300)
	b := make([]byte, 300)
	_, _ = p.Read(a[:100])
	_, _ = p.Read(a[100:])
	for i := range b {
		b[i] = byte(i)
	}
	assert.Equal(t, b, a)
}

// TestDebugPage: the example serves /debug/rsock, whose report lists the
// rsock connection the request came on, with its transport.
func TestDebugPage(t *testing.T) {
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: Handler()}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: settledDial}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + ln.Addr().String() + "/debug/rsock?format=json")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var r rsockdebug.Report
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&r))
	transports := map[string]int{}
	for _, c := range r.Connections {
		transports[c.Transport]++
	}
	assert.GreaterOrEqual(t, transports["shm"], 2, "the request's connection, both ends: %v", transports)
}

// settledDial dials with rsock and returns the connection once its
// transport has settled (its upgrade to a ring done, or refused).
func settledDial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&rsock.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if err := awaitSettled(c, 10*time.Second); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
