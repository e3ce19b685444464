// Package ring is rsock's credit-based ring protocol as pure logic: cursors,
// byte credits, message credits, wrap-around and the state messages. It does
// no I/O, takes no locks and imports only the standard library; the caller
// (internal/stream) owns the memory, posts the work requests and serialises
// calls.
//
// Each side of a connection owns a receive ring that the peer fills with
// RDMA WRITE. Cursors are running uint64 byte counts; a cursor's index in a
// ring is cursor & (size-1). After a burst of WRITEs the writer posts a SEND
// carrying a state message (Msg) with its absolute cursors. Every value a
// peer sends is validated against what the peer could legitimately know; a
// value that breaks a rule is an error and the connection must be torn down.
package ring

import (
	"errors"
	"fmt"
)

// Bounds on parameters.
const (
	MinRingSize = 4 << 10
	MaxRingSize = 1 << 30
	MinCredits  = 4
	MaxCredits  = 1024

	// Reserved is how many message credits only control messages (updates,
	// BLOCKED, FIN, CLOSE) may use, so credit updates never deadlock behind
	// data. It is a protocol constant: both sides' update rules assume the
	// peer reserves the same number. MinCredits leaves at least two data
	// credits above it.
	Reserved = 2
)

// ErrProtocol is wrapped by every error that reports a peer breaking the
// protocol.
var ErrProtocol = errors.New("ring: protocol violation")

// ErrUsage is wrapped by errors that report the local caller breaking a rule
// (writing more than the space, consuming more than is readable).
var ErrUsage = errors.New("ring: invalid use")

// ProtocolError describes one broken rule.
type ProtocolError struct {
	Rule string // the rule, e.g. "producer cursor beyond granted space"
	Got  uint64
	Want string // the bound it broke, in words
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("ring: protocol violation: %s (got %d, want %s)", e.Rule, e.Got, e.Want)
}

func (e *ProtocolError) Unwrap() error { return ErrProtocol }

func violation(rule string, got uint64, format string, args ...any) error {
	return &ProtocolError{Rule: rule, Got: got, Want: fmt.Sprintf(format, args...)}
}

// Params describe both rings of a connection. They come from the handshake.
type Params struct {
	LocalSize    uint64 // bytes of our receive ring (the peer writes into it)
	LocalCredits uint64 // receive work requests we post at start
	PeerSize     uint64 // bytes of the peer's receive ring
	PeerCredits  uint64 // receive work requests the peer posts at start
	// Threshold is how many consumed bytes we let accumulate before we
	// announce them unasked. Zero means LocalSize/4.
	Threshold uint64
}

// Seg is a contiguous piece of a ring: Len bytes at index Off.
type Seg struct{ Off, Len uint64 }

// State is one side's view of a connection: the send half (toward the
// peer's ring) and the receive half (our ring). The zero value is not
// usable; call New.
type State struct {
	p Params

	// Send half.
	prod         uint64 // bytes written into the peer's ring
	prodSent     uint64 // producer cursor of the last message sent
	peerCons     uint64 // peer's consumer cursor, as announced
	sent         uint64 // state messages posted to the peer
	peerPosted   uint64 // receive WRs the peer has posted in total, as announced
	finSent      bool
	finAnnounced bool // a message carrying FIN went out
	closeSent    bool
	blockedSent  bool // a BLOCKED went out and no data since
	// The peer's ring growing (GROW, MOVED): the size its GROW offered
	// (0: none came); once we moved, our MOVED cursor and the old size.
	peerGrowTo  uint64
	peerMovedAt uint64
	peerOldSize uint64

	// Receive half.
	peerProd        uint64 // peer's producer cursor into our ring
	cons            uint64 // bytes the application consumed
	announced       uint64 // consumer cursor we last sent
	recvd           uint64 // state messages received
	posted          uint64 // receive WRs posted in total
	postedAnnounced uint64 // posted count we last sent
	peerFIN         bool
	peerClose       bool
	peerBlocked     bool
	// Our ring growing: the size our GROW offered (0: none sent); once the
	// peer moved, its MOVED cursor and the old ring's size.
	growTo  uint64
	movedAt uint64
	oldSize uint64

	autoThreshold bool // Threshold was defaulted: it follows LocalSize
}

func isPow2(n uint64) bool { return n != 0 && n&(n-1) == 0 }

func checkSize(what string, n uint64) error {
	if !isPow2(n) || n < MinRingSize || n > MaxRingSize {
		return fmt.Errorf("%w: %s %d is not a power of two in [%d, %d]", ErrUsage, what, n, MinRingSize, MaxRingSize)
	}
	return nil
}

