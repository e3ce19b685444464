package rsock

import (
	"errors"
	"io"
	"net"
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

// leaseRing is the ring size of these tests: small, so that a few writes
// fill it.
const leaseRing = 64 << 10

// forLeaseTransports runs f on a connected pair of every transport with
// read leases, with the client's write deadline a minute away (a hang
// fails, slowly). The pair is closed after f.
func forLeaseTransports(t *testing.T, f func(t *testing.T, c, s *Conn)) {
	registerSim(t)
	for _, tr := range []string{"shm", "sim"} {
		t.Run(tr, func(t *testing.T) {
			cfg := &Config{Transports: []string{tr}, RingSize: leaseRing}
			c, s := pipe(t, listen(t, cfg), cfg)
			defer c.Close()
			defer s.Close()
			require.NoError(t, c.SetWriteDeadline(time.Now().Add(time.Minute)))
			f(t, c, s)
		})
	}
}

// readSmall reads c in pieces of size bytes until an error, which it
// reports with the count read.
func readSmall(c net.Conn, size int) <-chan readResult {
	done := make(chan readResult, 1)
	go func() {
		b := make([]byte, size)
		var r readResult
		for {
			n, err := c.Read(b)
			r.n += n
			if err != nil {
				r.err = err
				done <- r
				return
			}
		}
	}()
	return done
}

type readResult struct {
	n   int
	err error
}

// waitRead waits until s has read n bytes.
func waitRead(s *Conn, n int) {
	for s.Info().BytesRead < uint64(n) {
		time.Sleep(time.Millisecond)
	}
}

// TestCloseReadReturnsLease: after a small Read took a lease, CloseRead
// with no Read running discards the rest, so a writer of four rings' worth
// finishes.
func TestCloseReadReturnsLease(t *testing.T) {
	forLeaseTransports(t, func(t *testing.T, c, s *Conn) {
		errc := writeAll(c, 4*leaseRing)
		var b [100]byte
		_, err := io.ReadFull(s, b[:])
		require.NoError(t, err)
		require.NoError(t, s.CloseRead())
		require.NoError(t, <-errc)
		_, err = s.Read(b[:])
		assert.ErrorIs(t, err, io.EOF)
	})
}

// TestCloseReadDuringReads: CloseRead while another goroutine reads in
// small pieces; the reader ends with EOF and the writer finishes.
func TestCloseReadDuringReads(t *testing.T) {
	forLeaseTransports(t, func(t *testing.T, c, s *Conn) {
		require.NoError(t, s.SetReadDeadline(time.Now().Add(time.Minute)))
		errc := writeAll(c, 16*leaseRing)
		done := readSmall(s, 1000)
		waitRead(s, leaseRing)
		require.NoError(t, s.CloseRead())
		r := <-done
		assert.ErrorIs(t, r.err, io.EOF)
		require.NoError(t, <-errc)
		assert.LessOrEqual(t, r.n, 16*leaseRing)
	})
}

// TestCloseDuringSmallReads: Close while another goroutine reads in small
// pieces from a lease; the Read returns data or net.ErrClosed, never
// touches the unmapped ring (the race detector and a fault would say).
func TestCloseDuringSmallReads(t *testing.T) {
	forLeaseTransports(t, func(t *testing.T, c, s *Conn) {
		errc := writeAll(c, 16*leaseRing)
		done := readSmall(s, 700)
		waitRead(s, leaseRing)
		require.NoError(t, s.Close())
		r := <-done
		assert.True(t, errors.Is(r.err, net.ErrClosed), "read after Close: %v", r.err)
		<-errc // the writer fails (peer closed) or finished
	})
}
