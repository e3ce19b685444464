package rsock

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

// noReupgrade keeps connections on TCP after a failover for the rest of
// the test, so that it can check where they are.
func noReupgrade(t testing.TB) {
	reupgradeScale.Store(-1)
	t.Cleanup(func() { reupgradeScale.Store(1) })
}

// byteEachWay sends a byte from c to s and one back, checking both.
func byteEachWay(t testing.TB, c, s *Conn) {
	t.Helper()
	for _, p := range [][2]*Conn{{c, s}, {s, c}} {
		_, err := p[0].Write([]byte{'x'})
		require.NoError(t, err)
		var one [1]byte
		_, err = io.ReadFull(p[1], one[:])
		require.NoError(t, err)
		require.Equal(t, byte('x'), one[0])
	}
}

// onRing dials ln with an upgrade at once and waits until both ends have
// both directions on the ring.
func onRing(t testing.TB, ln *Listener, cfg *Config) (c, s *Conn) {
	t.Helper()
	c, s = dialAccept(t, ln, cfg)
	t.Cleanup(func() { c.Close(); s.Close() })
	// A byte each way makes each side's sending switch.
	byteEachWay(t, c, s)
	awaitSettled(t, c, s)
	require.Equal(t, cfg.Transports[0], TransportOf(c), c.Info().Reason)
	require.Equal(t, cfg.Transports[0], TransportOf(s), s.Info().Reason)
	return c, s
}

// breakRing forces x's queue pair into the error state (sim or ibverbs),
// if x is still on its ring.
func breakRing(x *Conn) {
	r := x.ring()
	if r == nil {
		return
	}
	switch q := r.QP().(type) {
	case *sim.QP:
		q.ForceError()
	case interface{ ForceError() error }:
		_ = q.ForceError()
	default:
		panic(fmt.Sprintf("no way to break a %T", q))
	}
}

// triggerConn calls fire once, after at bytes were written through it.
type triggerConn struct {
	net.Conn
	at      int
	written int
	fire    func()
	once    sync.Once
}

func (t *triggerConn) Write(b []byte) (int, error) {
	if t.written+len(b) > t.at {
		// Part before the point, then the failure, then the rest.
		k := max(t.at-t.written, 0)
		n, err := t.Conn.Write(b[:k])
		t.written += n
		if err != nil {
			return n, err
		}
		t.once.Do(t.fire)
		m, err := t.Conn.Write(b[k:])
		t.written += m
		return n + m, err
	}
	n, err := t.Conn.Write(b)
	t.written += n
	return n, err
}

// assertFailedOver checks that x moved to TCP by a failover, with the
// moves in its switch log.
func assertFailedOver(t *testing.T, x *Conn, from string) {
	t.Helper()
	info := x.Info()
	assert.Equal(t, "tcp", info.Transport, info.Reason)
	assert.Equal(t, CodeFailedOver, info.Code)
	assert.True(t, info.Fallback)
	assert.Contains(t, info.Reason, "failed over from "+from)
	var moves int
	for _, e := range info.Switches {
		if e.From == from && e.To == "tcp" {
			moves++
			assert.False(t, e.At.IsZero())
			assert.NotEmpty(t, e.Cause)
		}
	}
	assert.Equal(t, 2, moves, "both directions moved back: %+v", info.Switches)
}

// simOnRing connects two ends on a sim ring (onRing).
func simOnRing(t testing.TB) (c, s *Conn) {
	t.Helper()
	cfg := swCfg("sim", time.Nanosecond)
	return onRing(t, listen(t, cfg), cfg)
}

// simOnGrowingRing is simOnRing with rings that grow (growCfg).
func simOnGrowingRing(t testing.TB) (c, s *Conn) {
	t.Helper()
	cfg := growCfg("sim", time.Nanosecond)
	return onRing(t, listen(t, cfg), cfg)
}

