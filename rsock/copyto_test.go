package rsock

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"
)

// limitedWriter keeps up to limit bytes, then fails with fail.
type limitedWriter struct {
	buf   bytes.Buffer
	limit int
	fail  error
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	if w.buf.Len()+len(p) > w.limit {
		n := w.limit - w.buf.Len()
		w.buf.Write(p[:n])
		return n, w.fail
	}
	return w.buf.Write(p)
}

// TestWriteToOnRings: io.Copy from a ring connection goes through WriteTo,
// which hands the writer the receive ring's memory in place. The bytes
// arrive intact and in order, a writer's error comes back as is (not
// wrapped) with the bytes it took counted, and what it did not take is
// still there for the next Read; the read deadline applies.
func TestWriteToOnRings(t *testing.T) {
	registerSim(t)
	for _, tc := range []struct {
		tr   string
		ring int
	}{{"shm", 0}, {"shm", 4096}, {"sim", 0}, {"sim", 4096}} {
		t.Run(fmt.Sprintf("%s/ring=%d", tc.tr, tc.ring), func(t *testing.T) {
			cfg := &Config{Transports: []string{tc.tr}, RingSize: tc.ring}
			ln := listen(t, cfg)
			c, s := pipe(t, ln, cfg)
			defer c.Close()
			defer s.Close()
			require.Equal(t, tc.tr, TransportOf(s), s.Info().Reason)

			rng := rand.New(rand.NewPCG(uint64(tc.ring), 7))
			data := make([]byte, 3<<20)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			go func() {
				rest := data
				for len(rest) > 0 {
					n := 1 + rng.IntN(min(len(rest), 300_000))
					if _, err := c.Write(rest[:n]); err != nil {
						return
					}
					rest = rest[n:]
				}
			}()

			// The first 1 MiB + 17 through a writer that then fails.
			errStop := errors.New("writer full")
			lw := &limitedWriter{limit: 1<<20 + 17, fail: errStop}
			n, err := io.Copy(lw, s)
			require.ErrorIs(t, err, errStop)
			assert.Equal(t, errStop, err, "the writer's error is returned as is")
			assert.EqualValues(t, lw.limit, n)
			require.True(t, bytes.Equal(data[:lw.limit], lw.buf.Bytes()), "bytes through WriteTo differ")

			// The rest: first by Read, to check nothing was lost, then by
			// WriteTo again.
			got := make([]byte, 1000)
			_, err = io.ReadFull(s, got)
			require.NoError(t, err)
			require.True(t, bytes.Equal(data[lw.limit:lw.limit+1000], got), "Read after WriteTo stopped")
			rest := data[lw.limit+1000:]
			lw2 := &limitedWriter{limit: len(rest)}
			n, err = io.CopyN(lw2, s, int64(len(rest)))
			require.NoError(t, err)
			assert.EqualValues(t, len(rest), n)
			require.True(t, bytes.Equal(rest, lw2.buf.Bytes()), "bytes through WriteTo differ")

			// Nothing more comes: the read deadline ends WriteTo.
			require.NoError(t, s.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
			n, err = s.WriteTo(io.Discard)
			assert.Zero(t, n)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			var ne net.Error
			require.ErrorAs(t, err, &ne)
			assert.True(t, ne.Timeout())
			require.NoError(t, s.SetReadDeadline(time.Time{}))

			// EOF ends it with no error.
			_, err = c.Write([]byte("tail"))
			require.NoError(t, err)
			require.NoError(t, c.CloseWrite())
			var tail bytes.Buffer
			n, err = s.WriteTo(&tail)
			require.NoError(t, err)
			assert.EqualValues(t, 4, n)
			assert.Equal(t, "tail", tail.String())
		})
	}
}

// TestNettestEventOnly: busy-polling off, so every blocked call parks at
// once: woken by the completion queue's notification as the poller, or by
// the poller's progress, deadlines and Close.
func TestNettestEventOnly(t *testing.T) {
	registerSim(t)
	for _, tr := range []string{"shm", "sim"} {
		t.Run(tr, func(t *testing.T) {
			cfg := &Config{Transports: []string{tr}, BusyPoll: -1}
			nettest.TestConn(t, pipeOn(t, listen(t, cfg), cfg, tr))
		})
	}
}
