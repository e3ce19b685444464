package ring

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ---- helpers ----

func mustNew(t testing.TB, p Params) *State {
	t.Helper()
	s, err := New(p)
	require.NoError(t, err)
	return s
}

// mirror returns the peer's view of p.
func mirror(p Params) Params {
	p.LocalSize, p.PeerSize = p.PeerSize, p.LocalSize
	p.LocalCredits, p.PeerCredits = p.PeerCredits, p.LocalCredits
	return p
}

func newPair(t testing.TB, p Params) (a, b *State) {
	t.Helper()
	return mustNew(t, p), mustNew(t, mirror(p))
}

// send builds from's next message and delivers it to to, reposting the
// receive request it consumed.
func send(t testing.TB, from, to *State, extra Flags) Msg {
	t.Helper()
	m, err := from.Next(extra)
	require.NoError(t, err)
	require.NoError(t, to.Receive(m))
	require.NoError(t, to.Reposted())
	return m
}

// transfer moves n bytes from a to b and b's consumption back to a, one
// message each way.
func transfer(t testing.TB, a, b *State, n uint64) {
	t.Helper()
	require.NoError(t, a.Wrote(n))
	send(t, a, b, 0)
	require.NoError(t, b.Consumed(n))
	send(t, b, a, 0)
}

// advance moves a's producer and b's consumer cursor forward by n bytes in
// ring-sized steps.
func advance(t testing.TB, a, b *State, n uint64) {
	t.Helper()
	for n > 0 {
		k := min(n, a.Space())
		transfer(t, a, b, k)
		n -= k
	}
}

// checkSeg asserts a segment pair describes n bytes from cursor inside a
// ring of size.
func checkSegs(t testing.TB, cursor, n, size uint64, a, b Seg) {
	t.Helper()
	require.Equal(t, cursor&(size-1), a.Off, "first segment starts at the cursor's index")
	require.LessOrEqual(t, a.Off+a.Len, size, "first segment inside the ring")
	require.Equal(t, n, a.Len+b.Len, "segments cover n bytes")
	if b.Len > 0 {
		require.Equal(t, uint64(0), b.Off, "second segment starts at 0")
		require.Equal(t, size, a.Off+a.Len, "first segment runs to the end")
		require.LessOrEqual(t, b.Len, a.Off, "second segment stays below the first")
	} else {
		require.Equal(t, Seg{}, b)
	}
}

func requireViolation(t testing.TB, s *State, m Msg, rule string) {
	t.Helper()
	before := *s
	err := s.Receive(m)
	require.Error(t, err, "%+v accepted", m)
	require.ErrorIs(t, err, ErrProtocol)
	require.NotErrorIs(t, err, ErrUsage)
	var pe *ProtocolError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, rule, pe.Rule, "%v", err)
	require.Equal(t, before, *s, "state changed by a rejected message")
}

func requireUsage(t testing.TB, s *State, err error) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, ErrUsage)
	require.NotErrorIs(t, err, ErrProtocol)
}

var (
	small = Params{LocalSize: MinRingSize, LocalCredits: 4, PeerSize: MinRingSize, PeerCredits: 4}
	roomy = Params{LocalSize: MinRingSize, LocalCredits: 8, PeerSize: MinRingSize, PeerCredits: 8}
)

// ---- New ----

func TestNewValidation(t *testing.T) {
	ok := Params{LocalSize: 8 << 10, LocalCredits: 8, PeerSize: 4 << 10, PeerCredits: 6}
	bad := []struct {
		name string
		mod  func(*Params)
	}{
		{"local size zero", func(p *Params) { p.LocalSize = 0 }},
		{"local size not pow2", func(p *Params) { p.LocalSize = 12 << 10 }},
		{"local size pow2 below min", func(p *Params) { p.LocalSize = MinRingSize / 2 }},
		{"local size 1", func(p *Params) { p.LocalSize = 1 }},
		{"local size above max", func(p *Params) { p.LocalSize = MaxRingSize * 2 }},
		{"local size huge", func(p *Params) { p.LocalSize = 1 << 63 }},
		{"local size max uint", func(p *Params) { p.LocalSize = math.MaxUint64 }},
		{"peer size zero", func(p *Params) { p.PeerSize = 0 }},
		{"peer size not pow2", func(p *Params) { p.PeerSize = MinRingSize + 1 }},
		{"peer size below min", func(p *Params) { p.PeerSize = 2 << 10 }},
		{"peer size above max", func(p *Params) { p.PeerSize = 1 << 31 }},
		{"local credits zero", func(p *Params) { p.LocalCredits = 0 }},
		{"local credits below min", func(p *Params) { p.LocalCredits = MinCredits - 1 }},
		{"local credits above max", func(p *Params) { p.LocalCredits = MaxCredits + 1 }},
		{"peer credits zero", func(p *Params) { p.PeerCredits = 0 }},
		{"peer credits below min", func(p *Params) { p.PeerCredits = 3 }},
		{"peer credits above max", func(p *Params) { p.PeerCredits = MaxCredits + 1 }},
		{"peer credits max uint", func(p *Params) { p.PeerCredits = math.MaxUint64 }},
		{"local credits only reserved+1", func(p *Params) { p.LocalCredits = Reserved + 1 }},
		{"peer credits only reserved+1", func(p *Params) { p.PeerCredits = Reserved + 1 }},
		{"peer credits equal reserved", func(p *Params) { p.PeerCredits = Reserved }},
		{"threshold above size", func(p *Params) { p.Threshold = p.LocalSize + 1 }},
		{"threshold peer size is not the bound", func(p *Params) { p.LocalSize, p.PeerSize, p.Threshold = 4<<10, 8<<10, 8<<10 }},
		{"threshold max uint", func(p *Params) { p.Threshold = math.MaxUint64 }},
	}
	for _, c := range bad {
		p := ok
		c.mod(&p)
		s, err := New(p)
		assert.Nil(t, s, c.name)
		assert.ErrorIs(t, err, ErrUsage, c.name)
		assert.NotErrorIs(t, err, ErrProtocol, c.name)
	}

	good := []struct {
		name string
		mod  func(*Params)
	}{
		{"as is", func(*Params) {}},
		{"min everything", func(p *Params) { *p = small }},
		{"max everything", func(p *Params) {
			*p = Params{LocalSize: MaxRingSize, PeerSize: MaxRingSize, LocalCredits: MaxCredits, PeerCredits: MaxCredits, Threshold: MaxRingSize}
		}},
		{"credits just two above reserved", func(p *Params) { p.LocalCredits, p.PeerCredits = Reserved+2, Reserved+2 }},
		{"asymmetric min and max credits", func(p *Params) { p.LocalCredits, p.PeerCredits = MinCredits, MaxCredits }},
		{"threshold 1", func(p *Params) { p.Threshold = 1 }},
		{"threshold equal size", func(p *Params) { p.Threshold = p.LocalSize }},
	}
	for _, c := range good {
		p := ok
		c.mod(&p)
		s, err := New(p)
		require.NoError(t, err, c.name)
		got := s.Params()
		if p.Threshold == 0 {
			p.Threshold = p.LocalSize / 4
		}
		assert.Equal(t, p, got, c.name)
		assert.Equal(t, p.PeerSize, s.Space(), c.name)
		assert.Equal(t, p.PeerCredits, s.Credits(), c.name)
		assert.Zero(t, s.Readable(), c.name)
		assert.Zero(t, s.Prod(), c.name)
		assert.False(t, s.NeedUpdate(), c.name)
		assert.False(t, s.PeerBlocked() || s.PeerFIN() || s.PeerClosed() || s.EOF() || s.FINSent(), c.name)
		assert.True(t, s.CanSendData() && s.CanSendControl(), c.name)
	}
}

