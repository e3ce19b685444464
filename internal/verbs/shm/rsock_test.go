//go:build linux

package shm_test

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs/shm"
	"github.com/rdmanet/rdmanet/rsock"
)

var registerOnce sync.Once

// rsockPair returns both ends of an rsock connection over transports (a
// server that only accepts), checking that it runs on want.
func rsockPair(tb testing.TB, cfg *rsock.Config, want string) (client, server net.Conn) {
	tb.Helper()
	registerOnce.Do(func() { transport.Register("shm", shm.New()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ln, err := (&rsock.ListenConfig{Config: cfg}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			tb.Error(err)
		}
		accepted <- c
	}()
	client, err = (&rsock.Dialer{Config: cfg}).DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		tb.FailNow()
	}
	tb.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	if got, sgot := rsock.TransportOf(client), rsock.TransportOf(server); got != want || sgot != want {
		tb.Fatalf("transports %q (client) and %q (server), want %q", got, sgot, want)
	}
	return client, server
}

// TestRsockOverShm runs rsock's stream engine on this provider: an echo of
// 8 MiB in random pieces, checked byte for byte.
func TestRsockOverShm(t *testing.T) {
	c, s := rsockPair(t, &rsock.Config{Transports: []string{"shm"}}, "shm")
	go func() {
		_, _ = io.Copy(s, s)
		_ = s.Close()
	}()
	data := make([]byte, 8<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < len(data); {
			n := min(1+rng.IntN(300<<10), len(data)-off)
			if _, err := c.Write(data[off : off+n]); err != nil {
				errc <- err
				return
			}
			off += n
		}
		errc <- nil
	}()
	got := make([]byte, len(data))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("echoed data differs")
	}
}
