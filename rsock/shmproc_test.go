//go:build linux

package rsock

// Two-process tests of the shm transport (issue 3, Tests): stream
// integrity, peer death, isolation of the rendezvous socket, and scale.
//
// The server end runs in a helper process (the test binary re-executed with
// RSOCK_TEST_HELPER=shm-svc, see TestMain): it listens with rsock, prints
// "ADDR host:port", and answers control lines on its standard input (STATS,
// LAST, NOFILE) with one line on its standard output. Each connection a
// client makes starts with one command byte that picks what the helper does
// with it (svcEcho and friends below). A third process
// (RSOCK_TEST_HELPER=shm-intruder) plays the local attacker of the
// rendezvous socket.

import (
	"bufio"
	"bytes"
	cryptorand "crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/shm"
)

// The helper roles of this file (extraHelperRoles).
func init() {
	extraHelperRoles["shm-svc"] = runShmSvc
	extraHelperRoles["shm-intruder"] = runShmIntruder
	extraHelperRoles["shm-dialer"] = runShmDialer
}

// The first byte a client sends on a connection to the shm-svc helper.
const (
	svcEcho       = 'E' // echo until EOF, then close
	svcCloseFirst = 'C' // echo one byte, then close: the helper closes first
	svcHash       = 'X' // requests, see serveHash
	svcFlood      = 'W' // write to the client until an error
	svcDrain      = 'R' // read and discard until an error
)

// ---- the helper process ----

func runShmSvc() {
	_, _ = raiseNofile(0)
	ln, err := Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("ADDR", ln.Addr())
	svc := &shmSvc{}
	go svc.accept(ln)
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "STATS":
			st := collectStats()
			st["conns"] = int(svc.conns.Load())
			rs := shm.Stats()
			st["rv_accepted"], st["rv_refused"] = int(rs.Accepted), int(rs.Refused)
			fmt.Printf("STATS %s | %s\n", formatStats(st), rs.LastRefusal)
		case "CPU": // cheap, unlike STATS with many fds
			fmt.Println("CPU", cpuMillis())
		case "LAST": // the shm QP info of the latest accepted shm connection
			svc.mu.Lock()
			info := svc.lastInfo
			svc.mu.Unlock()
			fmt.Printf("LAST %x\n", info)
		case "NOFILE": // raise RLIMIT_NOFILE to at least f[1]
			need, _ := strconv.ParseUint(f[1], 10, 64)
			lim, err := raiseNofile(need)
			fmt.Printf("NOFILE %d %d %v\n", lim.Cur, lim.Max, err)
		default:
			fmt.Println("ERR unknown command", f[0])
		}
	}
	ln.Close()
}

type shmSvc struct {
	conns    atomic.Int64
	mu       sync.Mutex
	lastInfo []byte
}

func (s *shmSvc) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go s.handle(c.(*Conn))
	}
}

func (s *shmSvc) handle(c *Conn) {
	s.conns.Add(1)
	defer s.conns.Add(-1)
	defer c.Close()
	var cmd [1]byte
	if _, err := io.ReadFull(c, cmd[:]); err != nil {
		fmt.Fprintf(os.Stderr, "shm-svc: %v: reading the command: %v\n", c.RemoteAddr(), err)
		return
	}
	// A client whose Dial waited for the ring wrote its command on it.
	if r := c.ring(); r != nil && TransportOf(c) == "shm" {
		info := r.QP().Info()
		s.mu.Lock()
		s.lastInfo = info
		s.mu.Unlock()
	}
	switch cmd[0] {
	case svcEcho:
		_, _ = io.Copy(c, c)
	case svcCloseFirst:
		_, err := io.ReadFull(c, cmd[:])
		if err == nil {
			_, err = c.Write(cmd[:])
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "shm-svc: %v: echoing one byte: %v\n", c.RemoteAddr(), err)
		}
	case svcHash:
		_ = serveHash(c)
	case svcFlood:
		buf := make([]byte, 64<<10)
		genStream(1).Read(buf)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	case svcDrain:
		_, _ = io.Copy(io.Discard, c)
	}
}

// serveHash answers requests until EOF:
//
//	'S' n u64, then n bytes     -> the SHA-256 of those bytes (32 bytes)
//	'G' n u64, seed u64         -> n bytes of genStream(seed)
//
// Reads and writes are of random sizes (1 B to 1 MiB).
func serveHash(c net.Conn) error {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
	buf := make([]byte, 1<<20)
	var hdr [17]byte
	for {
		if _, err := io.ReadFull(c, hdr[:1]); err != nil {
			return err
		}
		switch hdr[0] {
		case 'S':
			if _, err := io.ReadFull(c, hdr[1:9]); err != nil {
				return err
			}
			h := sha256.New()
			for rest := binary.LittleEndian.Uint64(hdr[1:]); rest > 0; {
				n, err := c.Read(buf[:min(rest, uint64(chunkSize(rng)))])
				h.Write(buf[:n])
				rest -= uint64(n)
				if err != nil {
					return err
				}
			}
			if _, err := c.Write(h.Sum(nil)); err != nil {
				return err
			}
		case 'G':
			if _, err := io.ReadFull(c, hdr[1:17]); err != nil {
				return err
			}
			g := genStream(binary.LittleEndian.Uint64(hdr[9:]))
			for rest := binary.LittleEndian.Uint64(hdr[1:]); rest > 0; {
				k := min(rest, uint64(chunkSize(rng)))
				g.Read(buf[:k])
				if _, err := c.Write(buf[:k]); err != nil {
					return err
				}
				rest -= k
			}
		default:
			return fmt.Errorf("unknown request %q", hdr[0])
		}
	}
}

// genStream is the deterministic byte stream of seed.
func genStream(seed uint64) *rand.ChaCha8 {
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	s[31] = 0x5a
	return rand.NewChaCha8(s)
}

// chunkSize is a random I/O size from 1 B to 1 MiB, spread over the
// orders of magnitude.
func chunkSize(rng *rand.Rand) int { return 1 + rng.IntN(1<<rng.IntN(21)) }

// raiseNofile raises RLIMIT_NOFILE's soft limit to the hard one and, if
// need is larger, both to need (allowed with CAP_SYS_RESOURCE, up to
// fs.nr_open). It returns the limit in force.
func raiseNofile(need uint64) (syscall.Rlimit, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return lim, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return lim, err
		}
	}
	if need > lim.Max {
		want := syscall.Rlimit{Cur: need, Max: need}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
			return lim, err
		}
		lim = want
	}
	return lim, nil
}

// collectStats counts this process's resources: fds (all, and memfds of
// shm, eventfds, sockets), mappings (all, and of shm memfds), goroutines,
// OS threads, resident memory (kB) and CPU time (ms).
func collectStats() map[string]int {
	// A link whose last connection closed lingers for the next one (a
	// second); counting it would make every figure depend on timing.
	shm.EndIdleLinks()
	st := map[string]int{}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		st["fds"]++
		link, _ := os.Readlink("/proc/self/fd/" + e.Name())
		switch {
		case strings.Contains(link, "memfd:rsock-shm"):
			st["fd_memfd"]++
		case link == "anon_inode:[eventfd]":
			st["fd_eventfd"]++
		case strings.HasPrefix(link, "socket:"):
			st["fd_socket"]++
		}
	}
	if b, err := os.ReadFile("/proc/self/maps"); err == nil {
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			st["maps"]++
			if strings.Contains(l, "memfd:rsock-shm") {
				st["maps_memfd"]++
			}
			if f := strings.Fields(l); len(f) > 1 && strings.HasSuffix(f[1], "s") {
				st["maps_shared"]++
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			key := map[string]string{"Threads": "threads", "VmRSS": "rss_kb", "RssAnon": "rss_anon_kb", "RssShmem": "rss_shmem_kb"}[k]
			if key != "" {
				n, _ := strconv.Atoi(strings.Fields(v)[0])
				st[key] = n
			}
		}
	}
	st["mem_alloc"] = verbs.LiveMem()
	st["cpu_ms"] = cpuMillis()
	st["goroutines"] = runtime.NumGoroutine()
	return st
}

