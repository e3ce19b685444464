package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	t.Setenv("RSOCK_TRANSPORTS", "")
	var out bytes.Buffer
	require.NoError(t, runDemo(&out, log.New(io.Discard, "", 0), demoServerCmd()))
	s := out.String()
	assert.Contains(t, s, "hello from rsock over shm")
	assert.Contains(t, s, "over shm (shm agreed)")
	assert.Contains(t, s, "rsock over shm")
	assert.Contains(t, s, "plain TCP")
	assert.Contains(t, s, "between two processes")
	assert.NotContains(t, s, "this run used TCP")
}

func TestDemoOverTCP(t *testing.T) {
	t.Setenv("RSOCK_TRANSPORTS", "tcp")
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
