package rsock

import (
	"context"
	"encoding/json"
	"expvar"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// delta is after - before for every key of either.
func delta(before, after map[string]int64) map[string]int64 {
	d := map[string]int64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	for k, v := range before {
		if _, ok := after[k]; !ok && v != 0 {
			d[k] = -v
		}
	}
	return d
}

// TestTotalsMatchWhatHappened: three dials to plain servers are three
// fallbacks with the plain-server code, and three probes; five hellos of a
// version the listener does not speak are five handshake failures; a
// connection on the ring is counted open by its transport until Close.
func TestTotalsMatchWhatHappened(t *testing.T) {
	t0 := Totals()
	addr := plainServer(t, echo)
	for range 3 {
		c, err := dialProbing(t, addr, &Config{ProbeCacheTTL: -1})
		require.NoError(t, err)
		assert.Equal(t, CodePlainServer, c.Info().Code)
		c.Close()
	}
	t1 := Totals()
	assert.Equal(t, map[string]int64{CodePlainServer: 3}, delta(t0.ByCode, t1.ByCode))
	assert.Equal(t, int64(3), t1.Fallbacks-t0.Fallbacks)
	assert.Equal(t, int64(3), t1.Probes-t0.Probes)
	assert.Equal(t, map[string]int64{"tcp": 3}, delta(t0.Opened, t1.Opened))
	assert.Empty(t, delta(t0.Open, t1.Open), "closed connections still counted open")

	ln := listen(t, &Config{Transports: []string{"shm", "tcp"}})
	for range 5 {
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		_, err = c.Write(append([]byte(handshake.Magic), 99, 1, 0, 0)) // version 99
		require.NoError(t, err)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, c) // the magic, the decline, then the close
		c.Close()
	}
	for Totals().HandshakeFailures-t1.HandshakeFailures < 5 { // counted once its goroutine has closed it
		time.Sleep(time.Millisecond)
	}
	t15 := Totals()
	assert.Equal(t, int64(5), t15.HandshakeFailures-t1.HandshakeFailures)
	assert.Equal(t, map[string]int64{CauseVersion: 5}, delta(t1.HandshakeFailuresBy, t15.HandshakeFailuresBy))
	assert.Equal(t, uint64(5), ln.Stats().HandshakeErrors)

	cfg := &Config{Transports: []string{"shm"}}
	c, s := pipe(t, ln, cfg)
	t2 := Totals()
	assert.Equal(t, int64(2), t2.Open["shm"]-t1.Open["shm"], "both ends of a shm connection in one process")
	assert.Equal(t, CodeAgreed, c.Info().Code)
	c.Close()
	s.Close()
	assert.Equal(t, t1.Open["shm"], Totals().Open["shm"])
}

// TestConnectionsSnapshot: a live connection is in the snapshot with its
// transport, code, addresses, age and ring, and leaves it at Close.
func TestConnectionsSnapshot(t *testing.T) {
	cfg := &Config{Transports: []string{"shm"}, RingSize: 64 << 10}
	c, s := pipe(t, listen(t, cfg), cfg)
	_, err := c.Write([]byte("12345"))
	require.NoError(t, err)
	find := func(x *Conn) *ConnState {
		for _, st := range Connections() {
			if st.LocalAddr == x.LocalAddr().String() && st.RemoteAddr == x.RemoteAddr().String() {
				return &st
			}
		}
		return nil
	}
	// Once the server has read one byte, its ring holds the other four
	// (or all five, until the read is reported consumed): an idle
	// receiver learns of new bytes when it next polls, not per message.
	one := make([]byte, 1)
	_, err = io.ReadFull(s, one)
	require.NoError(t, err)
	st := find(s)
	require.NotNil(t, st)
	assert.Contains(t, []int64{4, 5}, st.RingReadable)
	assert.Equal(t, "shm", st.Transport)
	assert.Equal(t, CodeAgreed, st.Code)
	assert.Equal(t, int64(64<<10), st.RingSize)
	assert.False(t, st.Since.IsZero())
	assert.LessOrEqual(t, st.Since, time.Now())
	require.NotNil(t, find(c))
	c.Close()
	s.Close()
	assert.Nil(t, find(c))
	assert.Nil(t, find(s))
}

