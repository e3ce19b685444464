package rsock

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// The benchmarks run each workload over plain kernel TCP loopback (the
// baseline), over rsock's TCP fallback, and over the full ring protocol on
// the in-process sim provider, in the same run, so results can be read as
// ratios. shm here has both ends in one process (the two-process figures
// are in bench2p_test.go). sim moves bytes with memcpy in one process: it measures the
// protocol engine's cost, not a transport's speed.

type benchPair struct {
	name string
	make func(b *testing.B) (client, server net.Conn)
}

func benchPairs() []benchPair {
	return []benchPair{
		{"plain-tcp", func(b *testing.B) (net.Conn, net.Conn) {
			c, s := tcpPair(b)
			return c, s
		}},
		{"rsock-tcp", func(b *testing.B) (net.Conn, net.Conn) {
			ln := listen(b, tcpOnly())
			c, s := pipe(b, ln, tcpOnly())
			return c, s
		}},
		{"rsock-shm", func(b *testing.B) (net.Conn, net.Conn) {
			cfg := &Config{Transports: []string{"shm"}}
			c, s := pipe(b, listen(b, cfg), cfg)
			if TransportOf(c) != "shm" {
				b.Fatalf("not on shm: %s", c.Info().Reason)
			}
			return c, s
		}},
		{"rsock-sim", func(b *testing.B) (net.Conn, net.Conn) {
			c, s := simPipe(b, simCfgRing(1<<20))
			return c, s
		}},
	}
}

func simCfgRing(size int) *Config { return &Config{Transports: []string{"sim"}, RingSize: size} }

// BenchmarkPingPong measures one 64-byte round trip per op.
func BenchmarkPingPong(b *testing.B) {
	for _, p := range benchPairs() {
		b.Run(p.name, func(b *testing.B) {
			c, s := p.make(b)
			defer c.Close()
			defer s.Close()
			go func() {
				buf := make([]byte, 64)
				for {
					if _, err := io.ReadFull(s, buf); err != nil {
						return
					}
					if _, err := s.Write(buf); err != nil {
						return
					}
				}
			}()
			buf := make([]byte, 64)
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkThroughput measures one-way bulk transfer in 1 MiB writes.
func BenchmarkThroughput(b *testing.B) {
	const size = 1 << 20
	for _, p := range benchPairs() {
		b.Run(p.name, func(b *testing.B) {
			c, s := p.make(b)
			defer c.Close()
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = io.Copy(io.Discard, s)
			}()
			buf := make([]byte, size)
			b.SetBytes(size)
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			ci, _ := InfoOf(c)
			c.Close()
			<-done
			// State messages per MiB moved, both ways (a count, where
			// the time is noisy): the writer's announcements and the
			// reader's updates.
			if si, ok := InfoOf(s); ok {
				b.ReportMetric(float64(ci.MsgsSent+si.MsgsSent)/float64(b.N), "msgs/MiB")
			}
			s.Close()
		})
	}
}

// BenchmarkDialAccept measures one connection per op: Dial, Accept, one
// byte each way, Close on both ends, with allocations (both ends are in
// this process, so allocs/op is a dial's and an accept's together).
func BenchmarkDialAccept(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  *Config
	}{
		{"rsock-tcp", &Config{Transports: []string{"shm", "tcp"}, ProbeCacheTTL: -1}}, // the server allows tcp only
		{"rsock-shm", &Config{Transports: []string{"shm"}}},
		{"rsock-shm-switching", &Config{Transports: []string{"shm"}, UpgradeAfter: time.Millisecond}},
		{"rsock-default", nil}, // switching, verbs,shm,tcp (shm here)
	} {
		b.Run(tc.name, func(b *testing.B) {
			lcfg := tc.cfg
			if tc.name == "rsock-tcp" {
				lcfg = tcpOnly()
			}
			ln := listen(b, lcfg)
			served := oneByteEcho(ln)
			d := Dialer{Config: tc.cfg}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				c, err := d.Dial("tcp", ln.Addr().String())
				if err != nil {
					b.Fatal(err)
				}
				var one [1]byte
				if _, err := c.Write(one[:]); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, one[:]); err != nil {
					b.Fatal(err)
				}
				c.Close()
				if err := <-served; err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUpgradeTime measures, on the switching protocol with the
// upgrade at once, the time from Dial's start until both directions of
// the client's end run on the ring (shm; both ends in this process). It
// reports the median and the 99th percentile.
func BenchmarkUpgradeTime(b *testing.B) {
	cfg := &Config{Transports: []string{"shm"}, UpgradeAfter: time.Nanosecond}
	ln := listen(b, cfg)
	go drainAccepted(ln)
	d := Dialer{Config: cfg}
	var took []time.Duration
	for range b.N {
		t0 := time.Now()
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		<-c.(*Conn).w.settledChan()
		took = append(took, time.Since(t0))
		if tr := TransportOf(c); tr != "shm" {
			b.Fatalf("on %s: %s", tr, c.(*Conn).Info().Reason)
		}
		c.Close()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-us")
}
