package clients

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/rdmanet/rdmanet/rsock"
)

// yamuxPair connects once over rsock with cfg and runs a yamux server
// session on the accepted end and a client session on the dialed end,
// until the test ends. It returns the sessions and the connections under
// them.
func yamuxPair(t *testing.T, cfg *rsock.Config) (srv, cli *yamux.Session, accepted, dialed net.Conn) {
	t.Helper()
	lc := rsock.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	type result struct {
		c   net.Conn
		err error
	}
	acc := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		acc <- result{c, err}
	}()
	d := rsock.Dialer{Config: cfg, Timeout: 10 * time.Second}
	dialed, err = d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { dialed.Close() })
	select {
	case r := <-acc:
		require.NoError(t, r.err, "Accept")
		accepted = r.c
	case <-time.After(30 * time.Second):
		t.Fatal("Accept did not return in 30 s")
	}
	t.Cleanup(func() { accepted.Close() })

	ycfg := yamux.DefaultConfig()
	ycfg.LogOutput = io.Discard
	srv, err = yamux.Server(accepted, ycfg)
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	cli, err = yamux.Client(dialed, ycfg)
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return srv, cli, accepted, dialed
}

// echoStreams accepts n streams on s and echoes each one's bytes back
// until its opener closes its writing side, then closes it.
func echoStreams(s *yamux.Session, n int) error {
	var g errgroup.Group
	for range n {
		st, err := s.AcceptStream()
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		g.Go(func() error {
			if _, err := io.Copy(st, st); err != nil {
				return fmt.Errorf("stream %d: echo: %w", st.StreamID(), err)
			}
			return st.Close()
		})
	}
	return g.Wait()
}

// sendStreams opens n streams on s at once. On each it writes 64 KiB to
// 1 MiB of bytes from a generator seeded with seed, in chunks of 1 B to
// 64 KiB, then closes its writing side, while it reads the echo; the echo
// must match byte for byte and end there.
func sendStreams(s *yamux.Session, n int, seed uint64) error {
	var g errgroup.Group
	for i := range n {
		g.Go(func() error {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			payload := randomBytes(rng, 64<<10+rng.IntN(960<<10+1))
			st, err := s.OpenStream()
			if err != nil {
				return fmt.Errorf("open %d: %w", i, err)
			}
			var echo []byte
			var sg errgroup.Group
			sg.Go(func() error {
				var err error
				echo, err = io.ReadAll(st)
				if err != nil {
					return fmt.Errorf("stream %d: read the echo: %w", st.StreamID(), err)
				}
				return nil
			})
			for rest := payload; len(rest) > 0; {
				k := min(len(rest), 1+rng.IntN(64<<10))
				if _, err := st.Write(rest[:k]); err != nil {
					return fmt.Errorf("stream %d: write at %d of %d: %w", st.StreamID(), len(payload)-len(rest), len(payload), err)
				}
				rest = rest[k:]
			}
			// A yamux stream's Close sends FIN, and the stream reads on
			// until the peer's: it closes the writing side only.
			if err := st.Close(); err != nil {
				return fmt.Errorf("stream %d: close: %w", st.StreamID(), err)
			}
			if err := sg.Wait(); err != nil {
				return err
			}
			if !bytes.Equal(echo, payload) {
				return fmt.Errorf("stream %d: %d bytes back for %d, or different bytes", st.StreamID(), len(echo), len(payload))
			}
			return nil
		})
	}
	return g.Wait()
}

// TestYamux runs hashicorp/yamux sessions over one rsock connection: the
// client session opens 8 streams to the server and the server session 8
// to the client, all at once; on each the opener writes 64 KiB to 1 MiB in
// random chunks and half-closes, and the other end echoes it back. Every
// echo must match byte for byte, no call may hang, and the connection must
// end up on the subtest's transport at both ends.
func TestYamux(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			cfg := suiteConfig(tr)
			srv, cli, accepted, dialed := yamuxPair(t, cfg)

			const streams = 8
			var g errgroup.Group
			g.Go(func() error {
				if err := echoStreams(srv, streams); err != nil {
					return fmt.Errorf("server echoing: %w", err)
				}
				return nil
			})
			g.Go(func() error {
				if err := sendStreams(cli, streams, 1); err != nil {
					return fmt.Errorf("client to server: %w", err)
				}
				return nil
			})
			g.Go(func() error {
				if err := echoStreams(cli, streams); err != nil {
					return fmt.Errorf("client echoing: %w", err)
				}
				return nil
			})
			g.Go(func() error {
				if err := sendStreams(srv, streams, 2); err != nil {
					return fmt.Errorf("server to client: %w", err)
				}
				return nil
			})
			waitGroup(t, &g, 2*time.Minute)

			requireSettledOn(t, tr, "server side", []net.Conn{accepted})
			requireSettledOn(t, tr, "client side", []net.Conn{dialed})
		})
	}
}
