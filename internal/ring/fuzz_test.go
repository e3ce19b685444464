package ring

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// fuzzBytes hands out the fuzz input a byte at a time, zeros past the end.
type fuzzBytes struct {
	b []byte
	i int
}

func (f *fuzzBytes) next() byte {
	if f.i >= len(f.b) {
		f.i++
		return 0
	}
	f.i++
	return f.b[f.i-1]
}

func (f *fuzzBytes) more() bool { return f.i < len(f.b) }

// newFuzzModel builds a model from the first five bytes of in:
//
//	0: bit 0/1 A/B ring 4 or 8 KiB; bits 2-3 threshold (default, 1, half,
//	   whole ring); bit 4: a stalled writer may give up and close early
//	   (model.closeEarly); bit 5: either side may grow its ring once
//	   (model.grow); bit 6: B sends nothing (one direction)
//	1: credits: A 4 + v%5, B 4 + v/5%5
//	2, 3: prefixes A->B, B->A: none for 0, else k rings minus d bytes,
//	   k = 1 + v>>6, d = 3*(v&63), so cursors start at or just below a
//	   multiple of the ring size
//	4: stream lengths after the prefix: A 1 + v%4 rings, B 1 + v>>4%4 rings,
//	   plus 37*v bytes
//
// The prefixes are moved with the fair scheduler (which checks the model as
// it goes); the streams' limits are then lifted.
func newFuzzModel(t testing.TB, in *fuzzBytes) *model {
	h0, h1, h2, h3, h4 := in.next(), in.next(), in.next(), in.next(), in.next()
	size := func(bit byte) uint64 { return MinRingSize << (h0 >> bit & 1) }
	pa := Params{
		LocalSize: size(0), PeerSize: size(1),
		LocalCredits: 4 + uint64(h1%5), PeerCredits: 4 + uint64(h1/5%5),
	}
	pb := mirror(pa)
	switch h0 >> 2 & 3 {
	case 1:
		pa.Threshold, pb.Threshold = 1, 1
	case 2:
		pa.Threshold, pb.Threshold = pa.LocalSize/2, pb.LocalSize/2
	case 3:
		pa.Threshold, pb.Threshold = pa.LocalSize, pb.LocalSize
	}
	skip := func(v byte, ring uint64) uint64 {
		if v == 0 {
			return 0 // a fresh connection
		}
		return (1+uint64(v>>6))*ring - 3*uint64(v&63)
	}
	skipA, skipB := skip(h2, pa.PeerSize), skip(h3, pb.PeerSize)
	lenA := skipA + (1+uint64(h4%4))*pa.PeerSize + 37*uint64(h4)
	lenB := skipB + (1+uint64(h4>>4%4))*pb.PeerSize + 37*uint64(h4)
	if h0&0x40 != 0 {
		skipB, lenB = 0, 0
	}
	m := newModel(t, pa, pb, stream(uint64(h2), int(lenA)), stream(uint64(h3)+256, int(lenB)))
	m.grow = h0&0x20 != 0
	m.p[0].limit, m.p[1].limit = skipA, skipB
	m.runFair(pa.PeerSize/2+uint64(h2), m.settled, 1_000_000)
	m.p[0].limit, m.p[1].limit = lenA, lenB
	m.closeEarly = h0&0x10 != 0 // after the prefix: it must not end early
	return m
}

// fuzzOps applies the rest of in as operations: a byte picks the party (bit
// 0) and the operation, the next the size of a write or read. Operations
// that are not possible now are skipped.
func fuzzOps(m *model, in *fuzzBytes, maxOps int) {
	for n := 0; in.more() && n < maxOps; n++ {
		b, s := in.next(), in.next()
		x, op := m.p[b&1], opKind(b>>1)%numOps
		m.do(x, op, 1+uint64(s)*uint64(s)/5)
	}
}

