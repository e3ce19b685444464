package rsock

import (
	"bufio"
	cryptorand "crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"
)

// The two-process tests re-execute this test binary as a helper process
// (RSOCK_TEST_HELPER names its role). The helper listens with rsock, prints
// its address, and serves until its standard input closes, so it dies with
// the test.

const helperEnv = "RSOCK_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "relay":
		runHelper(relay)
	case "echo":
		runHelper(func(ln net.Listener) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go echo(c)
			}
		})
	case "sink":
		runHelper(func(ln net.Listener) {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go sink(c)
			}
		})
	default:
		if run := extraHelperRoles[os.Getenv(helperEnv)]; run != nil {
			run() // more roles, in shmproc_test.go
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "unknown helper role")
		os.Exit(2)
	}
}

// extraHelperRoles are the helper roles beyond relay and echo, by
// RSOCK_TEST_HELPER (shmproc_test.go's, on Linux).
var extraHelperRoles = map[string]func(){}

// runHelper listens on loopback with the RSOCK_* configuration of the
// environment, prints "ADDR host:port", and serves until stdin closes.
func runHelper(serve func(net.Listener)) {
	registerSim(nil)
	ln, err := Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("ADDR", ln.Addr())
	go serve(ln)
	_, _ = io.Copy(io.Discard, os.Stdin)
	ln.Close()
	os.Exit(0)
}

// relay pairs connections by the 8-byte ID each sends first, and splices
// each pair both ways, passing half-closes on, so that two connections from
// the test process behave as one pipe whose bytes cross into this process
// and back. (Pairing by accept order is wrong: a pipe closed before the
// listener classified its connections delivers them late.)
func relay(ln net.Listener) {
	var mu sync.Mutex
	waiting := map[string]net.Conn{}
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			var id [8]byte
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, id[:]); err != nil {
				c.Close()
				return
			}
			_ = c.SetReadDeadline(time.Time{})
			mu.Lock()
			other, ok := waiting[string(id[:])]
			if !ok {
				waiting[string(id[:])] = c
				mu.Unlock()
				return
			}
			delete(waiting, string(id[:]))
			mu.Unlock()
			splice(other, c)
		}()
	}
}

func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	half := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if err != nil {
			// An error (not EOF) on one side: tear both down.
			a.Close()
			b.Close()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}
	wg.Add(2)
	go half(a, b)
	go half(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// helperProc is a running helper process.
type helperProc struct {
	addr  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// startHelper starts the helper with role and extra environment, and stops
// it at the end of the test.
func startHelper(t testing.TB, role string, env ...string) *helperProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + role}, env...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "ADDR "), "helper said %q", line)
	h := &helperProc{addr: strings.TrimSpace(strings.TrimPrefix(line, "ADDR ")), cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	return h
}

// relayPipe dials the relay twice; the two conns form one pipe through the
// helper process.
func relayPipe(t testing.TB, h *helperProc, cfg *Config) (c1, c2 *Conn, err error) {
	d := Dialer{Config: cfg, Timeout: 10 * time.Second}
	var id [8]byte
	_, _ = cryptorand.Read(id[:])
	var conns [2]net.Conn
	for i := range conns {
		c, err := d.Dial("tcp", h.addr)
		if err == nil {
			_, err = c.Write(id[:])
		}
		if err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return nil, nil, err
		}
		conns[i] = c
	}
	return conns[0].(*Conn), conns[1].(*Conn), nil
}

// twoProcessTransports lists the transports the two-process tests run on:
// every one that can cross a process boundary and is built in.
func twoProcessTransports() []string { return []string{"tcp", "shm"} }

func TestNettestTwoProcesses(t *testing.T) {
	for _, tr := range twoProcessTransports() {
		t.Run(tr, func(t *testing.T) {
			h := startHelper(t, "relay", "RSOCK_TRANSPORTS="+tr)
			cfg := &Config{Transports: []string{tr}}
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				c1, c2, err := relayPipe(t, h, cfg)
				if err != nil {
					return nil, nil, nil, err
				}
				if TransportOf(c1) != tr || TransportOf(c2) != tr {
					return nil, nil, nil, fmt.Errorf("transport %s/%s, want %s: %s", TransportOf(c1), TransportOf(c2), tr, c1.Info().Reason)
				}
				return c1, c2, func() { c1.Close(); c2.Close() }, nil
			})
		})
	}
}

func TestTwoProcessEcho(t *testing.T) {
	for _, tr := range twoProcessTransports() {
		t.Run(tr, func(t *testing.T) {
			h := startHelper(t, "echo", "RSOCK_TRANSPORTS="+tr)
			d := Dialer{Config: &Config{Transports: []string{tr}}}
			c, err := d.Dial("tcp", h.addr)
			require.NoError(t, err)
			defer c.Close()
			assert.Equal(t, tr, TransportOf(c))
			streamCheck(t, c, c, 4<<20, 7)
		})
	}
}