// cpuMillis is the CPU time this process used (user and system), in ms.
func cpuMillis() int {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return -1
	}
	// Fields after the command's closing parenthesis: utime and stime are
	// the 12th and 13th (clock ticks of 10 ms on Linux).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return -1
	}
	ut, _ := strconv.Atoi(f[11])
	stt, _ := strconv.Atoi(f[12])
	return (ut + stt) * 10
}

func formatStats(st map[string]int) string {
	keys := make([]string, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", k, st[k])
	}
	return b.String()
}

// ---- the helper, seen from the test ----

// svcProc is a running shm-svc helper.
type svcProc struct {
	addr   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	exited chan struct{} // closed once the process is reaped
	mu     sync.Mutex    // one control exchange at a time
}

// startSvc starts the shm-svc helper with extra environment, and stops it
// at the end of the test.
func startSvc(t testing.TB, env ...string) *svcProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// SniffTimeout only matters for plain clients that wait for the server
	// to speak (none here). At its default (200 ms) a client starved that
	// long on this loaded 2-core box between connect and its first bytes is
	// taken for a plain client and, with fallback off, closed; see
	// testCfg for what that does next.
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=shm-svc", "RSOCK_SNIFF_TIMEOUT=30s", "RSOCK_HANDSHAKE_TIMEOUT=1m"}, env...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &svcProc{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	line := p.readLine(t, 30*time.Second)
	require.True(t, strings.HasPrefix(line, "ADDR "), "helper said %q", line)
	p.addr = strings.TrimPrefix(line, "ADDR ")
	return p
}

func (p *svcProc) readLine(t testing.TB, timeout time.Duration) string {
	t.Helper()
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := p.out.ReadString('\n')
		ch <- res{strings.TrimSpace(s), err}
	}()
	select {
	case r := <-ch:
		require.NoError(t, r.err, "helper's output")
		return r.s
	case <-time.After(timeout):
		t.Fatalf("helper did not answer within %v", timeout)
		return ""
	}
}

// ask sends a control line and returns the answer's line.
func (p *svcProc) ask(t testing.TB, line string) string {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := io.WriteString(p.stdin, line+"\n")
	require.NoError(t, err)
	return p.readLine(t, 2*time.Minute)
}

// stats returns the helper's collectStats and its rendezvous listener's
// latest refusal.
func (p *svcProc) stats(t testing.TB) (map[string]int, string) {
	t.Helper()
	line := p.ask(t, "STATS")
	require.True(t, strings.HasPrefix(line, "STATS "), "helper said %q", line)
	kv, refusal, _ := strings.Cut(strings.TrimPrefix(line, "STATS "), " |")
	return parseStats(t, kv), strings.TrimSpace(refusal)
}

func parseStats(t testing.TB, s string) map[string]int {
	st := map[string]int{}
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		require.True(t, ok, "stats field %q", f)
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		st[k] = n
	}
	return st
}

// raiseNofile asks the helper to raise its fd limit to need.
func (p *svcProc) raiseNofile(t testing.TB, need uint64) (cur, max uint64, err string) {
	f := strings.SplitN(p.ask(t, fmt.Sprintf("NOFILE %d", need)), " ", 4)
	require.Len(t, f, 4)
	cur, _ = strconv.ParseUint(f[1], 10, 64)
	max, _ = strconv.ParseUint(f[2], 10, 64)
	return cur, max, f[3]
}

// cpuMillis returns the helper's CPU time in ms.
func (p *svcProc) cpuMillis(t testing.TB) int {
	line := p.ask(t, "CPU")
	n, err := strconv.Atoi(strings.TrimPrefix(line, "CPU "))
	require.NoError(t, err, "helper said %q", line)
	return n
}

// lastInfo returns the shm QP info of the helper's latest accepted shm
// connection: its rendezvous socket's name and the (used) secret.
func (p *svcProc) lastInfo(t testing.TB) (name string, secret []byte) {
	t.Helper()
	var line string
	require.Eventually(t, func() bool { // the helper accepts asynchronously
		line = p.ask(t, "LAST")
		return strings.HasPrefix(line, "LAST ")
	}, 10*time.Second, 5*time.Millisecond, "helper said %q", line)
	info, err := hex.DecodeString(strings.TrimPrefix(line, "LAST "))
	require.NoError(t, err)
	return parseShmInfo(t, info)
}

// parseShmInfo reads an shm QP Info (internal/verbs/shm/wire.go): magic
// "rshm", version 5, name length at 5, secret at 40..72, name from 72.
func parseShmInfo(t testing.TB, info []byte) (name string, secret []byte) {
	t.Helper()
	require.GreaterOrEqual(t, len(info), 72, "shm info %x", info)
	require.Equal(t, "rshm", string(info[:4]))
	require.Equal(t, byte(5), info[4], "shm info version")
	require.Len(t, info, 72+int(info[5]))
	return string(info[72:]), info[40:72]
}

// testCfg is the client's Config of these tests: shm only, with a
// generous handshake bound (they are about integrity, death and scale, not
// about how fast one handshake is on a loaded machine), and no memory of
// "plain" servers: one failed handshake must not turn into a minute of
// dials refused as "server does not speak rsock (remembered)".
func testCfg(ringSize, credits int) *Config {
	return &Config{Transports: []string{"shm"}, RingSize: ringSize, Credits: credits, HandshakeTimeout: time.Minute, ProbeCacheTTL: -1}
}

// localStats is collectStats for this process.
func localStats() map[string]int { return collectStats() }

// dialSvc dials the helper over shm only and sends the command byte.
func dialSvc(addr string, cfg *Config, cmd byte) (*Conn, error) {
	return dialSvcOn(addr, cfg, cmd, "shm")
}