func FuzzProtocol(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 255, 1, 255, 8, 0, 9, 0})
	// Credit exhaustion both ways, then slow delivery.
	f.Add([]byte{0x00, 0, 0x40, 0x81, 0x33,
		0, 10, 1, 10, 0, 10, 1, 10, 0, 10, 1, 10, 12, 0, 13, 0, 8, 0, 9, 0, 12, 0, 13, 0})
	// A fresh connection, both sides writing before anything arrives.
	f.Add([]byte{0x00, 0, 0, 0, 0x11, 0, 50, 1, 50, 0, 50, 1, 50, 0, 50, 1, 50, 12, 0, 13, 0})
	// The same, then both writers stall, send BLOCKED on their second-last
	// credit and give up: both FINs must wait for a credit.
	f.Add([]byte{0x10, 0, 0, 0, 0x11, 0, 50, 1, 50, 0, 50, 1, 50, 12, 0, 13, 0, 14, 0, 15, 0})
	// Fill the ring, BLOCKED, dribbling reader.
	f.Add([]byte{0x08, 12, 0xc5, 0x03, 0x21,
		0, 255, 0, 255, 8, 0, 9, 0, 12, 0, 7, 3, 7, 3, 7, 3, 10, 0, 7, 200, 11, 0})
	// A grows its ring, B moves into it and writes across the wrap of
	// the new ring while A still reads the old one.
	f.Add([]byte{0x20, 0, 0, 0, 0x11, 1, 200, 16, 0, 9, 0, 9, 0, 19, 0, 1, 255, 1, 255, 6, 30, 6, 255, 6, 255})
	// Both grow; B moves before its credits return, A moves with a write
	// pending announcement.
	f.Add([]byte{0x20, 0, 0x41, 0x41, 0x22, 16, 1, 17, 0, 8, 0, 9, 0, 19, 0, 2, 90, 18, 0, 4, 0, 9, 0, 8, 0, 7, 255})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &fuzzBytes{b: data}
		m := newFuzzModel(t, in)
		fuzzOps(m, in, 4096)
		m.runFair(MinRingSize, m.complete, 1_000_000)
		require.True(t, m.complete())
	})
}

// FuzzReceive puts a State in a position reached by a correct run (the same
// encoding as FuzzProtocol, without finishing) and hands one side an
// arbitrary message. mode selects the side (bit 0) and which fields are
// deltas from the receiver's current view rather than absolute values (bit
// 1 seq, 2 prod, 3 cons, 4 posted; bit 6 makes cons a delta from the
// receiver's last announced producer cursor instead, the bound a peer may
// acknowledge up to); bit 5 sends the message through Marshal/Unmarshal.
// The message must be accepted with every invariant intact, or rejected as
// a protocol violation of a rule it breaks, with the state unchanged; which
// one must agree with the documented rules.
func FuzzReceive(f *testing.F) {
	rel := byte(0x1e)
	f.Add([]byte{}, rel, byte(0), uint32(0), uint64(0), uint64(0), uint64(0))
	f.Add([]byte{}, rel|1, byte(FlagFIN), uint32(0), uint64(10), uint64(0), uint64(0))
	f.Add([]byte{0, 0, 0x41, 0x41, 0}, rel, byte(0), uint32(0), uint64(MinRingSize+1), uint64(0), uint64(0))
	f.Add([]byte{0, 0, 0x41, 0x41, 0, 0, 40}, rel, byte(FlagBlocked), uint32(0), uint64(0), ^uint64(0), uint64(1))
	f.Add([]byte{0x3, 24, 9, 9, 9}, byte(0x20), byte(FlagClose), uint32(1), uint64(1<<63), uint64(5), uint64(8))
	// A has written bytes no message announced; B acknowledges one of them.
	f.Add([]byte{0, 0, 0x41, 0x41, 0, 0, 100, 1, 100, 8, 0, 2, 100}, rel|0x40, byte(0), uint32(0), uint64(0), uint64(1), uint64(0))
	// A GROW to 16 KiB; one after A offered a ring of its own, with a
	// MOVED that answers it.
	f.Add([]byte{}, byte(0x12), byte(FlagGrow), uint32(0), uint64(14), uint64(0x10000), uint64(0))
	f.Add([]byte{0x20, 0, 0, 0, 0, 16, 0}, byte(0x13), byte(FlagGrow), uint32(0), uint64(40), uint64(1), uint64(0))
	f.Add([]byte{0x20, 0, 0, 0, 0, 16, 0, 3, 10, 9, 0}, rel|1, byte(FlagMoved), uint32(0), uint64(0), uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, ops []byte, mode, flags byte, seq uint32, prod, cons, posted uint64) {
		in := &fuzzBytes{b: ops}
		m := newFuzzModel(t, in)
		fuzzOps(m, in, 256)
		s := m.p[mode&1].st
		msg := Msg{Flags: Flags(flags), Seq: seq, Prod: prod, Cons: cons, Posted: posted}
		if mode&2 != 0 {
			msg.Seq += uint32(s.recvd + 1)
		}
		if mode&4 != 0 {
			msg.Prod += s.peerProd
		}
		switch {
		case mode&0x40 != 0:
			msg.Cons += s.prodSent
		case mode&8 != 0:
			msg.Cons += s.peerCons
		}
		if mode&16 != 0 {
			msg.Posted += s.peerPosted
		}
		if msg.Flags&FlagGrow != 0 {
			// A GROW carries a ring instead of cursors: the cursor
			// fields become its size and address.
			msg.SizeLog, msg.Addr, msg.RKey, msg.Prod, msg.Cons = uint8(msg.Prod), msg.Cons, uint32(posted>>32), 0, 0
		}
		if mode&32 != 0 {
			var w [MsgLen]byte
			msg.Marshal(w[:])
			got, err := Unmarshal(w[:])
			if msg.Flags&^flagsKnown != 0 || msg.Flags&FlagGrow != 0 && msg.Flags&^(FlagGrow|FlagFIN) != 0 {
				require.ErrorIs(t, err, ErrMsgFormat)
				require.ErrorIs(t, err, ErrProtocol)
				return
			}
			require.NoError(t, err)
			require.Equal(t, msg, got)
		}
		checkReceive(t, s, msg)
	})
}