func TestNewDefaults(t *testing.T) {
	s := mustNew(t, Params{LocalSize: 64 << 10, LocalCredits: 4, PeerSize: 4 << 10, PeerCredits: 5})
	assert.Equal(t, uint64(16<<10), s.Params().Threshold, "a quarter of the local ring, not the peer's")
}

// Reserved is a protocol constant, not a parameter: both sides' update rules
// assume the peer keeps the same number of control-only credits, and
// MinCredits leaves two data credits above them.
func TestReservedConstant(t *testing.T) {
	assert.Equal(t, uint64(2), uint64(Reserved))
	assert.Equal(t, uint64(Reserved+2), uint64(MinCredits))
	for _, credits := range []uint64{MinCredits - 1, Reserved, 0} {
		p := small
		p.PeerCredits = credits
		_, err := New(p)
		assert.ErrorIs(t, err, ErrUsage, "peer credits %d", credits)
	}
	// The same reserve whatever the credits and ring sizes: data needs more
	// than Reserved credits, whoever the peer is.
	for _, credits := range []uint64{MinCredits, 5, 8, 64, MaxCredits} {
		for _, size := range []uint64{MinRingSize, 1 << 20} {
			p := Params{LocalSize: size, PeerSize: size, LocalCredits: MinCredits, PeerCredits: credits}
			a, b := newPair(t, p)
			for a.Credits() > Reserved {
				require.True(t, a.CanSendData(), "credits %d of %d", a.Credits(), credits)
				send(t, a, b, 0)
			}
			require.Equal(t, uint64(Reserved), a.Credits(), "credits %d", credits)
			assert.False(t, a.CanSendData(), "credits %d: the last %d credits are for control messages", credits, Reserved)
			assert.True(t, a.CanSendControl())
		}
	}
}

// ---- segments ----

func TestSegmentsTable(t *testing.T) {
	const size = 4096
	cases := []struct {
		cursor, n uint64
		a, b      Seg
	}{
		{0, 0, Seg{0, 0}, Seg{}},
		{0, 1, Seg{0, 1}, Seg{}},
		{0, size, Seg{0, size}, Seg{}},
		{1, size, Seg{1, size - 1}, Seg{0, 1}},
		{size - 1, 1, Seg{size - 1, 1}, Seg{}},
		{size - 1, 2, Seg{size - 1, 1}, Seg{0, 1}},
		{size - 1, size, Seg{size - 1, 1}, Seg{0, size - 1}},
		{size, 0, Seg{0, 0}, Seg{}},
		{size, size, Seg{0, size}, Seg{}},
		{size + 10, 100, Seg{10, 100}, Seg{}},
		{3*size - 50, 100, Seg{size - 50, 50}, Seg{0, 50}},
		{3*size - 50, 50, Seg{size - 50, 50}, Seg{}},
		{3*size - 50, 51, Seg{size - 50, 50}, Seg{0, 1}},
		{size / 2, size, Seg{size / 2, size / 2}, Seg{0, size / 2}},
		{math.MaxUint64, 1, Seg{size - 1, 1}, Seg{}},
		{math.MaxUint64, size, Seg{size - 1, 1}, Seg{0, size - 1}},
		{math.MaxUint64 - size + 1, size, Seg{0, size}, Seg{}},
	}
	for _, c := range cases {
		a, b := segments(c.cursor, c.n, size)
		assert.Equal(t, c.a, a, "cursor %d n %d", c.cursor, c.n)
		assert.Equal(t, c.b, b, "cursor %d n %d", c.cursor, c.n)
		checkSegs(t, c.cursor, c.n, size, a, b)
	}
}

func TestSegmentsRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		size := uint64(MinRingSize) << r.IntN(5)
		k := r.Uint64N(1 << 20)
		cursor := k*size + size - r.Uint64N(64) // near a multiple of size
		if r.IntN(2) == 0 {
			cursor = r.Uint64()
		}
		n := r.Uint64N(size + 1)
		a, b := segments(cursor, n, size)
		checkSegs(t, cursor, n, size, a, b)
	}
}

// The states' segments at cursors near and across ring-size multiples.
func TestStateSegmentsAtWrap(t *testing.T) {
	for _, skip := range []uint64{0, 1, 7, MinRingSize - 1, MinRingSize, MinRingSize + 1, 3*MinRingSize - 100} {
		a, b := newPair(t, small)
		advance(t, a, b, skip)
		require.Equal(t, skip, a.Prod())
		require.Equal(t, a.p.PeerSize, a.Space(), "all consumed and announced")
		for _, n := range []uint64{0, 1, 99, 100, 101, MinRingSize - 1, MinRingSize} {
			w1, w2 := a.WriteSegments(n)
			checkSegs(t, skip, n, MinRingSize, w1, w2)
		}
		// Fill the whole ring: n == size, wrapping unless skip is a multiple.
		w1, w2 := a.WriteSegments(a.Space())
		checkSegs(t, skip, MinRingSize, MinRingSize, w1, w2)
		assert.Equal(t, skip%MinRingSize == 0, w2.Len == 0)
		require.NoError(t, a.Wrote(MinRingSize))
		assert.Zero(t, a.Space())
		send(t, a, b, 0)
		require.Equal(t, uint64(MinRingSize), b.Readable())
		r1, r2 := b.ReadSegments(b.Readable())
		assert.Equal(t, w1, r1, "reader sees the writer's segments")
		assert.Equal(t, w2, r2)
		// Read a part, then the rest across the wrap.
		require.NoError(t, b.Consumed(100))
		r1, r2 = b.ReadSegments(b.Readable())
		checkSegs(t, skip+100, MinRingSize-100, MinRingSize, r1, r2)
	}
}