// dialSvcOn dials the helper, checks the transport (any if want is "")
// and sends the command byte.
func dialSvcOn(addr string, cfg *Config, cmd byte, want string) (*Conn, error) {
	d := Dialer{Config: cfg, Timeout: time.Minute}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := nc.(*Conn)
	if tr := TransportOf(c); want != "" && tr != want {
		c.Close()
		return nil, fmt.Errorf("transport %q, want %s: %s", tr, want, c.Info().Reason)
	}
	if _, err := c.Write([]byte{cmd}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// dumpStates describes conns for a hang report.
func dumpStates(conns []*Conn) string {
	var b strings.Builder
	for i, c := range conns {
		if c != nil {
			fmt.Fprintf(&b, "\nconn %d: %s", i, c.ring().DebugState())
		}
	}
	return b.String()
}

// waitAll waits for n results on errc, failing the test (with the conns'
// protocol states) if that takes longer than limit.
func waitAll(t *testing.T, errc <-chan error, n int, limit time.Duration, conns func() []*Conn) {
	t.Helper()
	timeout := time.After(limit)
	for range n {
		select {
		case err := <-errc:
			assert.NoError(t, err)
		case <-timeout:
			t.Fatalf("hang: not done after %v%s", limit, dumpStates(conns()))
		}
	}
}

// ---- 1. stream integrity ----

// hashSession runs requests on c, a svcHash connection: for each size, in
// turn, it sends that many bytes of a seeded stream and checks the
// helper's SHA-256 ('S'), or has the helper send them and compares them
// byte for byte as they arrive ('G'). Writes and reads are of random
// sizes. It returns the ring offsets (mod ringSize) at which the messages
// started in the helper's ring (S) and in ours (G).
func hashSession(c *Conn, sizes []int, seed uint64, ourRing, peerRing int) (offS, offG map[uint64]bool, err error) {
	rng := rand.New(rand.NewPCG(seed, 7))
	buf := make([]byte, 1<<20)
	want := make([]byte, 1<<20)
	sent, recvd := uint64(1), uint64(0) // the command byte went first
	offS, offG = map[uint64]bool{}, map[uint64]bool{}
	ring, pring := uint64(ourRing), uint64(peerRing)
	for i, n := range sizes {
		mseed := rng.Uint64()
		if i%2 == 0 {
			hdr := binary.LittleEndian.AppendUint64([]byte{'S'}, uint64(n))
			if _, err := c.Write(hdr); err != nil {
				return nil, nil, fmt.Errorf("request %d (S %d B): %w", i, n, err)
			}
			sent += uint64(len(hdr))
			offS[sent%pring] = true
			g, h := genStream(mseed), sha256.New()
			for rest := n; rest > 0; {
				k := min(rest, chunkSize(rng))
				g.Read(buf[:k])
				h.Write(buf[:k])
				if _, err := c.Write(buf[:k]); err != nil {
					return nil, nil, fmt.Errorf("request %d (S %d B) at %d: %w", i, n, n-rest, err)
				}
				rest -= k
			}
			sent += uint64(n)
			var sum [32]byte
			if _, err := io.ReadFull(c, sum[:]); err != nil {
				return nil, nil, fmt.Errorf("request %d (S %d B): reading the hash: %w", i, n, err)
			}
			recvd += 32
			if !bytes.Equal(sum[:], h.Sum(nil)) {
				return nil, nil, fmt.Errorf("request %d: %d bytes sent from ring offset %d arrived altered (SHA-256 differs)", i, n, (sent-uint64(n))%pring)
			}
			continue
		}
		hdr := binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64([]byte{'G'}, uint64(n)), mseed)
		if _, err := c.Write(hdr); err != nil {
			return nil, nil, fmt.Errorf("request %d (G %d B): %w", i, n, err)
		}
		sent += uint64(len(hdr))
		offG[recvd%ring] = true
		g := genStream(mseed)
		for got := 0; got < n; {
			k, err := c.Read(buf[:min(n-got, chunkSize(rng))])
			g.Read(want[:k])
			if j := firstDiff(buf[:k], want[:k]); j >= 0 {
				return nil, nil, fmt.Errorf("request %d (G %d B): byte %d (ring offset %d) is %#x, want %#x", i, n, got+j, (recvd+uint64(got+j))%ring, buf[j], want[j])
			}
			got += k
			if err != nil {
				return nil, nil, fmt.Errorf("request %d (G %d B) at %d: %w", i, n, got, err)
			}
		}
		recvd += uint64(n)
	}
	return offS, offG, nil
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// echoDuplex writes n bytes of a seeded stream to c, an svcEcho
// connection, in random-sized writes while it reads the echo in
// random-sized reads and compares it byte for byte: both rings full at once.
func echoDuplex(c *Conn, n int, seed uint64) error {
	werr := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(seed, 8))
		g := genStream(seed)
		buf := make([]byte, 1<<20)
		for rest := n; rest > 0; {
			k := min(rest, chunkSize(rng))
			g.Read(buf[:k])
			if _, err := c.Write(buf[:k]); err != nil {
				werr <- err
				return
			}
			rest -= k
		}
		werr <- nil
	}()
	rng := rand.New(rand.NewPCG(seed, 9))
	g := genStream(seed)
	buf, want := make([]byte, 1<<20), make([]byte, 1<<20)
	for got := 0; got < n; {
		k, err := c.Read(buf[:min(n-got, chunkSize(rng))])
		g.Read(want[:k])
		if j := firstDiff(buf[:k], want[:k]); j >= 0 {
			return fmt.Errorf("echo: byte %d is %#x, want %#x", got+j, buf[j], want[j])
		}
		got += k
		if err != nil {
			return fmt.Errorf("echo at %d of %d: %w", got, n, err)
		}
	}
	return <-werr
}

// integritySizes returns the message sizes of one session: the extremes
// and sizes around the ring's, then count sizes drawn log-uniformly from
// 1 B to 16 MiB (so every order of magnitude is as likely).
func integritySizes(rng *rand.Rand, ringSize, count int, extremes bool) []int {
	var sizes []int
	if extremes {
		sizes = []int{1, 1, 16 << 20, 16 << 20, ringSize - 1, ringSize + 1, ringSize, ringSize}
	}
	for range count {
		sizes = append(sizes, max(1, min(16<<20, int(math.Exp(rng.Float64()*math.Log(16<<20))))))
	}
	return sizes
}

// TestShmTwoProcessIntegrity: several connections at once to another
// process, each sending and receiving messages of 1 B to 16 MiB in random
// pieces (the stream's position in the ring, and so the wrap-around point,
// differs for every message), checked byte for byte; one more connection
// streams 16 MiB both ways at once through an echo. With the smallest ring
// (4 KiB, 4 credits) and the default (1 MiB, 64) on both sides, and with
// each on one side.
func TestShmTwoProcessIntegrity(t *testing.T) {
	const writers = 4
	for _, rc := range []struct {
		ring, credits         int // this process's receive ring
		peerRing, peerCredits int // the helper's
		random                int // random sizes per connection
	}{{4 << 10, 4, 4 << 10, 4, 10}, {1 << 20, 64, 1 << 20, 64, 16}, {4 << 10, 4, 1 << 20, 64, 6}} {
		t.Run(fmt.Sprintf("ring=%d,peer=%d", rc.ring, rc.peerRing), func(t *testing.T) {
			h := startSvc(t, "RSOCK_TRANSPORTS=shm", fmt.Sprintf("RSOCK_RING_SIZE=%d", rc.peerRing), fmt.Sprintf("RSOCK_CREDITS=%d", rc.peerCredits))
			cfg := testCfg(rc.ring, rc.credits)
			var mu sync.Mutex
			var conns []*Conn
			var total atomic.Uint64
			offS, offG := map[uint64]bool{}, map[uint64]bool{}
			errc := make(chan error, writers+1)
			start := time.Now()
			for w := range writers {
				c, err := dialSvc(h.addr, cfg, svcHash)
				require.NoError(t, err)
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(3 * time.Minute)) // a hang fails instead of blocking
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				go func() {
					sizes := integritySizes(rand.New(rand.NewPCG(uint64(w), uint64(rc.ring+rc.peerRing))), min(rc.ring, rc.peerRing), rc.random, w == 0)
					s, g, err := hashSession(c, sizes, uint64(w)<<8|uint64(rc.credits), rc.ring, rc.peerRing)
					mu.Lock()
					for o := range s {
						offS[o] = true
					}
					for o := range g {
						offG[o] = true
					}
					mu.Unlock()
					for _, n := range sizes {
						total.Add(uint64(n))
					}
					errc <- err
				}()
			}
			c, err := dialSvc(h.addr, cfg, svcEcho)
			require.NoError(t, err)
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(3 * time.Minute))
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				err := echoDuplex(c, 16<<20, uint64(rc.ring))
				total.Add(32 << 20)
				errc <- err
			}()
			waitAll(t, errc, writers+1, 4*time.Minute, func() []*Conn { mu.Lock(); defer mu.Unlock(); return slices.Clone(conns) })
			elapsed := time.Since(start)
			var stalls uint64
			for _, c := range conns {
				stalls += c.Info().CreditStalls
			}
			t.Logf("%d connections, %.0f MiB checked in %v (%.0f MiB/s); messages started at %d distinct offsets of the helper's ring and %d of ours; %d credit stalls here",
				len(conns), float64(total.Load())/(1<<20), elapsed.Round(time.Millisecond), float64(total.Load())/(1<<20)/elapsed.Seconds(), len(offS), len(offG), stalls)
			// Every message (but a few that land on the same offset by
			// chance) started at its own place in the ring.
			assert.Greater(t, len(offS), writers*(rc.random/2)/2)
			assert.Greater(t, len(offG), writers*(rc.random/2)/2)
		})
	}
}

// ---- 2. the peer process is killed ----

// TestShmPeerKilled kills the peer process with SIGKILL in the middle of a
// transfer: while it writes to us (our Read is blocked, or blocks once it
// has read what had arrived) and while it reads what we write (our Write
// blocks once the ring is full); with this process as the client (the
// shm-svc helper, passive side of the exchange, dies) and as the server
// (the shm-dialer helper, active side, dies). The blocked call must fail
// with an error matching ECONNRESET within one second of the kill. After
// Close, this process has no fd and no mapping left of that connection
// (shm memfds and their mappings, eventfds, sockets).
//
// The one-second bound is asserted as is, without slack: the death is seen
// through the bootstrap TCP socket, which the kernel closes while it tears
// the process down, so the survivor's watcher wakes at once (measured:
// a few ms under -race, see the log); no timer is involved, so scheduling
// noise on this box adds milliseconds, not a second.
func TestShmPeerKilled(t *testing.T) {
	for _, side := range []string{"client", "server"} {
		for _, tc := range []struct {
			name string
			cmd  byte
		}{{"peer-writing", svcFlood}, {"peer-reading", svcDrain}} {
			t.Run(side+"/"+tc.name, func(t *testing.T) {
				var lats []time.Duration
				for trial := range 3 {
					lats = append(lats, killTrial(t, side == "server", tc.cmd, trial))
					if t.Failed() {
						return
					}
				}
				slices.Sort(lats)
				t.Logf("error after SIGKILL: min %v, median %v, max %v", lats[0], lats[1], lats[2])
			})
		}
	}
}

