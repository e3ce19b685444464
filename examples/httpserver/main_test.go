package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

func TestDemoOverShmByDefault(t *testing.T) {
	t.Setenv("RSOCK_TRANSPORTS", "")
	var out bytes.Buffer
	require.NoError(t, runDemo(&out, log.New(io.Discard, "", 0)))
	s := out.String()
	assert.Contains(t, s, "hello from rsock over shm")
	assert.Contains(t, s, "over shm (shm agreed)")
	assert.Contains(t, s, "rsock over shm")
	assert.Contains(t, s, "plain TCP")
	assert.NotContains(t, s, "this run used TCP")
}

func TestDemoOverTCP(t *testing.T) {
	t.Setenv("RSOCK_TRANSPORTS", "tcp")
	var out bytes.Buffer
	require.NoError(t, runDemo(&out, log.New(io.Discard, "", 0)))
	s := out.String()
	assert.Contains(t, s, "hello from rsock over tcp")
	assert.Contains(t, s, "over tcp (")
	assert.Contains(t, s, "this run used TCP")
	up := strings.Repeat("rsock", 1<<18)
	sum := sha256.Sum256([]byte(up))
	assert.Contains(t, s, hex.EncodeToString(sum[:]))
}

func TestDemoOverSim(t *testing.T) {
	transport.Register("sim", sim.New())
	t.Cleanup(func() { transport.Unregister("sim") })
	t.Setenv("RSOCK_TRANSPORTS", "sim,tcp")
	var out bytes.Buffer
	require.NoError(t, runDemo(&out, log.New(io.Discard, "", 0)))
	s := out.String()
	assert.Contains(t, s, "hello from rsock over sim")
	assert.Contains(t, s, "over sim (sim agreed)")
	assert.NotContains(t, s, "fallback")
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
