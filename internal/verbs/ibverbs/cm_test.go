//go:build cgo && linux

package ibverbs

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

// cmDevice opens the device the harness names (SOFTROCE_DEV and
// SOFTROCE_IP; elsewhere RSOCK_DEVICE and RSOCK_TEST_VERBS_IP) with its IP
// as both ends' address, and skips unless it is connected through rdma_cm.
func openCMDevice(t *testing.T) *Device {
	t.Helper()
	pick := func(names ...string) string {
		for _, n := range names {
			if v := os.Getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	ip := net.ParseIP(pick("SOFTROCE_IP", "RSOCK_TEST_VERBS_IP"))
	if ip == nil {
		verbstest.Unavailable(t, "no RDMA address: set RSOCK_TEST_VERBS_IP (make test runs this in the VM)")
	}
	o := verbs.OpenOptions{Device: pick("SOFTROCE_DEV", "RSOCK_DEVICE"), GIDIndex: -1,
		LocalAddr: &net.TCPAddr{IP: ip}, RemoteAddr: &net.TCPAddr{IP: ip}}
	d, err := New().Open(o)
	if err != nil {
		verbstest.Unavailable(t, fmt.Sprintf("no device for %v: %v", ip, err))
	}
	t.Cleanup(func() { d.Close() })
	dev := d.(*Device)
	if !dev.t.iwarp {
		t.Skipf("%s is not connected through rdma_cm (this test is for iWARP devices)", dev.t.dev)
	}
	return dev
}

// newCMQP makes a QP with its own CQ on d, closed at the end of the test.
func newCMQP(t *testing.T, d *Device) *QP {
	t.Helper()
	cq, err := d.NewCQ(64, func() {})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := d.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 8, RecvDepth: 8, MaxInline: 32})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qp.Close(); cq.Close() })
	return qp.(*QP)
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestCMHostilePeers: connect requests to a passive QP's listener with no
// private data, a wrong secret, from another process (rping) and a flood
// of them are rejected and counted; the real peer then connects and
// carries data, a replay of its request is rejected too, and closing
// leaves no identifier and no descriptor behind.
func TestCMHostilePeers(t *testing.T) {
	d := openCMDevice(t)
	s, err := cmLoad()
	if err != nil {
		t.Fatal(err)
	}
	// The context's completion channels live as long as the process:
	// make them all before counting.
	for range maxChannels {
		cq, err := d.NewCQ(4, nil)
		if err != nil {
			t.Fatal(err)
		}
		cq.Close()
	}
	// Checked last: the QPs' and CQs' cleanups run before this one.
	fds := openFDs(t)
	t.Cleanup(func() {
		if n := openFDs(t); n != fds {
			t.Errorf("%d descriptors open after every QP and CQ closed, %d before", n, fds)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rejected0 := CMRejected()

	passive := newCMQP(t, d)
	active := newCMQP(t, d)
	if err := passive.Connect(ctx, active.Info(), false); err != nil {
		t.Fatalf("passive Connect: %v", err)
	}
	in, err := parseInfo(passive.Info())
	if err != nil || in.port == 0 || in.ticket == 0 {
		t.Fatalf("passive Info: %+v, %v", in, err)
	}
	t.Logf("listener port %d, ticket %d", in.port, in.ticket)

	// hostile connects with pdata from a fresh QP; each must be refused.
	hostile := func(name string, pdata []byte) {
		t.Helper()
		h := newCMQP(t, d)
		defer h.Close()
		if c, err := s.connect(ctx, h, in.port, pdata); err == nil {
			s.detach(c)
			t.Fatalf("%s: connected", name)
		} else if !errors.Is(err, verbs.ErrPeerInfo) {
			t.Fatalf("%s: %v, want a refusal", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	hostile("no private data", nil)
	var guess [cmPrivLen]byte
	copy(guess[:], (&cmTicket{num: in.ticket}).pdata()[:4])
	rand.Read(guess[4:])
	hostile("a guessed secret", guess[:])
	want := uint64(2)

	// Another process that does not know the ticket: rping, with its own
	// private data.
	if rping, err := exec.LookPath("rping"); err == nil {
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		out, err := exec.CommandContext(rctx, rping, "-c", "-a", d.local.String(), "-p", strconv.Itoa(int(in.port)), "-C", "1", "-v").CombinedOutput()
		rcancel()
		if err == nil {
			t.Fatalf("rping connected to the listener: %s", out)
		}
		t.Logf("rping: %v: %s", err, out)
		want++
	} else {
		t.Logf("rping not installed: the other-process case is not tried")
	}

	// A flood: rounds of requests in parallel, each from a fresh QP,
	// closed after its refusal.
	const flood, parallel = 64, 16
	var wg sync.WaitGroup
	errs := make(chan error, flood)
	for i := range flood {
		h := newCMQP(t, d)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer h.Close()
			pdata := make([]byte, cmPrivLen)
			rand.Read(pdata)
			if c, err := s.connect(ctx, h, in.port, pdata); err == nil {
				s.detach(c)
				errs <- fmt.Errorf("flood request %d connected", i)
			}
		}()
		if i%parallel == parallel-1 {
			wg.Wait()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want += flood
	if got := CMRejected() - rejected0; got != want {
		t.Errorf("%d requests rejected, want %d", got, want)
	}

	// The real peer is unaffected.
	if err := active.Connect(ctx, passive.Info(), true); err != nil {
		t.Fatalf("active Connect after the attack: %v", err)
	}
	if err := passive.Established(ctx); err != nil {
		t.Fatalf("Established after the attack: %v", err)
	}
	sendOne(t, active, passive)

	// A replay of the real request finds its ticket used.
	hostile("a replay", (&cmTicket{num: in.ticket, secret: in.secret}).pdata())
	if got := CMRejected() - rejected0; got != want+1 {
		t.Errorf("%d requests rejected after the replay, want %d", got, want+1)
	}

	passive.Close()
	active.Close()
	s.mu.Lock()
	left := len(s.conns)
	s.mu.Unlock()
	if left != 0 {
		t.Errorf("%d rdma_cm identifiers still dispatched after every QP closed", left)
	}
}

// sendOne sends a SEND from a to b and waits for both completions.
func sendOne(t *testing.T, a, b *QP) {
	t.Helper()
	mr, err := b.dev.AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Close()
	if err := b.PostRecv(&verbs.RecvWR{ID: 7, Local: verbs.SGE{MR: mr, Length: 4096}}); err != nil {
		t.Fatal(err)
	}
	if err := a.PostSend(&verbs.SendWR{ID: 9, Op: verbs.OpSend, Inline: []byte("through rdma_cm"), Signaled: true}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []*QP{a, b} {
		wc := make([]verbs.Completion, 1)
		deadline := time.Now().Add(time.Minute) // a hang guard
		for {
			n, err := q.cq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				if err := wc[0].Err(); err != nil {
					t.Fatalf("completion %+v: %v", wc[0], err)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no completion within a minute")
			}
			time.Sleep(time.Millisecond)
		}
	}
	if got := string(mr.Bytes()[:len("through rdma_cm")]); got != "through rdma_cm" {
		t.Fatalf("received %q", got)
	}
}

// TestCMPostAsPeerCloses: a SEND posted while the peer closes (before or
// after its disconnect is known here) completes or is refused; it never
// hangs. soft-iWARP takes a post on a QP that has just gone to the error
// state and never completes it: the provider refuses posts once it knows,
// and completes as flushed what the device dropped (CQ.flushDead). The
// conformance suite's ClosedPeer hit this race in about one run in five.
func TestCMPostAsPeerCloses(t *testing.T) {
	d := openCMDevice(t)
	const rounds = 50
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range rounds {
		a, b := newCMQP(t, d), newCMQP(t, d)
		if err := b.Connect(ctx, a.Info(), false); err != nil {
			t.Fatal(err)
		}
		if err := a.Connect(ctx, b.Info(), true); err != nil {
			t.Fatal(err)
		}
		if err := b.Established(ctx); err != nil {
			t.Fatal(err)
		}
		b.Close()
		err := a.PostSend(&verbs.SendWR{ID: 2, Op: verbs.OpSend, Inline: []byte("late"), Signaled: true})
		if err != nil {
			if !errors.Is(err, verbs.ErrQPState) {
				t.Fatalf("round %d: post: %v, want ErrQPState or a completion", i, err)
			}
		} else {
			wc := make([]verbs.Completion, 1)
			deadline := time.Now().Add(30 * time.Second) // a hang guard
			for {
				n, err := a.cq.Poll(wc)
				if err != nil {
					t.Fatal(err)
				}
				if n == 1 {
					if wc[0].ID != 2 {
						t.Fatalf("round %d: completion %+v, want ID 2", i, wc[0])
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: a SEND posted as the peer closed never completed (QP error: %v)", i, a.asyncErr.Load() != nil)
				}
				time.Sleep(time.Millisecond)
			}
		}
		a.Close()
	}
}
