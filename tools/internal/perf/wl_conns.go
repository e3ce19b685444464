package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/rdmanet/rdmanet/rsock"
)

// setupRate: one connection after another: dial (with rsock's handshake),
// one 1-byte round trip, close. Each sample is the whole cycle.
//
// Every other cycle makes one more 1-byte round trip before it closes,
// timed apart. In plain TCP's run their rate over the others' is
// MetricOneMoreRTT: what a protocol that must hear from the server before
// the application's first byte can reach at best, measured interleaved
// with the cycles it is judged against. Every mode runs them, so that
// every mode times the same pattern of cycles against a server that sees
// the same pattern of connections: until 2026-11-27 only plain TCP did,
// and its timed cycles came out about 5% slower for it (a second plain
// TCP mode without them, --control, ran 1.05x faster).
func setupRate(ctx context.Context, t *Target, d time.Duration) (Measurement, error) {
	msg := append(header{Op: opEcho, Param: 1}.marshal(), 'x')
	cycle := func(trips int) error {
		c, err := t.Dial.DialContext(ctx, t.Info.PerfAddr)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(slack))
		out := msg
		for range trips {
			if _, err := c.Write(out); err != nil {
				return err
			}
			var b [1]byte
			if _, err = io.ReadFull(c, b[:]); err != nil {
				return err
			}
			out = b[:]
		}
		return nil
	}
	for range 5 { // warm up
		if err := cycle(1); err != nil {
			return Measurement{}, err
		}
	}
	h := NewHist()
	var spent, spentMore time.Duration // in the cycles of h, and in those with one more round trip
	more := 0
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		trips := 1 + i%2
		t0 := time.Now()
		if err := cycle(trips); err != nil {
			return Measurement{}, err
		}
		took := time.Since(t0)
		if trips == 1 {
			Record(h, took)
			spent += took
		} else {
			more++
			spentMore += took
		}
	}
	rate := float64(h.TotalCount()) / spent.Seconds()
	m := map[string]float64{MetricRate: rate}
	if t.Mode == Plain && more > 0 { // the baseline's alone, not its control's
		m[MetricOneMoreRTT] = float64(more) / spentMore.Seconds() / rate
	}
	latencyMetrics(m, h)
	return Measurement{Metrics: m, Hist: h}, nil
}

// dialMany opens n connections with op, a few at a time. On error it
// closes what it opened.
func dialMany(ctx context.Context, t *Target, n int, op byte, param uint64, deadline time.Time) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range conns {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			conns[i], errs[i] = t.open(ctx, op, param, deadline)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeAll(conns)
		opened := 0
		for _, c := range conns {
			if c != nil {
				opened++
			}
		}
		return nil, fmt.Errorf("%d of %d connections opened: %w", opened, n, firstErr(errs))
	}
	return conns, nil
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
}

// manyConns: n connections each doing 64-byte ping-pong at once, one
// goroutine each. The rate is round trips per second over all of them.
func manyConns(ctx context.Context, t *Target, n int, d time.Duration) (Measurement, error) {
	const size = 64
	conns, err := dialMany(ctx, t, n, opEcho, size, time.Now().Add(d+2*slack))
	if err != nil {
		return Measurement{}, err
	}
	defer closeAll(conns)
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	rt := func(i int) error {
		if _, err := conns[i].Write(bufs[i]); err != nil {
			return err
		}
		_, err := io.ReadFull(conns[i], bufs[i])
		return err
	}
	h, elapsed, err := callers(n, d, rt)
	if err != nil {
		return Measurement{}, err
	}
	m := map[string]float64{MetricRate: float64(h.TotalCount()) / elapsed.Seconds()}
	latencyMetrics(m, h)
	return Measurement{Metrics: m, Hist: h}, nil
}

// idleConns: open n connections that then do nothing, and measure what
// they cost both processes: RSS and mapped memory per connection (after a
// garbage collection on each side), fds per connection, OS threads, and
// the client's memory registered with the device per connection (pinned,
// on verbs).
func idleConns(ctx context.Context, t *Target, n int) (Measurement, error) {
	srv0, err := t.ServerStats(true)
	if err != nil {
		return Measurement{}, err
	}
	cl0 := SelfStats(true)
	conns, err := dialMany(ctx, t, n, opIdle, 0, time.Time{})
	if err != nil {
		return Measurement{}, err
	}
	defer func() {
		closeAll(conns)
		// Let the server see the closes before the next workload.
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if st, err := t.ServerStats(false); err != nil || st.IdleConns == 0 {
				return
			}
		}
	}()
	// Wait for the server to hold them all.
	var srv1 ProcStats
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if srv1, err = t.ServerStats(false); err != nil {
			return Measurement{}, err
		}
		if srv1.IdleConns >= int64(n) {
			break
		}
		if time.Now().After(end) {
			return Measurement{}, fmt.Errorf("server holds %d of %d idle connections", srv1.IdleConns, n)
		}
	}
	time.Sleep(100 * time.Millisecond) // let background setup settle
	if srv1, err = t.ServerStats(true); err != nil {
		return Measurement{}, err
	}
	cl1 := SelfStats(true)
	var registered int64
	for _, c := range conns {
		if info, ok := rsock.InfoOf(c); ok {
			registered += info.Registered
		}
	}
	per := func(a, b int64) float64 { return float64(b-a) / float64(n) }
	kib := func(a, b int64) float64 { return per(a, b) / 1024 }
	return Measurement{Metrics: map[string]float64{
		MetricConns:         float64(n),
		MetricRSSClient:     kib(cl0.RSS, cl1.RSS),
		MetricRSSServer:     kib(srv0.RSS, srv1.RSS),
		MetricVSZClient:     kib(cl0.VSZ, cl1.VSZ),
		MetricVSZServer:     kib(srv0.VSZ, srv1.VSZ),
		MetricFDsClient:     per(int64(cl0.FDs), int64(cl1.FDs)),
		MetricFDsServer:     per(int64(srv0.FDs), int64(srv1.FDs)),
		MetricThreadsClient: float64(cl1.Threads),
		MetricThreadsServer: float64(srv1.Threads),
		MetricPinnedClient:  kib(0, registered),
	}}, nil
}
