package rsock

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs/sim"
)

// A model test of the switching state machine (docs/protocol.md §9): a
// client and a server on sim run a short program of operations decoded
// from the fuzzer's bytes: writes, reads, the upgrade (Offer, Accept,
// Confirm, Switch), ring failures on either side (Resume, sending again,
// a stale Switch when the ring fails while the peer's Switch is on its
// way, a new Offer soon after with reupgradeScale), CloseWrite (Fin on
// TCP, the ring's FIN on a ring), deadlines that pass, sim faults, and
// a last step that ends the connection: both CloseWrite then Close, an
// orderly Close of one side (Goodbye), or an abort (SetLinger(0)).
//
// Each direction carries a deterministic stream (modelByte), so the reader
// checks every byte as it arrives. The invariants:
//
//   - nothing panics (a panic crashes the fuzzer);
//   - no call hangs: every call with a deadline returns within
//     modelSlack of it, a Close within closeAckTimeout and modelSlack
//     (modelFinalAck more with failover off and a ring broken), every
//     program (ops and ending) finishes within its budget, or the
//     goroutines are dumped;
//   - the bytes each side reads are a prefix of the bytes the other
//     wrote (the bytes Write reported): nothing lost, repeated or
//     reordered; an io.EOF comes only after all of them, and an orderly
//     ending without a reset ends each direction with io.EOF;
//   - errors are of the expected kinds only: os.ErrDeadlineExceeded,
//     io.EOF (reads), net.ErrClosed (after the side's own Close), EPIPE
//     (after the peer's Close), and a reset (ECONNRESET) only where one
//     is allowed: after an abort, a Close that gave up on the bytes a
//     failover owed (closeAckTimeout), or a ring failure with failover
//     off;
//   - after both sides closed, the process's goroutines come back to
//     where they were before the program.
//
// The test reaches into the connection only through the seams of the
// other switching tests: breakRing, the client's kick (the upgrade policy
// is an hour, so the program decides when it upgrades) and
// reupgradeScale.
func FuzzSwitching(f *testing.F) {
	registerSim(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		runModel(t, decodeModel(data))
	})
}

// modelProgram is a decoded input:
//
//	data[0]  flags: bit 0 rings that grow (growCfg); bit 1 NoFailover;
//	         bits 2-3 the re-upgrade backoff: none, /100, /10000, /2^20
//	         (about nothing); bits 4-5 the client's policy: only the
//	         program's kick, at once (1 ns), after 4 KiB moved, after 1 ms;
//	         bit 6 sim faults from the start
//	data[1]  the ending: bits 0-1 both CloseWrite then Close, Close of
//	         the client, Close of the server, abort (SetLinger(0) and Close)
//	         of the side bit 2 names
//	then     (op, arg) pairs, at most modelMaxOps: op bits 0-3 the code
//	         (modelOp*), bit 4 the side (client, server), bit 5 async
//	         (a write the program does not wait for)
type modelProgram struct {
	grow, noFailover, faults bool
	scale                    int64
	policy                   uint8
	ending                   uint8
	ops                      []modelOp
}

type modelOp struct {
	code  uint8
	side  int
	async bool
	arg   uint8
}

const (
	modelOpWrite      = 0 // also 1, 2, 3, 15: write size(arg)
	modelOpPause      = 4 // stop or restart the side's reader
	modelOpRead       = 5 // with the reader stopped: one Read of up to size(arg), 30 ms deadline
	modelOpKick       = 6 // start the client's upgrade
	modelOpBreak      = 7 // the side's queue pair into error, if it has a ring
	modelOpKickBreak  = 8 // kick, wait for the side's ring, arg%32 yields, break it
	modelOpSleep      = 9 // arg × 50 µs
	modelOpCloseWrite = 10
	modelOpDeadline   = 11 // a deadline that passes, a Write after it, then none
	modelOpFaults     = 12 // sim faults: arg%4 = none, delay, delay+reorder, loss
	modelOpSync       = 13 // wait for the side's queued writes
	modelOpSettled    = 14 // wait at most 300 ms for the side's Settled
)

