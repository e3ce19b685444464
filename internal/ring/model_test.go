package ring

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// This file is a two-party model of the ring protocol: two States with real
// byte rings, an in-memory "RDMA" that copies written bytes into the peer's
// ring at the WriteSegments offsets, in-order message queues (the SENDs) in
// both directions and a pool of receive requests per side. Drivers pick
// operations; after every one the model checks byte-exact delivery, that no
// message ever arrives without a posted receive request, and the cursor and
// credit invariants of both sides. When no operation is possible but the
// streams are not complete, the protocol has deadlocked; and a position
// with nothing in flight in which neither side may send (the dead end the
// last-credit rule exists to prevent) fails at once.
//
// The drivers use State exactly as rsock's stream engine does: data
// messages only when CanSendData, every other message only when
// CanSendControl, Block only with a control credit to send the BLOCKED, and
// a FIN that finds no control credit left pending (FINPending) until one
// comes.

type opKind uint8

const (
	opWrite     opKind = iota // write a chunk into the peer's ring and post a data message
	opWriteOnly               // write a chunk, announce it later (coalescing writer)
	opNotify                  // announce written bytes with a data message
	opRead                    // consume a chunk of our ring
	opDeliver                 // deliver the oldest message in flight toward us
	opUpdate                  // send the update NeedUpdate asks for
	opBlock                   // a stalled writer with a control credit calls Block and sends BLOCKED
	opFIN                     // close for writing (SetFIN) and send FIN, now or once a control credit allows
	opGrow                    // offer the peer a larger ring (GROW), once, when the model allows growth
	opMove                    // move our writing into the ring the peer's GROW offered (MOVED)
	numOps
)

var opNames = [numOps]string{"write", "write-only", "notify", "read", "deliver", "update", "block", "fin", "grow", "move"}

func (o opKind) String() string { return opNames[o] }

type party struct {
	name  string
	st    *State
	peer  *party
	rings [][]byte // our receive rings, the peer writes into them: the first, and the one our GROW offered
	out   []byte   // the stream we send
	limit uint64   // bytes of out the application has handed us so far
	read  uint64   // bytes of the peer's stream we consumed
	inbox [][]byte // marshalled messages in flight toward us, in order
	free  uint64   // receive requests posted and not yet used
	// producer cursor of the last message we sent
	notified uint64
	finOut   bool // a message carrying FIN went out
	seqOut   uint32

	blocks, updates, grows uint64 // statistics
	oldFreed               bool   // the old ring was poisoned once every byte in it was read
}

type model struct {
	tb    testing.TB
	p     [2]*party
	trace []traceEntry // recent operations, for failure reports
	steps int

	// closeEarly lets a stalled writer give up on the rest of its stream
	// and close for writing, as an application does when a write deadline
	// expires before CloseWrite: the FIN then competes for the credits.
	closeEarly bool
	// grow lets each side offer a larger ring once (opGrow).
	grow bool
	// laxLastCredit is a counterfactual for the regression tests: the
	// drivers follow the rule before the fix (any credit may carry a
	// control message, NeedUpdate whenever a credit is left). State still
	// enforces the real rule, so the drivers bypass it (see spareCredit).
	laxLastCredit bool

	// statistics
	zeroCredits, wraps, pendingFINs int
}

func newModel(tb testing.TB, pa, pb Params, outA, outB []byte) *model {
	tb.Helper()
	require.Equal(tb, pa.LocalSize, pb.PeerSize)
	require.Equal(tb, pa.PeerSize, pb.LocalSize)
	require.Equal(tb, pa.LocalCredits, pb.PeerCredits)
	require.Equal(tb, pa.PeerCredits, pb.LocalCredits)
	m := &model{tb: tb}
	for i, c := range []struct {
		name string
		p    Params
		out  []byte
	}{{"A", pa, outA}, {"B", pb, outB}} {
		st, err := New(c.p)
		require.NoError(tb, err)
		m.p[i] = &party{
			name: c.name, st: st, rings: [][]byte{poisoned(c.p.LocalSize)}, out: c.out,
			limit: uint64(len(c.out)), free: c.p.LocalCredits,
		}
	}
	m.p[0].peer, m.p[1].peer = m.p[1], m.p[0]
	return m
}

// poisoned returns a ring of n bytes that are never a stream's: a read of
// bytes never written shows up.
func poisoned(n uint64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = 0xa5
	}
	return b
}

// dest is the ring of y's that x writes into, as x's state says: the new
// one once x moved.
func dest(x *party) []byte {
	if _, _, moved := x.st.PeerMoved(); moved {
		return x.peer.rings[1]
	}
	return x.peer.rings[0]
}