// rules collects the rules a message breaks, by the names Receive
// reports them under.
type rules []string

func (r *rules) check(ok bool, rule string) {
	if !ok {
		*r = append(*r, rule)
	}
}

// messageRules starts the rules of any message to a side in state b: its
// sequence and its credit.
func messageRules(b *State, msg Msg) *rules {
	r := &rules{}
	r.check(msg.Seq == uint32(b.recvd+1), "message sequence")
	r.check(b.recvd < b.postedAnnounced, "message without a credit")
	return r
}

// checkReceive delivers msg to s and checks the outcome against the rules
// of the protocol, restated independently.
func checkReceive(t *testing.T, s *State, msg Msg) {
	if msg.Flags&FlagGrow != 0 {
		checkReceiveGrow(t, s, msg)
		return
	}
	b := *s
	p := b.p
	broken := messageRules(&b, msg)
	check := broken.check
	check(msg.Prod >= b.peerProd, "producer cursor moved backwards")
	check(msg.Prod <= b.announced+p.LocalSize, "producer cursor beyond granted space")
	check(!b.peerFIN || msg.Prod == b.peerProd, "data after FIN")
	check(!b.peerFIN || msg.Flags&FlagFIN != 0, "FIN withdrawn")
	check(msg.Flags&FlagClose == 0 || msg.Flags&FlagFIN != 0, "CLOSE without FIN")
	check(!b.peerClose || msg.Flags&FlagClose != 0, "CLOSE withdrawn")
	// The peer acknowledges only bytes a message of ours announced.
	check(msg.Cons >= b.peerCons && msg.Cons <= b.prodSent, "consumer cursor out of range")
	check(msg.Posted >= b.peerPosted && msg.Posted <= p.PeerCredits+b.sent, "credits never granted")
	check(msg.Flags&FlagMoved == 0 || b.growTo != 0 && b.oldSize == 0, "MOVED without a GROW, or a second one")
	// Unknown flags cannot reach Receive from the wire (Unmarshal rejects
	// them); the rules say nothing about them, so either outcome is fine
	// when nothing else is wrong.
	unsure := msg.Flags&^flagsKnown != 0

	if rejected(t, s, b, msg, *broken, unsure) {
		return
	}
	require.Equal(t, b.recvd+1, s.recvd)
	require.Equal(t, msg.Prod, s.peerProd)
	require.Equal(t, msg.Cons, s.peerCons)
	require.Equal(t, msg.Posted, s.peerPosted)
	require.Equal(t, b.peerFIN || msg.Flags&FlagFIN != 0, s.peerFIN)
	require.Equal(t, b.peerClose || msg.Flags&FlagClose != 0, s.peerClose)
	require.Equal(t, b.peerBlocked || msg.Flags&FlagBlocked != 0, s.peerBlocked)
	if msg.Flags&FlagMoved != 0 {
		at, oldSize, moved := s.Moved()
		require.True(t, moved)
		require.Equal(t, msg.Prod, at)
		require.Equal(t, p.LocalSize, oldSize)
		require.Equal(t, b.growTo, s.p.LocalSize)
	}
	checkInvariants(t, s)
	checkUsable(t, s)
}

