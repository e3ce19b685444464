package stream

import (
	"bytes"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var growing = Options{RingSize: 4 << 10, Credits: 8, GrowTo: 64 << 10}

// pattern is n bytes of a seeded stream, so that a byte lost, repeated or
// moved shows up wherever it happens.
func pattern(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n]
}

// A writer that fills a small ring makes it grow; both directions
// carry a hash-checked stream across the move, and afterwards each side
// holds the larger rings and staging only.
func TestRingGrowsUnderLoad(t *testing.T) {
	a, b := newPair(t, growing)
	small := a.Registered()
	require.Equal(t, int64(4<<10+8*slotSize+4<<10), small, "ring, slots and staging of the starting size")

	// carry sends n bytes each way, hash-checked.
	carry := func(n int, seed uint64) {
		ab, ba := pattern(seed, n), pattern(seed+1, n)
		var wg sync.WaitGroup
		for _, dir := range []struct {
			w, r *Conn
			data []byte
		}{{a, b, ab}, {b, a, ba}} {
			wg.Add(2)
			go func() {
				defer wg.Done()
				// Writes of odd sizes, so chunks straddle the move and the
				// rings' wrap.
				for off := 0; off < n; {
					k := min(n-off, 1+off%7919)
					_, err := dir.w.Write(dir.data[off : off+k])
					if !assertNoError(t, err) {
						return
					}
					off += k
				}
			}()
			go func() {
				defer wg.Done()
				got := make([]byte, n)
				for off := 0; off < n; {
					k, err := dir.r.Read(got[off:min(n, off+1+off%5003)])
					if !assertNoError(t, err) {
						return
					}
					off += k
				}
				if !bytes.Equal(got, dir.data) {
					t.Errorf("the stream differs after the ring grew")
				}
			}()
		}
		wg.Wait()
	}
	carry(3<<20, 1)
	// A move completes beside the traffic that follows the writer's
	// block, not by itself: carry on until both sides have moved.
	grown := func(c *Conn) bool {
		return c.Stats().RingGrows.Load() == 2 && c.Registered() == 64<<10+8*slotSize+64<<10
	}
	for i := uint64(0); (!grown(a) || !grown(b)) && i < 256 && !t.Failed(); i++ {
		carry(64<<10, 10+2*i)
	}
	for _, c := range []*Conn{a, b} {
		require.Equal(t, uint64(2), c.Stats().RingGrows.Load(), "our ring, and the peer's, moved once")
		require.Zero(t, c.Stats().GrowFailures.Load())
		_, size := c.Occupancy()
		require.Equal(t, int64(64<<10), size)
		require.Equal(t, int64(64<<10+8*slotSize+64<<10), c.Registered(), "the old ring and staging were released")
	}
}

func assertNoError(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// A reader that never fills the ring keeps it small: ping-pong traffic
// does not grow rings.
func TestRingStaysSmallWithoutPressure(t *testing.T) {
	a, b := newPair(t, growing)
	msg := make([]byte, 512)
	for range 2000 {
		_, err := a.Write(msg)
		require.NoError(t, err)
		_, err = io.ReadFull(b, msg)
		require.NoError(t, err)
		_, err = b.Write(msg)
		require.NoError(t, err)
		_, err = io.ReadFull(a, msg)
		require.NoError(t, err)
	}
	for _, c := range []*Conn{a, b} {
		require.Zero(t, c.Stats().RingGrows.Load())
		require.Equal(t, int64(4<<10+8*slotSize+4<<10), c.Registered())
	}
}

// CopyTo reads across the move as Read does: the writer goes on until the
// reader's ring has moved (a move completes beside the traffic, not at a
// fixed point of it), then writes a little more and closes.
func TestRingGrowsUnderCopyTo(t *testing.T) {
	a, b := newPair(t, growing)
	data := pattern(3, 16<<20)
	const piece, after = 32 << 10, 8
	errc := make(chan error, 1)
	var n int // written, once errc has the writer's end
	go func() {
		var err error
		for extra := after; err == nil && extra > 0 && n < len(data); n += piece {
			if b.Stats().RingGrows.Load() > 0 {
				extra--
			}
			_, err = a.Write(data[n : n+piece])
		}
		if err == nil {
			err = a.CloseWrite()
		}
		errc <- err
	}()
	var got bytes.Buffer
	k, rerr, werr := b.CopyTo(&got)
	require.NoError(t, rerr)
	require.NoError(t, werr)
	require.NoError(t, <-errc)
	require.Less(t, n, len(data), "the reader's ring did not move within %d bytes", len(data))
	require.Equal(t, int64(n), k)
	require.True(t, bytes.Equal(got.Bytes(), data[:n]))
	require.Equal(t, uint64(1), b.Stats().RingGrows.Load())
}