// ---- send half ----

func TestCreditsAndReserved(t *testing.T) {
	for _, credits := range []uint64{4, 5, 6, 8, 16} {
		p := small
		p.PeerCredits, p.LocalCredits = credits, credits
		a, b := newPair(t, p)
		// b's first message crosses a's: it announces none of their reposts.
		early, err := b.Next(0)
		require.NoError(t, err)
		// a receives nothing: it never has reposted receive requests to
		// announce, so it may use every credit but the last.
		for i := uint64(0); i < credits-1; i++ {
			require.Equal(t, credits-i, a.Credits())
			require.Equal(t, credits-i > Reserved, a.CanSendData(), "credits %d of %d", credits-i, credits)
			require.True(t, a.CanSendControl(), "credits %d of %d", credits-i, credits)
			m, err := a.Next(0)
			require.NoError(t, err)
			require.Equal(t, uint32(i+1), m.Seq)
			require.NoError(t, b.Receive(m))
			require.NoError(t, b.Reposted())
		}
		// The last credit cannot carry a message that returns nothing.
		require.Equal(t, uint64(1), a.Credits())
		assert.False(t, a.CanSendData())
		assert.False(t, a.CanSendControl(), "last credit, nothing to return")
		for _, extra := range []Flags{0, FlagBlocked} {
			before := *a
			_, err := a.Next(extra)
			requireUsage(t, a, err)
			assert.Equal(t, before, *a, "failed Next changed the state")
		}
		a.SetFIN()
		require.True(t, a.FINPending())
		_, err = a.Next(0)
		requireUsage(t, a, err)
		assert.True(t, a.FINPending(), "a refused FIN stays pending")

		// b's message consumes (and a reposts) one of a's receive requests:
		// now the last credit may go, because it returns it.
		require.NoError(t, a.Receive(early))
		require.NoError(t, a.Reposted())
		require.Equal(t, uint64(1), a.Credits(), "b had not announced its reposts yet")
		assert.True(t, a.CanSendControl(), "last credit, one repost to announce")
		assert.False(t, a.CanSendData())
		m, err := a.Next(0)
		require.NoError(t, err)
		assert.Equal(t, FlagFIN, m.Flags, "the pending FIN goes with it")
		assert.Equal(t, credits+1, m.Posted)
		assert.False(t, a.FINPending())
		require.NoError(t, b.Receive(m))
		require.NoError(t, b.Reposted())

		// No credit at all: nothing can be sent, whatever is owed.
		assert.Zero(t, a.Credits())
		assert.False(t, a.CanSendData())
		assert.False(t, a.CanSendControl())
		require.NoError(t, a.Consumed(0))
		assert.False(t, a.NeedUpdate())
		before := *a
		_, err = a.Next(0)
		requireUsage(t, a, err)
		assert.Equal(t, before, *a)
		_, err = a.Next(FlagBlocked)
		requireUsage(t, a, err)

		// b announces its reposts: all credits come back.
		send(t, b, a, 0)
		assert.Equal(t, credits, a.Credits())
		assert.True(t, a.CanSendData())
	}
}

// CanSendControl, restated: more than one credit, or exactly one when the
// message returns credits (reposted receive requests not yet announced).
func TestCanSendControlLastCredit(t *testing.T) {
	for _, c := range []struct {
		credits, pending uint64
		want             bool
	}{
		{0, 0, false}, {0, 1, false}, {0, 4, false},
		{1, 0, false}, {1, 1, true}, {1, 3, true},
		{2, 0, true}, {2, 1, true}, {3, 0, true},
	} {
		a, b := newPair(t, Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 8, PeerCredits: 4})
		for a.Credits() > max(c.credits, 1) {
			_, err := a.Next(0) // lost in flight: b's messages do not depend on it
			require.NoError(t, err)
		}
		if c.credits == 0 {
			send(t, b, a, 0)
			_, err := a.Next(0)
			require.NoError(t, err)
		}
		for range c.pending { // b's messages consume a's receive requests
			send(t, b, a, 0)
		}
		require.Equal(t, c.credits, a.Credits())
		require.Equal(t, c.pending, a.posted-a.postedAnnounced)
		assert.Equal(t, c.want, a.CanSendControl(), "credits %d pending %d", c.credits, c.pending)
		assert.Equal(t, c.credits > Reserved, a.CanSendData(), "credits %d", c.credits)
		before := *a
		_, err := a.Next(0)
		if c.want {
			require.NoError(t, err, "credits %d pending %d", c.credits, c.pending)
			assert.Equal(t, a.posted, a.postedAnnounced, "the message announced the reposts")
		} else {
			requireUsage(t, a, err)
			assert.Equal(t, before, *a)
		}
	}
}

func TestCreditsPartialAnnouncement(t *testing.T) {
	a := mustNew(t, roomy)
	for range 5 {
		_, err := a.Next(0)
		require.NoError(t, err)
	}
	assert.Equal(t, uint64(3), a.Credits())
	// b got only the first two so far and announces them.
	m := Msg{Seq: 1, Posted: 9}
	require.NoError(t, a.Receive(m))
	assert.Equal(t, uint64(4), a.Credits())
	require.NoError(t, a.Receive(Msg{Seq: 2, Posted: 10}))
	assert.Equal(t, uint64(5), a.Credits())
	// Posted may repeat (idempotent, absolute values).
	require.NoError(t, a.Receive(Msg{Seq: 3, Posted: 10}))
	assert.Equal(t, uint64(5), a.Credits())
}

