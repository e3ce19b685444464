//go:build linux

package shm

import (
	"errors"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The tests here play the peer: they corrupt, through the peer's own
// mapping, what the other side reads from shared memory.

// expectFailed checks that b's QP is in the error state after a corrupt
// inbox: its oldest RECV completed with StatusFatal (if any was left), the
// rest flushed, later RECVs are refused, and the peer's next SEND fails.
func expectFailed(t *testing.T, a, b *end, posted int) {
	t.Helper()
	wc := drain(t, b.cq)
	for i, c := range wc {
		want := verbs.StatusFlushed
		if i == 0 {
			want = verbs.StatusFatal
		}
		if c.Status != want || c.Op != verbs.OpRecv {
			t.Errorf("completion %d: %+v (%v), want RECV %v", i, c, c.Status, want)
		}
	}
	if len(wc) != posted {
		t.Errorf("%d completions, want %d: %+v", len(wc), posted, wc)
	}
	if st := b.qp.state.Load(); st != stateError {
		t.Errorf("QP state %d, want error", st)
	}
	err := b.qp.PostRecv(&verbs.RecvWR{ID: 99})
	if !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("PostRecv after a corrupt inbox: %v, want ErrQPState", err)
	}
	drain(t, a.cq)
	sendInline(t, a, 100, []byte("x"))
	if c := pollN(t, a.cq, 1)[0]; c.ID != 100 || c.Status != verbs.StatusRetryExceeded {
		t.Errorf("SEND to the failed QP: %+v (%v), want StatusRetryExceeded", c, c.Status)
	}
}

func TestHostileInbox(t *testing.T) {
	lastEntry := func(a *end) *entry { return a.qp.out.entryAt(a.qp.tail - 1) }
	sendOne := func(t *testing.T, a *end) { sendInline(t, a, 1, []byte("payload")) }
	cases := []struct {
		name    string
		corrupt func(t *testing.T, a, b *end)
	}{
		{"SendTooLong", func(t *testing.T, a, b *end) { sendOne(t, a); lastEntry(a).length = MaxSend + 1 }},
		{"LengthHuge", func(t *testing.T, a, b *end) { sendOne(t, a); lastEntry(a).length = 1<<32 - 1 }},
		{"UnknownOp", func(t *testing.T, a, b *end) { sendOne(t, a); lastEntry(a).op = 77 }},
		{"OpZero", func(t *testing.T, a, b *end) { sendOne(t, a); lastEntry(a).op = 0 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, 16)
			b.postRecvs(t, 4, 64)
			tc.corrupt(t, a, b)
			left := int(b.qp.rcount)
			expectFailed(t, a, b, left)
		})
	}

	t.Run("NoRecvPosted", func(t *testing.T) {
		a, b := pair(t, 16)
		b.postRecvs(t, 2, 64)
		// Three messages for two RECVs: the producer ignored its credits.
		for i := range 3 {
			e := a.qp.out.entryAt(a.qp.tail)
			e.op, e.length = entrySend, 1
			a.qp.tail++
			e.seq.Store(a.qp.tail)
			_ = i
		}
		wc := drain(t, b.cq)
		if len(wc) != 2 || wc[0].Err() != nil || wc[1].Err() != nil {
			t.Errorf("completions %+v, want the two RECVs delivered", wc)
		}
		if st := b.qp.state.Load(); st != stateError {
			t.Errorf("QP state %d, want error", st)
		}
	})

	// An entry whose seq is not its number plus one is not there: it is
	// not delivered, and the QP stays usable (the producer only stalls its
	// own messages).
	t.Run("SeqNotItsNumber", func(t *testing.T) {
		for _, bad := range []func(n uint64) uint64{
			func(uint64) uint64 { return 0 },
			func(n uint64) uint64 { return n + 2 },
			func(n uint64) uint64 { return n + 1 + 16*64 },
			func(uint64) uint64 { return ^uint64(0) },
		} {
			a, b := pair(t, 16)
			b.postRecvs(t, 2, 64)
			sendOne(t, a)
			e := lastEntry(a)
			e.seq.Store(bad(a.qp.tail - 1))
			if wc := drain(t, b.cq); len(wc) != 0 {
				t.Errorf("completions %+v for an entry that is not there", wc)
			}
			if st := b.qp.state.Load(); st == stateError {
				t.Error("the QP failed")
			}
			e.seq.Store(a.qp.tail) // as sent: it comes
			if c := pollN(t, b.cq, 1)[0]; c.Err() != nil {
				t.Errorf("the entry once there: %+v", c)
			}
		}
	})

	t.Run("FaultFlag", func(t *testing.T) {
		a, b := pair(t, 16)
		b.postRecvs(t, 3, 64)
		sendOne(t, a)
		a.qp.out.hdr.fault.Store(0xdead)
		wc := drain(t, b.cq)
		// The message before the fault is delivered, then the rest flush.
		if len(wc) != 3 || wc[0].Err() != nil || wc[1].Status != verbs.StatusFlushed || wc[2].Status != verbs.StatusFlushed {
			t.Errorf("completions %+v", wc)
		}
	})
}