// New validates p and returns the state of a fresh connection. The initial
// LocalCredits receive work requests count as posted and announced (the
// handshake carried them).
func New(p Params) (*State, error) {
	if err := checkSize("local ring size", p.LocalSize); err != nil {
		return nil, err
	}
	if err := checkSize("peer ring size", p.PeerSize); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		what string
		n    uint64
	}{{"local credits", p.LocalCredits}, {"peer credits", p.PeerCredits}} {
		if c.n < MinCredits || c.n > MaxCredits {
			return nil, fmt.Errorf("%w: %s %d not in [%d, %d]", ErrUsage, c.what, c.n, MinCredits, MaxCredits)
		}
	}
	auto := p.Threshold == 0
	if auto {
		p.Threshold = p.LocalSize / 4
	}
	if p.Threshold > p.LocalSize {
		return nil, fmt.Errorf("%w: threshold %d above ring size %d", ErrUsage, p.Threshold, p.LocalSize)
	}
	return &State{
		p:               p,
		peerPosted:      p.PeerCredits,
		posted:          p.LocalCredits,
		postedAnnounced: p.LocalCredits,
		autoThreshold:   auto,
	}, nil
}

// Params returns the parameters in force (defaults filled in). LocalSize
// and PeerSize are the rings new bytes go to: the larger ones once a ring
// moved.
func (s *State) Params() Params { return s.p }

func segments(cursor, n, size uint64) (a, b Seg) {
	off := cursor & (size - 1)
	first := min(n, size-off)
	a = Seg{Off: off, Len: first}
	if n > first {
		b = Seg{Off: 0, Len: n - first}
	}
	return a, b
}

// ---- Send half ----

// Prod is our producer cursor: all bytes ever written to the peer.
func (s *State) Prod() uint64 { return s.prod }

// PeerCons is the peer's consumer cursor as it announced it: our bytes
// before it were read, the ones from it to Prod may not have been.
func (s *State) PeerCons() uint64 { return s.peerCons }

// Space is how many bytes we may write into the peer's ring now.
func (s *State) Space() uint64 { return s.p.PeerSize - (s.prod - s.peerCons) }

// Credits is how many state messages we may post now (the peer has a
// receive work request for each).
func (s *State) Credits() uint64 { return s.peerPosted - s.sent }

// CanSendData reports whether a data notification may be posted: it must
// leave the reserved credits for control messages.
func (s *State) CanSendData() bool { return s.Credits() > Reserved }

// CanSendControl reports whether a control message may be posted. The last
// credit may carry only a message that returns credits to the peer (we
// have reposted receive requests not yet announced): then the peer can
// always answer, and whatever it sends returns credits to us, so the two
// sides can never both be left without one.
func (s *State) CanSendControl() bool {
	c := s.Credits()
	return c > 1 || (c == 1 && s.posted > s.postedAnnounced)
}

// WriteSegments returns where n bytes starting at the producer cursor go in
// the peer's ring: one segment, or two when they wrap. n must not exceed
// Space (segments of a larger n would overlap).
func (s *State) WriteSegments(n uint64) (a, b Seg) { return segments(s.prod, n, s.p.PeerSize) }

// Wrote advances the producer cursor by n bytes after they were written
// into the peer's ring. The next message announces them.
func (s *State) Wrote(n uint64) error {
	if s.finSent {
		return fmt.Errorf("%w: write after FIN", ErrUsage)
	}
	if n > s.Space() {
		return fmt.Errorf("%w: wrote %d bytes with %d of space", ErrUsage, n, s.Space())
	}
	s.prod += n
	if n > 0 {
		s.blockedSent = false
	}
	return nil
}

// Unannounced is how many written bytes no message has announced yet. They
// go out with the next message; a writer that wrote them without a data
// credit leaves them for the next one.
func (s *State) Unannounced() uint64 { return s.prod - s.prodSent }

// Block records that a writer has data it cannot send for lack of space or
// credits. It reports whether a BLOCKED message should go out now: once per
// stall, until data moves again.
func (s *State) Block() bool {
	if s.blockedSent {
		return false
	}
	s.blockedSent = true
	return true
}

// SetFIN marks our side as done writing: every later message carries FIN.
func (s *State) SetFIN() { s.finSent = true }

// SetClose marks our side as done reading: every later message carries
// CLOSE (and FIN).
func (s *State) SetClose() { s.finSent, s.closeSent = true, true }

// FINPending reports whether SetFIN or SetClose was called but no message
// has carried FIN yet: the caller owes the peer one.
func (s *State) FINPending() bool { return s.finSent && !s.finAnnounced }

