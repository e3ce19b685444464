//go:build linux

package shm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// dialRendezvous connects to the rendezvous listener named in info.
func dialRendezvous(t *testing.T, info []byte) (*net.UnixConn, *peerInfo) {
	t.Helper()
	p, err := decodeInfo(info)
	if err != nil {
		t.Fatalf("decodeInfo: %v", err)
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: p.name, Net: "unixpacket"})
	if err != nil {
		t.Fatalf("dialing %s: %v", p.name, err)
	}
	return c, &p
}

// readListener reads the listener's next message on c (closing any fds it
// carries), waiting at most 10 s.
func readListener(c *net.UnixConn) (b []byte, nfds int, err error) {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, maxMsgLen)
	oob := make([]byte, unix.CmsgSpace(4*maxMsgFDs))
	b, fds, err := readMsg(c, buf, oob)
	closeFDs(fds)
	return b, len(fds), err
}

// expectHangUp fails unless the listener closes c without answering.
func expectHangUp(t *testing.T, c *net.UnixConn, what string) {
	t.Helper()
	if b, n, err := readListener(c); !errors.Is(err, io.EOF) {
		t.Errorf("%s: the listener answered (%d bytes, %d fds, %v), want it to hang up", what, len(b), n, err)
	}
}

// expectRefusal reads a refusal of the exchange that says why (the reason
// must contain want), then expects the listener to hang up.
func expectRefusal(t *testing.T, c *net.UnixConn, what, want string) {
	t.Helper()
	b, _, err := readListener(c)
	if err != nil {
		t.Errorf("%s: reading the refusal: %v", what, err)
		return
	}
	if err := decodeLinked(b); err == nil || !strings.Contains(err.Error(), "refused the exchange: ") || !strings.Contains(err.Error(), want) {
		t.Errorf("%s: the listener answered %q (%v), want a refusal saying %q", what, b, err, want)
	}
}