const (
	modelMaxOps  = 24
	modelWrite   = 150 * time.Millisecond // each write's deadline
	modelRead    = 30 * time.Millisecond  // the read op's deadline
	modelRingFor = 300 * time.Millisecond // modelOpKickBreak's wait for the ring
	// modelFinalAck is how long a ring's Close waits for its final
	// message to be acknowledged (stream.finalAckTimeout). On sim, without
	// loss, that takes microseconds; only a ring whose transport failed
	// makes Close wait it out, and with failover on that ring fails over
	// instead (§9.10: Close runs a failover whose ring failed). So a Close
	// may take closeAckTimeout (the bytes a failover owes, §9.10) and
	// modelSlack, and modelFinalAck only with failover off.
	modelFinalAck = 4 * time.Second
	// modelCloseWait bounds a Close with failover off (for the budget).
	modelCloseWait = modelFinalAck + closeAckTimeout
)

// modelSlack is how late past its deadline a call may return before the
// test calls it hung. It is a hang detector, not a latency check: by
// default far above what a loaded machine delays a call (make test runs
// under the race detector beside other packages). A fuzzing session that
// hunts slow paths sets RSOCK_MODEL_SLACK lower (2s found a Close that
// waited out finalAckTimeout).
var modelSlack = func() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("RSOCK_MODEL_SLACK")); err == nil && d > 0 {
		return d
	}
	return 10 * time.Second
}()

var modelSizes = [8]int{1, 3, 100, 1500, 4096, 20000, 65534, 200000}

// modelSize is the byte count of a write or read op.
func modelSize(arg uint8) int { return modelSizes[arg&7] + int(arg>>3) }

func decodeModel(data []byte) *modelProgram {
	p := &modelProgram{}
	var flags uint8
	if len(data) > 0 {
		flags = data[0]
	}
	if len(data) > 1 {
		p.ending = data[1] & 7
	}
	p.grow, p.noFailover, p.faults = flags&1 != 0, flags&2 != 0, flags&64 != 0
	p.scale = [4]int64{-1, 100, 10000, 1 << 20}[flags>>2&3]
	p.policy = flags >> 4 & 3
	for i := 2; i+1 < len(data) && len(p.ops) < modelMaxOps; i += 2 {
		p.ops = append(p.ops, modelOp{code: data[i] & 15, side: int(data[i] >> 4 & 1), async: data[i]&32 != 0, arg: data[i+1]})
	}
	return p
}

func (p *modelProgram) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "grow=%v noFailover=%v faults=%v reupgradeScale=%d policy=%d ending=%d;", p.grow, p.noFailover, p.faults, p.scale, p.policy, p.ending)
	for _, op := range p.ops {
		b.WriteString(" " + op.String())
	}
	return b.String()
}

func (op modelOp) String() string {
	side := [2]string{"c", "s"}[op.side]
	switch op.code {
	case modelOpPause:
		return "pause/" + side
	case modelOpRead:
		return fmt.Sprintf("read/%s(%d)", side, modelSize(op.arg))
	case modelOpKick:
		return "kick"
	case modelOpBreak:
		return "break/" + side
	case modelOpKickBreak:
		return fmt.Sprintf("kickbreak/%s(%d)", side, op.arg%32)
	case modelOpSleep:
		return fmt.Sprintf("sleep(%v)", time.Duration(op.arg)*50*time.Microsecond)
	case modelOpCloseWrite:
		return "closewrite/" + side
	case modelOpDeadline:
		return "deadline/" + side
	case modelOpFaults:
		return fmt.Sprintf("faults(%d)", op.arg%4)
	case modelOpSync:
		return "sync/" + side
	case modelOpSettled:
		return "settled/" + side
	}
	a := ""
	if op.async {
		a = "&"
	}
	return fmt.Sprintf("write/%s(%d)%s", side, modelSize(op.arg), a)
}