func TestSpace(t *testing.T) {
	a, b := newPair(t, Params{LocalSize: 8 << 10, PeerSize: 4 << 10, LocalCredits: 4, PeerCredits: 4})
	assert.Equal(t, uint64(4<<10), a.Space(), "the peer's ring bounds our writes")
	assert.Equal(t, uint64(8<<10), b.Space())
	require.NoError(t, a.Wrote(1000))
	assert.Equal(t, uint64(4<<10-1000), a.Space())
	assert.Equal(t, uint64(1000), a.Prod())
	send(t, a, b, 0)
	require.NoError(t, b.Consumed(400))
	assert.Equal(t, uint64(4<<10-1000), a.Space(), "consumption is not known before it is announced")
	send(t, b, a, 0)
	assert.Equal(t, uint64(4<<10-600), a.Space())
	require.NoError(t, a.Wrote(a.Space()))
	assert.Zero(t, a.Space())
}

func TestWroteErrors(t *testing.T) {
	a, b := newPair(t, small)
	advance(t, a, b, MinRingSize-3) // cursor near the wrap
	require.NoError(t, a.Wrote(100))
	for _, n := range []uint64{a.Space() + 1, MinRingSize, MinRingSize + 1, math.MaxUint64} {
		before := *a
		requireUsage(t, a, a.Wrote(n))
		require.Equal(t, before, *a)
	}
	require.NoError(t, a.Wrote(a.Space()))
	before := *a
	requireUsage(t, a, a.Wrote(1))
	require.Equal(t, before, *a)
	require.NoError(t, a.Wrote(0), "zero bytes always fit")

	a, _ = newPair(t, small)
	a.SetFIN()
	before = *a
	requireUsage(t, a, a.Wrote(1))
	requireUsage(t, a, a.Wrote(0))
	require.Equal(t, before, *a)

	a, _ = newPair(t, small)
	a.SetClose()
	requireUsage(t, a, a.Wrote(1))
}

func TestConsumedErrors(t *testing.T) {
	a, b := newPair(t, small)
	s := *b
	requireUsage(t, b, b.Consumed(1))
	require.Equal(t, s, *b)
	require.NoError(t, b.Consumed(0))

	advance(t, a, b, MinRingSize+MinRingSize/2)
	require.NoError(t, a.Wrote(MinRingSize))
	send(t, a, b, 0)
	require.Equal(t, uint64(MinRingSize), b.Readable())
	for _, n := range []uint64{MinRingSize + 1, math.MaxUint64} {
		s := *b
		requireUsage(t, b, b.Consumed(n))
		require.Equal(t, s, *b)
	}
	require.NoError(t, b.Consumed(MinRingSize-1))
	requireUsage(t, b, b.Consumed(2))
	require.NoError(t, b.Consumed(1))
	assert.Zero(t, b.Readable())
}

func TestRepostedErrors(t *testing.T) {
	a, b := newPair(t, small)
	s := *b
	requireUsage(t, b, b.Reposted())
	require.Equal(t, s, *b, "all initial receive requests are posted")

	for range 3 {
		m, err := a.Next(0)
		require.NoError(t, err)
		require.NoError(t, b.Receive(m))
	}
	// Three messages consumed three requests: three reposts, no more.
	for range 3 {
		require.NoError(t, b.Reposted())
	}
	s = *b
	requireUsage(t, b, b.Reposted())
	require.Equal(t, s, *b)
}

func TestNextFlagsSticky(t *testing.T) {
	a, b := newPair(t, Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 32, PeerCredits: 32})

	// Sticky flags come from SetFIN/SetClose, never from extra; anything
	// but BLOCKED is refused.
	for _, extra := range []Flags{FlagFIN, FlagClose, FlagFIN | FlagClose, FlagBlocked | FlagFIN, FlagBlocked | FlagClose, flagsKnown, 0x08, 0x80, FlagBlocked | 0x40} {
		before := *a
		_, err := a.Next(extra)
		requireUsage(t, a, err)
		require.Equal(t, before, *a, "extra %v", extra)
	}
	m := send(t, a, b, FlagBlocked)
	assert.Equal(t, FlagBlocked, m.Flags)
	m = send(t, a, b, 0)
	assert.Equal(t, Flags(0), m.Flags, "BLOCKED is one-shot")

	require.NoError(t, a.Wrote(10))
	a.SetFIN()
	assert.True(t, a.FINSent())
	assert.True(t, a.FINPending())
	for _, extra := range []Flags{0, FlagBlocked, 0} {
		m = send(t, a, b, extra)
		assert.False(t, a.FINPending())
		assert.NotZero(t, m.Flags&FlagFIN, "FIN on every message after SetFIN")
		assert.Zero(t, m.Flags&FlagClose)
		assert.Equal(t, extra&FlagBlocked, m.Flags&FlagBlocked)
		assert.Equal(t, uint64(10), m.Prod)
	}
	for _, extra := range []Flags{FlagFIN, FlagClose, FlagBlocked | FlagClose} {
		_, err := a.Next(extra)
		requireUsage(t, a, err) // not even FIN, although it would be set anyway
	}
	assert.True(t, b.PeerFIN())
	assert.False(t, b.EOF(), "ten bytes unread")
	require.NoError(t, b.Consumed(10))
	assert.True(t, b.EOF())

	a.SetClose()
	for range 3 {
		m = send(t, a, b, 0)
		assert.Equal(t, FlagFIN|FlagClose, m.Flags)
	}
	assert.True(t, b.PeerClosed())

	// SetClose alone implies FIN.
	c, d := newPair(t, small)
	c.SetClose()
	assert.True(t, c.FINSent())
	m = send(t, c, d, 0)
	assert.Equal(t, FlagFIN|FlagClose, m.Flags)
	assert.True(t, d.PeerFIN() && d.PeerClosed() && d.EOF())
}

func TestNextCarriesCursors(t *testing.T) {
	a, b := newPair(t, small)
	advance(t, b, a, 1234) // a has consumed 1234 bytes from b
	advance(t, a, b, 555)
	require.NoError(t, a.Wrote(77))
	sent := a.sent
	m, err := a.Next(0)
	require.NoError(t, err)
	assert.Equal(t, Msg{Seq: uint32(sent + 1), Prod: 555 + 77, Cons: 1234, Posted: a.posted}, m)
	assert.Equal(t, a.cons, a.announced)
	assert.Equal(t, a.posted, a.postedAnnounced)
}

