package verbstest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// testAllocMR: sizes, zeroing, remote keys, Close and double Close.
func (s *suite) testAllocMR(t *testing.T) {
	dev := s.openDevice(t)
	seen := make(map[uint32]bool)
	var live []verbs.MR
	defer func() {
		for _, mr := range live {
			_ = mr.Close()
		}
	}()
	for _, size := range []int{1, 100, 4096, 65537, 1<<20 + 3} {
		for _, access := range []verbs.Access{localWrite, remoteWrite} {
			mr, err := dev.AllocMR(size, access)
			if err != nil {
				t.Fatalf("AllocMR(%d, %v): %v", size, access, err)
			}
			b := mr.Bytes()
			if len(b) != size {
				t.Errorf("AllocMR(%d): len(Bytes()) = %d", size, len(b))
			}
			if i := bytes.IndexFunc(b, func(r rune) bool { return r != 0 }); i >= 0 {
				t.Errorf("AllocMR(%d): byte %d not zero", size, i)
			}
			fill(b, uint64(size)) // the memory is writable
			if access&verbs.AccessRemoteWrite != 0 {
				if mr.RKey() == 0 {
					t.Errorf("AllocMR(%d, remote write): RKey() = 0", size)
				}
				if seen[mr.RKey()] {
					t.Errorf("AllocMR(%d, remote write): RKey %#x already in use", size, mr.RKey())
				}
				seen[mr.RKey()] = true
				live = append(live, mr) // keep it so that keys must differ
				continue
			}
			if err := mr.Close(); err != nil {
				t.Errorf("MR.Close: %v", err)
			}
			_ = mr.Close() // must not panic
		}
	}
	for _, mr := range live {
		if err := mr.Close(); err != nil {
			t.Errorf("MR.Close: %v", err)
		}
		_ = mr.Close()
	}
	live = nil
}

