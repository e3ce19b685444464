package perf

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// dialCounter is a DialContext that checks each connection's transport,
// counts the connections, and remembers the last error (gRPC reports a
// failed dial only as Unavailable).
type dialCounter struct {
	d    Dialer
	n    atomic.Int64
	mu   sync.Mutex
	last error
	// With watch, each connection records the first read or write error
	// it meets before the client closes it (faults): a stock client
	// replaces a broken connection without a word, and the workload must
	// not measure that as a success.
	watch  bool
	faults []string
}

func (dc *dialCounter) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := dc.d.DialContext(ctx, addr)
	if err != nil {
		dc.mu.Lock()
		dc.last = err
		dc.mu.Unlock()
		return nil, err
	}
	id := dc.n.Add(1)
	if dc.watch {
		return &watchedConn{Conn: c, dc: dc, id: id}, nil
	}
	return c, nil
}

// fault records connection id's first I/O error.
func (dc *dialCounter) fault(id int64, op string, err error) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if len(dc.faults) < 8 {
		dc.faults = append(dc.faults, fmt.Sprintf("connection %d: %s: %v", id, op, err))
	}
}

// broken returns an error naming the connections that met an I/O error
// while they were in use, or nil. More connections than callers is no
// fault by itself: net/http also replaces a healthy connection, one whose
// request's write it has not seen completed within 50 ms of the
// response (maxWriteWaitBeforeConnReuse), as happens on a loaded machine.
func (dc *dialCounter) broken(n int) error {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if len(dc.faults) == 0 {
		return nil
	}
	return fmt.Errorf("%d connections dialed for %d callers, and some broke: %s", dc.n.Load(), n, strings.Join(dc.faults, "; "))
}

// watchedConn records its first read or write error that does not follow
// its own Close.
type watchedConn struct {
	net.Conn
	dc     *dialCounter
	id     int64
	closed atomic.Bool
	once   sync.Once
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		c.note("read", err)
	}
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if err != nil {
		c.note("write", err)
	}
	return n, err
}

func (c *watchedConn) note(op string, err error) {
	if !c.closed.Load() {
		c.once.Do(func() { c.dc.fault(c.id, op, err) })
	}
}

func (c *watchedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// NetConn exposes the connection for rsock.InfoOf.
func (c *watchedConn) NetConn() net.Conn { return c.Conn }

func (dc *dialCounter) wrap(err error) error {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if dc.last != nil {
		return fmt.Errorf("%w (last dial: %v)", err, dc.last)
	}
	return err
}

// callers runs n callers of call, each first warming up, then all
// together for d; it returns the merged latencies and the elapsed time.
func callers(n int, d time.Duration, call func(i int) error) (*hdrhistogram.Histogram, time.Duration, error) {
	hists := make([]*hdrhistogram.Histogram, n)
	errs := make([]error, n)
	var ready, done sync.WaitGroup
	startc := make(chan time.Time)
	for i := range n {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			var werr error
			for range 10 {
				if werr = call(i); werr != nil {
					break
				}
			}
			ready.Done()
			start := <-startc
			if werr != nil {
				errs[i] = werr
				return
			}
			h := NewHist()
			end := start.Add(d)
			for t0 := time.Now(); t0.Before(end); {
				if err := call(i); err != nil {
					errs[i] = err
					return
				}
				t1 := time.Now()
				Record(h, t1.Sub(t0))
				t0 = t1
			}
			hists[i] = h
		}()
	}
	ready.Wait()
	start := time.Now()
	for range n {
		startc <- start
	}
	done.Wait()
	elapsed := time.Since(start)
	if err := firstErr(errs); err != nil {
		return nil, 0, err
	}
	h := NewHist()
	for _, x := range hists {
		h.Merge(x)
	}
	return h, elapsed, nil
}

// httpLoad: a stock http.Client, at most n connections (keep-alive), n
// callers doing GET /hello against the stock net/http server.
func httpLoad(ctx context.Context, t *Target, n int, d time.Duration) (Measurement, error) {
	dc := &dialCounter{d: t.Dial, watch: true}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return dc.dial(ctx, addr)
		},
		MaxConnsPerHost:     n,
		MaxIdleConnsPerHost: n,
		DisableCompression:  true,
		IdleConnTimeout:     time.Minute,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: slack}
	url := "http://" + t.Info.HTTPAddr + "/hello"
	get := func(int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return dc.wrap(err)
		}
		nb, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK || nb != int64(len(helloBody)) {
			return fmt.Errorf("GET /hello: %s, %d bytes", resp.Status, nb)
		}
		return nil
	}
	h, elapsed, err := callers(n, d, get)
	if err != nil {
		return Measurement{}, err
	}
	if err := dc.broken(n); err != nil {
		return Measurement{}, err
	}
	m := map[string]float64{MetricRate: float64(h.TotalCount()) / elapsed.Seconds()}
	latencyMetrics(m, h)
	return Measurement{Metrics: m, Hist: h}, nil
}

// grpcLoad: n stock grpc.ClientConns (grpc.WithContextDialer), one caller
// each, making unary EmptyCalls to the stock gRPC server.
func grpcLoad(ctx context.Context, t *Target, n int, d time.Duration) (Measurement, error) {
	dc := &dialCounter{d: t.Dial}
	clients := make([]testpb.TestServiceClient, n)
	for i := range n {
		cc, err := grpc.NewClient("passthrough:///"+t.Info.GRPCAddr,
			grpc.WithContextDialer(dc.dial),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return Measurement{}, err
		}
		defer cc.Close()
		clients[i] = testpb.NewTestServiceClient(cc)
	}
	call := func(i int) error {
		cctx, cancel := context.WithTimeout(ctx, slack)
		defer cancel()
		_, err := clients[i].EmptyCall(cctx, &testpb.Empty{})
		if err != nil {
			return dc.wrap(err)
		}
		return nil
	}
	h, elapsed, err := callers(n, d, call)
	if err != nil {
		return Measurement{}, err
	}
	m := map[string]float64{MetricRate: float64(h.TotalCount()) / elapsed.Seconds()}
	latencyMetrics(m, h)
	return Measurement{Metrics: m, Hist: h}, nil
}