func (m *model) fail(format string, args ...any) {
	m.tb.Helper()
	m.tb.Fatalf("%s\n%s", fmt.Sprintf(format, args...), m.dump())
}

func (m *model) dump() string {
	var b strings.Builder
	fmt.Fprintf(&b, "after %d steps\n", m.steps)
	for _, x := range m.p {
		s := x.st
		fmt.Fprintf(&b, "%s: params %+v\n", x.name, s.p)
		fmt.Fprintf(&b, "   send: prod %d (limit %d, len %d, notified %d) peerCons %d space %d | sent %d peerPosted %d credits %d canData %v | blockedSent %v fin %v/%v\n",
			s.prod, x.limit, len(x.out), x.notified, s.peerCons, s.Space(), s.sent, s.peerPosted, s.Credits(), s.CanSendData(), s.blockedSent, s.finSent, x.finOut)
		fmt.Fprintf(&b, "   recv: peerProd %d cons %d announced %d readable %d | recvd %d posted %d postedAnnounced %d free %d inbox %d | peerBlocked %v peerFIN %v needUpdate %v\n",
			s.peerProd, s.cons, s.announced, s.Readable(), s.recvd, s.posted, s.postedAnnounced, x.free, len(x.inbox), s.peerBlocked, s.peerFIN, s.NeedUpdate())
	}
	b.WriteString("recent operations:\n")
	for _, t := range m.trace {
		fmt.Fprintf(&b, "   %6d "+t.format+"\n", append([]any{t.step}, t.args...)...)
	}
	return b.String()
}

type traceEntry struct {
	step   int
	format string
	args   []any
}

// note records an operation for the failure report (formatted only then).
func (m *model) note(format string, args ...any) {
	if len(m.trace) == 40 {
		copy(m.trace, m.trace[1:])
		m.trace = m.trace[:39]
	}
	m.trace = append(m.trace, traceEntry{m.steps, format, args})
}

// pending reports whether x's application has data it has not written or
// written bytes no message has announced.
func (x *party) pending() bool { return x.st.Prod() < x.limit || x.st.Unannounced() > 0 }

// stalled reports whether x's writer is stuck: it has data to write but no
// ring space or no data credit (the condition under which rsock's Write
// waits, and sends a BLOCKED if a control credit allows).
func (x *party) stalled() bool {
	s := x.st
	return !s.FINSent() && s.Prod() < x.limit && (s.Space() == 0 || !s.CanSendData())
}

// allWritten reports whether x's application wrote its whole stream.
func (x *party) allWritten() bool {
	return x.limit == uint64(len(x.out)) && x.st.Prod() == x.limit
}

// spareCredit runs f with one more credit than s has: the laxLastCredit
// drivers use it to get, from a State that enforces the last-credit rule,
// what it answered before the fix.
func spareCredit(s *State, f func()) {
	s.peerPosted++
	defer func() { s.peerPosted-- }()
	f()
}

// canControl reports whether x may send a control message.
func (m *model) canControl(x *party) bool {
	if m.laxLastCredit {
		return x.st.Credits() > 0
	}
	return x.st.CanSendControl()
}

// needUpdate is x.st.NeedUpdate under the drivers' rule.
func (m *model) needUpdate(x *party) bool {
	s := x.st
	if m.laxLastCredit && s.Credits() > 0 && !s.CanSendControl() {
		var need bool
		spareCredit(s, func() { need = s.NeedUpdate() })
		return need
	}
	return s.NeedUpdate()
}

func (m *model) enabled(x *party, op opKind) bool {
	s := x.st
	switch op {
	case opWrite, opWriteOnly:
		return s.Prod() < x.limit && !s.FINSent() && s.CanSendData() && s.Space() > 0
	case opNotify:
		return s.Unannounced() > 0 && s.CanSendData()
	case opRead:
		return s.Readable() > 0
	case opDeliver:
		return len(x.inbox) > 0
	case opUpdate:
		return m.needUpdate(x)
	case opBlock:
		return x.stalled() && m.canControl(x) && !s.blockedSent
	case opFIN:
		if !s.FINSent() {
			return x.allWritten() || m.closeEarly && x.limit == uint64(len(x.out)) && x.stalled()
		}
		return s.FINPending() && m.canControl(x)
	case opGrow:
		return m.grow && s.growTo == 0 && !s.closeSent && s.p.LocalSize < MaxRingSize && m.canControl(x)
	case opMove:
		return s.PeerGrowing() != 0 && m.canControl(x)
	}
	panic("bad op")
}