// budget bounds how long the program and its ending may take.
func (p *modelProgram) budget() time.Duration {
	d := 6*time.Second + 2*modelCloseWait
	for _, op := range p.ops {
		switch op.code {
		case modelOpPause, modelOpRead, modelOpSleep:
			d += 50 * time.Millisecond
		case modelOpKickBreak, modelOpSettled:
			d += modelRingFor
		case modelOpKick, modelOpBreak, modelOpFaults, modelOpSync:
		default: // writes, CloseWrite, deadline: one bounded call each
			d += modelWrite + 50*time.Millisecond
		}
	}
	return d
}

// modelFaults are the sim faults of modelOpFaults.
var modelFaults = [4]sim.Faults{
	{},
	{Delay: 30 * time.Microsecond},
	{Delay: 30 * time.Microsecond, Reorder: true},
	{LossRate: 0.02, RetransmitDelay: 50 * time.Microsecond, Reorder: true},
}

// modelByte is byte i of the stream that side dir (0 client, 1 server)
// writes: no period, so a lost, repeated or reordered piece shows at once.
func modelByte(dir int, i uint64) byte {
	x := (i>>3 | uint64(dir)<<62) + 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return byte(x >> (8 * (i & 7)))
}

// modelMismatch returns the index of the first byte of b that is not the
// stream dir's from off, or -1.
func modelMismatch(b []byte, dir int, off uint64) int {
	for j := range b {
		if b[j] != modelByte(dir, off+uint64(j)) {
			return j
		}
	}
	return -1
}

// model runs one program.
type model struct {
	p     *modelProgram
	start time.Time
	ends  [2]*modelEnd
	broke atomic.Bool // a ring was broken

	mu      sync.Mutex
	bad     []string
	errs    []modelErr // every error a call returned, judged at the end
	closing time.Time  // when the first Close of the ending began
	lenient bool       // an abort, or a close on TCP with bytes unread: resets may follow
}

type modelErr struct {
	at  time.Time
	end string
	op  string
	err error
}

func (m *model) failf(format string, args ...any) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.bad = append(m.bad, fmt.Sprintf("%6.3fs: ", time.Since(m.start).Seconds())+fmt.Sprintf(format, args...))
}

// returned records what a call of e returned, and checks that it came
// within modelSlack of its deadline dl (zero: none).
func (m *model) returned(e *modelEnd, op string, dl time.Time, err error) {
	now := time.Now()
	if !dl.IsZero() && now.Sub(dl) > modelSlack {
		m.failf("%s %s returned %v after its deadline (%v)", e.name, op, now.Sub(dl), err)
	}
	if err != nil {
		m.mu.Lock()
		m.errs = append(m.errs, modelErr{now, e.name, op, err})
		m.mu.Unlock()
	}
}

// modelEnd is one side of the connection: its writer goroutine, which
// makes every Write (so that the stream offset is the sum of what Write
// reported), and its reader goroutine, which drains what it receives
// unless the program stopped it.
type modelEnd struct {
	m    *model
	name string
	idx  int // the stream this side writes (modelByte's dir)
	c    *Conn
	peer *modelEnd

	cmds    chan modelCmd
	wdone   chan struct{}
	wmu     sync.Mutex
	written uint64 // bytes Write reported
	finQ    bool   // main: CloseWrite queued; later writes are skipped
	closed  bool   // main: Close called

	rmu      sync.Mutex
	received uint64
	mismatch bool
	rerr     error // what ended the reading
	paused   bool  // main: the reader goroutine is parked
	pauseReq atomic.Bool
	parked   chan struct{}
	unpause  chan struct{}
	stop     chan struct{}
	rdone    chan struct{}
}