// testWriteThenSend: a WRITE lands at the right offset, and a SEND posted
// after it arrives only once the WRITE's data is visible.
func (s *suite) testWriteThenSend(t *testing.T) {
	const (
		dstSize  = 64 << 10
		maxWrite = 8 << 10
		msgSize  = 8
		sendArea = maxWrite // offset of the SEND payload in the source MR
	)
	iterations := 2000
	if testing.Short() {
		iterations = 300
	}
	pr := s.newPair(t, defaultConfig)
	dst := pr.dst
	rbuf := pr.alloc(pr.b, defaultConfig.recvDepth*msgSize, localWrite)
	src := pr.alloc(pr.a, maxWrite+msgSize, localWrite)
	for i := range defaultConfig.recvDepth {
		pr.postRecv(pr.b, rbuf, i, msgSize)
	}
	maxInline := pr.a.qp.MaxInline()
	shadow := make([]byte, dstSize)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range iterations {
		size := 1 + rng.IntN(maxWrite)
		if i%4 == 0 {
			size = 1 + rng.IntN(min(maxWrite, max(maxInline, 1)))
		}
		off := rng.IntN(dstSize - size + 1)
		data := pattern(size, uint64(i))
		copy(shadow[off:], data)

		write := verbs.SendWR{ID: uint64(2 * i), Op: verbs.OpWrite, RemoteAddr: dst.Addr() + uint64(off), RKey: dst.RKey()}
		if size <= maxInline && i%3 != 2 {
			write.Inline = data
		} else {
			copy(src.Bytes(), data)
			write.Local = verbs.SGE{MR: src, Offset: 0, Length: size}
		}
		send := verbs.SendWR{ID: uint64(2*i + 1), Op: verbs.OpSend, Signaled: true}
		msg := binary.LittleEndian.AppendUint64(nil, uint64(i))
		if msgSize <= maxInline && i%3 != 0 {
			send.Inline = msg
		} else {
			copy(src.Bytes()[sendArea:], msg)
			send.Local = verbs.SGE{MR: src, Offset: sendArea, Length: msgSize}
		}
		if i%2 == 1 {
			// One post for both (SendWR.Next), both inline at times;
			// one doorbell where the provider counts them.
			write.Next = &send
			rung := doorbells(pr.a.qp)
			pr.postSend(pr.a, write)
			if n, counted := rung(); counted && n != 1 {
				t.Fatalf("iteration %d: a WRITE and a SEND chained took %d doorbells", i, n)
			}
		} else {
			pr.postSend(pr.a, write)
			pr.postSend(pr.a, send)
		}

		c := pr.one(pr.b.cq)
		slot := int(c.ID)
		if !expectOK(t, c, verbs.OpRecv, uint64(i%defaultConfig.recvDepth)) || c.Len != msgSize {
			t.Fatalf("iteration %d: recv completion %+v, want Len %d", i, c, msgSize)
		}
		got := binary.LittleEndian.Uint64(rbuf.Bytes()[slot*msgSize:])
		if got != uint64(i) {
			t.Fatalf("iteration %d: received message %d", i, got)
		}
		if !bytes.Equal(dst.Bytes(), shadow) {
			t.Fatalf("iteration %d: WRITE of %d bytes at %d not visible when the SEND after it arrived (first difference at %d)",
				i, size, off, firstDiff(dst.Bytes(), shadow))
		}
		pr.postRecv(pr.b, rbuf, slot, msgSize)
		// The signaled SEND retires the WRITE: src may be reused.
		expectOK(t, pr.one(pr.a.cq), verbs.OpSend, send.ID)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// testSendRecv: many SENDs of varied sizes land in the posted buffers in
// order, with the receiver re-posting and granting credits.
func (s *suite) testSendRecv(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 2000
	}
	cfg := defaultConfig
	pr := s.newPair(t, cfg)
	bufSize := sendLimit(pr.a.qp, 512)
	rbuf := pr.alloc(pr.b, cfg.recvDepth*bufSize, localWrite)
	src := pr.alloc(pr.a, cfg.sendDepth*bufSize, localWrite)
	for i := range cfg.recvDepth {
		pr.postRecv(pr.b, rbuf, i, bufSize)
	}
	maxInline := pr.a.qp.MaxInline()
	sizeOf := func(i int) int {
		switch {
		case i%97 == 0:
			return 0
		case i%5 == 0:
			return bufSize
		}
		return 1 + int(uint32(i)*2654435761%uint32(bufSize))
	}
	credits := make(chan struct{}, cfg.recvDepth)
	for range cfg.recvDepth {
		credits <- struct{}{}
	}

	var wg sync.WaitGroup
	wg.Go(func() { // receiver
		for i := range n {
			wc, err := pollN(pr.ctx, pr.b.cq, 1)
			if err != nil {
				pr.fail("receiver: %v", err)
				return
			}
			c, size := wc[0], sizeOf(i)
			if c.Status != verbs.StatusSuccess || c.Op != verbs.OpRecv || c.Len != size ||
				c.ID != uint64(i%cfg.recvDepth) {
				pr.fail("message %d (%d bytes): completion %+v", i, size, c)
				return
			}
			slot := int(c.ID)
			if got := rbuf.Bytes()[slot*bufSize : slot*bufSize+size]; !bytes.Equal(got, pattern(size, uint64(i))) {
				pr.fail("message %d: wrong payload", i)
				return
			}
			err = pr.b.qp.PostRecv(&verbs.RecvWR{ID: c.ID, Local: verbs.SGE{MR: rbuf, Offset: slot * bufSize, Length: bufSize}})
			if err != nil {
				pr.fail("re-post RECV: %v", err)
				return
			}
			credits <- struct{}{}
		}
	})

	// Sender: at most sendDepth outstanding, every 16th signaled.
	retired := 0 // sends 0..retired-1 are complete
	absorb := func(wc []verbs.Completion) bool {
		for _, c := range wc {
			if c.Status != verbs.StatusSuccess || c.Op != verbs.OpSend || int(c.ID) < retired {
				pr.fail("send completion %+v after %d retired", c, retired)
				return false
			}
			retired = int(c.ID) + 1
		}
		return true
	}
	for i := 0; i < n && pr.ctx.Err() == nil; i++ {
		select {
		case <-credits:
		case <-pr.ctx.Done():
			continue
		}
		wc, err := drain(pr.a.cq)
		for err == nil && absorb(wc) && i-retired >= cfg.sendDepth {
			wc, err = pollN(pr.ctx, pr.a.cq, 1)
		}
		if err != nil {
			pr.fail("sender: %v", err)
		}
		if pr.ctx.Err() != nil {
			break
		}
		size := sizeOf(i)
		data := pattern(size, uint64(i))
		wr := verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Signaled: i%16 == 15 || i == n-1}
		if size <= maxInline && i%2 == 0 {
			wr.Inline = data
		} else {
			slot := i % cfg.sendDepth
			copy(src.Bytes()[slot*bufSize:], data)
			wr.Local = verbs.SGE{MR: src, Offset: slot * bufSize, Length: size}
		}
		if err := pr.a.qp.PostSend(&wr); err != nil {
			pr.fail("PostSend %d: %v", i, err)
			break
		}
	}
	for retired < n && pr.ctx.Err() == nil {
		wc, err := pollN(pr.ctx, pr.a.cq, 1)
		if err != nil {
			pr.fail("sender: %v", err)
			break
		}
		if !absorb(wc) {
			break
		}
	}
	wg.Wait()
}