func TestStateString(t *testing.T) {
	a, b := newPair(t, small)
	require.NoError(t, a.Wrote(700))
	send(t, a, b, FlagBlocked)
	require.NoError(t, a.Wrote(11))
	require.NoError(t, b.Consumed(300))
	require.Equal(t, uint64(700), b.PeerProd())
	assert.Equal(t, "tx{prod 711 sent-prod 700 peer-cons 0 space 3385 msgs 1 peer-posted 4 credits 3 fin false close false blocked false} "+
		"rx{peer-prod 0 cons 0 announced 0 readable 0 recvd 0 posted 4 announced-posted 4 fin false close false peer-blocked false}", a.String())
	b.SetClose()
	assert.Equal(t, "tx{prod 0 sent-prod 0 peer-cons 0 space 4096 msgs 0 peer-posted 4 credits 4 fin true close true blocked false} "+
		"rx{peer-prod 700 cons 300 announced 0 readable 400 recvd 1 posted 5 announced-posted 4 fin false close false peer-blocked true}", b.String())
}

func TestBlockOncePerStall(t *testing.T) {
	a, b := newPair(t, small)
	assert.True(t, a.Block())
	assert.False(t, a.Block())
	assert.False(t, a.Block())
	send(t, a, b, FlagBlocked)
	assert.True(t, b.PeerBlocked())
	assert.False(t, a.Block(), "sending the BLOCKED does not end the stall")
	send(t, b, a, 0)
	assert.False(t, a.Block(), "an update alone does not end the stall")
	require.NoError(t, a.Wrote(0))
	assert.False(t, a.Block(), "zero bytes is no progress")
	require.NoError(t, a.Wrote(1))
	assert.True(t, a.Block(), "data moved: a new stall gets a new BLOCKED")
	assert.False(t, a.Block())
	require.Error(t, a.Wrote(a.Space()+1))
	assert.False(t, a.Block(), "a failed write is no progress")
}

// ---- receive half ----

// receivePosition returns a (the receiver under test) and b (its peer) in a
// position where every cursor of a is non-zero and not a multiple of the
// ring size, b has sent messages a has not seen, and a has consumed bytes
// and written bytes it has not announced.
func receivePosition(t testing.TB) (a, b *State) {
	p := Params{LocalSize: MinRingSize, PeerSize: 2 * MinRingSize, LocalCredits: 8, PeerCredits: 6}
	a, b = newPair(t, p)
	advance(t, b, a, 3*MinRingSize-7)
	advance(t, a, b, 5*MinRingSize+3)
	require.NoError(t, a.Wrote(300)) // unannounced by a, so b cannot know it
	send(t, a, b, 0)                 // now b knows
	require.NoError(t, b.Wrote(1000))
	send(t, b, a, 0)
	require.NoError(t, a.Consumed(200)) // not announced
	require.NoError(t, a.Wrote(50))     // not announced either
	require.Equal(t, uint64(50), a.Unannounced())
	return a, b
}

func TestReceiveAccepts(t *testing.T) {
	a, b := receivePosition(t)
	require.NoError(t, b.Wrote(b.Space()))
	m, err := b.Next(FlagBlocked)
	require.NoError(t, err)
	require.NoError(t, a.Receive(m))
	assert.Equal(t, a.p.LocalSize, a.Readable()+(a.cons-a.announced), "the peer filled exactly up to the announced consumer cursor")
	assert.True(t, a.PeerBlocked())
	assert.Equal(t, b.posted, a.peerPosted)
	assert.Equal(t, b.cons, a.peerCons)

	// Exact bounds are accepted.
	a, b = receivePosition(t)
	next := Msg{Seq: uint32(a.recvd + 1), Prod: a.announced + a.p.LocalSize, Cons: a.prodSent, Posted: a.p.PeerCredits + a.sent}
	require.Less(t, a.prodSent, a.prod, "the position has unannounced bytes")
	require.NoError(t, a.Receive(next))
	assert.Equal(t, uint64(0), a.Credits()-a.p.PeerCredits)

	// An identical repeat of the cursors (with the next seq) is fine.
	next.Seq++
	require.NoError(t, a.Receive(next))
	_ = b
}

// The peer can only acknowledge bytes it was told about: the bound on its
// consumer cursor is the producer cursor of our last message, not bytes we
// wrote since. Announcing them makes the same value legal.
func TestReceiveConsBoundIsAnnouncedProd(t *testing.T) {
	a, _ := receivePosition(t)
	m := Msg{Seq: uint32(a.recvd + 1), Prod: a.peerProd, Cons: a.prod, Posted: a.peerPosted}
	requireViolation(t, a, m, "consumer cursor out of range")
	require.NoError(t, a.Wrote(7))
	requireViolation(t, a, m, "consumer cursor out of range")
	sent, err := a.Next(0)
	require.NoError(t, err)
	require.Equal(t, a.prod, sent.Prod)
	require.NoError(t, a.Receive(m), "announced bytes may be acknowledged")
	assert.Equal(t, a.p.PeerSize-7, a.Space(), "all but the 7 bytes written since")
	m.Seq++
	m.Cons = a.prod
	require.NoError(t, a.Receive(m), "all of them")
	assert.Equal(t, a.p.PeerSize, a.Space())
}