// waitRefused waits until the listener has refused n more connections
// than before.
func waitRefused(t *testing.T, before RendezvousStats, n uint64) RendezvousStats {
	t.Helper()
	end := time.Now().Add(10 * time.Second)
	for {
		s := Stats()
		if s.Refused >= before.Refused+n {
			return s
		}
		if time.Now().After(end) {
			t.Fatalf("%d refusals, want %d", s.Refused-before.Refused, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// craftFDs returns what a well-behaved active side sends: with a link's
// connect message an eventfd, a bell page and a lane eventfd, and with an
// attach an inbox memfd of capacity c (the last fd).
func craftFDs(t *testing.T, c uint64) []int {
	t.Helper()
	fd, in, err := newInbox(int(c))
	if err != nil {
		t.Fatal(err)
	}
	in.release()
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	bfd, b, err := newBell()
	if err != nil {
		t.Fatal(err)
	}
	b.release()
	lfd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	return []int{efd, bfd, lfd, fd}
}

// linkByHand sets up a link on c with secret as a well-behaved active side
// would, and fails the test unless the listener answers linked.
func linkByHand(t *testing.T, c *net.UnixConn, secret []byte) {
	t.Helper()
	fds := craftFDs(t, minInboxCap)
	err := writeMsg(c, append(appendHeader(nil, msgConnect), secret...), fds[:3])
	closeFDs(fds)
	if err != nil {
		t.Fatalf("write: %v", err)
	}
	if b, n, err := readListener(c); err != nil || decodeLinked(b) != nil || n != 3 {
		t.Fatalf("the listener answered %q with %d fds (%v), want linked with 3", b, n, err)
	}
}

// TestRendezvousRefusesStrangers: connections without the registered secret
// are closed, their fds released, and the registration still works.
func TestRendezvousRefusesStrangers(t *testing.T) {
	a, b := openEnd(t, 16), openEnd(t, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.qp.Connect(ctx, a.qp.Info(), false); err != nil {
		t.Fatalf("passive Connect: %v", err)
	}
	binfo := b.qp.Info()
	waitLinks(t)
	fds0 := fdCount(t)
	before := Stats()

	wrong := []byte("not the secret, but 32 bytes....")
	connectMsg := func(secret []byte) []byte { return append(appendHeader(nil, msgConnect), secret...) }
	cases := []struct {
		name string
		msg  func(p *peerInfo) []byte
		fds  bool
	}{
		{"Silent", nil, false},
		{"Garbage", func(*peerInfo) []byte { return []byte("GET / HTTP/1.1\r\n\r\n") }, false},
		{"HeaderOnly", func(*peerInfo) []byte { return appendHeader(nil, msgConnect) }, false},
		{"TruncatedSecret", func(p *peerInfo) []byte { return connectMsg(p.secret[:16]) }, false},
		{"LongerThanSecret", func(p *peerInfo) []byte { return append(connectMsg(p.secret[:]), 0) }, false},
		{"WrongSecret", func(*peerInfo) []byte { return connectMsg(wrong) }, false},
		{"WrongSecretWithFDs", func(*peerInfo) []byte { return connectMsg(wrong) }, true},
		{"Attach", func(p *peerInfo) []byte {
			return encodeExchange(msgAttach, &exchange{secret: p.secret, inboxCap: minInboxCap}) // before a link
		}, true},
		{"TooLong", func(p *peerInfo) []byte { return append(connectMsg(wrong), make([]byte, maxMsgLen)...) }, false},
	}
	for _, tc := range cases {
		c, p := dialRendezvous(t, binfo)
		if tc.msg != nil {
			var fds []int
			if tc.fds {
				fds = craftFDs(t, minInboxCap)
			}
			err := writeMsg(c, tc.msg(p), fds)
			closeFDs(fds)
			if err != nil {
				t.Fatalf("%s: write: %v", tc.name, err)
			}
			expectHangUp(t, c, tc.name)
		}
		_ = c.Close()
	}
	s := waitRefused(t, before, uint64(len(cases)))
	t.Logf("last refusal: %s", s.LastRefusal)
	if !strings.Contains(s.LastRefusal, "pid") {
		t.Errorf("last refusal %q does not name the peer", s.LastRefusal)
	}
	if n := fdCount(t); n != fds0 {
		t.Errorf("%d fds after the refusals, %d before", n, fds0)
	}

	// The registration survived: the real peer connects.
	if err := a.qp.Connect(ctx, binfo, true); err != nil {
		t.Fatalf("active Connect after the strangers: %v", err)
	}
	if err := b.qp.Established(ctx); err != nil {
		t.Fatalf("Established: %v", err)
	}
	rb := b.postRecvs(t, 1, 64)
	ra := a.postRecvs(t, 1, 64)
	sendInline(t, a, 1, []byte("hello b"))
	if c := pollN(t, b.cq, 1)[0]; c.Err() != nil || c.Op != verbs.OpRecv || !bytes.Equal(rb.Bytes()[:c.Len], []byte("hello b")) {
		t.Errorf("b received %+v %q", c, rb.Bytes()[:c.Len])
	}
	sendInline(t, b, 2, []byte("hello a"))
	if c := pollN(t, a.cq, 2); c[0].Err() != nil || c[1].Err() != nil || !bytes.Equal(ra.Bytes()[:7], []byte("hello a")) {
		t.Errorf("a: completions %+v, received %q", c, ra.Bytes()[:7])
	}
	pid, uid := b.qp.PeerCred()
	if pid != unix.Getpid() || uid != unix.Geteuid() {
		t.Errorf("PeerCred() = %d, %d; want %d, %d", pid, uid, unix.Getpid(), unix.Geteuid())
	}
}

// TestRendezvousBadExchange: the right secret with bad doorbells is
// refused and leaves the registration for the genuine peer; an attach
// with bad resources is refused on the link, uses up the registration,
// reports the failure to Established, and leaks nothing.
func TestRendezvousBadExchange(t *testing.T) {
	memfd := func(t *testing.T, size int, seal bool) int {
		t.Helper()
		flags := unix.MFD_CLOEXEC
		fd, err := unix.MemfdCreate("rsock-shm-test", flags)
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.Ftruncate(fd, int64(size))
		if seal {
			_ = unix.Close(fd)
			var mem []byte
			if fd, mem, err = newMemfd("rsock-shm-test", size); err != nil {
				t.Fatal(err)
			}
			_ = unmap(mem)
		}
		return fd
	}
	inbox := func(t *testing.T) int {
		fds := craftFDs(t, minInboxCap)
		closeFDs(fds[:3])
		return fds[3]
	}
	// doorbell returns craftFDs' eventfd, bell page and lane, fds[i]
	// replaced by fd (-1: dropped).
	doorbell := func(t *testing.T, i, fd int) []int {
		fds := craftFDs(t, minInboxCap)
		_ = unix.Close(fds[3])
		if i < 0 {
			return fds[:3]
		}
		_ = unix.Close(fds[i])
		if fd < 0 {
			return append(fds[:i], fds[i+1:3]...)
		}
		fds[i] = fd
		return fds[:3]
	}
	pipe := func(t *testing.T) int {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatal(err)
		}
		_ = unix.Close(p[1])
		return p[0]
	}
	// Doorbells sent with the connect message.
	doorbells := []struct {
		name string
		fds  func(t *testing.T) []int
	}{
		{"NoFDs", func(t *testing.T) []int { return nil }},
		{"NoBell", func(t *testing.T) []int { return doorbell(t, 1, -1) }},
		{"NoLane", func(t *testing.T) []int { return doorbell(t, 2, -1) }},
		{"FourFDs", func(t *testing.T) []int { return append(doorbell(t, -1, 0), inbox(t)) }},
		{"BellWrongSize", func(t *testing.T) []int { return doorbell(t, 1, memfd(t, 4096, true)) }},
		{"BellZeroHeader", func(t *testing.T) []int { return doorbell(t, 1, memfd(t, bellPageBytes, true)) }},
		{"InboxForBell", func(t *testing.T) []int { return doorbell(t, 1, inbox(t)) }},
		{"PipeForEventfd", func(t *testing.T) []int { return doorbell(t, 0, pipe(t)) }},
		{"PipeForLane", func(t *testing.T) []int { return doorbell(t, 2, pipe(t)) }},
	}
	mr := mrRecord{rkey: 7, addr: 1 << 36, size: 8192}
	// The inbox and regions sent with an attach.
	attaches := []struct {
		name string
		fds  func(t *testing.T) ([]int, []mrRecord)
	}{
		{"NoInbox", func(t *testing.T) ([]int, []mrRecord) { return nil, nil }},
		{"MissingRegionFD", func(t *testing.T) ([]int, []mrRecord) { return []int{inbox(t)}, []mrRecord{mr} }},
		{"InboxWrongSize", func(t *testing.T) ([]int, []mrRecord) {
			return []int{memfd(t, 2*inboxBytes(minInboxCap), true)}, nil
		}},
		{"InboxUnsealed", func(t *testing.T) ([]int, []mrRecord) { return []int{memfd(t, inboxBytes(minInboxCap), false)}, nil }},
		{"InboxZeroHeader", func(t *testing.T) ([]int, []mrRecord) { return []int{memfd(t, inboxBytes(minInboxCap), true)}, nil }},
		{"BellForInbox", func(t *testing.T) ([]int, []mrRecord) { return []int{memfd(t, bellPageBytes, true)}, nil }},
		{"RegionWrongSize", func(t *testing.T) ([]int, []mrRecord) {
			return []int{inbox(t), memfd(t, 4096, true)}, []mrRecord{mr}
		}},
		{"RegionKeyZero", func(t *testing.T) ([]int, []mrRecord) {
			return []int{inbox(t), memfd(t, 8192, true)}, []mrRecord{{addr: 1 << 36, size: 8192}}
		}},
		{"RegionTwice", func(t *testing.T) ([]int, []mrRecord) {
			return []int{inbox(t), memfd(t, 8192, true), memfd(t, 8192, true)}, []mrRecord{mr, mr}
		}},
	}
	// run sets up a passive QP and lets step misbehave towards it, then
	// checks that nothing leaked.
	run := func(t *testing.T, step func(t *testing.T, ctx context.Context, a, b *end, c *net.UnixConn, p *peerInfo)) {
		waitLinks(t)
		_, ours0 := mapsCount(t)
		fds0 := fdCount(t)
		a, b := openEnd(t, 16), openEnd(t, 16)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.qp.Connect(ctx, a.qp.Info(), false); err != nil {
			t.Fatalf("passive Connect: %v", err)
		}
		c, p := dialRendezvous(t, b.qp.Info())
		step(t, ctx, a, b, c, p)
		_ = c.Close()
		a.close()
		b.close()
		waitLinks(t)
		if n := fdCount(t); n != fds0 {
			t.Errorf("%d fds after the refusal, %d before", n, fds0)
		}
		if _, ours := mapsCount(t); ours != ours0 {
			t.Errorf("%d memfd mappings after the refusal, %d before", ours, ours0)
		}
	}
	for _, tc := range doorbells {
		t.Run("Link"+tc.name, func(t *testing.T) {
			run(t, func(t *testing.T, ctx context.Context, a, b *end, c *net.UnixConn, p *peerInfo) {
				// The refusing goroutine waits after the refusal until
				// the genuine peer has connected: the secret must be
				// free for it by the time the refusal is visible.
				release := make(chan struct{})
				hold := func() { <-release }
				testHookLinkRefused.Store(&hold)
				defer func() {
					testHookLinkRefused.Store(nil)
					close(release)
				}()
				fds := tc.fds(t)
				err := writeMsg(c, append(appendHeader(nil, msgConnect), p.secret[:]...), fds)
				closeFDs(fds)
				if err != nil {
					t.Fatalf("write: %v", err)
				}
				expectRefusal(t, c, tc.name, "shm: ")
				expectHangUp(t, c, tc.name)
				// The registration is left: the genuine peer connects.
				if err := a.qp.Connect(ctx, b.qp.Info(), true); err != nil {
					t.Errorf("active Connect after a refused link: %v", err)
				}
				if err := b.qp.Established(ctx); err != nil {
					t.Errorf("Established: %v", err)
				}
			})
		})
	}
	for _, tc := range attaches {
		t.Run("Attach"+tc.name, func(t *testing.T) {
			run(t, func(t *testing.T, ctx context.Context, a, b *end, c *net.UnixConn, p *peerInfo) {
				linkByHand(t, c, p.secret[:])
				fds, mrs := tc.fds(t)
				x := &exchange{secret: p.secret, src: 5, inboxCap: minInboxCap, mrs: mrs}
				err := writeMsg(c, encodeExchange(msgAttach, x), fds)
				closeFDs(fds)
				if err != nil {
					t.Fatalf("write: %v", err)
				}
				expectRefusal(t, c, tc.name, "shm: ")
				if err := b.qp.Established(ctx); !errors.Is(err, verbs.ErrPeerInfo) {
					t.Errorf("Established after a bad exchange: %v, want ErrPeerInfo", err)
				}
				// The secret was used up: an attach with it is refused and
				// leaves the link up.
				x.mrs = nil
				fd := inbox(t)
				err = writeMsg(c, encodeExchange(msgAttach, x), []int{fd})
				_ = unix.Close(fd)
				if err != nil {
					t.Fatalf("write: %v", err)
				}
				expectRefusal(t, c, tc.name+" again", "unknown secret")
			})
		})
	}
	// A secret sets up one link at most.
	run(t, func(t *testing.T, ctx context.Context, a, b *end, c *net.UnixConn, p *peerInfo) {
		linkByHand(t, c, p.secret[:])
		c2, _ := dialRendezvous(t, b.qp.Info())
		defer c2.Close()
		fds := doorbell(t, -1, 0)
		err := writeMsg(c2, append(appendHeader(nil, msgConnect), p.secret[:]...), fds)
		closeFDs(fds)
		if err != nil {
			t.Fatalf("write: %v", err)
		}
		expectHangUp(t, c2, "second link")
	})
}

// TestConnectErrors: host checks, closed QPs and Connect twice.
func TestConnectErrors(t *testing.T) {
	a, b := openEnd(t, 16), openEnd(t, 16)
	ctx := context.Background()
	other := func(mut func(b []byte)) []byte {
		info := a.qp.Info()
		mut(info)
		return info
	}
	for _, tc := range []struct {
		name string
		info []byte
		want string
	}{
		{"OtherBoot", other(func(b []byte) { b[8] ^= 1 }), "peer is on another host"},
		{"OtherNetns", other(func(b []byte) { b[32] ^= 1 }), "peer is in another network namespace"},
	} {
		for _, active := range []bool{false, true} {
			err := b.qp.Connect(ctx, tc.info, active)
			if !errors.Is(err, verbs.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s (active %v): %v, want ErrUnavailable: %s", tc.name, active, err, tc.want)
			}
		}
	}
	noName := other(func(b []byte) {})[:infoFixed]
	noName[5] = 0
	if err := b.qp.Connect(ctx, noName, true); !errors.Is(err, verbs.ErrPeerInfo) {
		t.Errorf("active Connect to an Info without rendezvous: %v, want ErrPeerInfo", err)
	}
	path := append(other(func(b []byte) {})[:infoFixed], "/tmp/x"...)
	path[5] = byte(len("/tmp/x"))
	if err := b.qp.Connect(ctx, path, true); !errors.Is(err, verbs.ErrPeerInfo) {
		t.Errorf("active Connect to a socket path: %v, want ErrPeerInfo", err)
	}
	if err := b.qp.Established(ctx); !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("Established before Connect: %v, want ErrQPState", err)
	}
	connect(t, a, b)
	if err := a.qp.Connect(ctx, b.qp.Info(), true); !errors.Is(err, verbs.ErrQPState) {
		t.Errorf("second Connect: %v, want ErrQPState", err)
	}
	if err := a.qp.Established(ctx); err != nil {
		t.Errorf("Established on the active side: %v", err)
	}
	_ = a.qp.Close()
	if err := a.qp.Connect(ctx, b.qp.Info(), true); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Connect after Close: %v, want ErrClosed", err)
	}
	if err := a.qp.Close(); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("second Close: %v, want ErrClosed", err)
	}
}

// TestEstablishedCancel: Established honours ctx and Close.
func TestEstablishedCancel(t *testing.T) {
	a, b := openEnd(t, 16), openEnd(t, 16)
	if err := b.qp.Connect(context.Background(), a.qp.Info(), false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := b.qp.Established(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Established without a peer: %v, want DeadlineExceeded", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.qp.Established(context.Background()) }()
	time.Sleep(10 * time.Millisecond)
	_ = b.qp.Close()
	if err := <-errc; !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Established across Close: %v, want ErrClosed", err)
	}
	// The closed QP's registration is gone: an active Connect is refused.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	if err := a.qp.Connect(ctx2, b.qp.Info(), true); err == nil {
		t.Error("active Connect to a closed QP succeeded")
	}
}

// TestRendezvousFairShare: once maxHeld connections are held, by
// processes that each hold their full share of silent ones, such a
// process gets no more, and a process that holds none takes the place of
// the oldest silent connection of one that holds the most.
func TestRendezvousFairShare(t *testing.T) {
	// Every exchange ends on its peer's close, and gives its place back:
	// none of an earlier test's may count here, nor this test's after it.
	noneHeld := func() {
		for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			rv.mu.Lock()
			held := rv.held
			rv.mu.Unlock()
			if held == 0 {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("%d connections still held", held)
			}
		}
	}
	noneHeld()
	defer func(n int) { maxHeld = n }(maxHeld)
	maxHeld = 2 * maxPerPeer
	var theirs []*net.UnixConn // the ends the processes hold
	defer func() {
		for _, c := range theirs {
			_ = c.Close()
		}
		noneHeld()
	}()
	connect := func(pid int32) *net.UnixConn {
		t.Helper()
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		var ends [2]*net.UnixConn
		for i, fd := range fds {
			f := os.NewFile(uintptr(fd), "rendezvous")
			c, err := net.FileConn(f)
			f.Close()
			if err != nil {
				t.Fatal(err)
			}
			ends[i] = c.(*net.UnixConn)
		}
		theirs = append(theirs, ends[1])
		admit(pendingConn{c: ends[0], cred: &unix.Ucred{Pid: pid, Uid: uint32(os.Geteuid())}, accepted: time.Now()})
		return ends[1]
	}
	const hog1, hog2, honest = 1 << 30, 1<<30 + 1, 1<<30 + 2
	var first [2]*net.UnixConn
	for i, pid := range []int32{hog1, hog2} {
		for k := range maxPerPeer {
			if c := connect(pid); k == 0 {
				first[i] = c
			}
		}
	}
	expectHangUp(t, connect(hog1), "a connection past maxHeld of a process holding the most")

	connect(honest)
	rv.mu.Lock()
	served := rv.peers[honest].active
	hog2Left := len(rv.peers[hog2].silent)
	rv.mu.Unlock()
	if served != 1 {
		t.Fatalf("the connection of a process holding none is not served (%d)", served)
	}
	evicted := first[0]
	if hog2Left < maxPerPeer {
		evicted = first[1]
	}
	expectHangUp(t, evicted, "the oldest silent connection of a process holding the most")
}