// simOnTCP connects two ends that stay on TCP until the test kicks the
// client's upgrade (c.w.kick).
func simOnTCP(t *testing.T) (c, s *Conn) {
	cfg := swCfg("sim", time.Hour)
	cfg.UpgradeBytes = math.MaxInt // never by bytes
	c, s = dialAccept(t, listen(t, cfg), cfg)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// bothFailedOver moves a byte each way, then checks that both ends failed
// over from the ring transport from.
func bothFailedOver(t *testing.T, c, s *Conn, from string) {
	t.Helper()
	byteEachWay(t, c, s)
	assertFailedOver(t, c, from)
	assertFailedOver(t, s, from)
}

// TestFailoverHashedTransfer: a queue pair forced into error at a random
// point of a hash-checked transfer, on either side, in one or both
// directions; the transfer completes over TCP and both ends say so. With
// grow, the rings start small and grow during the transfer, so the
// failure can come while a move holds bytes in the old ring or staging.
func TestFailoverHashedTransfer(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	sizes := []int{1, 5000, 64<<10 + 7, 1 << 20, 8 << 20}
	if !testing.Short() {
		sizes = append(sizes, 64<<20)
	}
	for i, size := range sizes {
		for j, mode := range []string{"one", "both", "one/grow", "both/grow"} {
			both, grow := strings.HasPrefix(mode, "both"), strings.HasSuffix(mode, "grow")
			if grow && size > 8<<20 {
				continue
			}
			t.Run(fmt.Sprintf("size=%d/%s", size, mode), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(size), uint64(i*4+j)))
				on := simOnRing
				if grow {
					on = simOnGrowingRing
				}
				c, s := on(t)
				victim := []*Conn{c, s}[rng.IntN(2)]
				at := rng.IntN(size)
				fire := func() { breakRing(victim) }
				var wg sync.WaitGroup
				errs := make(chan error, 4)
				pairs := [][2]*Conn{{c, s}}
				if both {
					pairs = append(pairs, [2]*Conn{s, c})
				}
				for dir, p := range pairs {
					seed := uint64(size*10 + dir)
					w := &triggerConn{Conn: p[0], at: at, fire: fire}
					if dir == 1 {
						w.fire = func() {}
					}
					wg.Add(2)
					go func() { defer wg.Done(); errs <- hashedWrite(w, size, seed) }()
					go func() { defer wg.Done(); errs <- hashedRead(p[1], size, seed) }()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}
				// Every byte is through; the failure may still be found
				// (a transfer that ended before it reached the ring).
				breakRing(victim)
				bothFailedOver(t, c, s, "sim")
				assert.Equal(t, uint64(size+2), c.Info().BytesWritten)
				assert.Equal(t, uint64(len(pairs)-1)*uint64(size)+2, s.Info().BytesWritten)
			})
		}
	}
}

// TestFailoverWithDeadlines: the failure comes while a reader and a
// writer keep short deadlines, retrying on timeouts, and while a second
// reader competes for the stream; no byte is lost or repeated.
func TestFailoverWithDeadlines(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnRing(t)
	const size = 3 << 20
	data := streamBytes(size, 7)
	werr := make(chan error, 1)
	go func() {
		w := &triggerConn{Conn: c, at: size / 3, fire: func() { breakRing(s) }}
		for off := 0; off < size; {
			_ = c.SetWriteDeadline(time.Now().Add(time.Millisecond))
			n, err := w.Write(data[off:min(size, off+200_000)])
			off += n
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				werr <- err
				return
			}
		}
		werr <- nil
	}()
	// Two readers take turns through a lock, each with short deadlines:
	// pieces come out in order under the lock.
	var mu sync.Mutex
	got := make([]byte, 0, size)
	var wg sync.WaitGroup
	rerrs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 50_000)
			for {
				mu.Lock()
				if len(got) == size {
					mu.Unlock()
					rerrs <- nil
					return
				}
				_ = s.SetReadDeadline(time.Now().Add(time.Millisecond))
				n, err := s.Read(buf[:min(len(buf), size-len(got))])
				got = append(got, buf[:n]...)
				mu.Unlock()
				if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
					rerrs <- err
					return
				}
			}
		}()
	}
	require.NoError(t, <-werr)
	wg.Wait()
	close(rerrs)
	for err := range rerrs {
		require.NoError(t, err)
	}
	require.Equal(t, data, got)
	_ = s.SetReadDeadline(time.Time{})
	_ = c.SetWriteDeadline(time.Time{})
	bothFailedOver(t, c, s, "sim")
}