// runShmDialer dials RSOCK_TEST_DIAL_ADDR over shm, prints "DIALED", and
// then floods the connection (svcFlood) or drains it (svcDrain) until it is
// killed.
func runShmDialer() {
	mode := os.Getenv("RSOCK_TEST_DIAL_MODE")
	c, err := dialSvc(os.Getenv("RSOCK_TEST_DIAL_ADDR"), testCfg(0, 0), mode[0])
	if err != nil {
		fmt.Println("ERR", err)
		os.Exit(1)
	}
	fmt.Println("DIALED")
	if mode[0] == svcFlood {
		buf := make([]byte, 64<<10)
		genStream(1).Read(buf)
		for {
			if _, err := c.Write(buf); err != nil {
				break
			}
		}
	} else {
		_, _ = io.Copy(io.Discard, c)
	}
	c.Close()
}

// startDialer starts the shm-dialer helper against addr and returns the
// process and a channel closed once it is reaped.
func startDialer(t *testing.T, addr string, cmd byte) (*os.Process, chan struct{}) {
	t.Helper()
	p := exec.Command(os.Args[0], "-test.run=^$")
	p.Env = append(os.Environ(), helperEnv+"=shm-dialer", "RSOCK_TEST_DIAL_ADDR="+addr, "RSOCK_TEST_DIAL_MODE="+string(cmd))
	p.Stderr = os.Stderr
	out, err := p.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.Start())
	exited := make(chan struct{})
	go func() { _ = p.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = p.Process.Kill()
		<-exited
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "DIALED", strings.TrimSpace(line))
	return p.Process, exited
}

// killTrial sets up one connection with the peer in another process,
// kills that process mid-transfer and checks what this side sees. It
// returns the time from SIGKILL to the error of the blocked call.
func killTrial(t *testing.T, server bool, cmd byte, trial int) time.Duration {
	var c *Conn
	var peer *os.Process
	var exited chan struct{}
	var before map[string]int
	if server {
		ln := listen(t, testCfg(0, 0))
		before = localStats()
		peer, exited = startDialer(t, ln.Addr().String(), cmd)
		nc, err := ln.Accept()
		require.NoError(t, err)
		c = nc.(*Conn)
		require.Equal(t, "shm", TransportOf(c), c.Info().Reason)
		var b [1]byte
		_, err = io.ReadFull(c, b[:])
		require.NoError(t, err)
		require.Equal(t, cmd, b[0])
	} else {
		h := startSvc(t, "RSOCK_TRANSPORTS=shm")
		before = localStats()
		var err error
		c, err = dialSvc(h.addr, testCfg(0, 0), cmd)
		require.NoError(t, err)
		peer, exited = h.cmd.Process, h.exited
	}
	defer c.Close() // a second Close is harmless
	var moved atomic.Int64
	type result struct {
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		buf := make([]byte, 256<<10)
		for {
			var n int
			var err error
			if cmd == svcFlood { // the peer writes
				n, err = c.Read(buf)
			} else {
				n, err = c.Write(buf)
			}
			moved.Add(int64(n))
			if err != nil {
				done <- result{err, time.Now()}
				return
			}
		}
	}()
	require.Eventually(t, func() bool { return moved.Load() >= 8<<20 }, time.Minute, time.Millisecond, "no transfer")
	during := localStats()
	require.Greater(t, during["maps_memfd"], before["maps_memfd"], "the connection's mappings")

	t0 := time.Now()
	require.NoError(t, peer.Signal(syscall.SIGKILL))
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("blocked call not failed 30 s after SIGKILL: %s", c.ring().DebugState())
	}
	lat := r.at.Sub(t0)
	var reaped time.Duration
	select {
	case <-exited:
		reaped = time.Since(t0)
	case <-time.After(10 * time.Second):
		t.Error("peer not reaped")
	}
	assert.ErrorIs(t, r.err, syscall.ECONNRESET)
	var oe *net.OpError
	assert.ErrorAs(t, r.err, &oe)
	assert.Less(t, lat, time.Second, "the blocked call returned %v after SIGKILL", lat)
	t.Logf("trial %d: %.1f MiB moved; error %v after SIGKILL (peer reaped after %v): %v", trial, float64(moved.Load())/(1<<20), lat, reaped, r.err)

	require.NoError(t, c.Close())
	kinds := []string{"fd_memfd", "fd_eventfd", "fd_socket", "maps_memfd", "maps_shared"}
	var after map[string]int
	ok := assert.Eventually(t, func() bool {
		after = localStats()
		for _, k := range kinds {
			if after[k] > before[k] {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond)
	var b strings.Builder
	for _, k := range kinds {
		fmt.Fprintf(&b, " %s %d/%d/%d", k, before[k], during[k], after[k])
	}
	t.Logf("trial %d: before/during/after:%s", trial, b.String())
	if !ok {
		t.Errorf("resources of the connection not released")
	}
	return lat
}

// ---- 3. isolation of the rendezvous socket ----

// rendezvousListeners returns the abstract Unix listening sockets of shm
// rendezvous of process pid, from /proc/net/unix.
func rendezvousListeners(t testing.TB, pid int) []string {
	b, err := os.ReadFile("/proc/net/unix")
	require.NoError(t, err)
	var names []string
	prefix := fmt.Sprintf("@rsock-shm-%d-", pid)
	for _, l := range strings.Split(string(b), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(l)
		if len(f) < 8 || !strings.HasPrefix(f[7], prefix) {
			continue
		}
		flags, _ := strconv.ParseUint(f[3], 16, 32)
		typ, _ := strconv.ParseUint(f[4], 16, 32)
		if flags&(1<<16) != 0 && typ == unix.SOCK_SEQPACKET { // __SO_ACCEPTCON: listening
			names = append(names, f[7])
		}
	}
	return names
}

// runIntruder runs the shm-intruder helper with attack against the
// rendezvous socket name and returns its RESULT line.
func runIntruder(t *testing.T, name, attack string, secret []byte) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=shm-intruder", "RSOCK_TEST_RV_NAME="+name,
		"RSOCK_TEST_ATTACK="+attack, "RSOCK_TEST_RV_SECRET="+hex.EncodeToString(secret))
	cmd.Stderr = os.Stderr
	var out bytes.Buffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "intruder: %s", out.String())
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("intruder hung: %s", out.String())
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "RESULT ") {
			return strings.TrimPrefix(l, "RESULT ")
		}
	}
	t.Fatalf("intruder said %q", out.String())
	return ""
}