type modelCmd struct {
	kind int // cmdWrite, cmdCloseWrite, cmdDeadline, cmdSync
	n    int
	wait time.Duration
	done chan struct{}
}

const (
	cmdWrite = iota
	cmdCloseWrite
	cmdDeadline
	cmdSync
)

func (e *modelEnd) writer() {
	defer close(e.wdone)
	for cmd := range e.cmds {
		switch cmd.kind {
		case cmdWrite:
			dl := time.Now().Add(cmd.wait)
			_ = e.c.SetWriteDeadline(dl)
			e.write(cmd.n, dl)
		case cmdDeadline:
			// A deadline that passes, a Write after it; then the reads
			// have none again (the reader goes on) and the next write sets
			// its own.
			dl := time.Now().Add(time.Millisecond)
			_ = e.c.SetDeadline(dl)
			time.Sleep(2 * time.Millisecond)
			e.write(cmd.n, dl)
			_ = e.c.SetReadDeadline(time.Time{})
		case cmdCloseWrite:
			dl := time.Now().Add(cmd.wait)
			_ = e.c.SetWriteDeadline(dl)
			err := e.c.CloseWrite()
			e.m.returned(e, "CloseWrite", dl, err)
		}
		if cmd.done != nil {
			close(cmd.done)
		}
	}
}

func (e *modelEnd) write(n int, dl time.Time) {
	e.wmu.Lock()
	off := e.written
	e.wmu.Unlock()
	b := make([]byte, n)
	for j := range b {
		b[j] = modelByte(e.idx, off+uint64(j))
	}
	k, err := e.c.Write(b)
	e.wmu.Lock()
	e.written += uint64(k)
	e.wmu.Unlock()
	if err == nil && k != n {
		e.m.failf("%s Write(%d) returned %d and no error", e.name, n, k)
	}
	e.m.returned(e, fmt.Sprintf("Write(%d at %d) = %d", n, off, k), dl, err)
}

func (e *modelEnd) wrote() uint64 {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	return e.written
}

// send queues cmd for the writer; wait: until it has run.
func (e *modelEnd) send(cmd modelCmd, wait bool) {
	if wait {
		cmd.done = make(chan struct{})
	}
	e.cmds <- cmd
	if wait {
		<-cmd.done
	}
}