// post sends x's next message with the extra flags.
func (m *model) post(x *party, extra Flags, data bool) {
	s := x.st
	if !m.canControl(x) {
		m.fail("%s: sending without a credit", x.name)
	}
	if data {
		if !s.CanSendData() {
			m.fail("%s: data message on a reserved credit", x.name)
		}
	}
	credits, reposts := s.Credits(), s.posted-s.postedAnnounced
	if !m.laxLastCredit && credits == 1 && reposts == 0 {
		m.fail("%s: last credit on a message that returns none", x.name)
	}
	var msg Msg
	var err error
	if m.laxLastCredit && !s.CanSendControl() {
		spareCredit(s, func() { msg, err = s.Next(extra) })
	} else {
		msg, err = s.Next(extra)
	}
	if err != nil {
		m.fail("%s: Next: %v", x.name, err)
	}
	x.seqOut++
	if msg.Seq != x.seqOut {
		m.fail("%s: seq %d, want %d", x.name, msg.Seq, x.seqOut)
	}
	if !(msg.Prod == s.Prod() && msg.Cons == s.cons && msg.Posted == s.posted) {
		m.fail("%s: message cursors %+v", x.name, msg)
	}
	if s.Credits() != credits-1 || s.Unannounced() != 0 || s.posted != s.postedAnnounced {
		m.fail("%s: after sending: credits %d (was %d), unannounced %d, posted %d announced %d", x.name, s.Credits(), credits, s.Unannounced(), s.posted, s.postedAnnounced)
	}
	if msg.Flags&(FlagBlocked|FlagMoved) != extra {
		m.fail("%s: flags %v for extra %v", x.name, msg.Flags, extra)
	}
	if (msg.Flags&FlagFIN != 0) != s.FINSent() {
		m.fail("%s: FIN flag %v", x.name, msg.Flags)
	}
	if msg.Flags&FlagClose != 0 {
		m.fail("%s: CLOSE flag %v without SetClose", x.name, msg.Flags)
	}
	if x.finOut {
		if msg.Flags&FlagFIN == 0 {
			m.fail("%s: FIN not sticky", x.name)
		}
	}
	wire := make([]byte, MsgLen)
	msg.Marshal(wire)
	x.peer.inbox = append(x.peer.inbox, wire)
	x.notified = msg.Prod
	x.finOut = x.finOut || msg.Flags&FlagFIN != 0
	if s.Credits() == 0 {
		m.zeroCredits++
	}
	m.note("%s sends %v seq %d prod %d cons %d posted %d (credits left %d, returned %d)", x.name, msg.Flags, msg.Seq, msg.Prod, msg.Cons, msg.Posted, s.Credits(), reposts)
}

// postGrow offers x's peer a ring of size bytes.
func (m *model) postGrow(x *party, size uint64) {
	s := x.st
	credits := s.Credits()
	msg, err := s.Grow(size, 0x10000, 7)
	if err != nil {
		m.fail("%s: Grow(%d): %v", x.name, size, err)
	}
	x.seqOut++
	if msg.Seq != x.seqOut {
		m.fail("%s: seq %d, want %d", x.name, msg.Seq, x.seqOut)
	}
	if s.Credits() != credits-1 || s.posted != s.postedAnnounced {
		m.fail("%s: after GROW: credits %d (was %d), posted %d announced %d", x.name, s.Credits(), credits, s.posted, s.postedAnnounced)
	}
	if msg.Flags != FlagGrow|msg.Flags&FlagFIN || (msg.Flags&FlagFIN != 0) != x.finOut {
		m.fail("%s: GROW flags %v, FIN sent %v", x.name, msg.Flags, x.finOut)
	}
	if _, err := s.Grow(2*size, 0, 0); !errors.Is(err, ErrUsage) {
		m.fail("%s: a second Grow: %v", x.name, err)
	}
	x.rings = append(x.rings, poisoned(size))
	wire := make([]byte, MsgLen)
	msg.Marshal(wire)
	x.peer.inbox = append(x.peer.inbox, wire)
	x.grows++
	m.note("%s sends GROW to %d seq %d posted %d", x.name, size, msg.Seq, msg.Posted)
}

