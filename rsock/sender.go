package rsock

import (
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	pool "github.com/libp2p/go-buffer-pool"

	"github.com/rdmanet/rdmanet/internal/deadline"
	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/sysdep"
)

// sendQueue bounds the bytes queued for the bootstrap socket beyond what
// the kernel took: a Write waits (deadline permitting) while it is full.
const sendQueue = 256 << 10

// sender writes a switching connection's frames on its bootstrap socket, in
// the order queued, one goroutine at a time, with no deadline: a frame cut
// short would break the framing for good (docs/protocol.md §9.3).
type sender struct {
	raw *net.TCPConn
	sys sysdep.Writer             // raw's RawConn's calls (sendLocked, delivered), guarded by mu
	hdr [handshake.HeaderLen]byte // data's frame header, guarded by mu

	mu         sync.Mutex
	q          net.Buffers   // frames not yet written, in order (pooled)
	queued     int           // bytes of q
	sent       uint64        // Data payload bytes queued so far: the stream cursor on TCP
	running    bool          // a goroutine is writing
	end        sendEnd       // how far the sending has ended
	err        error         // the socket failed; set once
	room       note          // the queue shrank
	closeTimer *time.Timer   // resets the socket under a finished sender's queue (finish)
	readerGone bool          // the reader has stopped (readerDone)
	ended      chan struct{} // closed once the socket is (closeSocket)
	endOnce    sync.Once     // closeSocket runs once
	held       []byte        // goes out in front of the next frame queued (hold)
	// offered: the client's Offer is queued and its Confirm not yet; no
	// Data goes between them (offer, confirmed; docs/protocol.md §9.4).
	offered bool
}

// sendEnd is how far a sender's end has come; it only moves forward.
type sendEnd uint8

const (
	endOpen   sendEnd = iota // frames are taken
	endHalf                  // the peer said goodbye (halfClose): no more frames; a FIN once the queue is written, and the socket stays open for Close
	endFinish                // finish, or a last frame: no more frames; the socket ends once they are written, or at closeTimer
	endShut                  // written after finish: FIN sent; the socket closes at the reader's end or lingerTimeout (shutLocked)
)

// sendLocked queues the frame of head and body, behind the held one, and
// makes sure a goroutine writes the queue; with nothing queued the caller
// first writes what the socket takes, without blocking or copying. head and
// body stay the caller's.
func (s *sender) sendLocked(head, body []byte) {
	held := s.held
	s.held = nil
	skip := 0
	if !s.running && len(s.q) == 0 && s.err == nil {
		skip = s.sys.WriteNow(held, head, body) // 0 on an error, which run meets again
	}
	if rest := len(held) + len(head) + len(body) - skip; rest > 0 {
		frame := pool.Get(rest)[:0]
		for _, p := range [...][]byte{held, head, body} {
			k := min(skip, len(p))
			frame, skip = append(frame, p[k:]...), skip-k
		}
		s.q = append(s.q, frame)
		s.queued += len(frame)
		if !s.running {
			s.running = true
			go s.run()
		}
	}
}

// hold keeps frame, an early hello or the answer to one, to go out in
// front of the next frame queued, or at flush or finish (§9.11). The
// frame is shared and read only: s never writes to it or pools it.
func (s *sender) hold(frame []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = frame
}

// flush queues the held frame, if any; one that can no longer go is dropped.
func (s *sender) flush() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
}

func (s *sender) flushLocked() {
	if s.held != nil && s.failureLocked() == nil {
		s.sendLocked(nil, nil)
	}
	s.held = nil
}

// init prepares s to write on raw, whose RawConn is rc (nil: WriteNow
// and delivered fail).
func (s *sender) init(raw *net.TCPConn, rc syscall.RawConn) {
	s.raw = raw
	s.sys.Init(rc)
	s.ended = make(chan struct{})
	s.room = newNote()
}

func (s *sender) closeSocket() {
	s.endOnce.Do(func() {
		_ = s.raw.Close()
		close(s.ended)
	})
}

// run writes queued frames until the queue is empty or the socket fails.
func (s *sender) run() {
	for {
		s.mu.Lock()
		if len(s.q) == 0 || s.err != nil {
			s.running = false
			switch {
			case s.end == endHalf && s.err == nil:
				_ = s.raw.CloseWrite()
			case s.end == endFinish:
				if s.closeTimer != nil {
					s.closeTimer.Stop()
				}
				if s.err == nil {
					s.shutLocked()
				} else {
					s.closeSocket()
				}
			}
			s.mu.Unlock()
			return
		}
		bufs := s.q
		s.q = nil
		s.mu.Unlock()
		all := append(make([][]byte, 0, len(bufs)), bufs...)
		n, err := bufs.WriteTo(s.raw)
		for _, b := range all {
			pool.Put(b)
		}
		s.mu.Lock()
		s.queued -= int(n)
		if err != nil && s.err == nil {
			s.err = err
		}
		s.mu.Unlock()
		s.room.wake()
	}
}

// send queues a control frame; it fails only once the socket has failed or
// the sender took its last frame.
func (s *sender) send(m handshake.Message) error {
	_, err := s.sendAt(func(uint64) handshake.Message { return m }, false)
	return err
}