// FINSent reports whether SetFIN or SetClose was called.
func (s *State) FINSent() bool { return s.finSent }

// Next builds the next state message with our current cursors, plus the
// extra one-shot flags (FlagBlocked, FlagMoved; FIN and CLOSE come from
// SetFIN and SetClose), and records it as sent. It fails when
// CanSendControl is false; the caller checks CanSendData or CanSendControl
// first.
//
// With FlagMoved (only while PeerGrowing is not 0) the message moves our
// writing into the ring the peer's GROW offered: bytes before our
// producer cursor are in the old ring, later ones go to the new one, and
// Space and WriteSegments use its size from now on. The caller switches
// its destination in the same step, with no write in progress.
func (s *State) Next(extra Flags) (Msg, error) {
	if !s.CanSendControl() {
		return Msg{}, fmt.Errorf("%w: no message credit", ErrUsage)
	}
	if extra&^(FlagBlocked|FlagMoved) != 0 {
		return Msg{}, fmt.Errorf("%w: flags %v cannot be sent one-shot", ErrUsage, extra)
	}
	if extra&FlagMoved != 0 && s.PeerGrowing() == 0 {
		return Msg{}, fmt.Errorf("%w: MOVED without the peer's GROW", ErrUsage)
	}
	f := extra
	if s.finSent {
		f |= FlagFIN
		s.finAnnounced = true
	}
	if s.closeSent {
		f |= FlagClose
	}
	s.sent++
	m := Msg{Flags: f, Seq: uint32(s.sent), Prod: s.prod, Cons: s.cons, Posted: s.posted}
	if s.cons > s.announced {
		s.peerBlocked = false
	}
	s.announced, s.postedAnnounced, s.prodSent = s.cons, s.posted, s.prod
	if f&FlagMoved != 0 {
		s.peerMovedAt, s.peerOldSize, s.p.PeerSize = s.prod, s.p.PeerSize, s.peerGrowTo
	}
	return m, nil
}

// PeerGrowing is the size of the ring the peer's GROW offered, while we
// have not moved into it (Next with FlagMoved); else 0.
func (s *State) PeerGrowing() uint64 {
	if s.peerOldSize != 0 {
		return 0
	}
	return s.peerGrowTo
}

// PeerMoved reports, once we moved into the peer's new ring, our MOVED
// cursor (our bytes before it are in the old ring) and the old ring's
// size.
func (s *State) PeerMoved() (at, oldSize uint64, ok bool) {
	return s.peerMovedAt, s.peerOldSize, s.peerOldSize != 0
}

// Grow builds a GROW message that offers the peer a receive ring of size
// bytes (a power of two above LocalSize, at most MaxRingSize) at addr,
// rkey, and records it as sent. It is a control message (CanSendControl)
// and goes at most once, never after SetClose. Until the peer's MOVED the
// peer's bytes go to the old ring; from its MOVED cursor on, to the new
// one (Moved).
func (s *State) Grow(size, addr uint64, rkey uint32) (Msg, error) {
	switch {
	case s.growTo != 0:
		return Msg{}, fmt.Errorf("%w: the ring grows once", ErrUsage)
	case s.closeSent:
		return Msg{}, fmt.Errorf("%w: grow after CLOSE", ErrUsage)
	case !s.CanSendControl():
		return Msg{}, fmt.Errorf("%w: no message credit", ErrUsage)
	}
	if err := checkSize("new ring size", size); err != nil {
		return Msg{}, err
	}
	if size <= s.p.LocalSize {
		return Msg{}, fmt.Errorf("%w: new ring of %d bytes is not larger than %d", ErrUsage, size, s.p.LocalSize)
	}
	f := FlagGrow
	if s.finAnnounced {
		f |= FlagFIN
	}
	s.sent++
	m := Msg{Flags: f, Seq: uint32(s.sent), Posted: s.posted, Addr: addr, RKey: rkey, SizeLog: uint8(log2(size))}
	s.postedAnnounced = s.posted
	s.growTo = size
	return m, nil
}

func log2(n uint64) int {
	k := 0
	for n > 1 {
		n >>= 1
		k++
	}
	return k
}

// Moved reports, once the peer moved into the ring our GROW offered, its
// MOVED cursor (the peer's bytes before it are in the old ring) and the
// old ring's size.
func (s *State) Moved() (at, oldSize uint64, ok bool) {
	return s.movedAt, s.oldSize, s.oldSize != 0
}