// reader drains the side's receiving until it ends, parking when the
// program stops it (pause).
func (e *modelEnd) reader() {
	defer close(e.rdone)
	buf := make([]byte, 48<<10)
	for {
		if e.pauseReq.Load() {
			select {
			case e.parked <- struct{}{}:
			case <-e.stop:
				return
			}
			select {
			case <-e.unpause:
			case <-e.stop:
				return
			}
			continue
		}
		n, err := e.c.Read(buf)
		if e.took(buf[:n], err, time.Time{}) {
			return
		}
		if err != nil { // a deadline: the pause's, or a deadline op's
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// took checks and counts the bytes a Read returned; it reports whether
// err ended the reading (anything but a deadline).
func (e *modelEnd) took(b []byte, err error, dl time.Time) bool {
	e.rmu.Lock()
	if i := modelMismatch(b, e.peer.idx, e.received); i >= 0 && !e.mismatch {
		e.mismatch = true
		at := e.received + uint64(i)
		e.m.failf("%s read byte %d of the %s's stream as %#02x, want %#02x (a byte lost, repeated or out of order; %s wrote %d bytes so far)",
			e.name, at, e.peer.name, b[i], modelByte(e.peer.idx, at), e.peer.name, e.peer.wrote())
	}
	e.received += uint64(len(b))
	ended := err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	if ended && e.rerr == nil {
		e.rerr = err
	}
	e.rmu.Unlock()
	if err != nil && !(dl.IsZero() && errors.Is(err, os.ErrDeadlineExceeded)) {
		e.m.returned(e, "Read", dl, err)
	}
	return ended
}

// pause parks the reader goroutine: a read deadline in the past ends its
// Read, which must return at once.
func (e *modelEnd) pause() {
	if e.paused {
		return
	}
	e.paused = true
	e.pauseReq.Store(true)
	until := time.Now().Add(modelSlack)
	for {
		_ = e.c.SetReadDeadline(aLongTimeAgo)
		select {
		case <-e.parked:
			return
		case <-e.rdone:
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(until) {
			e.m.failf("%s: a Read did not return within %v of its deadline moved to the past", e.name, modelSlack)
			return
		}
	}
}

func (e *modelEnd) resume() {
	if !e.paused {
		return
	}
	e.paused = false
	_ = e.c.SetReadDeadline(time.Time{})
	e.pauseReq.Store(false)
	for {
		select {
		case e.unpause <- struct{}{}:
			return
		case <-e.parked: // it parked after pause gave up on it
		case <-e.rdone:
			return
		}
	}
}

// readOp is one Read by the program, the reader goroutine parked.
func (e *modelEnd) readOp(n int) {
	if !e.paused {
		return
	}
	dl := time.Now().Add(modelRead)
	_ = e.c.SetReadDeadline(dl)
	b := make([]byte, n)
	k, err := e.c.Read(b)
	e.took(b[:k], err, dl)
}

// closeEnd closes e (abort: with SetLinger(0) first), the write deadline
// cleared so that what a failover owes goes out (a background resend
// stops at the write deadline).
func (m *model) closeEnd(e *modelEnd, abort bool) {
	_ = e.c.SetWriteDeadline(time.Time{})
	start := time.Now()
	m.mu.Lock()
	if m.closing.IsZero() {
		m.closing = start
	}
	if abort {
		m.lenient = true
	}
	m.mu.Unlock()
	e.rmu.Lock()
	unread := e.received < e.peer.wrote()
	e.rmu.Unlock()
	if info, _ := InfoOf(e.c); unread && info.Transport == "tcp" {
		// On TCP, a close that leaves the peer's bytes unread (or meets
		// more of them after it) resets, as plain TCP's does (§9.6).
		m.mu.Lock()
		m.lenient = true
		m.mu.Unlock()
	}
	if abort {
		_ = e.c.SetLinger(0)
	}
	e.closed = true
	err := e.c.Close()
	limit := closeAckTimeout + modelSlack
	if m.p.noFailover && m.broke.Load() {
		// A failure is judged after suspectGrace, and one during Close
		// not at all: Close waits for its final message.
		limit = modelCloseWait + modelSlack
	}
	if d := time.Since(start); d > limit {
		m.failf("%s Close took %v (at most %v expected)", e.name, d, limit)
	}
	m.returned(e, "Close", time.Time{}, err)
}

func runModel(t *testing.T, p *modelProgram) {
	g0 := runtime.NumGoroutine()
	reupgradeScale.Store(p.scale)
	t.Cleanup(func() { reupgradeScale.Store(1) })
	if p.faults {
		simProv.SetFaults(modelFaults[3])
	}
	t.Cleanup(func() { simProv.SetFaults(sim.Faults{}) })

	cfg := swCfg("sim", time.Hour)
	if p.grow {
		cfg = growCfg("sim", time.Hour)
	}
	cfg.UpgradeBytes = math.MaxInt // never by bytes
	cfg.NoFailover = p.noFailover
	cfg.HandshakeTimeout = 3 * time.Second
	switch p.policy {
	case 1:
		cfg.UpgradeAfter = time.Nanosecond
	case 2:
		cfg.UpgradeBytes = 4 << 10
	case 3:
		cfg.UpgradeAfter = time.Millisecond
	}
	ln := listen(t, cfg)
	c, s := dialAccept(t, ln, cfg)

	m := &model{p: p, start: time.Now()}
	for i, x := range []*Conn{c, s} {
		m.ends[i] = &modelEnd{m: m, name: [2]string{"client", "server"}[i], idx: i, c: x,
			cmds: make(chan modelCmd, 2*modelMaxOps), wdone: make(chan struct{}),
			parked: make(chan struct{}), unpause: make(chan struct{}), stop: make(chan struct{}), rdone: make(chan struct{})}
	}
	m.ends[0].peer, m.ends[1].peer = m.ends[1], m.ends[0]
	for _, e := range m.ends {
		go e.writer()
		go e.reader()
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		m.program()
		m.ending()
	}()
	budget := p.budget()
	select {
	case <-done:
	case <-time.After(budget):
		t.Fatalf("the program did not finish within %v: %s\n%s\n%s", budget, p, m.state(), goroutines())
	}
	ln.Close()
	m.check()

	// Every goroutine of the connection ends once both sides closed.
	var g int
	for until := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if g = runtime.NumGoroutine(); g <= g0 || time.Now().After(until) {
			break
		}
	}
	if g > g0 {
		m.failf("%d goroutines 5 s after both sides closed, %d before the program\n%s", g, g0, goroutines())
	}
	if testing.Verbose() {
		t.Logf("program: %s\n%s", p, m.state())
	}
	if len(m.bad) > 0 {
		t.Errorf("program: %s\n%s\n%s", p, m.state(), strings.Join(m.bad, "\n"))
	}
}

// program runs the ops.
func (m *model) program() {
	for _, op := range m.p.ops {
		e := m.ends[op.side]
		switch op.code {
		case modelOpPause:
			if e.paused {
				e.resume()
			} else {
				e.pause()
			}
		case modelOpRead:
			e.readOp(modelSize(op.arg))
		case modelOpKick:
			m.ends[0].c.w.kick()
		case modelOpBreak:
			m.brk(e)
		case modelOpKickBreak:
			m.ends[0].c.w.kick()
			until := time.Now().Add(modelRingFor)
			for i := 0; e.c.ring() == nil && time.Now().Before(until); i++ {
				if i < 1000 {
					runtime.Gosched()
				} else {
					time.Sleep(50 * time.Microsecond)
				}
			}
			for range op.arg % 32 {
				runtime.Gosched()
			}
			m.brk(e)
		case modelOpSleep:
			time.Sleep(time.Duration(op.arg) * 50 * time.Microsecond)
		case modelOpCloseWrite:
			if !e.finQ {
				e.finQ = true
				e.send(modelCmd{kind: cmdCloseWrite, wait: modelWrite}, !op.async)
			}
		case modelOpDeadline:
			if !e.finQ {
				e.send(modelCmd{kind: cmdDeadline, n: modelSize(op.arg)}, true)
			}
		case modelOpFaults:
			simProv.SetFaults(modelFaults[op.arg%4])
		case modelOpSync:
			e.send(modelCmd{kind: cmdSync}, true)
		case modelOpSettled:
			_, _ = settleWithin(e.c, modelRingFor)
		default:
			if !e.finQ {
				e.send(modelCmd{kind: cmdWrite, n: modelSize(op.arg), wait: modelWrite}, !op.async)
			}
		}
	}
}

func (m *model) brk(e *modelEnd) {
	m.broke.Store(true)
	breakRing(e.c)
}

// ending ends the connection as the program says, and waits for the
// writers and readers.
func (m *model) ending() {
	for _, e := range m.ends {
		e.resume()
	}
	for _, e := range m.ends {
		e.send(modelCmd{kind: cmdSync}, true)
	}
	x := m.ends[m.p.ending>>2&1]
	switch m.p.ending & 3 {
	case 0:
		// Both CloseWrite (again, if one failed at its deadline), each
		// reader reads to the end, then both Close.
		for _, e := range m.ends {
			e.send(modelCmd{kind: cmdCloseWrite, wait: 3 * time.Second}, false)
		}
		for _, e := range m.ends {
			e.send(modelCmd{kind: cmdSync}, true)
		}
		for _, e := range m.ends {
			<-e.rdone
		}
		for _, e := range m.ends {
			m.closeEnd(e, false)
		}
	case 1, 2:
		x = m.ends[m.p.ending&3-1]
		fallthrough
	case 3:
		m.closeEnd(x, m.p.ending&3 == 3)
		<-x.peer.rdone // the peer's reading ends: EOF, or a reset
		m.closeEnd(x.peer, false)
	}
	for _, e := range m.ends {
		close(e.cmds)
		<-e.wdone
		close(e.stop)
		<-e.rdone
	}
}

// resetAllowed reports whether a reset (an error matching ECONNRESET) at
// at is one the program may cause.
func (m *model) resetAllowed(at time.Time, err error) bool {
	m.mu.Lock()
	closing, lenient := m.closing, m.lenient
	m.mu.Unlock()
	switch {
	case m.p.noFailover && m.broke.Load():
		return true // a ring failure resets
	case closing.IsZero() || at.Before(closing):
		return false // while both sides are open: none but the above
	case lenient:
		return true // an abort
	case strings.Contains(err.Error(), "closed before the failover sent its bytes again"):
		// A Close that gave up after closeAckTimeout on the bytes a
		// failover owed (the write deadline had stopped their resend):
		// its goodbye is an abort (§9.10).
		return true
	}
	return false
}

// check judges the errors and the bytes once the program is over.
func (m *model) check() {
	resets := false
	for _, r := range m.errs {
		err := r.err
		e := m.ends[0]
		if r.end != e.name {
			e = m.ends[1]
		}
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
		case err == io.EOF && r.op == "Read":
		case errors.Is(err, net.ErrClosed) && e.closed:
		case errors.Is(err, syscall.EPIPE) && e.peer.closed:
		case errors.Is(err, syscall.ECONNRESET) && m.resetAllowed(r.at, err):
			resets = true
		default:
			m.failf("%s %s at %.3fs: unexpected error: %v", r.end, r.op, r.at.Sub(m.start).Seconds(), err)
		}
	}
	for _, e := range m.ends {
		w := e.peer
		sent := w.wrote()
		e.rmu.Lock()
		got, rerr := e.received, e.rerr
		e.rmu.Unlock()
		switch {
		case got > sent:
			m.failf("%s read %d bytes; the %s wrote %d", e.name, got, w.name, sent)
		case rerr == io.EOF && got != sent:
			m.failf("%s read io.EOF after %d bytes; the %s wrote %d", e.name, got, w.name, sent)
		}
		// An orderly ending without a reset ends each direction that is
		// read to its end with io.EOF: every direction when both closed
		// their writing; the closed side's when one side closed.
		orderly := m.p.ending&3 == 0 || m.p.ending&3 != 3 && e == m.ends[2-m.p.ending&3]
		if orderly && !resets && rerr != io.EOF {
			m.failf("%s's reading ended with %v, not io.EOF (read %d bytes; the %s wrote %d)", e.name, rerr, got, w.name, sent)
		}
	}
}

// state describes where the program left both sides.
func (m *model) state() string {
	var b strings.Builder
	for _, e := range m.ends {
		e.rmu.Lock()
		got, rerr := e.received, e.rerr
		e.rmu.Unlock()
		info, _ := InfoOf(e.c)
		fmt.Fprintf(&b, "%s: wrote %d, read %d (%v); %s %s: %s\n", e.name, e.wrote(), got, rerr, info.Transport, info.Code, info.Reason)
		for _, sw := range info.Switches {
			fmt.Fprintf(&b, "    %s %s -> %s: %s\n", sw.Direction, sw.From, sw.To, sw.Cause)
		}
	}
	return b.String()
}

// goroutines returns every goroutine's stack (at most 256 KiB).
func goroutines() string {
	buf := make([]byte, 256<<10)
	return string(buf[:runtime.Stack(buf, true)])
}