// do performs op for x if it is enabled, with size bytes for writes and
// reads (clamped to what is possible; at least 1). It reports whether the
// op was enabled.
func (m *model) do(x *party, op opKind, size uint64) bool {
	if !m.enabled(x, op) {
		return false
	}
	m.steps++
	s, y := x.st, x.peer
	switch op {
	case opWrite, opWriteOnly:
		n := max(1, min(size, s.Space(), x.limit-s.Prod()))
		prod := s.Prod()
		ring := dest(x)
		if prod+n-y.st.cons > uint64(len(ring)) {
			m.fail("%s: writing [%d, %d) over unread bytes from %d of %s's ring", x.name, prod, prod+n, y.st.cons, y.name)
		}
		if at, _, moved := s.PeerMoved(); moved && prod < at {
			m.fail("%s: writing at %d, before its MOVED at %d", x.name, prod, at)
		}
		a, b := s.WriteSegments(n)
		m.checkSegs(x.name+" write", prod, n, uint64(len(ring)), a, b)
		src := x.out[prod : prod+n]
		copy(ring[a.Off:a.Off+a.Len], src)
		copy(ring[b.Off:b.Off+b.Len], src[a.Len:])
		if err := s.Wrote(n); err != nil {
			m.fail("%s: Wrote(%d): %v", x.name, n, err)
		}
		if prod/s.p.PeerSize != (prod+n)/s.p.PeerSize {
			m.wraps++
		}
		m.note("%s writes %d at %d (segs %v %v)", x.name, n, prod, a, b)
		if op == opWrite {
			m.post(x, 0, true)
		}
	case opNotify:
		m.post(x, 0, true)
	case opRead:
		here, old := s.ReadableHere()
		if here == 0 {
			m.fail("%s: %d readable, none in the ring at the consumer cursor", x.name, s.Readable())
		}
		n := max(1, min(size, here))
		a, b := s.ReadSegments(n)
		ring := x.rings[0]
		if _, _, moved := s.Moved(); moved && !old {
			ring = x.rings[1]
		}
		m.checkSegs(x.name+" read", s.cons, n, uint64(len(ring)), a, b)
		got := append(append([]byte(nil), ring[a.Off:a.Off+a.Len]...), ring[b.Off:b.Off+b.Len]...)
		if x.read+n > uint64(len(y.out)) {
			m.fail("%s: reads %d bytes beyond the %d %s sent", x.name, x.read+n, len(y.out), y.name)
		}
		want := y.out[x.read : x.read+n]
		if !bytes.Equal(got, want) {
			i := 0
			for got[i] == want[i] {
				i++
			}
			m.fail("%s: stream byte %d is %#x, want %#x", x.name, x.read+uint64(i), got[i], want[i])
		}
		if err := s.Consumed(n); err != nil {
			m.fail("%s: Consumed(%d): %v", x.name, n, err)
		}
		x.read += n
		if at, _, moved := s.Moved(); moved && s.cons >= at && !x.oldFreed {
			// Every byte of the old ring was read: it is released, and a
			// late write into it must not be read as the stream.
			x.oldFreed = true
			x.rings[0] = poisoned(uint64(len(x.rings[0])))
		}
		m.note("%s reads %d (segs %v %v), %d left", x.name, n, a, b, s.Readable())
	case opDeliver:
		wire := x.inbox[0]
		x.inbox = x.inbox[1:]
		if x.free == 0 {
			m.fail("%s: message arrived with no receive request posted (RNR)", x.name)
		}
		x.free--
		msg, err := Unmarshal(wire)
		if err != nil {
			m.fail("%s: Unmarshal: %v", x.name, err)
		}
		before := *s
		if err := s.Receive(msg); err != nil {
			m.fail("%s: Receive(%+v) from a correct peer: %v", x.name, msg, err)
		}
		if !(s.peerProd >= before.peerProd && s.peerCons >= before.peerCons && s.peerPosted >= before.peerPosted) {
			m.fail("%s: Receive moved a cursor backwards", x.name)
		}
		if err := s.Reposted(); err != nil {
			m.fail("%s: Reposted: %v", x.name, err)
		}
		x.free++
		m.note("%s receives %v seq %d prod %d cons %d posted %d (credits %d, readable %d, space %d)", x.name, msg.Flags, msg.Seq, msg.Prod, msg.Cons, msg.Posted, s.Credits(), s.Readable(), s.Space())
	case opUpdate:
		x.updates++
		m.post(x, 0, false)
	case opBlock:
		// As rsock's Write does: only with a control credit to send it.
		if !s.Block() {
			m.fail("%s: Block() false although no BLOCKED went out this stall", x.name)
		}
		if s.Block() {
			m.fail("%s: second Block() true", x.name)
		}
		x.blocks++
		m.post(x, FlagBlocked, false)
	case opFIN:
		if !s.FINSent() {
			if !x.allWritten() {
				// The application gives up on the rest of its stream.
				m.note("%s gives up on %d unwritten bytes", x.name, uint64(len(x.out))-s.Prod())
				x.out = x.out[:s.Prod():s.Prod()]
				x.limit = s.Prod()
			}
			s.SetFIN()
			if s.Wrote(0) == nil {
				m.fail("%s: Wrote accepted after SetFIN", x.name)
			}
			if !s.FINPending() {
				m.fail("%s: FIN not pending after SetFIN", x.name)
			}
			if !m.canControl(x) {
				// As rsock's CloseWrite does: the FIN waits for a
				// credit (flushLocked sends it when one comes).
				m.pendingFINs++
				m.note("%s closes for writing, no credit for the FIN (credits %d)", x.name, s.Credits())
				break
			}
		}
		m.post(x, 0, false)
	case opGrow:
		m.postGrow(x, s.p.LocalSize<<(1+size%2))
	case opMove:
		at := s.Prod()
		m.post(x, FlagMoved, false)
		if got, _, moved := s.PeerMoved(); !moved || got != at || s.p.PeerSize != uint64(len(y.rings[1])) {
			m.fail("%s: moved %v at %d (prod %d), peer size %d", x.name, moved, got, at, s.p.PeerSize)
		}
	}
	m.checkAll()
	return true
}