// inOld reports whether the byte at cursor c of the peer's stream is in
// our old ring.
func (s *State) inOld(c uint64) bool { return s.oldSize != 0 && c < s.movedAt }

// ---- Receive half ----

// Cons is our consumer cursor: all bytes consumed.
func (s *State) Cons() uint64 { return s.cons }

// Readable is how many bytes the peer has written that we have not consumed.
func (s *State) Readable() uint64 { return s.peerProd - s.cons }

// ReadableHere is how many readable bytes are in the ring that holds the
// consumer cursor, and whether that is the old ring of a move (Moved):
// the peer's bytes before its MOVED cursor are in the old ring, the rest
// in the new one. Without a move it is Readable, in the one ring.
func (s *State) ReadableHere() (n uint64, old bool) {
	if s.inOld(s.cons) {
		return min(s.Readable(), s.movedAt-s.cons), true
	}
	return s.Readable(), false
}

// ReadSegments returns where the next n readable bytes are in the ring
// that holds the consumer cursor. n must not exceed ReadableHere.
func (s *State) ReadSegments(n uint64) (a, b Seg) {
	if s.inOld(s.cons) {
		return segments(s.cons, n, s.oldSize)
	}
	return segments(s.cons, n, s.p.LocalSize)
}

// Consumed advances the consumer cursor by n bytes the application took.
func (s *State) Consumed(n uint64) error {
	if n > s.Readable() {
		return fmt.Errorf("%w: consumed %d bytes with %d readable", ErrUsage, n, s.Readable())
	}
	s.cons += n
	return nil
}

// Reposted records one receive work request posted again after a state
// message consumed one.
func (s *State) Reposted() error {
	if s.posted-s.recvd >= s.p.LocalCredits {
		return fmt.Errorf("%w: more receive work requests than %d credits", ErrUsage, s.p.LocalCredits)
	}
	s.posted++
	return nil
}

// PeerProd is the peer's producer cursor: all bytes it has announced.
func (s *State) PeerProd() uint64 { return s.peerProd }

// PeerFIN reports whether the peer said it writes no more.
func (s *State) PeerFIN() bool { return s.peerFIN }

// PeerClosed reports whether the peer said it reads no more.
func (s *State) PeerClosed() bool { return s.peerClose }

// EOF reports whether the peer sent FIN and we consumed everything.
func (s *State) EOF() bool { return s.peerFIN && s.cons == s.peerProd }

// PeerBlocked reports whether the peer said it is blocked and we have not
// announced freed space since.
func (s *State) PeerBlocked() bool { return s.peerBlocked }

// Receive validates a state message from the peer and adopts it. On error
// the state is unchanged and the connection must be torn down.
func (s *State) Receive(m Msg) error {
	if m.Seq != uint32(s.recvd+1) {
		return violation("message sequence", uint64(m.Seq), "%d", uint32(s.recvd+1))
	}
	if s.recvd >= s.postedAnnounced {
		return violation("message without a credit", s.recvd+1, "at most %d announced receive requests", s.postedAnnounced)
	}
	if m.Flags&FlagGrow != 0 {
		return s.receiveGrow(m)
	}
	// Receive half: the peer's producer cursor into our ring.
	if m.Prod < s.peerProd {
		return violation("producer cursor moved backwards", m.Prod, ">= %d", s.peerProd)
	}
	if m.Flags&FlagMoved != 0 && (s.growTo == 0 || s.oldSize != 0) {
		return violation("MOVED without a GROW, or a second one", m.Prod, "one MOVED after our GROW")
	}
	if m.Prod-s.announced > s.p.LocalSize {
		return violation("producer cursor beyond granted space", m.Prod, "<= %d (announced %d + ring %d)", s.announced+s.p.LocalSize, s.announced, s.p.LocalSize)
	}
	if s.peerFIN && m.Prod != s.peerProd {
		return violation("data after FIN", m.Prod, "%d", s.peerProd)
	}
	if s.peerFIN && m.Flags&FlagFIN == 0 {
		return violation("FIN withdrawn", uint64(m.Flags), "FIN set")
	}
	if m.Flags&FlagClose != 0 && m.Flags&FlagFIN == 0 {
		return violation("CLOSE without FIN", uint64(m.Flags), "FIN set with CLOSE")
	}
	if s.peerClose && m.Flags&FlagClose == 0 {
		return violation("CLOSE withdrawn", uint64(m.Flags), "CLOSE set")
	}
	// Send half: what the peer says about our data and its credits.
	if m.Cons < s.peerCons || m.Cons > s.prodSent {
		return violation("consumer cursor out of range", m.Cons, "in [%d, %d] (announced bytes)", s.peerCons, s.prodSent)
	}
	if err := s.checkPosted(m); err != nil {
		return err
	}
	s.recvd++
	if m.Flags&FlagMoved != 0 {
		s.movedAt, s.oldSize, s.p.LocalSize = m.Prod, s.p.LocalSize, s.growTo
		if s.autoThreshold {
			s.p.Threshold = s.p.LocalSize / 4
		}
	}
	s.peerProd = m.Prod
	s.peerCons = m.Cons
	s.peerPosted = m.Posted
	if m.Flags&FlagFIN != 0 {
		s.peerFIN = true
	}
	if m.Flags&FlagClose != 0 {
		s.peerClose = true
	}
	if m.Flags&FlagBlocked != 0 {
		s.peerBlocked = true
	}
	return nil
}