// runShmIntruder is a local process that knows the name of a rendezvous
// socket (anyone can read /proc/net/unix) but not the secret of any
// pending exchange. It prints "RESULT refused ..." or "RESULT BREACH ...".
func runShmIntruder() {
	name := os.Getenv("RSOCK_TEST_RV_NAME")
	used, _ := hex.DecodeString(os.Getenv("RSOCK_TEST_RV_SECRET"))
	var secret [32]byte
	switch os.Getenv("RSOCK_TEST_ATTACK") {
	case "wrong-secret":
		_, _ = cryptorand.Read(secret[:])
		fmt.Println("RESULT", intrude(name, connectMsg(secret[:])))
	case "used-secret": // the secret of an exchange that already happened
		fmt.Println("RESULT", intrude(name, connectMsg(used)))
	case "zero-secret":
		fmt.Println("RESULT", intrude(name, connectMsg(secret[:])))
	case "garbage":
		b := make([]byte, 200)
		_, _ = cryptorand.Read(b)
		fmt.Println("RESULT", intrude(name, b))
	case "silent":
		fmt.Println("RESULT", intrude(name, nil))
	case "hog": // hold many silent connections at once
		n, _ := strconv.Atoi(os.Getenv("RSOCK_TEST_HOG"))
		fds := make([]int, 0, n)
		for range n {
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			if err == nil {
				if err = unix.Connect(fd, &unix.SockaddrUnix{Name: name}); err != nil {
					unix.Close(fd)
				}
			}
			if err != nil {
				fmt.Println("RESULT error connect:", err)
				return
			}
			fds = append(fds, fd)
		}
		start := time.Now()
		fmt.Println("HOLDING", len(fds))
		closed, last, other := 0, time.Duration(0), "none"
		for _, fd := range fds {
			_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 60})
			n, _, _, _, err := unix.Recvmsg(fd, make([]byte, 64), nil, 0)
			for errors.Is(err, unix.EINTR) {
				// With SO_RCVTIMEO set, a signal (the Go runtime's
				// preemption) interrupts the call even under SA_RESTART.
				n, _, _, _, err = unix.Recvmsg(fd, make([]byte, 64), nil, 0)
			}
			if err == nil && n == 0 || errors.Is(err, unix.ECONNRESET) {
				closed++
				last = time.Since(start)
			} else if other == "none" {
				other = fmt.Sprintf("%d bytes, %v", n, err)
			}
			unix.Close(fd)
		}
		if closed == len(fds) {
			fmt.Printf("RESULT refused all %d (the last after %v)\n", closed, last.Round(time.Millisecond))
		} else {
			fmt.Printf("RESULT BREACH? %d of %d closed (first other outcome: %s)\n", closed, len(fds), other)
		}
	default:
		fmt.Println("RESULT unknown attack")
	}
}

// connectMsg is a well-formed shm rendezvous connect message, a link's
// first (see internal/verbs/shm/wire.go): header "rsrv", version 6, kind
// 1; the secret.
func connectMsg(secret []byte) []byte {
	return append(append([]byte("rsrv"), 6, 1, 0, 0), secret...)
}

// intrude connects to the rendezvous socket, sends msg (nil: nothing) with
// a sealed memfd and an eventfd attached as a real peer would, and waits
// for the answer. Refused means the socket was closed with no answer and
// no fd.
func intrude(name string, msg []byte) string {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "error socket: " + err.Error()
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: name}); err != nil {
		return "error connect: " + err.Error()
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 30})
	start := time.Now()
	if msg != nil {
		mfd, _ := unix.MemfdCreate("intruder", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		_ = unix.Ftruncate(mfd, 4096+64*64)
		_, _ = unix.FcntlInt(uintptr(mfd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
		efd, _ := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		err := unix.Sendmsg(fd, msg, unix.UnixRights(mfd, efd), nil, 0)
		unix.Close(mfd)
		unix.Close(efd)
		if err != nil {
			return fmt.Sprintf("refused (send: %v)", err)
		}
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*256))
	n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, 0)
	took := time.Since(start).Round(time.Millisecond)
	switch {
	case err == nil && n == 0 && oobn == 0:
		return fmt.Sprintf("refused (closed after %v)", took)
	case errors.Is(err, unix.ECONNRESET):
		return fmt.Sprintf("refused (reset after %v)", took)
	case err != nil:
		return fmt.Sprintf("BREACH? no refusal after %v: %v", took, err)
	}
	return fmt.Sprintf("BREACH: answered %d bytes and %d control bytes after %v", n, oobn, took)
}

// TestShmRendezvousIsolation: a third local process (same user) that
// connects to the helper's rendezvous socket with a wrong, zero or already
// used secret, with garbage, or with nothing, is refused; the real
// connection keeps carrying data byte for byte meanwhile, and new
// connections still work.
func TestShmRendezvousIsolation(t *testing.T) {
	h := startSvc(t, "RSOCK_TRANSPORTS=shm")
	cfg := testCfg(0, 0)
	c, err := dialSvc(h.addr, cfg, svcEcho)
	require.NoError(t, err)
	defer c.Close()

	// The rendezvous socket, two ways: the accepted conn's QP info, and
	// the listening abstract sockets of the helper's pid.
	name, used := h.lastInfo(t)
	require.True(t, strings.HasPrefix(name, fmt.Sprintf("@rsock-shm-%d-", h.cmd.Process.Pid)), "name %q", name)
	require.Equal(t, []string{name}, rendezvousListeners(t, h.cmd.Process.Pid))
	peerPID, _ := c.ring().QP().(*shm.QP).PeerCred()
	require.Equal(t, h.cmd.Process.Pid, peerPID)

	// Data flows on the real connection the whole time.
	stop := make(chan struct{})
	flow := make(chan error, 1)
	var rounds atomic.Int64
	go func() {
		for i := uint64(0); ; i++ {
			select {
			case <-stop:
				flow <- nil
				return
			default:
			}
			if err := echoDuplex(c, 256<<10, i); err != nil {
				flow <- err
				return
			}
			rounds.Add(1)
		}
	}()

	st0, _ := h.stats(t)
	refused := st0["rv_refused"]
	for _, attack := range []string{"wrong-secret", "used-secret", "zero-secret", "garbage", "silent"} {
		res := runIntruder(t, name, attack, used)
		assert.True(t, strings.HasPrefix(res, "refused"), "%s: %s", attack, res)
		var st map[string]int
		var why string
		require.Eventually(t, func() bool {
			st, why = h.stats(t)
			return st["rv_refused"] > refused
		}, 10*time.Second, 10*time.Millisecond, "%s: the helper did not count a refusal", attack)
		refused = st["rv_refused"]
		t.Logf("%s: %s; the helper's reason: %s", attack, res, why)
		switch attack {
		case "wrong-secret", "used-secret", "zero-secret":
			// Refused for the secret, not for a malformed message.
			assert.Contains(t, why, "unknown secret", attack)
		}
		assert.Equal(t, st0["rv_accepted"], st["rv_accepted"], "%s: an exchange was accepted", attack)
	}
	// A local process holding many connections silently takes its own
	// share of the listener's exchanges (maxPerPeer) for the first
	// message's bound (2 s): new connections from other processes do not
	// wait behind them (TestShmRendezvousSlotExhaustion).
	res, delay, err := hogRendezvous(t, h.addr, name, 100)
	require.NoError(t, err, "a new connection while 100 silent ones hold the rendezvous")
	assert.True(t, strings.HasPrefix(res, "refused all"), "hog: %s", res)
	t.Logf("hog: %s; a new connection meanwhile took %v to set up", res, delay.Round(time.Millisecond))

	// The process of the real client was never involved: this process's
	// own rendezvous listener (started by its QP) refuses strangers too.
	ourName, _ := parseShmInfo(t, c.ring().QP().Info())
	ours0 := shm.Stats().Refused
	res = runIntruder(t, ourName, "wrong-secret", nil)
	assert.True(t, strings.HasPrefix(res, "refused"), "our listener: %s", res)
	require.Eventually(t, func() bool { return shm.Stats().Refused > ours0 }, 10*time.Second, 10*time.Millisecond)
	t.Logf("this process's listener: %s; reason: %s", res, shm.Stats().LastRefusal)

	close(stop)
	select {
	case err := <-flow:
		require.NoError(t, err, "the real connection was disturbed")
	case <-time.After(time.Minute):
		t.Fatalf("the real connection hung: %s", c.ring().DebugState())
	}
	require.NoError(t, echoDuplex(c, 1<<20, 99))
	assert.Positive(t, rounds.Load())
	assert.Equal(t, "shm", TransportOf(c))
	// And a new connection is set up as usual.
	c2, err := dialSvc(h.addr, cfg, svcEcho)
	require.NoError(t, err)
	require.NoError(t, echoDuplex(c2, 64<<10, 100))
	c2.Close()
	t.Logf("%d echo rounds of 256 KiB on the real connection during the attacks", rounds.Load())
}

