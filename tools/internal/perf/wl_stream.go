package perf

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// slack is added to a workload's duration for its connections' deadlines:
// a stuck connection fails the workload instead of hanging the run.
const slack = 30 * time.Second

// pingPong: one connection; write size bytes, read size bytes back; one
// round trip per sample.
func pingPong(ctx context.Context, t *Target, size int, d time.Duration) (Measurement, error) {
	c, err := t.open(ctx, opEcho, uint64(size), time.Now().Add(d+slack))
	if err != nil {
		return Measurement{}, err
	}
	defer c.Close()
	buf := make([]byte, size)
	rt := func() error {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		_, err := io.ReadFull(c, buf)
		return err
	}
	// Warm up: a tenth of the time, at least 20 round trips.
	warm := time.Now().Add(d / 10)
	for i := 0; i < 20 || time.Now().Before(warm); i++ {
		if err := rt(); err != nil {
			return Measurement{}, err
		}
	}
	h := NewHist()
	end := time.Now().Add(d)
	for t0 := time.Now(); t0.Before(end); {
		if err := rt(); err != nil {
			return Measurement{}, err
		}
		t1 := time.Now()
		Record(h, t1.Sub(t0))
		t0 = t1
	}
	m := map[string]float64{MetricRate: float64(h.TotalCount()) / d.Seconds()}
	latencyMetrics(m, h)
	return Measurement{Metrics: m, Hist: h}, nil
}

// cpuMeter measures the CPU time of both processes over a workload.
type cpuMeter struct {
	t              *Target
	client, server ProcStats
}

func startCPU(t *Target) (*cpuMeter, error) {
	srv, err := t.ServerStats(false)
	if err != nil {
		return nil, err
	}
	return &cpuMeter{t: t, client: SelfStats(false), server: srv}, nil
}

// perGB returns CPU seconds of both processes per 1e9 bytes.
func (m *cpuMeter) perGB(bytes int64) (float64, error) {
	cl := SelfStats(false)
	srv, err := m.t.ServerStats(false)
	if err != nil {
		return 0, err
	}
	cpu := (cl.CPU() - m.client.CPU()) + (srv.CPU() - m.server.CPU())
	if bytes <= 0 {
		return 0, fmt.Errorf("no bytes moved")
	}
	return cpu.Seconds() / (float64(bytes) / 1e9), nil
}

// throughput: one connection, size-byte writes for d, then a half-close;
// the server answers with the byte count it read once it has seen EOF.
func throughput(ctx context.Context, t *Target, size int, d time.Duration) (Measurement, error) {
	c, err := t.open(ctx, opSink, uint64(size), time.Now().Add(d+slack))
	if err != nil {
		return Measurement{}, err
	}
	defer c.Close()
	buf := make([]byte, size)
	cpu, err := startCPU(t)
	if err != nil {
		return Measurement{}, err
	}
	start := time.Now()
	sent, err := writeFor(c, buf, start.Add(d))
	if err != nil {
		return Measurement{}, err
	}
	var ack [8]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return Measurement{}, fmt.Errorf("waiting for the server's count: %w", err)
	}
	elapsed := time.Since(start)
	if got := int64(binary.BigEndian.Uint64(ack[:])); got != sent {
		return Measurement{}, fmt.Errorf("server read %d bytes, client wrote %d", got, sent)
	}
	return cpu.rate(sent, elapsed)
}

// writeFor writes buf to c until end, then half-closes c, and returns the
// bytes written.
func writeFor(c net.Conn, buf []byte, end time.Time) (int64, error) {
	var sent int64
	for time.Now().Before(end) {
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			return sent, err
		}
	}
	return sent, closeWrite(c)
}

// rate is the measurement of bytes moved in elapsed: throughput, and CPU
// per GB since the sample was taken.
func (m *cpuMeter) rate(bytes int64, elapsed time.Duration) (Measurement, error) {
	perGB, err := m.perGB(bytes)
	if err != nil {
		return Measurement{}, err
	}
	return Measurement{Metrics: map[string]float64{
		MetricGBps:     float64(bytes) / elapsed.Seconds() / 1e9,
		MetricCPUPerGB: perGB,
	}}, nil
}

// bidir: both ends write size-byte chunks at once: the client for d, the
// server until it has read the client's EOF. Throughput counts both
// directions.
func bidir(ctx context.Context, t *Target, size int, d time.Duration) (Measurement, error) {
	c, err := t.open(ctx, opBidir, uint64(size), time.Now().Add(d+slack))
	if err != nil {
		return Measurement{}, err
	}
	defer c.Close()
	buf := make([]byte, size)
	cpu, err := startCPU(t)
	if err != nil {
		return Measurement{}, err
	}
	type result struct {
		n   int64
		err error
	}
	got := make(chan result, 1)
	start := time.Now()
	go func() {
		n, err := discard(c, clampBuf(uint64(size)))
		got <- result{n, err}
	}()
	sent, werr := writeFor(c, buf, start.Add(d))
	if werr != nil {
		c.Close()
		<-got
		return Measurement{}, werr
	}
	r := <-got
	elapsed := time.Since(start)
	if r.err != nil {
		return Measurement{}, r.err
	}
	return cpu.rate(sent+r.n, elapsed)
}
