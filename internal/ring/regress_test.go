package ring

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Regression tests for the defects found while testing the ring protocol,
// all fixed in state.go and msg.go. The liveness ones drive the two-party
// model of model_test.go through a short, legal script (every operation is
// one a correct rsock endpoint may perform, in an order the network may
// deliver) and then let a fair scheduler finish the connection. Where the
// fix is a rule of the drivers (the last-credit rule), the same script is
// also run under the rule before the fix (model.laxLastCredit), and the
// model must report the deadlock: the script really exercises the rule.

// crossingScript: a fresh connection with 4 credits a side. Both sides
// write twice (two data messages: the data credits are gone), stall, send
// BLOCKED on the second-last credit, then give up on the rest (a write
// deadline) and close for writing: the FIN finds one credit and nothing
// received, so no credit to return. All messages cross.
func crossingScript(tb testing.TB, lax bool) *model {
	p := symmetric(MinRingSize, MinCredits)
	m := newModel(tb, p, mirror(p), stream(1, 3*MinRingSize), stream(2, 3*MinRingSize))
	m.laxLastCredit, m.closeEarly = lax, true
	a, b := m.p[0], m.p[1]
	for range MinCredits - Reserved { // all data credits, messages crossing
		require.True(tb, m.do(a, opWrite, 100))
		require.True(tb, m.do(b, opWrite, 100))
	}
	for _, x := range m.p {
		require.False(tb, m.enabled(x, opWrite), "%s: data on a reserved credit", x.name)
		require.True(tb, x.stalled())
		require.True(tb, m.do(x, opBlock, 0), "%s: BLOCKED", x.name)
		require.Equal(tb, uint64(1), x.st.Credits())
	}
	require.True(tb, m.do(a, opFIN, 0))
	require.True(tb, m.do(b, opFIN, 0))
	return m
}

// BUG 1 (was: Reserved = 1 deadlocks at start). Both sides spent their
// last credit before either had received anything; each then held the
// other's messages and owed it an update, but had no credit to send it
// with, and no credit could come. Reserved is now fixed at 2, and the last
// credit may only carry a message that returns credits: the FINs wait, the
// first delivery gives each side a repost to announce, and the FIN that
// then goes out returns it.
func TestRegressStartupCrossingLastCredit(t *testing.T) {
	m := crossingScript(t, false)
	for _, x := range m.p {
		s := x.st
		assert.Equal(t, uint64(1), s.Credits(), x.name)
		assert.False(t, s.CanSendControl(), "%s: the last credit would return nothing", x.name)
		assert.False(t, s.NeedUpdate(), x.name)
		assert.True(t, s.FINPending(), "%s: the FIN waits for a credit", x.name)
		assert.Len(t, x.peer.inbox, 3, "%s: two data messages and the BLOCKED, no FIN", x.name)
		_, err := s.Next(0)
		requireUsage(t, s, err)
	}
	require.Equal(t, 2, m.pendingFINs)
	// One delivery is enough to unlock a side.
	a := m.p[0]
	require.True(t, m.do(a, opDeliver, 0))
	require.True(t, a.st.CanSendControl())
	require.True(t, m.enabled(a, opFIN))
	m.runFair(MinRingSize, m.complete, 100_000)
	require.True(t, m.complete())

	// Under the rule before the fix, the very same script deadlocks.
	msg := modelFailure(t, func(tb testing.TB) {
		m := crossingScript(tb, true)
		for _, x := range m.p {
			require.Zero(tb, x.st.Credits(), "%s spent the last credit on its FIN", x.name)
			require.Len(tb, x.peer.inbox, 4)
		}
		m.runFair(MinRingSize, m.complete, 100_000)
	})
	require.Contains(t, msg, "DEADLOCK", "the lax rule did not deadlock:\n%s", msg)
}