// TestHostileConsumer: the producer survives whatever the consumer
// publishes.
func TestHostileConsumer(t *testing.T) {
	t.Run("HugeCreditsStuckHead", func(t *testing.T) {
		a, b := pair(t, 16)
		b.qp.in.hdr.posted.Store(1 << 60)
		b.qp.in.hdr.head.Store(^uint64(0) - 3)
		var st verbs.Status
		for i := range 4 * int(a.qp.out.cap) {
			if err := a.qp.PostSend(&verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Inline: []byte("x"), Signaled: true}); err != nil {
				break
			}
			c := pollN(t, a.cq, 1)[0]
			if st = c.Status; st != verbs.StatusSuccess {
				break
			}
		}
		if st != verbs.StatusFatal {
			t.Errorf("sending into an impossible inbox ended with %v, want StatusFatal", st)
		}
	})
	t.Run("CreditsGoBack", func(t *testing.T) {
		a, b := pair(t, 16)
		b.postRecvs(t, 4, 64)
		sendInline(t, a, 1, []byte("x"))
		b.qp.in.hdr.posted.Store(0)
		a.qp.credit = 0 // force a reload
		sendInline(t, a, 2, []byte("x"))
		if c := pollN(t, a.cq, 2)[1]; c.Status != verbs.StatusRNR {
			t.Errorf("SEND with no credit left: %+v (%v), want StatusRNR", c, c.Status)
		}
	})
	t.Run("StateGarbage", func(t *testing.T) {
		a, b := pair(t, 16)
		b.postRecvs(t, 4, 64)
		b.qp.in.hdr.state.Store(12345)
		sendInline(t, a, 1, []byte("x"))
		if c := pollN(t, a.cq, 1)[0]; c.Status != verbs.StatusRetryExceeded {
			t.Errorf("SEND: %+v (%v), want StatusRetryExceeded", c, c.Status)
		}
	})
	t.Run("SleepingGarbage", func(t *testing.T) {
		a, b := pair(t, 16)
		b.postRecvs(t, 4, 64)
		b.qp.in.hdr.sleeping.Store(0xdeadbeef)
		sendInline(t, a, 1, []byte("x"))
		if c := pollN(t, a.cq, 1)[0]; c.Status != verbs.StatusSuccess {
			t.Errorf("SEND: %+v (%v)", c, c.Status)
		}
		if c := pollN(t, b.cq, 1)[0]; c.Status != verbs.StatusSuccess {
			t.Errorf("RECV: %+v (%v)", c, c.Status)
		}
	})
}

// TestHostileInboxRandom scribbles random values over the inbox header's
// producer fields and random entries, then polls: never a panic, and every
// completion names a posted RECV.
func TestHostileInboxRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	iterations := 200
	if testing.Short() {
		iterations = 40
	}
	for i := range iterations {
		a, b := openEnd(t, 8), openEnd(t, 8)
		connect(t, a, b)
		b.postRecvs(t, 8, 64)
		for k := range rng.IntN(4) {
			sendInline(t, a, uint64(k), []byte("ok"))
		}
		out := a.qp.out
		for range 1 + rng.IntN(6) {
			switch rng.IntN(4) {
			case 0: // an entry that looks published, ahead of the producer
				k := a.qp.tail + uint64(rng.IntN(2*int(out.cap)))
				out.entryAt(k).seq.Store(k + 1)
			case 1:
				out.entryAt(uint64(rng.IntN(int(out.cap)))).seq.Store(rng.Uint64())
			default:
				e := unsafe.Slice((*byte)(unsafe.Pointer(out.entryAt(uint64(rng.IntN(int(out.cap)))))), EntrySize)
				e[rng.IntN(16)] = byte(rng.Uint32())
			}
		}
		for range 3 {
			for _, c := range drain(t, b.cq) {
				if c.Op != verbs.OpRecv || c.ID >= 8 || c.Len < 0 || c.Len > 64 {
					t.Fatalf("iteration %d: completion %+v", i, c)
				}
			}
		}
		a.close()
		b.close()
	}
}