// TestFailoverThenClose: a side that writes and closes right after its
// ring failed still delivers every byte, then an orderly EOF; the other
// side's writes end with a broken pipe or succeed, never with a reset.
func TestFailoverThenClose(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	for _, victim := range []string{"writer", "reader"} {
		t.Run(victim, func(t *testing.T) {
			c, s := simOnRing(t)
			const size = 2 << 20
			data := streamBytes(size, 3)
			done := make(chan error, 1)
			go func() {
				b, err := io.ReadAll(s)
				if err == nil && string(b) != string(data) {
					err = fmt.Errorf("read %d bytes, not the %d written", len(b), size)
				}
				done <- err
			}()
			x := map[string]*Conn{"writer": c, "reader": s}[victim]
			w := &triggerConn{Conn: c, at: size / 2, fire: func() { breakRing(x) }}
			_, err := w.Write(data)
			require.NoError(t, err)
			require.NoError(t, c.Close())
			require.NoError(t, <-done)
			assertFailedOver(t, s, "sim")
		})
	}
}

// TestFailoverCloseRightAfterBreak: a Close right after the ring failed,
// before any call saw it, fails over too (stream.Conn.Moving polls for
// the failure), and the peer reads every byte, then io.EOF. It used to
// close on the broken ring: the final message never came back, and after
// finalAckTimeout the peer was reset.
func TestFailoverCloseRightAfterBreak(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnRing(t)
	data := streamBytes(1000, 7)
	_, err := s.Write(data)
	require.NoError(t, err)
	breakRing(s)
	require.NoError(t, s.Close())
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Minute)))
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	assert.Equal(t, data, got)
	assert.Equal(t, CodeFailedOver, c.Info().Code, c.Info().Reason)
}

// TestFailoverOff: with NoFailover, a ring failure resets the connection.
func TestFailoverOff(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	cfg := swCfg("sim", time.Nanosecond)
	cfg.NoFailover = true
	ln := listen(t, cfg)
	c, s := onRing(t, ln, cfg)
	breakRing(c)
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err)
	assert.True(t, errors.Is(err, syscall.ECONNRESET), "%v", err)
	_, err = s.Read(make([]byte, 1))
	assert.True(t, errors.Is(err, syscall.ECONNRESET), "%v", err)
}

// TestFailoverPeerDeath: a peer whose process dies (its TCP connection
// reset, its queue pair gone) is a dead connection: Read fails with a
// reset, never an EOF that would pass a cut stream for a whole one.
func TestFailoverPeerDeath(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	for i := range 5 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			c, s := simOnRing(t)
			_, err := s.Write(make([]byte, 1000))
			require.NoError(t, err)
			// As the kernel ends a dead process's connections.
			_ = s.tcp.SetLinger(0)
			_ = s.tcp.Close()
			_ = s.ring().QP().Close()
			buf := make([]byte, 4096)
			var n int
			for err == nil {
				var k int
				k, err = c.Read(buf)
				n += k
			}
			assert.True(t, errors.Is(err, syscall.ECONNRESET), "after %d bytes: %v", n, err)
		})
	}
}

