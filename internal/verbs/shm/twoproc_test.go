//go:build linux

package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// helperEnv marks the re-executed test binary that plays the active side.
const helperEnv = "RSOCK_SHM_TEST_HELPER"

// TestTwoProcesses runs the two ends in two processes: this one (passive)
// and a re-executed copy of the test binary (active), with a socketpair as
// the bootstrap connection. Data goes both ways through the rings, by
// MapRemote copies and WRITEs, and is checked byte
// for byte. The helper then exits without closing anything: the kernel's
// cleanup must make this side's sends fail.
func TestTwoProcesses(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("this is the helper process")
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	parentF, childF := os.NewFile(uintptr(sp[0]), "boot"), os.NewFile(uintptr(sp[1]), "boot-child")
	boot, err := net.FileConn(parentF)
	_ = parentF.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer boot.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTwoProcessesHelper$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.ExtraFiles = []*os.File{childF} // fd 3
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = childF.Close()
	start := time.Now()
	e, err := runTwoProc(boot, false, cmd.Process.Pid)
	if e != nil {
		defer e.close()
	}
	werr := cmd.Wait()
	if err != nil || werr != nil {
		t.Fatalf("passive side: %v; helper: %v; helper output:\n%s", err, werr, out.String())
	}
	t.Logf("%d rounds between pid %d and pid %d in %v", twoProcRounds, os.Getpid(), cmd.Process.Pid, time.Since(start).Round(time.Millisecond))

	// The helper exited without closing its QP.
	end := time.Now().Add(10 * time.Second)
	for !e.qp.peerGone.Load() && time.Now().Before(end) {
		time.Sleep(time.Millisecond)
	}
	drain(t, e.cq)
	sendInline(t, e, 1, []byte("still there?"))
	if c := pollN(t, e.cq, 1)[0]; c.Status != verbs.StatusRetryExceeded {
		t.Errorf("SEND after the peer process exited: %+v (%v), want StatusRetryExceeded", c, c.Status)
	}
}

// TestTwoProcessesHelper is the active side of TestTwoProcesses.
func TestTwoProcessesHelper(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("run by TestTwoProcesses")
	}
	f := os.NewFile(3, "boot")
	boot, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := runTwoProc(boot, true, os.Getppid()); err != nil {
		t.Fatal(err)
	}
	// Exit with everything open: the kernel closes it.
}

const (
	twoProcRounds  = 400
	twoProcRing    = 1 << 20
	twoProcCredits = 16
)

// twoProcStep says what round r moves: size bytes at off, by which path.
func twoProcStep(r int) (size, off int, path int) {
	rng := rand.New(rand.NewPCG(uint64(r), 77))
	switch r % 4 {
	case 0:
		size = 1 + rng.IntN(64)
	case 1:
		size = 1 + rng.IntN(64<<10)
	default:
		size = 1 + rng.IntN(twoProcRing)
	}
	return size, rng.IntN(twoProcRing - size + 1), r % 2
}

