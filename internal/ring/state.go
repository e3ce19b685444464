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
	if p.Threshold == 0 {
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
	}, nil
}

// Params returns the parameters in force (defaults filled in).
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
// extra one-shot flags (only FlagBlocked; FIN and CLOSE come from SetFIN
// and SetClose), and records it as sent. It fails when CanSendControl is
// false; the caller checks CanSendData or CanSendControl first.
func (s *State) Next(extra Flags) (Msg, error) {
	if !s.CanSendControl() {
		return Msg{}, fmt.Errorf("%w: no message credit", ErrUsage)
	}
	if extra&^FlagBlocked != 0 {
		return Msg{}, fmt.Errorf("%w: flags %v cannot be sent one-shot", ErrUsage, extra)
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
	return m, nil
}

// ---- Receive half ----

// Cons is our consumer cursor: all bytes consumed.
func (s *State) Cons() uint64 { return s.cons }

// Readable is how many bytes the peer has written that we have not consumed.
func (s *State) Readable() uint64 { return s.peerProd - s.cons }

// ReadSegments returns where the next n readable bytes are in our ring. n
// must not exceed Readable.
func (s *State) ReadSegments(n uint64) (a, b Seg) { return segments(s.cons, n, s.p.LocalSize) }

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
	// Receive half: the peer's producer cursor into our ring.
	if m.Prod < s.peerProd {
		return violation("producer cursor moved backwards", m.Prod, ">= %d", s.peerProd)
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
	if m.Posted < s.peerPosted || m.Posted-s.p.PeerCredits > s.sent {
		return violation("credits never granted", m.Posted, "in [%d, %d]", s.peerPosted, s.p.PeerCredits+s.sent)
	}
	s.recvd++
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
	return fmt.Sprintf("tx{prod %d sent-prod %d peer-cons %d space %d msgs %d peer-posted %d credits %d fin %v close %v blocked %v} "+
		"rx{peer-prod %d cons %d announced %d readable %d recvd %d posted %d announced-posted %d fin %v close %v peer-blocked %v}",
		s.prod, s.prodSent, s.peerCons, s.Space(), s.sent, s.peerPosted, s.Credits(), s.finSent, s.closeSent, s.blockedSent,
		s.peerProd, s.cons, s.announced, s.Readable(), s.recvd, s.posted, s.postedAnnounced, s.peerFIN, s.peerClose, s.peerBlocked)
}