// TestFailoverBadResume: a Resume whose cursor breaks the rules is a
// clean error: beyond what was sent, or before what the peer had
// confirmed consuming.
func TestFailoverBadResume(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	for _, tc := range []struct {
		name   string
		cursor func(sent uint64) uint64
		want   string
	}{
		{"beyond", func(sent uint64) uint64 { return sent + 1 }, "resume at"},
		{"before-confirmed", func(uint64) uint64 { return 0 }, "resume at 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := simOnRing(t)
			// Bytes the server reads on the ring: it reports them consumed.
			// (More than the starting ring holds: the Write returns once
			// the server read them, or its ring grew.)
			werr := make(chan error, 1)
			go func() { _, err := c.Write(make([]byte, 40_000)); werr <- err }()
			_, err := io.ReadFull(s, make([]byte, 40_000))
			require.NoError(t, err)
			require.NoError(t, <-werr)
			// Hold the server's Resume back: its sender is locked.
			s.w.out.mu.Lock()
			require.NoError(t, c.w.failover("test"))
			c.w.mu.Lock()
			sent := c.w.owe.end()
			c.w.mu.Unlock()
			err = c.w.peerResumed(tc.cursor(sent))
			s.w.out.mu.Unlock()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestFailoverSecondResume: a second Resume is a protocol error that
// resets the connection.
func TestFailoverSecondResume(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnRing(t)
	breakRing(c)
	byteEachWay(t, c, s) // through TCP: both Resumes were read
	assertFailedOver(t, c, "sim")
	require.NoError(t, s.w.out.send(&handshake.Resume{Cursor: 2}))
	_, err := c.Read(make([]byte, 1))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "without a failover")
}

// TestFailoverUpgradesAgain: after a failover the client offers a ring
// again after its backoff, the stream moves back to the ring, and a
// second failure fails over again; every byte arrives once, in order.
func TestFailoverUpgradesAgain(t *testing.T) {
	registerSim(t)
	reupgradeScale.Store(100) // 1 ms, 2 ms, 4 ms
	t.Cleanup(func() { reupgradeScale.Store(1) })
	c, s := simOnRing(t)
	for round := range 3 {
		const size = 1 << 20
		w := &triggerConn{Conn: c, at: size / 2, fire: func() { breakRing([]*Conn{c, s}[round%2]) }}
		errs := make(chan error, 2)
		go func() { errs <- hashedWrite(w, size, uint64(round)) }()
		go func() { errs <- hashedRead(s, size, uint64(round)) }()
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
		// Traffic until both ends are on the ring again (the backoff is
		// 1, 2, then 4 ms here).
		deadline := time.Now().Add(10 * time.Second)
		for !bothDirectionsOnRing(c) || !bothDirectionsOnRing(s) {
			require.True(t, time.Now().Before(deadline), "round %d: not on the ring again: %+v", round, c.Info())
			byteEachWay(t, c, s)
		}
	}
	byteEachWay(t, c, s)
	var back, forth int
	for _, e := range c.Info().Switches {
		switch {
		case e.From == "sim" && e.To == "tcp":
			back++
		case e.From == "tcp" && e.To == "sim":
			forth++
		}
	}
	assert.Equal(t, 6, back, "%+v", c.Info().Switches)
	assert.GreaterOrEqual(t, forth, 7, "%+v", c.Info().Switches)
}

// bothDirectionsOnRing reports whether x sends and receives on its ring.
func bothDirectionsOnRing(x *Conn) bool {
	x.w.mu.Lock()
	defer x.w.mu.Unlock()
	return x.w.send == sendRing && x.w.recv == recvRing && x.w.ring != nil
}

// TestReupgradeBackoff: the wait before a new upgrade doubles with each
// failover, up to its bound.
func TestReupgradeBackoff(t *testing.T) {
	assert.Equal(t, 100*time.Millisecond, reupgradeDelay(1))
	assert.Equal(t, 200*time.Millisecond, reupgradeDelay(2))
	assert.Equal(t, 800*time.Millisecond, reupgradeDelay(4))
	assert.Equal(t, time.Minute, reupgradeDelay(11))
	assert.Equal(t, time.Minute, reupgradeDelay(1000))
}

// TestFailoverCarriesRingBytes: the bytes a failover must carry over are
// neither lost nor repeated: bytes the peer announced that the
// application had not read yet (taken out of the ring), and bytes that
// were written but never reached the peer (sent again from its Resume).
func TestFailoverCarriesRingBytes(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	for _, tc := range []struct {
		name   string
		break_ func(c, s *Conn)
	}{
		// s has not read: the bytes wait in its ring.
		{"unread", func(c, s *Conn) { breakRing(s) }},
		// s's queue pair holds the transfers back, and c's fails with them
		// in flight: they never arrive.
		{"undelivered", func(c, s *Conn) { breakRing(c) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s := simOnRing(t)
			sq := s.ring().QP().(*sim.QP)
			if tc.name == "undelivered" {
				sq.Stall(true)
			}
			data := streamBytes(100_000, 9)
			_, err := c.Write(data[:30_000]) // within the 64 KiB ring
			require.NoError(t, err)
			tc.break_(c, s)
			sq.Stall(false)
			_, err = c.Write(data[30_000:])
			require.NoError(t, err)
			got := make([]byte, len(data))
			require.NoError(t, s.SetReadDeadline(time.Now().Add(10*time.Second)))
			_, err = io.ReadFull(s, got)
			require.NoError(t, err)
			require.Equal(t, data, got)
			bothFailedOver(t, c, s, "sim")
		})
	}
}

// TestFailoverEchoThroughCopyTo: an echo server (io.Copy from the
// connection to itself: CopyTo hands the ring's bytes to the
// connection's own Write) fails over while its writer is blocked inside
// that copy; nothing is lost and nothing deadlocks.
func TestFailoverEchoThroughCopyTo(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	for i, victim := range []string{"server", "client", "server"} {
		t.Run(fmt.Sprintf("%d-%s", i, victim), func(t *testing.T) {
			c, s := simOnRing(t)
			go func() {
				_, _ = io.Copy(s, s)
				_ = s.CloseWrite()
			}()
			const size = 4 << 20
			x := map[string]*Conn{"server": s, "client": c}[victim]
			w := &triggerConn{Conn: c, at: size/3 + i*1000, fire: func() { breakRing(x) }}
			errs := make(chan error, 2)
			go func() {
				err := hashedWrite(w, size, 11)
				if err == nil {
					err = c.CloseWrite()
				}
				errs <- err
			}()
			go func() { errs <- hashedRead(c, size, 11) }()
			require.NoError(t, <-errs)
			require.NoError(t, <-errs)
			n, err := c.Read(make([]byte, 1))
			assert.Equal(t, 0, n)
			assert.Equal(t, io.EOF, err)
			assertFailedOver(t, c, "sim")
			assertFailedOver(t, s, "sim")
		})
	}
}

// failoverPause breaks the ring of c or s (alternately) and times how long
// a byte written right after takes to arrive: the failure found, the
// Resumes exchanged and what the ring had not delivered sent again.
func failoverPause(t testing.TB, ln *Listener, cfg *Config, n int) []time.Duration {
	d := make([]time.Duration, 0, n)
	for i := range n {
		c, s := onRing(t, ln, cfg)
		start := time.Now()
		breakRing([]*Conn{c, s}[i%2])
		_, err := c.Write([]byte{1})
		require.NoError(t, err)
		_, err = io.ReadFull(s, make([]byte, 1))
		require.NoError(t, err)
		d = append(d, time.Since(start))
		require.Equal(t, CodeFailedOver, s.Info().Code)
		c.Close()
		s.Close()
	}
	slices.Sort(d)
	return d
}

// BenchmarkFailoverPause reports the failover pause on sim (p50, p99 over
// b.N failovers; setup excluded).
func BenchmarkFailoverPause(b *testing.B) {
	registerSim(b)
	noReupgrade(b)
	b.StopTimer()
	cfg := swCfg("sim", time.Nanosecond)
	d := failoverPause(b, listen(b, cfg), cfg, max(b.N, 20))
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-us")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), "p99-us")
	b.ReportMetric(0, "ns/op")
}

// TestFailoverOnHostileRingMessage: a state message that breaks the
// ring's rules (here a wrong sequence number, posted under the peer's
// engine in the middle of a transfer) fails the ring over, on shm as on
// sim; the transfer completes over TCP.
func TestFailoverOnHostileRingMessage(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	for _, tr := range []string{"sim", "shm"} {
		t.Run(tr, func(t *testing.T) {
			cfg := swCfg(tr, time.Nanosecond)
			ln := listen(t, cfg)
			c, s := onRing(t, ln, cfg)
			const size = 1 << 20
			var injected error
			w := &triggerConn{Conn: s, at: size / 2, fire: func() {
				// Not inject(): this runs on the writer's goroutine.
				var b [ring.MsgLen]byte
				m := ring.Msg{Seq: 7, Posted: DefaultCredits}
				m.Marshal(b[:])
				injected = s.ring().QP().PostSend(&verbs.SendWR{Op: verbs.OpSend, Inline: b[:], Signaled: true})
			}}
			errs := make(chan error, 2)
			go func() { errs <- hashedWrite(w, size, 5) }()
			go func() { errs <- hashedRead(c, size, 5) }()
			require.NoError(t, <-errs)
			require.NoError(t, <-errs)
			require.NoError(t, injected)
			byteEachWay(t, c, s)
			assertFailedOver(t, c, tr)
			assertFailedOver(t, s, tr)
			assert.Contains(t, c.Info().Reason, "peer broke the protocol")
		})
	}
}

// sendMoved reports whether x's switch log has its sending moved from
// one transport to another.
func sendMoved(x *Conn, from, to string) bool {
	for _, e := range x.Info().Switches {
		if e.Direction == "send" && e.From == from && e.To == to {
			return true
		}
	}
	return false
}

func owes(x *Conn) bool {
	x.w.mu.Lock()
	defer x.w.mu.Unlock()
	return x.w.owe != nil
}

// TestFailoverWriteEndsWithThePeer: a Write waiting for the peer's
// Resume ends when the peer dies, aborts or says goodbye instead.
func TestFailoverWriteEndsWithThePeer(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	for _, how := range []string{"peer-dies", "peer-aborts", "peer-goodbye"} {
		t.Run(how, func(t *testing.T) {
			c, s := simOnRing(t)
			s.w.out.mu.Lock() // s's Resume cannot go out
			defer s.w.out.mu.Unlock()
			breakRing(c)
			require.Eventually(t, func() bool { return owes(c) }, 10*time.Second, time.Millisecond, "c's failover")
			done := make(chan error, 1)
			go func() { _, err := c.Write([]byte{1}); done <- err }()
			switch how {
			case "peer-dies":
				_ = s.tcp.SetLinger(0)
				_ = s.tcp.Close()
			case "peer-goodbye":
				c.w.mu.Lock()
				final := c.w.rcvd
				c.w.mu.Unlock()
				_ = handshake.Write(s.tcp, &handshake.Goodbye{FinalProd: final})
			default:
				_ = handshake.Write(s.tcp, &handshake.Goodbye{Abort: true, Reason: "bye"})
			}
			select {
			case err := <-done:
				assert.True(t, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE), "%v", err)
			case <-time.After(10 * time.Second):
				t.Fatalf("Write still blocked after the peer's end (%v)", c.w.err)
			}
		})
	}
}

// TestFailoverCloseWriteDeadline: CloseWrite waiting for the peer's
// Resume honours the write deadline.
func TestFailoverCloseWriteDeadline(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnRing(t)
	s.w.out.mu.Lock()
	defer s.w.out.mu.Unlock()
	breakRing(c)
	require.Eventually(t, func() bool { return owes(c) }, 10*time.Second, time.Millisecond, "c's failover")
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(100*time.Millisecond)))
	done := make(chan error, 1)
	go func() { done <- c.CloseWrite() }()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, os.ErrDeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("CloseWrite still blocked long after its write deadline")
	}
}