// sendAt queues a control frame made from the Data cursor, under the lock
// of the Data frames, so that none slips between the two. With last, the
// sender takes no frames after it.
func (s *sender) sendAt(m func(cursor uint64) handshake.Message, last bool) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cursor := s.sent
	if err := s.failureLocked(); err != nil {
		return cursor, err
	}
	frame, err := handshake.Append(pool.Get(512)[:0], m(cursor))
	if err == nil {
		s.sendLocked(frame, nil)
		if last {
			s.end = endFinish
		}
	}
	pool.Put(frame)
	return cursor, err
}

// offer queues the client's Offer; Data waits from here until confirmed,
// which the caller calls however the upgrade ends.
func (s *sender) offer(m *handshake.UpgradeOffer) error {
	s.mu.Lock()
	s.offered = true
	s.mu.Unlock()
	return s.send(m)
}

// confirmed queues the client's Confirm m, if not nil, and lets Data go
// again (the offer was answered, or the upgrade ended); it fails as send does.
func (s *sender) confirmed(m *handshake.Confirm) error {
	var err error
	if m != nil {
		err = s.send(m)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.offered {
		s.offered = false
		s.room.wake()
	}
	return err
}

func (s *sender) cursor() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// seek moves the Data cursor forward to x, for a failover's resend.
func (s *sender) seek(x uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = max(s.sent, x)
}

// failureLocked is why s takes no more frames, nil while it takes them:
// the socket's failure, or net.ErrClosed once it ended (end).
func (s *sender) failureLocked() error {
	switch {
	case s.err != nil:
		return s.err
	case s.end != endOpen:
		return net.ErrClosed
	}
	return nil
}

// data queues b as Data frames. It waits for room while sendQueue bytes
// are queued, and while an offer awaits its answer (offer), until dl
// passes or done is closed, and returns how many bytes of b it queued.
func (s *sender) data(b []byte, dl *deadline.Deadline, done <-chan struct{}) (int, error) {
	n := 0
	for n < len(b) {
		s.mu.Lock()
		for (s.queued >= sendQueue || s.offered) && s.failureLocked() == nil {
			s.mu.Unlock()
			select {
			case <-s.room:
			case <-dl.Wait():
				return n, os.ErrDeadlineExceeded
			case <-done:
				return n, net.ErrClosed
			}
			s.mu.Lock()
		}
		if err := s.failureLocked(); err != nil {
			s.mu.Unlock()
			return n, err
		}
		k := min(len(b)-n, handshake.MaxData)
		handshake.PutDataHeader(&s.hdr, k)
		s.sent += uint64(k)
		s.sendLocked(s.hdr[:], b[n:n+k])
		s.mu.Unlock()
		n += k
	}
	return n, nil
}

// finish takes no more frames and closes the socket once the queued ones
// are written, or wait from now, whichever comes first. It does not block.
func (s *sender) finish(wait time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	s.end = max(s.end, endFinish)
	if !s.running {
		s.shutLocked()
		return
	}
	// Frames still queued then are lost: a reset, not an orderly end, so
	// the peer cannot take a cut stream for a whole one.
	s.closeTimer = time.AfterFunc(wait, func() {
		_ = s.raw.SetLinger(0)
		s.closeSocket()
	})
}

// halfClose ends the sending for a peer whose goodbye checked out: no more
// frames, and once the queued ones are written a FIN, which tells the peer
// we have what it sent (it keeps its ring until then, stream.Owner). The
// socket stays open until Close (finish).
func (s *sender) halfClose() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flushLocked()
	if s.end != endOpen {
		return
	}
	s.end = endHalf
	if !s.running && s.err == nil {
		_ = s.raw.CloseWrite()
	}
}

// lingerTimeout bounds the half-closed socket's wait for the peer's end,
// in nanoseconds; a test may change it while earlier tests' Conns read it.
var lingerTimeout atomic.Int64

func init() { lingerTimeout.Store(int64(2 * time.Second)) }

// shutLocked ends the sending once everything queued is written: a FIN, not
// a close, so that frames the peer sent meanwhile do not make it a reset that
// destroys what we sent (§9.6). The socket closes once the reader has
// stopped (readerDone), or lingerTimeout from now.
func (s *sender) shutLocked() {
	if s.end == endShut {
		return
	}
	s.end = endShut
	if s.readerGone {
		s.closeSocket()
		return
	}
	_ = s.raw.CloseWrite()
	time.AfterFunc(time.Duration(lingerTimeout.Load()), s.closeSocket)
}

// readerDone says the socket's reader has stopped: the socket is closed
// now if the sending has ended.
func (s *sender) readerDone() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readerGone = true
	if s.end == endShut {
		s.closeSocket()
	}
}

// delivered reports whether every frame queued so far has been written
// and acknowledged by the peer's TCP (SIOCOUTQ; false where the system
// does not tell): a reset that meets the socket now destroys none of ours.
// With quiet, the same system call (SO_MEMINFO) also finds nothing of the
// peer's unread in the socket.
func (s *sender) delivered(quiet bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.running || len(s.q) > 0 || s.err != nil || s.held != nil:
		return false // a frame is queued, being written or held, or the socket failed
	case quiet:
		return s.sys.Quiet()
	}
	return s.sys.Delivered()
}
