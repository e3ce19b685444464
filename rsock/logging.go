package rsock

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// What a peer can cause by itself (a listener's failed handshakes) is
// logged rate-limited per listener: logBurst records, then one per logEvery.

const (
	logBurst = 10
	logEvery = time.Second
)

// discard is the logger of a Config without one.
var discard = slog.New(slog.DiscardHandler)

// limiter lets a burst of records through, then one per interval.
type limiter struct {
	mu         sync.Mutex
	now        func() time.Time // time.Now, or a test's clock
	tokens     float64
	last       time.Time
	suppressed int
}

// allow reports whether a record may be logged now, and how many were
// suppressed since the last one that was.
func (l *limiter) allow() (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if l.last.IsZero() {
		l.tokens = logBurst
	} else {
		l.tokens = min(logBurst, l.tokens+now.Sub(l.last).Seconds()/logEvery.Seconds())
	}
	l.last = now
	if l.tokens < 1 {
		l.suppressed++
		return false, 0
	}
	l.tokens--
	n := l.suppressed
	l.suppressed = 0
	return true, n
}

// logConn logs a connection that falls back to TCP.
func (s *settings) logConn(c *Conn, side string) {
	l := c.label.Load()
	if !l.fallback {
		return
	}
	s.log.LogAttrs(context.Background(), slog.LevelInfo, "rsock: connection falls back to TCP",
		slog.String("side", side), slog.String("code", l.code), slog.String("transport", l.transport),
		slog.String("reason", l.reason), slog.String("peer", c.RemoteAddr().String()))
}

// logReset records a switching connection that ends in a reset while on
// TCP (a ring logs its own, through the stream's logger).
func (s *settings) logReset(c *Conn, err error) {
	s.log.LogAttrs(context.Background(), slog.LevelWarn, "rsock: connection reset",
		slog.String("transport", c.label.Load().transport), slog.String("reason", err.Error()), slog.String("peer", c.RemoteAddr().String()))
}
