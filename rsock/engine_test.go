package rsock

import (
	"bytes"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/stream"
)

// The engine under load: n connections between one client and one server
// ping-pong at once, in the default busy-poll mode and in event mode, on
// every transport here. A lost wake-up shows as a hang, which the
// deadlines turn into a failure.

// stressPairs opens n connection pairs on ln, each checked to run on tr.
func stressPairs(t *testing.T, ln *Listener, cfg *Config, tr string, n int) [][2]*Conn {
	t.Helper()
	pairs := make([][2]*Conn, n)
	for i := range pairs {
		c, s := pipe(t, ln, cfg)
		t.Cleanup(func() { c.Close(); s.Close() })
		require.Equal(t, tr, TransportOf(c), c.Info().Reason)
		require.Equal(t, tr, TransportOf(s), s.Info().Reason)
		pairs[i] = [2]*Conn{c, s}
	}
	return pairs
}

// echoRounds runs rounds round trips of size bytes on every pair at once:
// the client writes, the server echoes, the client checks. Each side's
// deadline turns a lost wake-up into an error.
func echoRounds(t *testing.T, pairs [][2]*Conn, rounds, size int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(pairs))
	for i, p := range pairs {
		c, s := p[0], p[1]
		for _, x := range p {
			if err := x.SetDeadline(deadline); err != nil {
				t.Fatal(err)
			}
		}
		wg.Go(func() { // the server echoes
			buf := make([]byte, size)
			for range rounds {
				if _, err := io.ReadFull(s, buf); err != nil {
					errs <- fmt.Errorf("pair %d: server read: %w (%s)", i, err, s.ring().DebugState())
					return
				}
				if _, err := s.Write(buf); err != nil {
					errs <- fmt.Errorf("pair %d: server write: %w", i, err)
					return
				}
			}
		})
		wg.Go(func() {
			out, in := make([]byte, size), make([]byte, size)
			for r := range rounds {
				for j := range out {
					out[j] = byte(i + r + j)
				}
				if _, err := c.Write(out); err != nil {
					errs <- fmt.Errorf("pair %d round %d: client write: %w", i, r, err)
					return
				}
				if _, err := io.ReadFull(c, in); err != nil {
					errs <- fmt.Errorf("pair %d round %d: client read: %w (%s)", i, r, err, c.ring().DebugState())
					return
				}
				if !bytes.Equal(in, out) {
					errs <- fmt.Errorf("pair %d round %d: echo differs", i, r)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// stress runs echoRounds over 1, 4, 16 and 64 connections on tr, each mode
// with its own listener from mk (given the mode's BusyPoll): about total
// round trips in all, at least 20 per connection.
func stress(t *testing.T, tr string, total int, mk func(t *testing.T, busyPoll time.Duration) (*Listener, *Config)) {
	for _, mode := range []struct {
		name     string
		busyPoll time.Duration
	}{{"BusyPoll", 0}, {"EventOnly", -1}} {
		for _, n := range []int{1, 4, 16, 64} {
			t.Run(fmt.Sprintf("%s/%d", mode.name, n), func(t *testing.T) {
				ln, cfg := mk(t, mode.busyPoll)
				echoRounds(t, stressPairs(t, ln, cfg, tr, n), max(total/n, 20), 64)
			})
		}
	}
}

// onLocal makes a listener and config for tr on loopback.
func onLocal(tr string) func(t *testing.T, busyPoll time.Duration) (*Listener, *Config) {
	return func(t *testing.T, busyPoll time.Duration) (*Listener, *Config) {
		cfg := &Config{Transports: []string{tr}, RingSize: 64 << 10, BusyPoll: busyPoll}
		return listen(t, cfg), cfg
	}
}

func TestStressSim(t *testing.T) {
	registerSim(t)
	stress(t, "sim", 4000, onLocal("sim"))
}

func TestStressShm(t *testing.T) { stress(t, "shm", 4000, onLocal("shm")) }

// In event mode a ping-pong costs one wake-up per message: the blocked
// Read is woken by its message's notification itself, not through another
// goroutine, and almost no notification finds no call waiting. Counted,
// not timed.
func oneWakeupPerMessage(t *testing.T, ln *Listener, cfg *Config, tr string) {
	const rounds = 1000
	pairs := stressPairs(t, ln, cfg, tr, 1)
	echoRounds(t, pairs, rounds, 64)
	for _, c := range pairs[0] {
		ci := c.Info()
		t.Logf("%s: wake-ups %d, notifications %d, background %d, spin hits %d for %d messages in",
			tr, ci.Wakeups, ci.Notifications, ci.Background, ci.SpinHits, rounds)
		// Two wake-ups per message (a goroutine between the queue and
		// the call) would make this 2*rounds.
		require.LessOrEqual(t, ci.Wakeups+ci.Background, uint64(rounds)*5/4)
		// A Read parks only if the answer has not come yet: on a loaded
		// machine many find it there (458 of 1,000 parked once, beside
		// two CPU hogs), so the bound is only that parking happened.
		require.GreaterOrEqual(t, ci.Wakeups, uint64(rounds)/10, "the Reads did not park: not event mode")
		require.Zero(t, ci.SpinHits, "a call busy-polled in event mode")
	}
}

// With busy-polling on, a ping-pong's answers are found by polling.
func busyPollHits(t *testing.T, ln *Listener, cfg *Config, tr string) {
	const rounds = 1000
	pairs := stressPairs(t, ln, cfg, tr, 1)
	echoRounds(t, pairs, rounds, 64)
	var hits uint64
	for _, c := range pairs[0] {
		ci := c.Info()
		t.Logf("%s: wake-ups %d, notifications %d, background %d, spin hits %d for %d messages in",
			tr, ci.Wakeups, ci.Notifications, ci.Background, ci.SpinHits, rounds)
		hits += ci.SpinHits
	}
	require.NotZero(t, hits, "no Read found its answer by busy-polling")
}

func TestShmOneWakeupPerMessage(t *testing.T) {
	cfg := &Config{Transports: []string{"shm"}, BusyPoll: -1}
	oneWakeupPerMessage(t, listen(t, cfg), cfg, "shm")
}

// The window is measured (what a park costs here, at most BusyPoll): the
// test sets it to BusyPoll's 1 ms, so that under the race detector, whose
// answers come later than a park, polling still finds them.
func TestShmBusyPollHits(t *testing.T) {
	defer stream.SetParkCost(time.Millisecond)()
	cfg := &Config{Transports: []string{"shm"}, BusyPoll: time.Millisecond}
	busyPollHits(t, listen(t, cfg), cfg, "shm")
}

// A state message goes out in one post (one doorbell on verbs) with the
// WRITEs of the bytes it announces: at most one post per message, idle (a
// ping-pong) and busy (one side streams writes of every size, through the
// ring's wrap, while the other reads). Counted, not timed.
func onePostPerMessage(t *testing.T, ln *Listener, cfg *Config, tr string) {
	pairs := stressPairs(t, ln, cfg, tr, 1)
	c, s := pairs[0][0], pairs[0][1]
	check := func(phase string) {
		for _, x := range pairs[0] {
			ci := x.Info()
			t.Logf("%s %s: %d posts for %d messages, %d bytes written", tr, phase, ci.Posts, ci.MsgsSent, ci.BytesWritten)
			require.NotZero(t, ci.Posts, phase)
			require.LessOrEqual(t, ci.Posts, ci.MsgsSent, "%s: more posts than state messages", phase)
		}
	}
	echoRounds(t, pairs, 500, 64)
	check("idle")

	const total = 4 << 20
	require.NoError(t, c.SetDeadline(time.Now().Add(2*time.Minute)))
	require.NoError(t, s.SetDeadline(time.Now().Add(2*time.Minute)))
	done := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, s, total)
		done <- err
	}()
	buf := make([]byte, 64<<10)
	for n, size := 0, 1; n < total; size = size*7%(64<<10) + 1 {
		k, err := c.Write(buf[:min(size, total-n)])
		require.NoError(t, err)
		n += k
	}
	require.NoError(t, <-done)
	check("busy")
}

func TestSimOnePostPerMessage(t *testing.T) {
	registerSim(t)
	ln, cfg := onLocal("sim")(t, 0)
	onePostPerMessage(t, ln, cfg, "sim")
}