// TestSnapshotsWhileConnectionsComeAndGo: 1,000 connections open and close
// on four goroutines while two others take snapshots and totals (under the
// race detector in make test); afterwards nothing of theirs is left.
func TestSnapshotsWhileConnectionsComeAndGo(t *testing.T) {
	const total, workers = 1000, 4
	// Dial waits for the upgrade: every connection is on shm from Dial
	// to Close (the server's end from its settling).
	cfg := &Config{Transports: []string{"shm", "tcp"}, UpgradeAfter: -1}
	ln := listen(t, cfg)
	go echoAccepted(ln)
	before := Totals()
	ctx, stop := context.WithCancel(context.Background())
	var snaps sync.WaitGroup
	for range 2 {
		snaps.Add(1)
		go func() {
			defer snaps.Done()
			for ctx.Err() == nil {
				for _, st := range Connections() {
					_ = st.Transport + st.Reason
				}
				_ = Totals()
			}
		}()
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := Dialer{Config: cfg, Timeout: 30 * time.Second}
			for i := range total / workers {
				c, err := d.Dial("tcp", ln.Addr().String())
				if err != nil {
					errs <- err
					return
				}
				if _, err := c.Write([]byte{byte(w), byte(i)}); err != nil {
					errs <- err
					return
				}
				var b [2]byte
				if _, err := io.ReadFull(c, b[:]); err != nil {
					errs <- err
					return
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	stop()
	snaps.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	after := Totals()
	assert.Equal(t, int64(2*total), after.Opened["tcp"]-before.Opened["tcp"], "both ends of each connection, made on TCP")
	assert.Equal(t, int64(2*total), after.Upgraded["shm"]-before.Upgraded["shm"], "both ends of each connection, upgraded")
	// The server ends close when their echo sees EOF: wait for them.
	for Totals().Open["shm"] != before.Open["shm"] {
		time.Sleep(time.Millisecond)
	}
	assert.Equal(t, before.Open, Totals().Open)
}

// TestPublishExpvar: the totals are published once, as JSON, whatever the
// number of calls.
func TestPublishExpvar(t *testing.T) {
	PublishExpvar()
	PublishExpvar() // a second Publish of the name would panic
	v := expvar.Get("rsock")
	require.NotNil(t, v)
	c, s := pipe(t, listen(t, tcpOnly()), tcpOnly())
	defer c.Close()
	defer s.Close()
	var got TotalStats
	require.NoError(t, json.Unmarshal([]byte(v.String()), &got))
	assert.GreaterOrEqual(t, got.Open["tcp"], int64(2))
	assert.Equal(t, Totals().Opened["tcp"], got.Opened["tcp"])
}

// BenchmarkRegister measures what the registry adds to a connection: one
// register and one unregister (the data path does not touch it). Compare
// with BenchmarkDialAccept's time per connection.
func BenchmarkRegister(b *testing.B) {
	c := newConn("tcp", label{transport: "tcp", code: CodeTCPOnly})
	b.ReportAllocs()
	for range b.N {
		c.register()
		c.unregister()
	}
}

// TestRegisteredBytes: a shm connection registers its ring and its
// state-message buffers (the peer's ring is mapped, no staging); TCP none.
func TestRegisteredBytes(t *testing.T) {
	cfg := &Config{Transports: []string{"shm"}, RingSize: 64 << 10}
	c, s := pipe(t, listen(t, cfg), cfg)
	defer c.Close()
	defer s.Close()
	assert.Equal(t, int64(64<<10+DefaultCredits*64), c.Info().Registered)
	tc, ts := pipe(t, listen(t, tcpOnly()), tcpOnly())
	defer tc.Close()
	defer ts.Close()
	assert.Zero(t, tc.Info().Registered)
}

// TestRelabelAfterClose: an upgrade or failover that relabels a
// connection after its Close leaves the open counts where Close took
// them; relabel and unregister racing (under the race detector) leave
// every open count as it was.
func TestRelabelAfterClose(t *testing.T) {
	before := Totals()
	c := newConn("tcp", label{transport: "tcp", code: CodeTCPOnly})
	c.register()
	c.unregister()
	c.relabel(&label{transport: "shm", code: CodeAgreed})
	assert.Equal(t, before.Open, Totals().Open)

	var wg sync.WaitGroup
	for range 200 {
		c := newConn("tcp", label{transport: "tcp", code: CodeTCPOnly})
		c.register()
		wg.Add(2)
		go func() { defer wg.Done(); c.relabel(&label{transport: "shm", code: CodeAgreed}) }()
		go func() { defer wg.Done(); c.unregister() }()
	}
	wg.Wait()
	assert.Equal(t, before.Open, Totals().Open)
}

// TestRegistryList: connections leave their shard's list in any order,
// once, and the others stay in it.
func TestRegistryList(t *testing.T) {
	listed := func() map[*Conn]bool {
		m := map[*Conn]bool{}
		for i := range registry.shards {
			sh := &registry.shards[i]
			sh.mu.Lock()
			for c := sh.head; c != nil; c = c.next {
				m[c] = true
			}
			sh.mu.Unlock()
		}
		return m
	}
	before := Totals()
	cs := make([]*Conn, 3*registryShards)
	for i := range cs {
		cs[i] = newConn("tcp", label{transport: "tcp", code: CodeTCPOnly})
		cs[i].register()
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
	for i, c := range cs {
		c.unregister()
		c.unregister() // gone already: no change
		in := listed()
		for j, d := range cs {
			require.Equal(t, j > i, in[d], "connection %d after %d left", j, i)
		}
	}
	assert.Equal(t, before.Open, Totals().Open)
}

// TestTotalsOnlyGrow: through an upgrade and a failover, every count but
// the Open gauge only grows. A switching connection is made on TCP
// (Opened), moves onto the ring (Upgraded, ByCode agreed) and back to TCP
// (ByCode failed-over, Fallbacks), and Open follows it. The bytes, by path
// (Bytes, ConnInfo.Paths), only grow too, through the failover and the
// close: a ring's bytes stay the ring's.
func TestTotalsOnlyGrow(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	cfg := swCfg("sim", time.Nanosecond)
	ln := listen(t, cfg)
	t0, b0 := Totals(), Bytes()
	c, s := onRing(t, ln, cfg)
	byteEachWay(t, c, s)
	t1, b1 := Totals(), Bytes()
	breakRing(c)
	// Traffic until both ends have failed over (each learns of the
	// failure as it next uses the ring, or from the other's Resume).
	deadline := time.Now().Add(10 * time.Second)
	for c.Info().Code != CodeFailedOver || s.Info().Code != CodeFailedOver {
		require.True(t, time.Now().Before(deadline), "not failed over: %+v / %+v", c.Info(), s.Info())
		byteEachWay(t, c, s)
	}
	t2, b2 := Totals(), Bytes()
	info := c.Info()
	c.Close()
	s.Close()
	b3 := Bytes()
	for i, b := range []map[string]int64{b0, b1, b2, b3}[1:] {
		for k, v := range []map[string]int64{b0, b1, b2, b3}[i] {
			assert.GreaterOrEqual(t, b[k], v, "Bytes()[%s] went down at step %d", k, i+1)
		}
	}
	assert.Positive(t, b1["sim"]-b0["sim"], "the ring's bytes count under sim")
	require.Len(t, info.Paths, 2, "%+v", info.Paths)
	assert.Equal(t, "tcp", info.Paths[0].Transport)
	assert.Equal(t, "sim", info.Paths[1].Transport)
	assert.Positive(t, info.Paths[1].BytesRead, "the byte read on the ring")
	assert.Equal(t, info.BytesRead, info.Paths[0].BytesRead+info.Paths[1].BytesRead)
	assert.Equal(t, info.BytesWritten, info.Paths[0].BytesWritten+info.Paths[1].BytesWritten)

	for _, step := range []struct {
		name     string
		from, to TotalStats
	}{{"upgrade", t0, t1}, {"failover", t1, t2}} {
		for _, m := range []struct {
			name     string
			from, to map[string]int64
		}{{"Opened", step.from.Opened, step.to.Opened}, {"Upgraded", step.from.Upgraded, step.to.Upgraded}, {"ByCode", step.from.ByCode, step.to.ByCode}} {
			for k, v := range m.from {
				assert.GreaterOrEqual(t, m.to[k], v, "%s[%s] went down at the %s", m.name, k, step.name)
			}
		}
		assert.GreaterOrEqual(t, step.to.Fallbacks, step.from.Fallbacks, "Fallbacks went down at the %s", step.name)
	}
	assert.Equal(t, map[string]int64{"tcp": 2}, delta(t0.Opened, t1.Opened), "both ends made on TCP")
	assert.Equal(t, map[string]int64{"sim": 2}, delta(t0.Upgraded, t1.Upgraded))
	assert.Equal(t, map[string]int64{CodeUpgrading: 2, CodeAgreed: 2}, delta(t0.ByCode, t1.ByCode))
	assert.Equal(t, map[string]int64{"sim": 2}, delta(t0.Open, t1.Open), "open, on the ring")
	assert.Equal(t, map[string]int64{CodeFailedOver: 2}, delta(t1.ByCode, t2.ByCode))
	assert.Equal(t, int64(2), t2.Fallbacks-t1.Fallbacks)
	assert.Equal(t, map[string]int64{"sim": -2, "tcp": 2}, delta(t1.Open, t2.Open), "open, back on TCP")
}

func newConn(network string, l label) *Conn {
	c := &Conn{network: network}
	c.label.Store(&l)
	return c
}

// TestUpgradeCountedBeforeItsRingIsUsed: a connection is relabelled, and
// its upgrade counted, before a call can move bytes on its new ring.
func TestUpgradeCountedBeforeItsRingIsUsed(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	testHookRingSet.set(func(w *swConn) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, w.c.Info().Transport)
	})
	t.Cleanup(func() { testHookRingSet.set(nil) })
	cfg := &Config{Transports: []string{"shm", "tcp"}, UpgradeAfter: -1}
	c, s := pipe(t, listen(t, cfg), cfg)
	defer c.Close()
	defer s.Close()
	mu.Lock() // pipe waited for both ends to settle, after their rings were installed
	defer mu.Unlock()
	assert.Equal(t, []string{"shm", "shm"}, seen, "both ends, as their rings were installed")
}