// checkUsable checks that s goes on after a message it accepted: an
// update, reads of everything readable, a repost, a write of all space.
func checkUsable(t *testing.T, s *State) {
	if s.NeedUpdate() {
		_, err := s.Next(0)
		require.NoError(t, err)
	}
	for s.Readable() > 0 {
		n, old := s.ReadableHere()
		require.NotZero(t, n)
		a1, a2 := s.ReadSegments(n)
		checkSegs(t, s.cons, n, readSize(s, old), a1, a2)
		require.NoError(t, s.Consumed(n))
	}
	require.NoError(t, s.Reposted())
	require.True(t, s.CanSendControl() || s.Credits() == 0, "a repost to announce makes the last credit usable")
	if !s.FINSent() {
		require.NoError(t, s.Wrote(s.Space()))
	}
	checkInvariants(t, s)
}

// rejected delivers msg to s (whose state was b) and, if s rejects it,
// checks that the rejection is a protocol violation of a rule in broken
// (or that either outcome was fine: unsure) and that s is unchanged. It
// reports whether s rejected msg; if not, msg must have been valid.
func rejected(t *testing.T, s *State, b State, msg Msg, broken []string, unsure bool) bool {
	t.Helper()
	valid := len(broken) == 0
	err := s.Receive(msg)
	if err == nil {
		require.True(t, valid, "invalid message %+v accepted (breaks %q)", msg, broken)
		return false
	}
	require.ErrorIs(t, err, ErrProtocol)
	require.NotErrorIs(t, err, ErrUsage)
	var pe *ProtocolError
	require.True(t, errors.As(err, &pe), "%T", err)
	require.Equal(t, b, *s, "rejected message changed the state")
	require.True(t, !valid || unsure, "valid message %+v rejected: %v", msg, err)
	if !valid {
		require.Contains(t, broken, pe.Rule, "%+v rejected for a rule it keeps: %v", msg, err)
	}
	return true
}

// checkReceiveGrow is checkReceive for a GROW message.
func checkReceiveGrow(t *testing.T, s *State, msg Msg) {
	b := *s
	p := b.p
	broken := messageRules(&b, msg)
	check := broken.check
	check((msg.Flags&FlagFIN != 0) == b.peerFIN, "FIN on a GROW differs from the cursor messages'")
	check(!b.peerClose, "GROW after CLOSE")
	check(b.peerGrowTo == 0, "a second GROW")
	sizeOK := msg.SizeLog < 64 && uint64(1)<<msg.SizeLog > p.PeerSize && uint64(1)<<msg.SizeLog <= MaxRingSize
	check(sizeOK, "GROW's ring size out of range")
	check(!sizeOK || msg.Addr <= ^uint64(0)-uint64(1)<<msg.SizeLog, "GROW's ring address overflows")
	check(msg.Posted >= b.peerPosted && msg.Posted <= p.PeerCredits+b.sent, "credits never granted")
	// Flags beside FIN, and cursors, cannot reach Receive from the wire
	// on a GROW (Unmarshal): either outcome is fine for them.
	unsure := msg.Flags&^(FlagGrow|FlagFIN) != 0 || msg.Prod != 0 || msg.Cons != 0

	if rejected(t, s, b, msg, *broken, unsure) {
		return
	}
	want := b
	want.recvd++
	want.peerPosted = msg.Posted
	want.peerGrowTo = uint64(1) << msg.SizeLog
	require.Equal(t, want, *s, "a GROW changes only the sequence, credits and the offered size")
	require.Equal(t, want.peerGrowTo, s.PeerGrowing())
	checkInvariants(t, s)
	if s.CanSendControl() {
		at := s.Prod()
		_, err := s.Next(FlagMoved)
		require.NoError(t, err)
		got, oldSize, moved := s.PeerMoved()
		require.True(t, moved)
		require.Equal(t, at, got)
		require.Equal(t, p.PeerSize, oldSize)
		require.Equal(t, want.peerGrowTo, s.p.PeerSize)
		require.Zero(t, s.PeerGrowing())
	}
	checkInvariants(t, s)
	checkUsable(t, s)
}

// FuzzUnmarshal: any 32 bytes either parse to a message that marshals back
// to the same bytes, or fail with ErrMsgFormat.
func FuzzUnmarshal(f *testing.F) {
	f.Add(validWire())
	f.Add(make([]byte, MsgLen))
	f.Add([]byte{1, 7, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Unmarshal(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMsgFormat)
			require.ErrorIs(t, err, ErrProtocol, "a malformed message is a protocol violation")
			require.NotErrorIs(t, err, ErrUsage)
			require.Equal(t, Msg{}, m)
			return
		}
		var w [MsgLen]byte
		m.Marshal(w[:])
		require.Equal(t, b, w[:])
	})
}