func TestReceiveViolations(t *testing.T) {
	type mod struct {
		name, rule string
		mod        func(a *State, m *Msg)
	}
	mods := []mod{
		{"seq +1", "message sequence", func(a *State, m *Msg) { m.Seq++ }},
		{"seq -1 (replay)", "message sequence", func(a *State, m *Msg) { m.Seq-- }},
		{"seq 0", "message sequence", func(a *State, m *Msg) { m.Seq = 0 }},
		{"seq max", "message sequence", func(a *State, m *Msg) { m.Seq = math.MaxUint32 }},
		{"prod backwards by one", "producer cursor moved backwards", func(a *State, m *Msg) { m.Prod = a.peerProd - 1 }},
		{"prod zero", "producer cursor moved backwards", func(a *State, m *Msg) { m.Prod = 0 }},
		{"prod one beyond grant", "producer cursor beyond granted space", func(a *State, m *Msg) { m.Prod = a.announced + a.p.LocalSize + 1 }},
		{"prod counts unannounced consumption", "producer cursor beyond granted space", func(a *State, m *Msg) { m.Prod = a.cons + a.p.LocalSize }},
		{"prod max", "producer cursor beyond granted space", func(a *State, m *Msg) { m.Prod = math.MaxUint64 }},
		{"prod two rings ahead", "producer cursor beyond granted space", func(a *State, m *Msg) { m.Prod = a.peerProd + 2*a.p.LocalSize }},
		{"cons backwards", "consumer cursor out of range", func(a *State, m *Msg) { m.Cons = a.peerCons - 1 }},
		{"cons zero", "consumer cursor out of range", func(a *State, m *Msg) { m.Cons = 0 }},
		{"cons beyond prod", "consumer cursor out of range", func(a *State, m *Msg) { m.Cons = a.prod + 1 }},
		{"cons one beyond announced prod", "consumer cursor out of range", func(a *State, m *Msg) { m.Cons = a.prodSent + 1 }},
		{"cons counts unannounced bytes", "consumer cursor out of range", func(a *State, m *Msg) { m.Cons = a.prod }},
		{"cons max", "consumer cursor out of range", func(a *State, m *Msg) { m.Cons = math.MaxUint64 }},
		{"posted backwards", "credits never granted", func(a *State, m *Msg) { m.Posted = a.peerPosted - 1 }},
		{"posted zero", "credits never granted", func(a *State, m *Msg) { m.Posted = 0 }},
		{"posted below initial", "credits never granted", func(a *State, m *Msg) { m.Posted = a.p.PeerCredits - 1 }},
		{"posted beyond credits+sent", "credits never granted", func(a *State, m *Msg) { m.Posted = a.p.PeerCredits + a.sent + 1 }},
		{"posted max", "credits never granted", func(a *State, m *Msg) { m.Posted = math.MaxUint64 }},
		{"CLOSE without FIN", "CLOSE without FIN", func(a *State, m *Msg) { m.Flags = FlagClose }},
		{"CLOSE|BLOCKED without FIN", "CLOSE without FIN", func(a *State, m *Msg) { m.Flags = FlagClose | FlagBlocked }},
	}
	for _, c := range mods {
		a, b := receivePosition(t)
		require.NoError(t, b.Wrote(100))
		m, err := b.Next(0)
		require.NoError(t, err)
		ok := *a
		require.NoError(t, ok.Receive(m), "the unmodified message is valid")
		c.mod(a, &m)
		t.Run(c.name, func(t *testing.T) { requireViolation(t, a, m, c.rule) })
	}
}

func TestReceiveWithoutCredit(t *testing.T) {
	a, b := newPair(t, small)
	// b may send 4 messages before a announces more. Its last credit needs
	// a repost to announce: a's first message, which crosses b's (it
	// announces none of their reposts).
	crossing, err := a.Next(0)
	require.NoError(t, err)
	for i := range 4 {
		if i == 3 {
			require.NoError(t, b.Receive(crossing))
			require.NoError(t, b.Reposted())
		}
		m, err := b.Next(0)
		require.NoError(t, err)
		require.NoError(t, a.Receive(m))
		require.NoError(t, a.Reposted())
	}
	require.Zero(t, b.Credits())
	// A hostile b that ignores its credits: a has announced only 4.
	m := Msg{Seq: 5, Posted: b.posted}
	requireViolation(t, a, m, "message without a credit")
	// Reposting alone does not make it legal: the peer cannot know.
	require.Equal(t, uint64(8), a.posted)
	requireViolation(t, a, m, "message without a credit")
	// Once a announces its reposts, message 5 is fine.
	_, err = a.Next(0)
	require.NoError(t, err)
	require.NoError(t, a.Receive(m))
	// Sequence is checked first.
	requireViolation(t, a, Msg{Seq: 7, Posted: b.posted}, "message sequence")
}

func TestReceiveAfterFIN(t *testing.T) {
	a, b := receivePosition(t)
	require.NoError(t, b.Wrote(10))
	b.SetFIN()
	fin, err := b.Next(0)
	require.NoError(t, err)
	require.NoError(t, a.Receive(fin))
	require.NoError(t, a.Reposted())
	require.True(t, a.PeerFIN())

	next := fin
	next.Seq++
	more := next
	more.Prod++
	requireViolation(t, a, more, "data after FIN")
	more.Prod = fin.Prod + a.p.LocalSize // also beyond the ring: the earlier rule wins
	requireViolation(t, a, more, "producer cursor beyond granted space")
	withdrawn := next
	withdrawn.Flags = 0
	requireViolation(t, a, withdrawn, "FIN withdrawn")
	withdrawn.Flags = FlagBlocked
	requireViolation(t, a, withdrawn, "FIN withdrawn")

	// Same producer cursor with FIN: fine, and so is CLOSE now.
	require.NoError(t, a.Receive(next))
	next.Seq++
	next.Flags |= FlagClose
	require.NoError(t, a.Receive(next))
	require.True(t, a.PeerClosed())
	next.Seq++
	next.Flags = FlagFIN
	requireViolation(t, a, next, "CLOSE withdrawn")
	next.Flags = FlagFIN | FlagClose | FlagBlocked
	require.NoError(t, a.Receive(next))
}

func TestReceiveCloseWithdrawn(t *testing.T) {
	a, b := newPair(t, small)
	send(t, b, a, 0)
	require.NoError(t, a.Receive(Msg{Seq: 2, Flags: FlagFIN | FlagClose, Posted: 4}))
	require.True(t, a.PeerClosed())
	requireViolation(t, a, Msg{Seq: 3, Flags: FlagFIN, Posted: 4}, "CLOSE withdrawn")
	requireViolation(t, a, Msg{Seq: 3, Flags: FlagFIN | FlagBlocked, Posted: 4}, "CLOSE withdrawn")
	requireViolation(t, a, Msg{Seq: 3, Posted: 4}, "FIN withdrawn")
	require.NoError(t, a.Receive(Msg{Seq: 3, Flags: FlagFIN | FlagClose, Posted: 4}))
}

func TestProtocolErrorText(t *testing.T) {
	a, _ := newPair(t, small)
	err := a.Receive(Msg{Seq: 2})
	require.Error(t, err)
	assert.Equal(t, "ring: protocol violation: message sequence (got 2, want 1)", err.Error())
	assert.Same(t, ErrProtocol, errors.Unwrap(err))
}

// ---- NeedUpdate ----