// hogRendezvous has a shm-intruder process hold n silent connections to
// the rendezvous socket name, then dials a new shm connection to addr
// (echoing 64 KiB through it). It returns the intruder's verdict on its
// connections (all refused, in the end), how long the dial took and its
// error.
func hogRendezvous(t *testing.T, addr, name string, n int) (string, time.Duration, error) {
	t.Helper()
	intr := exec.Command(os.Args[0], "-test.run=^$")
	intr.Env = append(os.Environ(), helperEnv+"=shm-intruder", "RSOCK_TEST_RV_NAME="+name, "RSOCK_TEST_ATTACK=hog", fmt.Sprintf("RSOCK_TEST_HOG=%d", n))
	intr.Stderr = os.Stderr
	out, err := intr.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, intr.Start())
	done := make(chan error, 1)
	go func() { done <- intr.Wait() }()
	defer func() {
		_ = intr.Process.Kill()
		<-done
	}()
	lines := bufio.NewReader(out)
	line, err := lines.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("HOLDING %d", n), strings.TrimSpace(line))
	start := time.Now()
	c, derr := dialSvc(addr, testCfg(0, 0), svcEcho)
	delay := time.Since(start)
	if derr == nil {
		derr = echoDuplex(c, 64<<10, 101)
		c.Close()
	}
	line, err = lines.ReadString('\n')
	require.NoError(t, err)
	return strings.TrimPrefix(strings.TrimSpace(line), "RESULT "), delay, derr
}

// ---- 4. scale ----

// dialMany opens n shm connections to the helper, conc at a time, each
// sending cmd.
func dialMany(t *testing.T, addr string, cfg *Config, n, conc int, cmd byte) []*Conn {
	t.Helper()
	return dialManyOn(t, addr, cfg, n, conc, cmd, "shm")
}

// dialManyOn is dialMany on the transport want ("" for any).
func dialManyOn(t *testing.T, addr string, cfg *Config, n, conc int, cmd byte, want string) []*Conn {
	t.Helper()
	conns := make([]*Conn, n)
	errs := make([]error, n)
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			conns[i], errs[i] = dialSvcOn(addr, cfg, cmd, want)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeAll(conns, conc)
		t.Fatalf("of %d dials:%s", n, summarizeErrors(errs))
	}
	return conns
}

// summarizeErrors counts errs by message (with addresses and ports
// stripped), first failure first.
func summarizeErrors(errs []error) string {
	addr := regexp.MustCompile(`[0-9.]+:[0-9]+`)
	counts := map[string]int{}
	var order []string
	for _, e := range errs {
		if e == nil {
			continue
		}
		m := addr.ReplaceAllString(e.Error(), "ADDR")
		if counts[m] == 0 {
			order = append(order, m)
		}
		counts[m]++
	}
	var b strings.Builder
	for _, m := range order {
		fmt.Fprintf(&b, "\n%d failed: %s", counts[m], m)
	}
	return b.String()
}

func closeAll(conns []*Conn, conc int) {
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	for _, c := range conns {
		if c == nil {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.Close()
		}()
	}
	wg.Wait()
}

// TestShmThousandPingPong: 1,000 shm connections open at once between two
// processes, all doing 64-byte ping-pongs at the same time.
func TestShmThousandPingPong(t *testing.T) {
	const n, rounds = 1000, 20
	h := startSvc(t, "RSOCK_TRANSPORTS=shm")
	start := time.Now()
	conns := dialMany(t, h.addr, testCfg(0, 0), n, 32, svcEcho)
	defer closeAll(conns, 64)
	setup := time.Since(start)
	hs, _ := h.stats(t)
	require.Equal(t, n, hs["conns"], "connections the helper holds")

	start = time.Now()
	errc := make(chan error, n)
	gate := make(chan struct{})
	for i, c := range conns {
		_ = c.SetDeadline(time.Now().Add(3 * time.Minute))
		go func() {
			<-gate
			ping, pong := make([]byte, 64), make([]byte, 64)
			for r := range rounds {
				binary.LittleEndian.PutUint64(ping, uint64(i)<<32|uint64(r))
				ping[63] = byte(r)
				if _, err := c.Write(ping); err != nil {
					errc <- fmt.Errorf("conn %d round %d: %w", i, r, err)
					return
				}
				if _, err := io.ReadFull(c, pong); err != nil {
					errc <- fmt.Errorf("conn %d round %d: %w", i, r, err)
					return
				}
				if !bytes.Equal(ping, pong) {
					errc <- fmt.Errorf("conn %d round %d: got %x", i, r, pong)
					return
				}
			}
			errc <- nil
		}()
	}
	close(gate)
	waitAll(t, errc, n, 4*time.Minute, func() []*Conn { return conns[:8] })
	pp := time.Since(start)
	ls := localStats()
	hs, _ = h.stats(t)
	t.Logf("%d connections set up in %v; %d concurrent ping-pongs each in %v; threads here %d, in the helper %d",
		n, setup.Round(time.Millisecond), rounds, pp.Round(time.Millisecond), ls["threads"], hs["threads"])
}