func (s *State) checkPosted(m Msg) error {
	if m.Posted < s.peerPosted || m.Posted-s.p.PeerCredits > s.sent {
		return violation("credits never granted", m.Posted, "in [%d, %d]", s.peerPosted, s.p.PeerCredits+s.sent)
	}
	return nil
}

// receiveGrow validates and adopts the peer's GROW: its sequence and
// credit were checked.
func (s *State) receiveGrow(m Msg) error {
	if (m.Flags&FlagFIN != 0) != s.peerFIN {
		return violation("FIN on a GROW differs from the cursor messages'", uint64(m.Flags), "FIN %v", s.peerFIN)
	}
	if s.peerClose {
		return violation("GROW after CLOSE", uint64(m.Flags), "no GROW")
	}
	if s.peerGrowTo != 0 {
		return violation("a second GROW", uint64(m.SizeLog), "one GROW")
	}
	if m.SizeLog >= 64 || m.SizeLog > uint8(log2(MaxRingSize)) || uint64(1)<<m.SizeLog <= s.p.PeerSize {
		return violation("GROW's ring size out of range", uint64(m.SizeLog), "log2 in (%d, %d]", log2(s.p.PeerSize), log2(MaxRingSize))
	}
	size := uint64(1) << m.SizeLog
	if m.Addr+size < m.Addr {
		return violation("GROW's ring address overflows", m.Addr, "<= %d", ^uint64(0)-size)
	}
	if err := s.checkPosted(m); err != nil {
		return err
	}
	s.recvd++
	s.peerPosted = m.Posted
	s.peerGrowTo = size
	return nil
}

// NeedUpdate reports whether we owe the peer a state message even though we
// have no data to send:
//   - we consumed Threshold bytes we have not announced; or
//   - the peer is blocked and we have drained our ring, so nothing else will
//     prompt us to announce what we freed (a reader that still has data to
//     read announces at the threshold: no silly-window dribble); or
//   - half of our receive work requests were reposted unannounced; or
//   - the peer's view of its credits is down to the reserved ones and we
//     have reposted any.
//
// It is false whenever CanSendControl is false.
func (s *State) NeedUpdate() bool {
	if !s.CanSendControl() {
		return false
	}
	freed := s.cons - s.announced
	if freed >= s.p.Threshold && freed > 0 {
		return true
	}
	if s.peerBlocked && freed > 0 && s.cons == s.peerProd {
		return true
	}
	pending := s.posted - s.postedAnnounced
	if pending > 0 && pending >= s.p.LocalCredits/2 {
		return true
	}
	if pending > 0 && s.postedAnnounced-s.recvd <= Reserved {
		return true
	}
	return false
}

// String describes the state for debugging.
func (s *State) String() string {
	g := ""
	if s.growTo != 0 || s.peerGrowTo != 0 {
		g = fmt.Sprintf(" grow{ours to %d moved at %d from %d; peer's to %d moved at %d from %d}",
			s.growTo, s.movedAt, s.oldSize, s.peerGrowTo, s.peerMovedAt, s.peerOldSize)
	}
	return fmt.Sprintf("tx{prod %d sent-prod %d peer-cons %d space %d msgs %d peer-posted %d credits %d fin %v close %v blocked %v} "+
		"rx{peer-prod %d cons %d announced %d readable %d recvd %d posted %d announced-posted %d fin %v close %v peer-blocked %v}",
		s.prod, s.prodSent, s.peerCons, s.Space(), s.sent, s.peerPosted, s.Credits(), s.finSent, s.closeSent, s.blockedSent,
		s.peerProd, s.cons, s.announced, s.Readable(), s.recvd, s.posted, s.postedAnnounced, s.peerFIN, s.peerClose, s.peerBlocked) + g
}