func TestNeedUpdateThreshold(t *testing.T) {
	for _, th := range []uint64{0, 1, 100, MinRingSize} {
		p := small
		p.Threshold = th
		a, b := newPair(t, p)
		th = b.Params().Threshold
		require.NoError(t, a.Wrote(MinRingSize))
		send(t, a, b, 0)
		assert.False(t, b.NeedUpdate())
		if th > 1 {
			require.NoError(t, b.Consumed(th-1))
			assert.False(t, b.NeedUpdate(), "threshold %d: %d freed", th, th-1)
			require.NoError(t, b.Consumed(1))
		} else {
			require.NoError(t, b.Consumed(th))
		}
		assert.True(t, b.NeedUpdate(), "threshold %d reached", th)
		send(t, b, a, 0)
		assert.False(t, b.NeedUpdate(), "announced")
	}
}

func TestNeedUpdateFalseWithoutCredit(t *testing.T) {
	a, b := newPair(t, small)
	require.NoError(t, a.Wrote(MinRingSize))
	send(t, a, b, 0)
	for range 3 { // the first announces b's repost
		_, err := b.Next(0)
		require.NoError(t, err)
	}
	require.Equal(t, uint64(1), b.Credits())
	require.NoError(t, b.Consumed(MinRingSize))
	assert.False(t, b.CanSendControl())
	assert.False(t, b.NeedUpdate(), "owed, but the last credit may only carry a message that returns credits")

	// A repost to announce: the update may use the last credit.
	send(t, a, b, 0)
	assert.True(t, b.CanSendControl())
	assert.True(t, b.NeedUpdate())
	_, err := b.Next(0)
	require.NoError(t, err)

	// No credit at all.
	send(t, a, b, 0)
	require.Zero(t, b.Credits())
	require.Equal(t, uint64(1), b.posted-b.postedAnnounced)
	assert.False(t, b.NeedUpdate(), "owed (a repost) but no credit to send with")
}

func TestNeedUpdatePeerBlockedDrained(t *testing.T) {
	a, b := newPair(t, roomy) // threshold 1024
	require.NoError(t, a.Wrote(MinRingSize))
	send(t, a, b, 0)
	assert.True(t, a.Block())
	send(t, a, b, FlagBlocked)
	require.True(t, b.PeerBlocked())
	assert.False(t, b.NeedUpdate(), "blocked, but nothing freed")

	// Anti silly window: a little consumed, ring not drained: no update.
	for _, n := range []uint64{1, 10, 500} {
		require.NoError(t, b.Consumed(n))
		assert.False(t, b.NeedUpdate(), "freed %d of %d, not drained", b.cons-b.announced, MinRingSize)
	}
	// Draining announces the little that was freed... (here it also crosses
	// the threshold, so start over below with a smaller ring fill).
	a, b = newPair(t, roomy)
	require.NoError(t, a.Wrote(600))
	send(t, a, b, 0)
	require.NoError(t, a.Wrote(a.Space()))
	assert.True(t, a.Block())
	send(t, a, b, FlagBlocked)
	require.NoError(t, b.Consumed(100))
	assert.False(t, b.NeedUpdate(), "blocked peer, reader not drained, below threshold")
	require.NoError(t, b.Consumed(b.Readable()-1))
	assert.True(t, b.NeedUpdate(), "crossed the threshold")

	a, b = newPair(t, roomy)
	require.NoError(t, a.Wrote(600))
	assert.True(t, a.Block())
	send(t, a, b, FlagBlocked)
	require.NoError(t, b.Consumed(599))
	assert.False(t, b.NeedUpdate())
	require.NoError(t, b.Consumed(1))
	assert.True(t, b.NeedUpdate(), "blocked peer and drained ring: announce the 600 bytes")
	send(t, b, a, 0)
	assert.False(t, b.PeerBlocked(), "announcing freed space ends the peer's block")
	assert.False(t, b.NeedUpdate())
	assert.Equal(t, uint64(MinRingSize), a.Space())

	// Drained but the peer is not blocked: below threshold, no update.
	a, b = newPair(t, roomy)
	require.NoError(t, a.Wrote(600))
	send(t, a, b, 0)
	require.NoError(t, b.Consumed(600))
	assert.False(t, b.NeedUpdate())
}

func TestNeedUpdatePeerBlockedSticksUntilFreedSpaceAnnounced(t *testing.T) {
	a, b := newPair(t, roomy)
	require.NoError(t, a.Wrote(600))
	send(t, a, b, FlagBlocked)
	// b sends a message that announces nothing new: the block stands.
	send(t, b, a, 0)
	assert.True(t, b.PeerBlocked())
	require.NoError(t, b.Consumed(600))
	assert.True(t, b.NeedUpdate())
	send(t, b, a, 0)
	assert.False(t, b.PeerBlocked())
}

func TestNeedUpdateHalfReposted(t *testing.T) {
	p := Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 8, PeerCredits: 8}
	a, b := newPair(t, p)
	for i := range 4 {
		m, err := a.Next(0)
		require.NoError(t, err)
		require.NoError(t, b.Receive(m))
		assert.False(t, b.NeedUpdate(), "%d received, none reposted", i+1)
	}
	for i := range 4 {
		assert.False(t, b.NeedUpdate(), "%d reposted", i)
		require.NoError(t, b.Reposted())
	}
	assert.True(t, b.NeedUpdate(), "half of 8 reposted unannounced")
	send(t, b, a, 0)
	assert.False(t, b.NeedUpdate())

	// Odd credits: 5/2 = 2.
	p.LocalCredits, p.PeerCredits = 5, 5
	a, b = newPair(t, p)
	send(t, a, b, 0)
	assert.False(t, b.NeedUpdate(), "1 of 5 pending")
	send(t, a, b, 0)
	assert.True(t, b.NeedUpdate(), "2 of 5 pending")
}