func (m *model) checkSegs(what string, cursor, n, size uint64, a, b Seg) {
	ok := a.Off == cursor&(size-1) && a.Off+a.Len <= size && a.Len+b.Len == n &&
		(b.Len == 0 && b == Seg{} || b.Off == 0 && a.Off+a.Len == size && b.Len <= a.Off)
	if !ok {
		m.fail("%s: segments %v %v for %d bytes at %d in a ring of %d", what, a, b, n, cursor, size)
	}
}

// checkAll asserts the invariants of both sides and between them.
func (m *model) checkAll() {
	for _, x := range m.p {
		s, y := x.st, x.peer
		ys := y.st
		p := s.p
		if s.Readable() > p.LocalSize {
			m.fail("%s: readable %d > ring %d", x.name, s.Readable(), p.LocalSize)
		}
		if s.Space() > p.PeerSize {
			m.fail("%s: space %d > peer ring %d", x.name, s.Space(), p.PeerSize)
		}
		if s.prod-ys.cons > p.PeerSize {
			m.fail("%s: producer %d more than a ring ahead of %s's consumer %d", x.name, s.prod, y.name, ys.cons)
		}
		if !(s.peerCons <= ys.announced && ys.announced <= ys.cons) {
			m.fail("%s: peer consumer view %d, %s announced %d cons %d", x.name, s.peerCons, y.name, ys.announced, ys.cons)
		}
		if !(ys.PeerProd() <= x.notified && x.notified <= s.prod) {
			m.fail("%s: %s's producer view %d, notified %d, prod %d", x.name, y.name, ys.peerProd, x.notified, s.prod)
		}
		if s.cons != x.read {
			m.fail("%s: consumer %d, read %d", x.name, s.cons, x.read)
		}
		if s.Credits() > p.PeerCredits {
			m.fail("%s: credits %d > %d", x.name, s.Credits(), p.PeerCredits)
		}
		// The receive requests the peer really has cover our credits and
		// everything in flight: no message can arrive without one.
		if s.Credits()+uint64(len(y.inbox)) > y.free {
			m.fail("%s: credits %d + in flight %d > %s's free receive requests %d", x.name, s.Credits(), len(y.inbox), y.name, y.free)
		}
		if s.sent != ys.recvd+uint64(len(y.inbox)) {
			m.fail("%s: sent %d, %s received %d + %d in flight", x.name, s.sent, y.name, ys.recvd, len(y.inbox))
		}
		if s.peerPosted > ys.postedAnnounced {
			m.fail("%s: peer posted %d > announced %d", x.name, s.peerPosted, ys.postedAnnounced)
		}
		if !(x.free == s.posted-s.recvd && x.free <= p.LocalCredits) {
			m.fail("%s: free %d, posted %d recvd %d", x.name, x.free, s.posted, s.recvd)
		}
		if s.peerFIN {
			if !(y.finOut && s.peerProd == uint64(len(y.out))) {
				m.fail("%s: FIN at %d, stream is %d", x.name, s.peerProd, len(y.out))
			}
		}
		if s.prodSent != x.notified || s.Unannounced() != s.prod-x.notified {
			m.fail("%s: announced producer %d, unannounced %d, notified %d", x.name, s.prodSent, s.Unannounced(), x.notified)
		}
		if s.FINPending() != (s.FINSent() && !x.finOut) {
			m.fail("%s: FINPending %v, SetFIN %v, FIN sent %v", x.name, s.FINPending(), s.FINSent(), x.finOut)
		}
		// The rules a user relies on, restated.
		c := s.Credits()
		if s.CanSendControl() != (c > 1 || c == 1 && s.posted > s.postedAnnounced) || s.CanSendData() != (c > Reserved) {
			m.fail("%s: CanSendControl %v CanSendData %v with %d credits, %d reposts unannounced", x.name, s.CanSendControl(), s.CanSendData(), c, s.posted-s.postedAnnounced)
		}
		if s.NeedUpdate() && !s.CanSendControl() {
			m.fail("%s: NeedUpdate without a control credit", x.name)
		}
		if !s.CanSendControl() {
			cp := *s
			if _, err := cp.Next(0); !errors.Is(err, ErrUsage) || cp != *s {
				m.fail("%s: Next without a control credit: %v", x.name, err)
			}
		}
	}
	// Nothing in flight and neither side may send: nothing can ever arrive
	// to change that. (The last-credit rule makes this impossible: a side
	// with one credit left that may not use it has returned every credit
	// of the peer's, so the peer has them all.)
	a, b := m.p[0], m.p[1]
	if len(a.inbox) == 0 && len(b.inbox) == 0 && !m.canControl(a) && !m.canControl(b) {
		m.fail("DEADLOCK: nothing in flight and no side may send (credits %d and %d)", a.st.Credits(), b.st.Credits())
	}
}