// The last-credit rule in random runs. Writers stall (slow delivery, no
// notify or write-only: every write is a data message) and give up, so
// FINs compete for the last credit. Under the rule before the fix the
// model finds deadlocks on its own; under the fixed rule the same seeds
// complete. This keeps the drivers and the detector honest: drivers that
// stopped reaching the last credit, or a detector that stopped seeing dead
// ends, fail here. (With the reserve fixed at 2, the model found no
// deadlock under the old rule without writers that give up: a FIN is what
// competes with the BLOCKED for the last credit.)
func TestRegressLaxLastCreditDeadlocksInRandomRuns(t *testing.T) {
	seeds := 2000
	if testing.Short() {
		seeds = 500
	}
	w := [numOps]int{6, 0, 0, 6, 1, 6, 6, 3}
	run := func(tb testing.TB, c, seed uint64, lax bool) {
		r := rand.New(rand.NewPCG(seed, c))
		p := symmetric(MinRingSize, c)
		m := newModel(tb, p, mirror(p), stream(2*seed, 1+r.IntN(3*MinRingSize)), stream(2*seed+1, 1+r.IntN(3*MinRingSize)))
		m.closeEarly, m.laxLastCredit = true, lax
		m.runRandom(r, [2][numOps]int{w, w}, 100_000)
		require.True(tb, m.complete())
	}
	for _, c := range []uint64{4, 5} {
		found := 0
		first := ""
		for seed := range uint64(seeds) {
			run(t, c, seed, false)
			msg := modelFailure(t, func(tb testing.TB) { run(tb, c, seed, true) })
			if msg == "" {
				continue
			}
			require.Contains(t, msg, "DEADLOCK", "credits %d seed %d: the lax rule failed otherwise:\n%s", c, seed, msg)
			if found == 0 {
				first = fmt.Sprintf("seed %d", seed)
			}
			found++
		}
		t.Logf("credits %d: the lax last-credit rule deadlocked %d of %d runs (first: %s)", c, found, seeds, first)
		require.Positive(t, found, "credits %d: the model no longer finds the deadlock the last-credit rule prevents", c)
	}
}

// BUG 2 (was: Reserved = credits-1 livelocks). With a reserve of all but
// one credit, "the peer is down to its reserved credits" held after any
// single message, so every message was answered with an update, forever,
// and a writer (which needed all its credits back at once) starved. With
// the constant reserve, even at the fewest credits (reserve = credits-2)
// the streams complete, and no message on an idle connection is answered
// with more than one update.
func TestRegressFewestCreditsNoLivelock(t *testing.T) {
	for c := uint64(MinCredits); c <= 8; c++ {
		p := symmetric(MinRingSize, c)
		m := newModel(t, p, mirror(p), stream(1, 2*MinRingSize), stream(2, 2*MinRingSize))
		m.runFair(MinRingSize, m.complete, 100_000)
		require.True(t, m.complete())
		var updates uint64
		for _, x := range m.p {
			updates += x.updates
		}
		// Each side moves 8 KiB through a 4 KiB ring with writes of at
		// most 4 KiB: a handful of messages, not thousands.
		assert.Less(t, m.steps, 200, "credits %d: %d steps, %d updates", c, m.steps, updates)
	}
}

func TestRegressIdleConnectionNoUpdateStorm(t *testing.T) {
	for c := uint64(MinCredits); c <= 8; c++ {
		for k := uint64(1); k < c; k++ { // k messages in a row, then quiet
			for _, extra := range []Flags{0, FlagBlocked} {
				a, b := newPair(t, symmetric(MinRingSize, c))
				for range k {
					send(t, a, b, extra)
				}
				echoes := 0
				from, to := b, a
				for from.NeedUpdate() {
					send(t, from, to, 0)
					from, to = to, from
					echoes++
					require.LessOrEqual(t, echoes, 1, "credits %d, %d messages: an update answered with an update", c, k)
				}
				assert.False(t, a.NeedUpdate() || b.NeedUpdate())
				// Whatever the echo, a gets all its credits back once b
				// answers; b answers when a needs it (a has no data credit).
				if a.Credits() <= Reserved {
					assert.Equal(t, 1, echoes, "credits %d, %d messages: a left without a data credit", c, k)
				}
			}
		}
	}
}

// BUG 3 (was: mismatched Reserved deadlocks). NeedUpdate's rule "the
// peer's view of its credits is down to the reserved ones" used our
// Reserved as the peer's, and Reserved was a local parameter: a peer that
// reserved more than we did could stall above our reserve, out of data
// credits with its BLOCKED sent, and never get an update. Reserved is now a
// protocol constant, so a peer without a data credit is always below the
// reserve we assume; whenever we have its messages reposted, we answer.
func TestRegressPeerWithoutDataCreditGetsUpdate(t *testing.T) {
	for c := uint64(MinCredits); c <= 16; c++ {
		for left := uint64(1); left <= Reserved; left++ {
			a, b := newPair(t, symmetric(MinRingSize, c))
			for a.Credits() > left {
				send(t, a, b, 0) // delivered and reposted
			}
			require.False(t, a.CanSendData())
			assert.Zero(t, b.cons-b.announced, "nothing freed")
			assert.True(t, b.NeedUpdate(), "credits %d, peer left with %d", c, left)
		}
	}
}