func TestNeedUpdatePeerLowOnCredits(t *testing.T) {
	p := Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 16, PeerCredits: 16}
	a, b := newPair(t, p)
	// a spends all but the reserved credits; b reposts nothing yet.
	for range 16 - Reserved {
		m, err := a.Next(0)
		require.NoError(t, err)
		require.NoError(t, b.Receive(m))
	}
	require.Equal(t, uint64(Reserved), a.Credits())
	require.False(t, a.CanSendData())
	assert.False(t, b.NeedUpdate(), "nothing reposted: nothing to announce")
	require.NoError(t, b.Reposted())
	assert.True(t, b.NeedUpdate(), "peer down to its reserved credits and one repost pending")
	send(t, b, a, 0)
	assert.False(t, b.NeedUpdate())
	assert.Equal(t, uint64(Reserved+1), a.Credits())

	// One above the reserve with fewer than half pending: no update.
	a2, b2 := newPair(t, p)
	for range 16 - Reserved - 1 {
		m, err := a2.Next(0)
		require.NoError(t, err)
		require.NoError(t, b2.Receive(m))
	}
	for range 7 {
		require.NoError(t, b2.Reposted())
	}
	require.Equal(t, uint64(Reserved+1), b2.postedAnnounced-b2.recvd)
	assert.False(t, b2.NeedUpdate(), "7 of 16 pending, peer has %d > %d reserved", Reserved+1, Reserved)
	require.NoError(t, b2.Reposted())
	assert.True(t, b2.NeedUpdate(), "8 of 16 pending")
}

// Every Receive, valid or not, leaves the invariants intact, and every
// rejected one leaves the state as it was.
func TestReceiveRandomMutations(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		a, b := receivePosition(t)
		for range 30 {
			if b.CanSendData() && b.Space() > 0 && r.IntN(2) == 0 {
				require.NoError(t, b.Wrote(r.Uint64N(b.Space()+1)))
			}
			if !b.CanSendControl() {
				break
			}
			m, err := b.Next(Flags(r.IntN(2)) * FlagBlocked)
			require.NoError(t, err)
			bad := m
			switch r.IntN(5) {
			case 0:
				bad.Prod += 1 + r.Uint64N(2*a.p.LocalSize)
			case 1:
				bad.Cons = r.Uint64N(a.prod + 100)
			case 2:
				bad.Posted = r.Uint64N(a.p.PeerCredits + a.sent + 4)
			case 3:
				bad.Seq += uint32(r.IntN(3)) - 1
			case 4:
				bad.Prod = r.Uint64N(a.peerProd + a.p.LocalSize + 100)
			}
			before := *a
			if err := a.Receive(bad); err != nil {
				require.ErrorIs(t, err, ErrProtocol)
				require.Equal(t, before, *a)
				require.NoError(t, a.Receive(m))
			} else if bad != m {
				// A legal value b did not send: the two views now differ,
				// which is fine for a but ends this run.
				checkInvariants(t, a)
				break
			}
			checkInvariants(t, a)
			require.NoError(t, a.Reposted())
			if r.IntN(3) == 0 {
				require.NoError(t, a.Consumed(r.Uint64N(a.Readable()+1)))
			}
			if a.NeedUpdate() || a.Credits() > 2 && r.IntN(2) == 0 {
				send(t, a, b, 0)
			}
		}
	}
}

// checkInvariants asserts what must hold of any State whatever the peer
// sent.
func checkInvariants(t testing.TB, s *State) {
	t.Helper()
	p := s.p
	require.LessOrEqual(t, s.Readable(), p.LocalSize, "readable beyond the ring")
	require.LessOrEqual(t, s.peerProd-s.announced, p.LocalSize, "peer producer beyond the announced grant")
	require.LessOrEqual(t, s.announced, s.cons)
	require.LessOrEqual(t, s.cons, s.peerProd)
	require.LessOrEqual(t, s.Space(), p.PeerSize, "space beyond the peer's ring")
	require.LessOrEqual(t, s.peerCons, s.prodSent, "peer acknowledged bytes never announced")
	require.LessOrEqual(t, s.prodSent, s.prod)
	require.Equal(t, s.prod-s.prodSent, s.Unannounced())
	require.LessOrEqual(t, s.Credits(), p.PeerCredits, "more credits than the peer has receive requests")
	require.LessOrEqual(t, s.sent, s.peerPosted)
	require.LessOrEqual(t, s.recvd, s.postedAnnounced)
	require.LessOrEqual(t, s.postedAnnounced, s.posted)
	require.LessOrEqual(t, s.posted-s.recvd, p.LocalCredits)
	n, old := s.ReadableHere()
	a, b := s.ReadSegments(n)
	checkSegs(t, s.cons, n, readSize(s, old), a, b)
	if at, oldSize, moved := s.Moved(); moved {
		require.Equal(t, p.LocalSize, s.growTo)
		require.Less(t, oldSize, p.LocalSize)
		require.Equal(t, s.cons < at, old)
		require.LessOrEqual(t, at, s.peerProd)
	} else {
		require.False(t, old)
	}
	n = s.Space()
	a, b = s.WriteSegments(n)
	checkSegs(t, s.prod, n, p.PeerSize, a, b)
	c := s.Credits()
	require.Equal(t, c > 1 || c == 1 && s.posted > s.postedAnnounced, s.CanSendControl(), "credits %d, %d reposts pending", c, s.posted-s.postedAnnounced)
	require.Equal(t, c > Reserved, s.CanSendData())
	if s.CanSendData() {
		require.True(t, s.CanSendControl())
	}
	if s.NeedUpdate() {
		require.True(t, s.CanSendControl())
	}
	if !s.CanSendControl() {
		cp := *s
		_, err := cp.Next(0)
		requireUsage(t, &cp, err)
		require.Equal(t, *s, cp, "refused Next changed the state")
	}
}

// readSize is the size of the ring ReadSegments indexes: the old one of
// a move while the consumer cursor is before the peer's MOVED cursor.
func readSize(s *State, old bool) uint64 {
	if old {
		_, oldSize, _ := s.Moved()
		return oldSize
	}
	return s.p.LocalSize
}

// Sequence numbers are 32 bits on the wire over 64-bit counters: they wrap.
func TestReceiveSequenceWraps(t *testing.T) {
	a, b := newPair(t, small)
	const n = 1<<32 - 2 // messages b already sent and a received
	b.sent, b.peerPosted = n, n+4
	a.recvd, a.posted, a.postedAnnounced = n, n+4, n+4
	var seqs []uint32
	for range 3 {
		seqs = append(seqs, send(t, b, a, 0).Seq)
	}
	assert.Equal(t, []uint32{math.MaxUint32, 0, 1}, seqs)
	requireViolation(t, a, Msg{Seq: math.MaxUint32, Posted: a.peerPosted}, "message sequence")
	requireViolation(t, a, Msg{Seq: 1, Posted: a.peerPosted}, "message sequence")
	checkInvariants(t, a)
}