// TestFailoverParkedReader: a failover while our reader is parked for
// room (the application has not read) and the peer's sending is still on
// TCP: the peer's Resume, behind its Data, is still read.
func TestFailoverParkedReader(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnTCP(t)
	s.w.wmu.Lock() // a Write of s in progress: its sending stays on TCP
	c.w.kick()
	require.Eventually(t, func() bool {
		c.w.mu.Lock()
		defer c.w.mu.Unlock()
		return c.w.send == sendRing && s.ring() != nil
	}, 10*time.Second, time.Millisecond, "rings on both ends, c sending on its")
	go func() { // Data c's application does not read; then it waits for room
		_, _ = s.w.out.data(make([]byte, 32<<20), &s.w.wdl, s.w.done)
		s.w.wmu.Unlock()
	}()
	require.Eventually(t, func() bool { return c.w.parked.Load() }, 10*time.Second, time.Millisecond, "c's reader parked")
	go func() { _, _ = io.Copy(io.Discard, s) }()
	breakRing(c)
	// Not owes(c): with s reading, its Resume may settle what c owes
	// before a poll sees it. The log's entry stays.
	require.Eventually(t, func() bool { return sendMoved(c, "sim", "tcp") }, 10*time.Second, time.Millisecond, "c's failover")
	done := make(chan error, 1)
	go func() { _, err := c.Write([]byte{1}); done <- err }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("a 1-byte Write hangs after the failover (reader parked: %v)", c.w.parked.Load())
	}
}