// testRecvBeforeConnect: RECVs posted on new QPs, before any Connect, take
// the first SENDs once connected.
func (s *suite) testRecvBeforeConnect(t *testing.T) {
	const n = 4
	var abuf, bbuf verbs.MR
	cfg := defaultConfig
	cfg.beforeConnect = func(pr *pair) {
		abuf, bbuf = pr.alloc(pr.a, n*8, localWrite), pr.alloc(pr.b, n*8, localWrite)
		for i := range n {
			pr.postRecv(pr.a, abuf, i, 8)
			pr.postRecv(pr.b, bbuf, i, 8)
		}
	}
	pr := s.newPair(t, cfg)
	for _, dir := range []struct {
		from, to *side
		buf      verbs.MR
	}{{pr.a, pr.b, bbuf}, {pr.b, pr.a, abuf}} {
		src := pr.alloc(dir.from, n*8, localWrite)
		for i := range n {
			binary.LittleEndian.PutUint64(src.Bytes()[i*8:], uint64(100+i))
			pr.postSend(dir.from, verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Local: verbs.SGE{MR: src, Offset: i * 8, Length: 8}, Signaled: true})
		}
		wc, err := pollN(pr.ctx, dir.to.cq, n)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range wc {
			if expectOK(t, c, verbs.OpRecv, uint64(i)) && binary.LittleEndian.Uint64(dir.buf.Bytes()[i*8:]) != uint64(100+i) {
				t.Errorf("RECV %d posted before Connect: wrong payload", i)
			}
		}
		if wc, err = pollN(pr.ctx, dir.from.cq, n); err != nil {
			t.Fatal(err)
		}
		for i, c := range wc {
			expectOK(t, c, verbs.OpSend, uint64(i))
		}
	}
}

// testChain: a chain longer than a provider posts at once (ibverbs: 8)
// executes in order, each request once, with few doorbells.
func (s *suite) testChain(t *testing.T) {
	const n = 20
	pr := s.newPair(t, defaultConfig)
	rbuf := pr.alloc(pr.b, n, localWrite)
	for i := range n {
		pr.postRecv(pr.b, rbuf, i, 1)
	}
	wrs := make([]verbs.SendWR, n)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: uint64(i), Op: verbs.OpSend, Inline: []byte{byte(100 + i)}, Signaled: i == n-1}
		if i > 0 {
			wrs[i-1].Next = &wrs[i]
		}
	}
	rung := doorbells(pr.a.qp)
	pr.postSend(pr.a, wrs[0])
	if bells, counted := rung(); counted && bells > 3 {
		t.Errorf("a chain of %d took %d doorbells", n, bells)
	}
	for i := range n {
		c := pr.one(pr.b.cq)
		if expectOK(t, c, verbs.OpRecv, uint64(i)) && rbuf.Bytes()[i] != byte(100+i) {
			t.Fatalf("receive %d holds message %d", i, rbuf.Bytes()[i]-100)
		}
	}
	expectOK(t, pr.one(pr.a.cq), verbs.OpSend, n-1)
}

// doorbells returns a function that reports how many doorbells qp has rung
// since, and whether its provider counts them (ibverbs: QP.Doorbells).
func doorbells(qp verbs.QP) func() (uint64, bool) {
	bells, counted := qp.(interface{ Doorbells() uint64 })
	if !counted {
		return func() (uint64, bool) { return 0, false }
	}
	before := bells.Doorbells()
	return func() (uint64, bool) { return bells.Doorbells() - before, true }
}