// TestShmTenThousandIdle holds 10,000 idle shm connections between two
// processes and reports what they cost: OS threads (bounded: idle
// connections park goroutines, not threads), fds, mappings, resident memory
// at the default 1 MiB ring, and CPU while idle.
//
// Each connection costs one fd in each process, its TCP bootstrap socket
// (shm's Unix connection, eventfds and memfds are per process pair or
// closed once mapped); the cost is measured first, on a sample, and both
// processes raise RLIMIT_NOFILE as far as they can. If the hard limit
// cannot fit 10,000 and cannot be raised (no CAP_SYS_RESOURCE), the test
// holds the most connections that fit, checks and reports the same things
// for them, and then skips, saying why and with the numbers.
func TestShmTenThousandIdle(t *testing.T) {
	const want, sample = 10000, 200
	const threadBound = 64
	const conc = 32 // dials at a time
	h := startSvc(t, "RSOCK_TRANSPORTS=shm")
	cfg := testCfg(0, 0)

	// One connection's cost in both processes, from a sample.
	runtime.GC()
	l0, h0 := localStats(), must2(h.stats(t))
	conns := dialMany(t, h.addr, cfg, sample, conc, svcEcho)
	l1, h1 := localStats(), must2(h.stats(t))
	closeAll(conns, conc)
	per := func(a, b map[string]int, k string) float64 { return float64(b[k]-a[k]) / sample }
	fdsHere, fdsThere := per(l0, l1, "fds"), per(h0, h1, "fds")
	mapsHere, mapsThere := per(l0, l1, "maps"), per(h0, h1, "maps")
	t.Logf("per connection (sample of %d): fds %.2f here (client: memfd %.2f, eventfd %.2f, socket %.2f), %.2f in the helper (server); mappings %.2f here, %.2f there (of them shm memfds %.2f / %.2f)",
		sample, fdsHere, per(l0, l1, "fd_memfd"), per(l0, l1, "fd_eventfd"), per(l0, l1, "fd_socket"), fdsThere,
		mapsHere, mapsThere, per(l0, l1, "maps_memfd"), per(h0, h1, "maps_memfd"))

	// Room: fds (RLIMIT_NOFILE) in both processes.
	const margin = 256
	needHere := uint64(l0["fds"]) + uint64(math.Ceil(fdsHere*want)) + margin
	needThere := uint64(h0["fds"]) + uint64(math.Ceil(fdsThere*want)) + margin
	limHere, errHere := raiseNofile(needHere)
	curThere, maxThere, errThere := h.raiseNofile(t, needThere)
	fit := func(lim uint64, base int, per float64) int {
		return int(float64(int(lim)-base-margin) / per)
	}
	n := min(want, fit(limHere.Cur, l0["fds"], fdsHere), fit(curThere, h0["fds"], fdsThere))
	short := ""
	if n < want {
		n = n / 100 * 100
		short = fmt.Sprintf("RLIMIT_NOFILE: %d shm connections need about %d fds in this process and %d in the helper (%.2f and %.2f per connection), but the limits are %d/%d here and %d/%d there and cannot be raised (here: %v; there: %s); held %d instead, the most that fits",
			want, needHere, needThere, fdsHere, fdsThere, limHere.Cur, limHere.Max, curThere, maxThere, errHere, errThere, n)
		t.Logf("%s; the checks below are for %d", short, n)
	}
	// Room: mappings (vm.max_map_count), projected for 10,000 and checked
	// for n.
	mapMax := readIntFile(t, "/proc/sys/vm/max_map_count")
	for _, side := range []struct {
		who  string
		base int
		per  float64
	}{{"this process", l0["maps"], mapsHere}, {"the helper", h0["maps"], mapsThere}} {
		proj := side.base + int(math.Ceil(side.per*want))
		t.Logf("vm.max_map_count %d: %d connections need about %d mappings in %s (%d + %.2f per connection)", mapMax, want, proj, side.who, side.base, side.per)
		if need := side.base + int(math.Ceil(side.per*float64(n))); need > mapMax {
			t.Fatalf("vm.max_map_count is %d: %d idle connections need about %d mappings in %s (%d before, %.2f per connection)", mapMax, n, need, side.who, side.base, side.per)
		}
	}

	runtime.GC()
	l0, h0 = localStats(), must2(h.stats(t))
	start := time.Now()
	conns = dialMany(t, h.addr, cfg, n, conc, svcEcho)
	setup := time.Since(start)
	defer func() {
		start := time.Now()
		closeAll(conns, 64)
		t.Logf("closed %d connections in %v", n, time.Since(start).Round(time.Millisecond))
	}()
	// Let the set-up settle, then measure an idle second.
	time.Sleep(500 * time.Millisecond)
	runtime.GC()
	debug.FreeOSMemory()
	l1, h1 = localStats(), must2(h.stats(t))
	require.Equal(t, n, h1["conns"], "connections the helper holds")
	// CPU while idle, read cheaply (collecting the stats above reads
	// /proc/self/fd and maps, which costs tens of ms at this scale).
	const idle = 2 * time.Second
	cpuHere, cpuThere := cpuMillis(), h.cpuMillis(t)
	time.Sleep(idle)
	cpuHere, cpuThere = cpuMillis()-cpuHere, h.cpuMillis(t)-cpuThere
	l2, h2 := localStats(), must2(h.stats(t))

	t.Logf("%d idle connections set up in %v (%d dials at a time)", n, setup.Round(time.Millisecond), conc)
	for _, side := range []struct {
		who        string
		a, b, idle map[string]int
		cpu        int
	}{{"here (client)", l0, l1, l2, cpuHere}, {"helper (server)", h0, h1, h2, cpuThere}} {
		d := func(k string) float64 { return float64(side.b[k]-side.a[k]) / float64(n) }
		t.Logf("%s: threads %d (before %d); fds %d (+%.2f/conn); mappings %d (+%.2f/conn, shm memfd %d); RSS %+d kB = %.1f kB/conn (anon %.1f, shmem %.1f); goroutines %d (+%.2f/conn); CPU while idle %d ms over %v",
			side.who, side.idle["threads"], side.a["threads"], side.b["fds"], d("fds"),
			side.b["maps"], d("maps"), side.b["maps_memfd"],
			side.b["rss_kb"]-side.a["rss_kb"], d("rss_kb"), d("rss_anon_kb"), d("rss_shmem_kb"),
			side.b["goroutines"], d("goroutines"), side.cpu, idle)
		assert.LessOrEqual(t, side.idle["threads"], threadBound, "%s: OS threads with %d idle connections", side.who, n)
		// Idle connections cost no CPU (no spinning once the busy-poll
		// window has passed): measured 0-10 ms, the clock's tick; a
		// spinning connection would cost a CPU-second per second.
		assert.LessOrEqual(t, side.cpu, 200, "%s: CPU ms over %v with %d idle connections", side.who, idle, n)
	}
	// They are still connections: a sample of them answers.
	for i := 0; i < n; i += n / 10 {
		require.NoError(t, echoDuplex(conns[i], 1000, uint64(i)), "conn %d", i)
	}
	if short != "" {
		t.Skip(short)
	}
}

func must2(st map[string]int, _ string) map[string]int { return st }

// TestShmPastTheMappingBudget opens 14,000 connections between two
// processes: more than shm's mapping budget (four fifths of
// vm.max_map_count, about five mappings per connection and side) lets
// both processes hold. Both survive, every connection answers, and those
// past the budget run on TCP and say why. (Without the budget, about
// 13,000 shm connections used the mappings the Go runtime needs, and both
// processes died.)
func TestShmPastTheMappingBudget(t *testing.T) {
	const want, conc = 14000, 32
	const margin = 256
	h := startSvc(t, "RSOCK_TRANSPORTS=shm,tcp")
	cfg := testCfg(0, 0)
	cfg.Transports = []string{"shm", "tcp"}
	cfg.UpgradeAfter = -1 // Dial waits: the ring, or the reason, from Dial on
	// Dial returns once both endpoints are set up, and either
	// process can stall for a while here: the run takes both to the
	// host's mapping limit, under the race detector, beside other
	// packages' tests, and each doubling of a process's descriptor table
	// (at 8,192 here) waits for an RCU grace period (4-28 ms on a quiet
	// machine, longer on a loaded one). A default 1 s probe once took such
	// a stall for a server that does not answer (19 dials of a run went
	// to TCP for "no answer"); this test is about the mapping budget, not
	// the probe's timing, and a server that never answers still fails it.
	cfg.ProbeTimeout = time.Minute
	l0, h0 := localStats(), must2(h.stats(t))
	limHere, errHere := raiseNofile(uint64(l0["fds"] + want + margin))
	curThere, _, errThere := h.raiseNofile(t, uint64(h0["fds"]+want+margin))
	if int(limHere.Cur) < l0["fds"]+want+margin || int(curThere) < h0["fds"]+want+margin {
		t.Skipf("RLIMIT_NOFILE: %d connections need about %d fds in each process; the limits are %d here (%v) and %d in the helper (%s)",
			want, want+margin, limHere.Cur, errHere, curThere, errThere)
	}
	start := time.Now()
	conns := dialManyOn(t, h.addr, cfg, want, conc, svcEcho, "")
	t.Logf("%d connections in %v", want, time.Since(start).Round(time.Millisecond))
	defer closeAll(conns, 64)

	byTransport := map[string]int{}
	var sample []string
	for i, c := range conns {
		info := c.Info()
		byTransport[info.Transport]++
		if info.Transport == "shm" {
			continue
		}
		if len(sample) < 3 {
			sample = append(sample, info.Reason)
		}
		if !strings.Contains(info.Reason, "mapping budget") {
			t.Errorf("conn %d on %s for another reason: %s", i, info.Transport, info.Reason)
		}
	}
	live, budget := shm.Mappings()
	t.Logf("transports %v; shm mappings here %d of a budget of %d; reasons for TCP, for example: %q", byTransport, live, budget, sample)
	assert.LessOrEqual(t, live, budget)
	if byTransport["tcp"] == 0 {
		t.Logf("no connection reached the budget: vm.max_map_count is large here")
	}
	// Every connection answers, and the helper is alive and holds them.
	// (It once did not: one connection got no echo. A failure says what
	// the helper held and what the connection's state was.)
	buf := make([]byte, 1)
	for i, c := range conns {
		require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
		_, err := c.Write([]byte{byte(i)})
		if err == nil {
			_, err = io.ReadFull(c, buf)
		}
		if err != nil {
			st, _ := h.stats(t)
			t.Fatalf("conn %d: %v\nits info: %+v\nthe helper holds %d connections of %d", i, err, c.Info(), st["conns"], want)
		}
		require.Equal(t, byte(i), buf[0], "conn %d", i)
	}
	hs := must2(h.stats(t))
	assert.Equal(t, want, hs["conns"], "connections the helper holds")
}

func readIntFile(t testing.TB, path string) int {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	require.NoError(t, err)
	return n
}

