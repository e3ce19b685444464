package rsock

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Reads lend the readable bytes to later Reads (a lease, internal/stream
// read.go). These tests check that the bytes lent come back whatever ends
// the reading: CloseRead with no Read running, CloseRead during Reads,
// Close during Reads.

// writeAll writes n bytes to c in 64 KiB writes and reports the outcome.
func writeAll(c net.Conn, n int) <-chan error {
	errc := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		for n > 0 {
			k, err := c.Write(buf[:min(n, len(buf))])
			if err != nil {
				errc <- err
				return
			}
			n -= k
		}
		errc <- nil
	}()
	return errc
}

func leaseTransports(t *testing.T) []string {
	registerSim(t)
	return []string{"shm", "sim"}
}

// TestCloseReadReturnsLease: after a small Read took a lease, CloseRead
// with no Read running discards the rest, so a writer of four rings' worth
// finishes.
func TestCloseReadReturnsLease(t *testing.T) {
	for _, tr := range leaseTransports(t) {
		t.Run(tr, func(t *testing.T) {
			cfg := &Config{Transports: []string{tr}, RingSize: 64 << 10}
			ln := listen(t, cfg)
			c, s := pipe(t, ln, cfg)
			defer c.Close()
			defer s.Close()
			require.NoError(t, c.SetWriteDeadline(time.Now().Add(time.Minute))) // a hang fails, slowly
			errc := writeAll(c, 4*cfg.RingSize)
			var b [100]byte
			_, err := io.ReadFull(s, b[:])
			require.NoError(t, err)
			require.NoError(t, s.CloseRead())
			require.NoError(t, <-errc)
			_, err = s.Read(b[:])
			assert.ErrorIs(t, err, io.EOF)
		})
	}
}

// TestCloseReadDuringReads: CloseRead while another goroutine reads in
// small pieces; the reader ends with EOF and the writer finishes.
func TestCloseReadDuringReads(t *testing.T) {
	for _, tr := range leaseTransports(t) {
		t.Run(tr, func(t *testing.T) {
			cfg := &Config{Transports: []string{tr}, RingSize: 64 << 10}
			ln := listen(t, cfg)
			c, s := pipe(t, ln, cfg)
			defer c.Close()
			defer s.Close()
			require.NoError(t, c.SetWriteDeadline(time.Now().Add(time.Minute)))
			require.NoError(t, s.SetReadDeadline(time.Now().Add(time.Minute)))
			errc := writeAll(c, 16*cfg.RingSize)
			var wg sync.WaitGroup
			wg.Add(1)
			var rerr error
			var got int
			go func() {
				defer wg.Done()
				var b [1000]byte
				for {
					n, err := s.Read(b[:])
					got += n
					if err != nil {
						rerr = err
						return
					}
				}
			}()
			for s.Info().BytesRead < uint64(cfg.RingSize) {
				time.Sleep(time.Millisecond)
			}
			require.NoError(t, s.CloseRead())
			wg.Wait()
			assert.ErrorIs(t, rerr, io.EOF)
			require.NoError(t, <-errc)
			assert.LessOrEqual(t, got, 16*cfg.RingSize)
		})
	}
}

// TestCloseDuringSmallReads: Close while another goroutine reads in small
// pieces from a lease; the Read returns data or net.ErrClosed, never
// touches the unmapped ring (the race detector and a fault would say).
func TestCloseDuringSmallReads(t *testing.T) {
	for _, tr := range leaseTransports(t) {
		t.Run(tr, func(t *testing.T) {
			cfg := &Config{Transports: []string{tr}, RingSize: 64 << 10}
			ln := listen(t, cfg)
			c, s := pipe(t, ln, cfg)
			defer c.Close()
			require.NoError(t, c.SetWriteDeadline(time.Now().Add(time.Minute)))
			errc := writeAll(c, 16*cfg.RingSize)
			done := make(chan error, 1)
			go func() {
				var b [700]byte
				for {
					if _, err := s.Read(b[:]); err != nil {
						done <- err
						return
					}
				}
			}()
			for s.Info().BytesRead < uint64(cfg.RingSize) {
				time.Sleep(time.Millisecond)
			}
			require.NoError(t, s.Close())
			err := <-done
			assert.True(t, errors.Is(err, net.ErrClosed), "read after Close: %v", err)
			<-errc // the writer fails (peer closed) or finished
		})
	}
}