// quiet reports whether no operation is enabled.
func (m *model) quiet() bool {
	for _, x := range m.p {
		for op := range numOps {
			if m.enabled(x, op) {
				return false
			}
		}
	}
	return true
}

// complete reports whether every byte was delivered and read, FIN went both
// ways and nothing is in flight.
func (m *model) complete() bool {
	for _, x := range m.p {
		if x.read != uint64(len(x.peer.out)) || !x.st.EOF() || !x.finOut || len(x.inbox) > 0 {
			return false
		}
	}
	return true
}

// settled reports whether the prefix (up to the limits) was fully moved.
func (m *model) settled() bool {
	for _, x := range m.p {
		if x.st.Prod() != x.limit || x.read != x.peer.limit || len(x.inbox) > 0 || x.pending() {
			return false
		}
	}
	return true
}

// requireLive fails when no operation is possible but the run is not done.
func (m *model) requireLive(done func() bool) {
	if m.quiet() && !done() {
		m.fail("DEADLOCK: no operation possible, streams incomplete")
	}
}

// runFair drives the model with a deterministic round robin over all
// (party, op) pairs until nothing is enabled, then requires done.
func (m *model) runFair(size uint64, done func() bool, maxSteps int) {
	i := 0
	for range maxSteps {
		progressed := false
		for range 2 * int(numOps) {
			x, op := m.p[i%2], opKind(i/2%int(numOps))
			i = (i + 1) % (2 * int(numOps))
			if m.do(x, op, size) {
				progressed = true
				break
			}
		}
		if !progressed {
			m.requireLive(done)
			return
		}
	}
	m.fail("LIVELOCK: still busy after %d steps", maxSteps)
}

// runRandom drives the model with random operations picked with the given
// weights until nothing is enabled, then requires complete.
func (m *model) runRandom(r *rand.Rand, weights [2][numOps]int, maxSteps int) {
	type choice struct {
		x  *party
		op opKind
		w  int
	}
	var cs []choice
	for range maxSteps {
		cs = cs[:0]
		total := 0
		for i, x := range m.p {
			for op := range numOps {
				if w := weights[i][op]; w > 0 && m.enabled(x, op) {
					cs = append(cs, choice{x, op, w})
					total += w
				}
			}
		}
		if total == 0 {
			m.requireLive(m.complete)
			return
		}
		k := r.IntN(total)
		for _, c := range cs {
			if k < c.w {
				m.do(c.x, c.op, randSize(r))
				break
			}
			k -= c.w
		}
	}
	m.fail("LIVELOCK: still busy after %d steps", maxSteps)
}

func randSize(r *rand.Rand) uint64 {
	switch r.IntN(5) {
	case 0:
		return 1 + r.Uint64N(16)
	case 1:
		return 1 + r.Uint64N(512)
	case 2:
		return 1 + r.Uint64N(MinRingSize)
	case 3:
		return MinRingSize - 8 + r.Uint64N(16)
	default:
		return 1 + r.Uint64N(3*MinRingSize)
	}
}