// testInline: inline data is copied by PostSend; too long is refused.
func (s *suite) testInline(t *testing.T) {
	pr := s.newPair(t, defaultConfig)
	maxInline := pr.a.qp.MaxInline()
	if maxInline <= 0 {
		t.Skip("the provider grants no inline data")
	}
	dst := pr.dst
	rbuf := pr.alloc(pr.b, 4*maxInline, localWrite)
	for i := range 4 {
		pr.postRecv(pr.b, rbuf, i, maxInline)
	}

	buf := pattern(maxInline, 7)
	orig := bytes.Clone(buf)
	pr.postSend(pr.a, verbs.SendWR{ID: 1, Op: verbs.OpWrite, Inline: buf, RemoteAddr: dst.Addr() + 100, RKey: dst.RKey()})
	for i := range buf {
		buf[i] = ^buf[i]
	}
	pr.postSend(pr.a, verbs.SendWR{ID: 2, Op: verbs.OpSend, Inline: buf, Signaled: true})
	sent := bytes.Clone(buf)
	clear(buf)

	c := pr.one(pr.b.cq)
	if expectOK(t, c, verbs.OpRecv, 0) && c.Len != maxInline {
		t.Errorf("inline SEND: Len %d, want %d", c.Len, maxInline)
	}
	if !bytes.Equal(rbuf.Bytes()[:maxInline], sent) {
		t.Error("inline SEND: the peer saw the buffer as changed after PostSend")
	}
	if !bytes.Equal(dst.Bytes()[100:100+maxInline], orig) {
		t.Error("inline WRITE: the peer saw the buffer as changed after PostSend")
	}
	expectOK(t, pr.one(pr.a.cq), verbs.OpSend, 2)

	long := make([]byte, maxInline+1)
	err := pr.a.qp.PostSend(&verbs.SendWR{ID: 3, Op: verbs.OpSend, Inline: long, Signaled: true})
	if !errors.Is(err, verbs.ErrInlineTooLong) {
		t.Errorf("PostSend with %d inline bytes (max %d): %v, want ErrInlineTooLong", len(long), maxInline, err)
	}
	// A refused post has no effect: the QP still works.
	pr.postSend(pr.a, verbs.SendWR{ID: 4, Op: verbs.OpSend, Inline: long[:1], Signaled: true})
	if c := pr.one(pr.b.cq); expectOK(t, c, verbs.OpRecv, 1) && c.Len != 1 {
		t.Errorf("SEND after refused post: Len %d, want 1", c.Len)
	}
	expectOK(t, pr.one(pr.a.cq), verbs.OpSend, 4)

	// In a chain, the refused request and those after it are not posted;
	// the one before it may have been.
	third := verbs.SendWR{ID: 7, Op: verbs.OpSend, Inline: []byte{7}, Signaled: true}
	second := verbs.SendWR{ID: 6, Op: verbs.OpSend, Inline: long, Signaled: true, Next: &third}
	err = pr.a.qp.PostSend(&verbs.SendWR{ID: 5, Op: verbs.OpSend, Inline: []byte{5}, Signaled: true, Next: &second})
	if !errors.Is(err, verbs.ErrInlineTooLong) {
		t.Fatalf("PostSend of a chain holding %d inline bytes (max %d): %v, want ErrInlineTooLong", len(long), maxInline, err)
	}
	pr.postSend(pr.a, verbs.SendWR{ID: 8, Op: verbs.OpSend, Inline: []byte{8}, Signaled: true})
	for slot := 2; ; slot++ {
		c := pr.one(pr.b.cq)
		if !expectOK(t, c, verbs.OpRecv, uint64(slot)) || c.Len != 1 {
			t.Fatalf("after a refused chain: %+v", c)
		}
		got := rbuf.Bytes()[slot*maxInline]
		if got == 8 {
			break
		}
		if got != 5 || slot > 2 {
			t.Fatalf("after a chain refused at its second request, the peer received message %d", got)
		}
	}
}

// testSignaled: only signaled successful sends produce send completions.
func (s *suite) testSignaled(t *testing.T) {
	cfg := defaultConfig
	cfg.sendDepth = 16
	pr := s.newPair(t, cfg)
	dst := pr.dst
	rbuf := pr.alloc(pr.b, cfg.recvDepth*8, localWrite)
	src := pr.alloc(pr.a, 8, localWrite)
	posted := 0
	for i := range cfg.recvDepth {
		pr.postRecv(pr.b, rbuf, i, 8)
	}
	id := uint64(0)
	for round := range 40 {
		unsignaled := round % 8
		op := verbs.OpWrite
		if round%2 == 1 {
			op = verbs.OpSend
		}
		for range unsignaled + 1 {
			wr := verbs.SendWR{ID: id, Op: op, Local: verbs.SGE{MR: src, Length: 8}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
			id++
			if op == verbs.OpSend {
				posted++
			}
			pr.postSend(pr.a, wr)
		}
		last := verbs.SendWR{ID: id, Op: op, Local: verbs.SGE{MR: src, Length: 8}, RemoteAddr: dst.Addr(), RKey: dst.RKey(), Signaled: true}
		id++
		if op == verbs.OpSend {
			posted++
		}
		pr.postSend(pr.a, last)
		// Receive every SEND of the round, signaled or not.
		for posted > 0 {
			c := pr.one(pr.b.cq)
			if c.Status != verbs.StatusSuccess || c.Op != verbs.OpRecv {
				t.Fatalf("round %d: receiver got %+v", round, c)
			}
			pr.postRecv(pr.b, rbuf, int(c.ID), 8)
			posted--
		}
		c := pr.one(pr.a.cq)
		if !expectOK(t, c, op, last.ID) {
			t.Fatalf("round %d: %d unsignaled then one signaled %v", round, unsignaled, op)
		}
	}
	extra, err := drain(pr.a.cq)
	if err != nil || len(extra) > 0 {
		t.Errorf("after the last signaled send: %d more completions (%v), err %v", len(extra), extra, err)
	}
}