// The scenario of BUG 3, scripted on the model with equal (constant)
// reserves: A stalls for lack of data credits with its BLOCKED sent, its
// last credit unusable for the update its reading owes, while B has freed
// nothing; B's reposts must bring A back.
func TestRegressStalledWriterNothingFreed(t *testing.T) {
	p := symmetric(MinRingSize, 8)
	m := newModel(t, p, mirror(p), stream(1, 3*MinRingSize), stream(2, 2010))
	a, b := m.p[0], m.p[1]
	steps := []struct {
		x  *party
		op opKind
		n  uint64
	}{
		{b, opWrite, 2000}, // B sends data
		{a, opDeliver, 0},  // ... A gets it
		{a, opWrite, 100},  // A: data, 7 credits left (and announces its repost)
		{a, opWrite, 100},  // 6
		{a, opWrite, 100},  // 5
		{a, opWrite, 100},  // 4
		{a, opWrite, 100},  // 3
		{a, opWrite, 100},  // 2: no data credit
		{a, opBlock, 0},    // A: BLOCKED, 1 left
		{a, opRead, 2000},  // A reads past the threshold
	}
	for i, s := range steps {
		require.True(t, m.do(s.x, s.op, s.n), "step %d: %s %v not possible\n%s", i, s.x.name, s.op, m.dump())
	}
	require.Equal(t, uint64(1), a.st.Credits())
	assert.False(t, m.enabled(a, opUpdate), "the update A owes returns no credits: not on the last one")
	for range 7 {
		require.True(t, m.do(b, opDeliver, 0))
	}
	assert.Zero(t, b.st.cons-b.st.announced, "B freed nothing")
	assert.True(t, b.st.NeedUpdate(), "B owes A its reposts")
	m.runFair(MinRingSize, m.complete, 100_000)
	require.True(t, m.complete())
}

// BUG 4 (missed validation): SetClose puts FIN on every CLOSE message
// ("CLOSE (and FIN)"), so CLOSE without FIN is something no correct peer
// sends. Receive accepted it, and then more data from a peer that said it
// had closed.
func TestRegressCloseWithoutFINRejected(t *testing.T) {
	a, b := newPair(t, small)
	send(t, b, a, 0)
	for _, f := range []Flags{FlagClose, FlagClose | FlagBlocked} {
		requireViolation(t, a, Msg{Seq: 2, Flags: f, Posted: 4}, "CLOSE without FIN")
	}
	require.False(t, a.PeerClosed() || a.PeerFIN())
	// What a correct peer sends is fine, and then data is over.
	require.NoError(t, a.Receive(Msg{Seq: 2, Flags: FlagFIN | FlagClose, Posted: 4}))
	require.True(t, a.PeerClosed() && a.PeerFIN())
	requireViolation(t, a, Msg{Seq: 3, Flags: FlagFIN | FlagClose, Prod: 1, Posted: 4}, "data after FIN")
	// A correct peer never sends it: SetClose implies FIN.
	b.SetClose()
	m, err := b.Next(0)
	require.NoError(t, err)
	assert.Equal(t, FlagFIN|FlagClose, m.Flags)
}

// BUG 5 (missed validation): the peer's consumer cursor was checked
// against our producer cursor, including bytes we had written but no
// message had announced; the peer cannot know of those.
func TestRegressConsumerBeyondAnnouncedRejected(t *testing.T) {
	a, b := newPair(t, small)
	require.NoError(t, a.Wrote(100))
	send(t, a, b, 0)
	require.NoError(t, a.Wrote(50)) // not announced
	requireViolation(t, a, Msg{Seq: 1, Cons: 101, Posted: 4}, "consumer cursor out of range")
	requireViolation(t, a, Msg{Seq: 1, Cons: 150, Posted: 4}, "consumer cursor out of range")
	require.NoError(t, a.Receive(Msg{Seq: 1, Cons: 100, Posted: 4}))
}

// BUG 6: a malformed message was not a protocol violation to callers that
// tear connections down on ErrProtocol.
func TestRegressMsgFormatIsProtocolViolation(t *testing.T) {
	require.ErrorIs(t, ErrMsgFormat, ErrProtocol)
	_, err := Unmarshal(make([]byte, MsgLen)) // version 0
	require.ErrorIs(t, err, ErrMsgFormat)
	require.ErrorIs(t, err, ErrProtocol)
	require.NotErrorIs(t, err, ErrUsage)
	var pe *ProtocolError
	assert.False(t, errors.As(err, &pe), "a format error is not a rule of the state machine")
	assert.NotErrorIs(t, ErrProtocol, ErrMsgFormat, "not every violation is a format error")
}

// BUG 7: Next silently dropped FIN and CLOSE passed as one-shot flags, and
// sent on a last credit that returned nothing. It now refuses both.
func TestRegressNextRefusesStickyFlagsAndLastCredit(t *testing.T) {
	a, b := newPair(t, small)
	for _, f := range []Flags{FlagFIN, FlagClose, FlagFIN | FlagClose} {
		_, err := a.Next(f)
		requireUsage(t, a, err)
	}
	for a.CanSendControl() {
		send(t, a, b, FlagBlocked)
	}
	require.Equal(t, uint64(1), a.Credits(), "stopped at the last credit, not at zero")
	_, err := a.Next(0)
	requireUsage(t, a, err)
}