func stream(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

// modelConfig is one pair of Params (A's and B's view).
type modelConfig struct {
	name       string
	pa, pb     Params
	closeEarly bool
}

func symmetric(size, credits uint64) Params {
	return Params{LocalSize: size, PeerSize: size, LocalCredits: credits, PeerCredits: credits}
}

// modelConfigs covers credits 4 to 8 on 4 KiB rings (with few credits the
// reserve is a large share and the last-credit rule binds often), uneven
// credits and rings, the extreme thresholds, and writers that give up.
func modelConfigs() []modelConfig {
	var cs []modelConfig
	add := func(name string, pa Params, pbMod func(*Params)) {
		pb := mirror(pa)
		if pbMod != nil {
			pbMod(&pb)
		}
		cs = append(cs, modelConfig{name: name, pa: pa, pb: pb})
	}
	for c := uint64(MinCredits); c <= 8; c++ {
		add(fmt.Sprintf("4K/%d", c), symmetric(MinRingSize, c), nil)
	}
	add("4K/4-8", Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 4, PeerCredits: 8}, nil)
	add("4K/7-5", Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 7, PeerCredits: 5}, nil)
	add("4K-8K/4-7", Params{LocalSize: MinRingSize, PeerSize: 2 * MinRingSize, LocalCredits: 4, PeerCredits: 7}, nil)
	add("8K-4K/8-5", Params{LocalSize: 2 * MinRingSize, PeerSize: MinRingSize, LocalCredits: 8, PeerCredits: 5}, nil)
	add("threshold1", Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 5, PeerCredits: 5, Threshold: 1}, nil)
	add("threshold=size", Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 4, PeerCredits: 6, Threshold: MinRingSize},
		func(p *Params) { p.Threshold = 100 })
	for _, c := range []uint64{4, 5, 8} {
		add(fmt.Sprintf("4K/%d/close-early", c), symmetric(MinRingSize, c), nil)
		cs[len(cs)-1].closeEarly = true
	}
	add("4K/4-6/threshold=size/close-early", Params{LocalSize: MinRingSize, PeerSize: MinRingSize, LocalCredits: 4, PeerCredits: 6, Threshold: MinRingSize}, nil)
	cs[len(cs)-1].closeEarly = true
	return cs
}

// weightSets are scheduling styles: balanced, slow delivery (credits run
// out), slow reader (space runs out), lazy updates.
var weightSets = [][numOps]int{
	// write write-only notify read deliver update block fin grow move
	{6, 2, 3, 6, 6, 6, 6, 2, 1, 2},
	{6, 2, 3, 6, 1, 3, 6, 1, 1, 1},
	{8, 2, 3, 1, 4, 4, 8, 1, 1, 4},
	{4, 4, 1, 4, 8, 1, 2, 1, 1, 1},
}

var modelSeeds = flag.Int("ring.seeds", 100, "random seeds per configuration for TestModelRandom")

// modelStats sums the statistics of many runs.
type modelStats struct {
	runs, steps, wraps, zero, pendingFINs, blocks, updates, grows int
}

func (st *modelStats) add(m *model) {
	st.runs++
	st.steps += m.steps
	st.wraps += m.wraps
	st.zero += m.zeroCredits
	st.pendingFINs += m.pendingFINs
	for _, x := range m.p {
		st.blocks += int(x.blocks)
		st.updates += int(x.updates)
		st.grows += int(x.grows)
	}
}

func (st modelStats) String() string {
	return fmt.Sprintf("%d runs, %d steps, %d writes across the wrap, %d messages on the last credit, %d FINs waiting for a credit, %d BLOCKED, %d updates, %d rings grown",
		st.runs, st.steps, st.wraps, st.zero, st.pendingFINs, st.blocks, st.updates, st.grows)
}

// randomRun runs one random model of cfg with the given seed.
func randomRun(tb testing.TB, cfg modelConfig, seed uint64, lax bool) *model {
	r := rand.New(rand.NewPCG(seed, 0xc0ffee))
	var w [2][numOps]int
	w[0] = weightSets[r.IntN(len(weightSets))]
	w[1] = weightSets[r.IntN(len(weightSets))]
	na, nb := 4*MinRingSize+r.IntN(8*MinRingSize), r.IntN(10*MinRingSize)
	if seed%4 == 3 {
		nb = 0 // one direction only: B only ever sends control messages
	}
	m := newModel(tb, cfg.pa, cfg.pb, stream(2*seed, na), stream(2*seed+1, nb))
	m.closeEarly = cfg.closeEarly
	m.laxLastCredit = lax
	m.grow = seed%3 == 1 && !lax
	m.runRandom(r, w, 2_000_000)
	require.True(tb, m.complete())
	return m
}