// TestFailoverGoodbyeRace: the peer's orderly goodbye, read just before
// the ring's failover runs, still ends the stream with EOF after every
// byte.
func TestFailoverGoodbyeRace(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnRing(t)
	_, err := c.Write([]byte("hello"))
	require.NoError(t, err)
	var once sync.Once
	testHookGoodbye.set(func(w *swConn) {
		once.Do(func() { _ = w.failover("test: the ring failed") })
	})
	t.Cleanup(func() { testHookGoodbye.set(nil) })
	require.NoError(t, c.Close())
	require.NoError(t, s.SetReadDeadline(time.Now().Add(10*time.Second)))
	b, err := io.ReadAll(s)
	assert.Equal(t, "hello", string(b))
	assert.NoError(t, err, "want EOF after the 5 bytes")
}

// TestFailoverCloseDuringDetach: Close while the failover is between
// detaching the ring and taking the connection off it waits for it, and
// ends the stream on TCP in order.
func TestFailoverCloseDuringDetach(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnRing(t)
	closeErr := make(chan error, 1)
	var once sync.Once
	testHookDetached.set(func(w *swConn) {
		if w != c.w {
			return
		}
		once.Do(func() {
			go func() { closeErr <- c.Close() }()
			time.Sleep(20 * time.Millisecond) // Close meets the failover in progress
		})
	})
	t.Cleanup(func() { testHookDetached.set(nil) })
	breakRing(c)
	require.NoError(t, <-closeErr)
	require.NoError(t, s.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := s.Read(make([]byte, 1))
	assert.Equal(t, io.EOF, err)
}

// TestFailoverResumeBeforeServerRing: the client's ring fails before its
// Switch went out and before the server installed its ring; the server's
// reader waits for its ring, then fails over instead of resetting.
func TestFailoverResumeBeforeServerRing(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnTCP(t)
	byteEachWay(t, c, s)
	release := make(chan struct{})
	// The server stops between its side exchange (done: c's queue pair
	// is still up) and the start of its ring.
	exchanged := make(chan struct{}, 1)
	testHookServeStart.set(func(*swConn) { exchanged <- struct{}{}; <-release })
	t.Cleanup(func() { testHookServeStart.set(nil) })
	c.w.wmu.Lock() // c's Switch is not sent
	c.w.kick()
	require.Eventually(t, func() bool { return c.ring() != nil }, 10*time.Second, time.Millisecond, "c's ring")
	select {
	case <-exchanged:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not finish its side exchange")
	}
	breakRing(c)
	require.Eventually(t, func() bool { c.w.mu.Lock(); defer c.w.mu.Unlock(); return c.w.setbacks > 0 }, 10*time.Second, time.Millisecond, "c's failover")
	c.w.wmu.Unlock()
	close(release)
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	require.NoError(t, s.SetDeadline(time.Now().Add(10*time.Second)))
	byteEachWay(t, c, s)
	assert.Equal(t, "tcp", TransportOf(s), s.Info().Reason)
}

// TestServerStartFails: the server's start of an agreed ring fails (its
// side exchange, after the client's Confirm{0}; the client has switched,
// or will): the server fails over as from a ring that carried nothing
// (§9.4 step 4), instead of resetting. Its Resume moves the client off its
// ring too, and the bytes the client wrote on either path arrive.
func TestServerStartFails(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnTCP(t)
	byteEachWay(t, c, s)
	injected := errors.New("injected: the side exchange failed")
	testServeExchangeErr.Store(&injected)
	t.Cleanup(func() { testServeExchangeErr.Store(nil) })
	_, err := c.Write([]byte("on tcp"))
	require.NoError(t, err)
	c.w.kick()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	require.NoError(t, s.SetDeadline(time.Now().Add(10*time.Second)))
	got := make([]byte, len("on tcp"))
	_, err = io.ReadFull(s, got)
	require.NoError(t, err)
	assert.Equal(t, "on tcp", string(got))
	require.Eventually(t, func() bool { return s.Info().Code == CodeFailedOver }, 10*time.Second, time.Millisecond, "s: %+v", s.Info())
	_, err = c.Write([]byte("after"))
	require.NoError(t, err)
	got = make([]byte, len("after"))
	_, err = io.ReadFull(s, got)
	require.NoError(t, err)
	assert.Equal(t, "after", string(got))
	byteEachWay(t, c, s)
	assert.Contains(t, s.Info().Reason, "injected")
	assert.Equal(t, "tcp", TransportOf(c), c.Info().Reason)
}

// TestFailoverSecondResumeDuringResend: a second failover while the bytes
// the first one owes are still being sent again (our sending never moved
// to the second ring): the peer's new Resume must not move where that
// resend stands.
func TestFailoverSecondResumeDuringResend(t *testing.T) {
	registerSim(t)
	noReupgrade(t)
	c, s := simOnTCP(t)
	byteEachWay(t, c, s)
	// The state after the first failover and the peer's Resume: c owes
	// data from x, and sends it again.
	data := streamBytes(8_000_000, 3)
	c.w.mu.Lock()
	x := c.w.out.cursor()
	c.w.owe, c.w.send = &owed{x: x, first: x, data: data, known: true, from: x, done: make(chan struct{})}, sendOwed
	c.w.mu.Unlock()
	go c.w.resendBg() // as the peer's first Resume started it
	// A Write with a deadline sends them; s does not read, so it waits for
	// room with part of them queued.
	require.NoError(t, c.SetWriteDeadline(time.Now().Add(time.Second)))
	werr := make(chan error, 1)
	go func() { _, err := c.Write([]byte("after")); werr <- err }()
	require.Eventually(t, func() bool { return s.w.parked.Load() }, 10*time.Second, time.Millisecond, "s's reader parked")
	// The second failover: c's sending was on TCP, so it owes nothing new;
	// then s's Resume, at what s has received so far.
	s.w.mu.Lock()
	r2 := s.w.rcvd
	s.w.mu.Unlock()
	c.w.mu.Lock()
	c.w.awaitResume = true
	c.w.mu.Unlock()
	require.NoError(t, c.w.peerResumed(r2))
	err := <-werr
	require.True(t, err == nil || errors.Is(err, os.ErrDeadlineExceeded), "%v", err)
	require.NoError(t, c.SetWriteDeadline(time.Time{}))
	got := make([]byte, len(data))
	require.NoError(t, s.SetReadDeadline(time.Now().Add(20*time.Second)))
	n, err := io.ReadFull(s, got)
	require.NoError(t, err, "read %d of %d owed bytes", n, len(data))
	require.Equal(t, data, got)
}

// TestRingCallsReturnTheConnectionsReset: once the connection is reset,
// a call on the ring's fast path returns the connection's error, which
// says once that the peer aborted (the ring does not read its own
// connection's failure as a second abort of the peer's).
func TestRingCallsReturnTheConnectionsReset(t *testing.T) {
	registerSim(t)
	cfg := growCfg("sim", time.Nanosecond)
	c, s := onRing(t, listen(t, cfg), cfg)
	require.NoError(t, s.SetLinger(0))
	require.NoError(t, s.Close())
	for _, call := range []func() error{
		func() error { _, err := c.Read(make([]byte, 1)); return err },
		func() error { _, err := c.Write([]byte{'x'}); return err },
	} {
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		err := call()
		require.ErrorIs(t, err, syscall.ECONNRESET)
		assert.Equal(t, 1, strings.Count(err.Error(), "peer aborted"), "%v", err)
	}
}