// TestShmOpenCloseNoLeaks: 2,000 shm connections opened, used and closed
// leave no goroutine, fd or mapping behind in either process. Half are
// closed by this process first; in the other half this process half-closes
// and the helper, seeing EOF, closes first. (Not by the helper closing
// after it read our last Write: see TestShmWriteCompletedThenPeerCloses for
// what that does to the Write.)
func TestShmOpenCloseNoLeaks(t *testing.T) {
	const cycles, workers = 2000, 4
	h := startSvc(t, "RSOCK_TRANSPORTS=shm")
	cfg := testCfg(0, 0)
	cycle := func(i int) error {
		c, err := dialSvc(h.addr, cfg, svcEcho)
		if err != nil {
			return fmt.Errorf("cycle %d: %w", i, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Minute))
		b := []byte{byte(i)}
		if _, err := c.Write(b); err != nil {
			return fmt.Errorf("cycle %d: writing: %w (%s)", i, err, c.ring().DebugState())
		}
		if _, err := io.ReadFull(c, b); err != nil || b[0] != byte(i) {
			return fmt.Errorf("cycle %d: echo %v, %v (%s)", i, b, err, c.ring().DebugState())
		}
		if i%2 == 1 { // the helper closes first
			if err := c.CloseWrite(); err != nil {
				return fmt.Errorf("cycle %d: CloseWrite: %w", i, err)
			}
			if _, err := c.Read(b); err != io.EOF {
				return fmt.Errorf("cycle %d: after the helper's close: %v, want EOF (%s)", i, err, c.ring().DebugState())
			}
		}
		if err := c.Close(); err != nil {
			return fmt.Errorf("cycle %d: close: %w", i, err)
		}
		return nil
	}
	for i := range 8 { // warm up
		require.NoError(t, cycle(i))
	}
	settle := func() (map[string]int, map[string]int) {
		time.Sleep(50 * time.Millisecond)
		runtime.GC()
		l := localStats()
		hs, _ := h.stats(t)
		return l, hs
	}
	l0, h0 := settle()
	start := time.Now()
	errc := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := w; i < cycles; i += workers {
				if err := cycle(i); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	waitAll(t, errc, workers, 4*time.Minute, func() []*Conn { return nil })
	elapsed := time.Since(start)

	// Exact for what a connection owns: every fd, every shared mapping, and
	// every private mapping the library makes (verbs.AllocMem, counted by
	// verbs.LiveMem). Slack for goroutines the runtime may start, and for
	// the total of /proc/self/maps, whose private anonymous mappings are
	// the Go heap's and, under -race, the race runtime's: CI measured +220
	// over 2,000 cycles after the package's other tests had grown the heap
	// to 5,000 mappings. A per-cycle leak of any mapping would add 2,000;
	// half the cycles catches that and not the runtime's growth.
	exact := []string{"fd_memfd", "fd_eventfd", "fd_socket", "fds", "maps_memfd", "maps_shared", "mem_alloc", "conns"}
	slack := map[string]int{"goroutines": 2, "maps": cycles / 2}
	leaks := func(a, b map[string]int) []string {
		var out []string
		for _, k := range exact {
			if b[k] > a[k] {
				out = append(out, fmt.Sprintf("%s %d -> %d", k, a[k], b[k]))
			}
		}
		for k, s := range slack {
			if b[k] > a[k]+s {
				out = append(out, fmt.Sprintf("%s %d -> %d", k, a[k], b[k]))
			}
		}
		return out
	}
	var l1, h1 map[string]int
	var lk, hk []string
	deadline := time.Now().Add(15 * time.Second)
	for {
		l1, h1 = settle()
		lk, hk = leaks(l0, l1), leaks(h0, h1)
		if len(lk)+len(hk) == 0 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("%d cycles in %v (%v each, %d at a time)", cycles, elapsed.Round(time.Millisecond), (elapsed / cycles).Round(time.Microsecond), workers)
	for _, k := range []string{"goroutines", "fds", "fd_memfd", "fd_eventfd", "fd_socket", "maps", "maps_shared", "maps_memfd", "mem_alloc", "threads"} {
		t.Logf("  %-10s here %5d -> %5d   helper %5d -> %5d", k, l0[k], l1[k], h0[k], h1[k])
	}
	assert.Empty(t, lk, "leaks in this process")
	assert.Empty(t, hk, "leaks in the helper")
	assert.Empty(t, rendezvousListeners(t, os.Getpid()), "this process's rendezvous listener outlived its connections")
	assert.Empty(t, rendezvousListeners(t, h.cmd.Process.Pid), "the helper's rendezvous listener outlived its connections")
}

// ---- misbehaviour found ----

// TestShmWriteCompletedThenPeerCloses: a Write whose bytes all reached the
// peer must not fail because the peer, having read them, closed.
//
// The helper (svcCloseFirst) reads one byte, echoes it and closes. This
// process writes that byte with one Write of 1 byte: the helper can only
// close after it has read the byte, so the Write had completed. Yet Write
// sometimes returns (1, EPIPE) ("rsock: broken pipe"; the Conn state shows
// the byte sent, consumed by the peer, and the peer's FIN and CLOSE).
//
// Cause (internal/stream's Write, since fixed): after posting the final
// chunk the loop releases c.mu and starts over, and the top of the loop
// checks writeErrLocked (closed, error, wrClosed, PeerClosed, peerGone,
// deadline) before "written == len(b)". If background progress or the
// bootstrap watcher takes c.mu in that gap and records the peer's CLOSE
// or goodbye, the completed Write reports EPIPE with n == len(b). The same
// gap turns a completed Write into net.ErrClosed (a concurrent Close),
// EPIPE (a concurrent CloseWrite) or os.ErrDeadlineExceeded (the write
// deadline passing just then).
//
// The gap is short; other goroutines calling methods that take c.mu widen
// it, as a concurrent Read or SetDeadline would. Here three goroutines per
// connection call DebugState in a loop during the Write: measured under
// -race, about one Write in ten then fails (without them, one in several
// thousand: it showed up in TestShmOpenCloseNoLeaks about one run in five).
func TestShmWriteCompletedThenPeerCloses(t *testing.T) {
	const maxCycles, spinners = 1000, 3
	h := startSvc(t, "RSOCK_TRANSPORTS=shm")
	cfg := testCfg(0, 0)
	var failures []string
	cycles := 0
	start := time.Now()
	for cycles < maxCycles && len(failures) < 3 && time.Since(start) < 30*time.Second {
		cycles++
		c, err := dialSvc(h.addr, cfg, svcCloseFirst)
		require.NoError(t, err)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range spinners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						_ = c.ring().DebugState()
					}
				}
			}()
		}
		n, werr := c.Write([]byte{42})
		close(stop)
		wg.Wait()
		var b [1]byte
		_, rerr := io.ReadFull(c, b[:])
		if werr != nil && rerr == nil && b[0] == 42 {
			// The helper echoed the byte: it had it, and then closed.
			failures = append(failures, fmt.Sprintf("cycle %d: Write returned (%d, %v), but the peer had read the byte and echoed it; state %s", cycles, n, werr, c.ring().DebugState()))
		}
		c.Close()
	}
	t.Logf("%d cycles in %v, %d completed Writes failed", cycles, time.Since(start).Round(time.Millisecond), len(failures))
	for _, f := range failures {
		t.Errorf("%s", f)
	}
}

// TestShmRendezvousSlotExhaustion: a local process of the same user that
// holds a few hundred silent connections to a server's rendezvous socket
// (its name is public in /proc/net/unix) must not stop that server from
// setting up new shm connections with other processes.
//
// It used to: the listener served at most 64 exchanges at once, gave each
// connection 2 s for its first message, and left the rest in the kernel's
// backlog, in order, so behind 400 silent connections a real client waited
// about 400/64 x 2 s = 12.5 s, past the bound on its exchange, and fell
// back. Now the listener reads every connection's SO_PEERCRED as it
// accepts it and serves at most maxPerPeer exchanges of one process at
// once, queueing the rest of that process's connections; each connection
// has firstMessageTimeout from its accept to send its message. So the hog
// delays only itself, and its queue drains in about 2 s.
func TestShmRendezvousSlotExhaustion(t *testing.T) {
	h := startSvc(t, "RSOCK_TRANSPORTS=shm")
	c, err := dialSvc(h.addr, testCfg(0, 0), svcEcho)
	require.NoError(t, err)
	defer c.Close()
	name, _ := h.lastInfo(t)
	res, delay, err := hogRendezvous(t, h.addr, name, 400)
	t.Logf("hog: %s; a new connection meanwhile: %v after %v", res, err, delay.Round(time.Millisecond))
	assert.NoError(t, err, "a new connection while 400 silent ones hold the rendezvous")
	assert.True(t, strings.HasPrefix(res, "refused all"), "hog: %s", res)
	assert.NoError(t, echoDuplex(c, 1<<20, 7), "the established connection")
}