// runTwoProc is one end of TestTwoProcesses. It returns the end (nil if
// it could not be opened) for the caller to inspect.
func runTwoProc(boot net.Conn, active bool, peerPID int) (*end, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok {
		_ = boot.SetDeadline(dl)
	}
	dev, err := New().OpenDevice()
	if err != nil {
		return nil, err
	}
	e := &end{dev: dev}
	cq, err := newTestCQ(dev, 256)
	if err != nil {
		return e, err
	}
	e.cq = cq
	qp, err := dev.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 64, RecvDepth: twoProcCredits, MaxInline: 32})
	if err != nil {
		return e, err
	}
	e.qp = qp.(*QP)
	alloc := func(size int, access verbs.Access) (*MR, error) {
		mr, err := dev.AllocMR(size, access)
		if err != nil {
			return nil, err
		}
		e.mrs = append(e.mrs, mr.(*MR))
		return mr.(*MR), nil
	}
	ring, err := alloc(twoProcRing, verbs.AccessRemoteWrite)
	if err != nil {
		return e, err
	}
	slots, err := alloc(twoProcCredits*64, verbs.AccessLocalWrite)
	if err != nil {
		return e, err
	}
	stage, err := alloc(twoProcRing, verbs.AccessLocalWrite)
	if err != nil {
		return e, err
	}
	repost := func(i int) error {
		return e.qp.PostRecv(&verbs.RecvWR{ID: uint64(i), Local: verbs.SGE{MR: slots, Offset: i * 64, Length: 64}})
	}
	for i := range twoProcCredits {
		if err := repost(i); err != nil {
			return e, err
		}
	}

	// Bootstrap: Info, ring address and key each way.
	hello := binary.LittleEndian.AppendUint16(nil, uint16(len(e.qp.Info())))
	hello = append(hello, e.qp.Info()...)
	hello = binary.LittleEndian.AppendUint64(hello, ring.Addr())
	hello = binary.LittleEndian.AppendUint32(hello, ring.RKey())
	if _, err := boot.Write(hello); err != nil {
		return e, err
	}
	var n [2]byte
	if _, err := io.ReadFull(boot, n[:]); err != nil {
		return e, err
	}
	peer := make([]byte, int(binary.LittleEndian.Uint16(n[:]))+12)
	if _, err := io.ReadFull(boot, peer); err != nil {
		return e, err
	}
	info := peer[:len(peer)-12]
	peerAddr := binary.LittleEndian.Uint64(peer[len(info):])
	peerKey := binary.LittleEndian.Uint32(peer[len(info)+8:])
	var ready [1]byte
	if active {
		if _, err := io.ReadFull(boot, ready[:]); err != nil {
			return e, err
		}
		if err := e.qp.Connect(ctx, info, true); err != nil {
			return e, fmt.Errorf("active Connect: %w", err)
		}
	} else {
		if err := e.qp.Connect(ctx, info, false); err != nil {
			return e, fmt.Errorf("passive Connect: %w", err)
		}
		if _, err := boot.Write(ready[:]); err != nil {
			return e, err
		}
		if err := e.qp.Established(ctx); err != nil {
			return e, fmt.Errorf("Established: %w", err)
		}
	}
	if pid, _ := e.qp.PeerCred(); pid != peerPID {
		return e, fmt.Errorf("PeerCred pid %d, want %d", pid, peerPID)
	}
	direct, err := e.qp.MapRemote(peerAddr, peerKey, twoProcRing)
	if err != nil {
		return e, err
	}

	wc := make([]verbs.Completion, 8)
	// next returns the next completion of op class recv (or send).
	next := func(recv bool, sleep bool) (verbs.Completion, error) {
		for {
			k, err := e.cq.Poll(wc[:1])
			if err != nil {
				return verbs.Completion{}, err
			}
			if k == 1 {
				if err := wc[0].Err(); err != nil {
					return wc[0], err
				}
				if isRecv := wc[0].Op == verbs.OpRecv; isRecv == recv {
					return wc[0], nil
				}
				continue
			}
			if ctx.Err() != nil {
				return verbs.Completion{}, ctx.Err()
			}
			if sleep { // the eventfd path, across processes
				if err := e.cq.Arm(); err != nil {
					return verbs.Completion{}, err
				}
				if k, err := e.cq.Poll(wc[:1]); err != nil || k == 1 {
					if err != nil {
						return verbs.Completion{}, err
					}
					if isRecv := wc[0].Op == verbs.OpRecv; isRecv == recv && wc[0].Err() == nil {
						return wc[0], nil
					}
					continue
				}
				select {
				case <-bellOf(e.cq).ch:
				case <-ctx.Done():
					return verbs.Completion{}, ctx.Err()
				}
			}
		}
	}
	post := func(wr verbs.SendWR) error { return e.qp.PostSend(&wr) }
	for r := range twoProcRounds {
		size, off, path := twoProcStep(r)
		want := pattern(size, uint64(r))
		if mine := (r%2 == 0) != active; mine {
			var msg [32]byte
			binary.LittleEndian.PutUint64(msg[:], uint64(r))
			var err error
			switch path {
			case 0: // straight into the peer's ring
				copy(direct[off:], want)
				err = post(verbs.SendWR{ID: uint64(r), Op: verbs.OpSend, Inline: msg[:], Signaled: true})
			case 1:
				copy(stage.Bytes(), want)
				err = post(verbs.SendWR{ID: uint64(r), Op: verbs.OpWrite, Local: verbs.SGE{MR: stage, Length: size}, RemoteAddr: peerAddr + uint64(off), RKey: peerKey})
				if err == nil {
					err = post(verbs.SendWR{ID: uint64(r), Op: verbs.OpSend, Inline: msg[:], Signaled: true})
				}
			}
			if err != nil {
				return e, fmt.Errorf("round %d: %w", r, err)
			}
			if c, err := next(false, false); err != nil || c.ID != uint64(r) {
				return e, fmt.Errorf("round %d: send completion %+v: %v", r, c, err)
			}
			continue
		}
		c, err := next(true, r%4 >= 2)
		if err != nil {
			return e, fmt.Errorf("round %d: receive: %v (%+v)", r, err, c)
		}
		if c.Op != verbs.OpRecv || c.Len != 32 || binary.LittleEndian.Uint64(slots.Bytes()[int(c.ID)*64:]) != uint64(r) {
			return e, fmt.Errorf("round %d: completion %+v, want a 32-byte SEND for this round", r, c)
		}
		if got := ring.Bytes()[off : off+size]; !bytes.Equal(got, want) {
			i := 0
			for got[i] == want[i] {
				i++
			}
			return e, fmt.Errorf("round %d: %d bytes at %d differ from byte %d on", r, size, off, i)
		}
		if err := repost(int(c.ID)); err != nil {
			return e, err
		}
	}
	// Both sides are done before either one exits.
	if _, err := boot.Write(ready[:]); err != nil {
		return e, err
	}
	if _, err := io.ReadFull(boot, ready[:]); err != nil && !errors.Is(err, io.EOF) {
		return e, err
	}
	return e, nil
}

// pattern returns n bytes derived from seed.
func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}