func TestModelRandom(t *testing.T) {
	seeds := *modelSeeds
	if testing.Short() {
		seeds = 3
	}
	var total modelStats
	for _, cfg := range modelConfigs() {
		var st modelStats
		for seed := range uint64(seeds) {
			ok := t.Run(fmt.Sprintf("%s/seed%d", cfg.name, seed), func(t *testing.T) {
				st.add(randomRun(t, cfg, seed, false))
			})
			if !ok {
				return
			}
		}
		t.Logf("%s: %v", cfg.name, st)
		if !testing.Short() {
			require.Positive(t, st.blocks, cfg.name)
			require.Positive(t, st.zero, "%s: the last credit never used", cfg.name)
		}
		total.runs += st.runs
		total.steps += st.steps
		total.wraps += st.wraps
		total.zero += st.zero
		total.pendingFINs += st.pendingFINs
		total.blocks += st.blocks
		total.updates += st.updates
	}
	t.Logf("total: %v", total)
	require.Positive(t, total.wraps)
	require.Positive(t, total.zero)
	require.Positive(t, total.blocks)
	if !testing.Short() {
		require.Positive(t, total.pendingFINs, "no FIN ever waited for a credit")
	}
}

// A prefix moved first puts every cursor just below a multiple of the ring
// size, so the random run starts at the wrap.
func TestModelNearWrap(t *testing.T) {
	for i, skip := range []uint64{MinRingSize - 1, 2*MinRingSize - 3, 3*MinRingSize - 64, 1<<20 - 5} {
		for _, credits := range []uint64{4, 6} {
			r := rand.New(rand.NewPCG(uint64(i), 7))
			cfg := symmetric(MinRingSize, credits)
			m := newModel(t, cfg, mirror(cfg), stream(uint64(i), int(skip)+3*MinRingSize), stream(uint64(i)+100, int(skip)+MinRingSize))
			m.p[0].limit, m.p[1].limit = skip, skip
			m.runFair(MinRingSize, m.settled, 1_000_000)
			require.Equal(t, skip, m.p[0].st.Prod())
			require.Equal(t, skip, m.p[1].st.cons)
			m.p[0].limit, m.p[1].limit = uint64(len(m.p[0].out)), uint64(len(m.p[1].out))
			m.runRandom(r, [2][numOps]int{weightSets[0], weightSets[1]}, 1_000_000)
			require.True(t, m.complete())
		}
	}
}

// The deterministic round robin completes too (it is what the fuzz target
// uses to finish a run).
func TestModelFair(t *testing.T) {
	for _, cfg := range modelConfigs() {
		for _, size := range []uint64{1 << 10, MinRingSize, 3 * MinRingSize} {
			m := newModel(t, cfg.pa, cfg.pb, stream(1, 5*MinRingSize+17), stream(2, 3*MinRingSize+1))
			m.closeEarly = cfg.closeEarly
			m.runFair(size, m.complete, 1_000_000)
		}
	}
}

// failCatcher is a testing.TB whose fatal failures end the goroutine
// running the model and are recorded instead of failing the test: the
// regression tests use it to show the model catches what it must.
type failCatcher struct {
	testing.TB
	msg string
}

func (c *failCatcher) Helper() {}

func (c *failCatcher) Errorf(format string, args ...any) {
	c.msg += fmt.Sprintf(format, args...)
}

func (c *failCatcher) Fatalf(format string, args ...any) {
	c.Errorf(format, args...)
	runtime.Goexit()
}

func (c *failCatcher) Error(args ...any) { c.msg += fmt.Sprint(args...) }

func (c *failCatcher) Fail() { c.msg += "failed" }

func (c *failCatcher) Failed() bool { return c.msg != "" }

func (c *failCatcher) FailNow() { runtime.Goexit() }

func (c *failCatcher) Fatal(args ...any) {
	c.msg += fmt.Sprint(args...)
	runtime.Goexit()
}

// modelFailure runs f and returns the failure it reported ("" if none).
func modelFailure(t testing.TB, f func(tb testing.TB)) string {
	t.Helper()
	c := &failCatcher{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(c)
	}()
	<-done
	return c.msg
}
