package rsock

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// records is a slog.Handler that keeps what it is given.
type records struct {
	mu    sync.Mutex
	recs  []slog.Record
	attrs []slog.Attr
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	rec = rec.Clone()
	rec.AddAttrs(r.attrs...)
	r.mu.Lock()
	r.recs = append(r.recs, rec)
	r.mu.Unlock()
	return nil
}
func (r *records) WithAttrs(as []slog.Attr) slog.Handler {
	return &sharedRecords{r, append(append([]slog.Attr(nil), r.attrs...), as...)}
}
func (r *records) WithGroup(string) slog.Handler { return r }

// sharedRecords adds attributes and keeps the records in the parent.
type sharedRecords struct {
	*records
	extra []slog.Attr
}

func (s *sharedRecords) Handle(ctx context.Context, rec slog.Record) error {
	rec = rec.Clone()
	rec.AddAttrs(s.extra...)
	return s.records.Handle(ctx, rec)
}

// find returns the records with message msg, as attribute maps.
func (r *records) find(msg string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for _, rec := range r.recs {
		if rec.Message != msg {
			continue
		}
		m := map[string]string{"level": rec.Level.String()}
		rec.Attrs(func(a slog.Attr) bool {
			m[a.Key] = a.Value.String()
			return true
		})
		out = append(out, m)
	}
	return out
}

// TestLogFallbacksAndVerdicts: each fallback is logged with its code,
// reason and peer, and the probe cache's verdict once it is reached.
func TestLogFallbacksAndVerdicts(t *testing.T) {
	rec := &records{}
	addr := plainServer(t, echo)
	t.Cleanup(func() { plainServers.forget("tcp " + addr) })
	for range 2 {
		c, err := dialProbing(t, addr, &Config{Logger: slog.New(rec)})
		require.NoError(t, err)
		c.Close()
	}
	fb := rec.find("rsock: connection falls back to TCP")
	require.Len(t, fb, 2)
	assert.Equal(t, CodePlainServer, fb[0]["code"])
	assert.Equal(t, "tcp", fb[0]["transport"])
	assert.Equal(t, "INFO", fb[0]["level"])
	assert.Contains(t, fb[0]["reason"], "echoed")
	assert.Equal(t, addr, fb[0]["peer"])
	v := rec.find("rsock: remembering a server that does not speak rsock")
	require.Len(t, v, 1, "the verdict, at the second probe")
	assert.Equal(t, addr, v[0]["peer"])
}

// TestLogResets: a connection that ends in a reset is logged with its
// transport, reason and peer.
func TestLogResets(t *testing.T) {
	rec := &records{}
	cfg := &Config{Transports: []string{"shm"}, Logger: slog.New(rec)}
	c, s := pipe(t, listen(t, cfg), cfg)
	defer s.Close()
	require.NoError(t, c.SetLinger(0))
	require.NoError(t, c.Close())
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := s.Read(make([]byte, 1))
	require.Error(t, err)
	var resets []map[string]string
	for resets = rec.find("rsock: connection reset"); len(resets) == 0; resets = rec.find("rsock: connection reset") {
		time.Sleep(time.Millisecond) // logged by the goroutine that tells the peer
	}
	assert.Equal(t, "shm", resets[0]["transport"])
	assert.Equal(t, "WARN", resets[0]["level"])
	assert.Contains(t, resets[0]["reason"], "linger 0")
}

// TestLogFloodIsLimited: a flood of malformed hellos at a listener logs
// at most logBurst records at once.
func TestLogFloodIsLimited(t *testing.T) {
	rec := &records{}
	ln := listen(t, &Config{Transports: []string{"shm", "tcp"}, Logger: slog.New(rec)})
	const flood = 50
	for range flood {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		_, _ = c.Write(append([]byte(handshake.Magic), 99, 1, 0, 0))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	for ln.Stats().HandshakeErrors < flood {
		time.Sleep(time.Millisecond)
	}
	n := len(rec.find("rsock: handshake dropped"))
	assert.GreaterOrEqual(t, n, 1)
	assert.LessOrEqual(t, n, logBurst+2, "records for %d failed handshakes", flood) // plus what the seconds of the test refilled
}

// TestLimiter: a burst, then one record per interval, and the next record
// counts those suppressed.
func TestLimiter(t *testing.T) {
	now := time.Unix(1000, 0)
	l := limiter{now: func() time.Time { return now }}
	for i := range logBurst {
		ok, n := l.allow()
		require.True(t, ok, "record %d of the burst", i)
		require.Zero(t, n)
	}
	for range 5 {
		ok, _ := l.allow()
		require.False(t, ok)
	}
	now = now.Add(logEvery)
	ok, n := l.allow()
	assert.True(t, ok)
	assert.Equal(t, 5, n)
	ok, _ = l.allow()
	assert.False(t, ok, "one per interval")
	now = now.Add(time.Hour)
	for range logBurst {
		ok, _ := l.allow()
		assert.True(t, ok, "the burst refills")
	}
}
