package rsock

import (
	"fmt"
	"io"

	pool "github.com/libp2p/go-buffer-pool"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/sysdep"
)

// inboxSize is the buffer an inbox reads into: several small frames, or a
// header and the start of its payload, per system call (longer: their size).
const inboxSize = 4 << 10

// errWouldBlock is an inbox read with wait false that found nothing.
var errWouldBlock = sysdep.ErrWouldBlock

// inbox reads a switching connection's frames (docs/protocol.md §9.2) through
// a pooled buffer, held only while it holds bytes or, unless lean, waits on
// the socket. Reads are resumable: one cut short (a deadline, or wait false)
// loses nothing. Callers serialise its use.
type inbox struct {
	src  source // one read: a sysdep.Reader's
	buf  []byte // pooled; nil when empty
	r, w int    // buf[r:w] is unread
	data int    // payload bytes of the current Data frame not yet taken
	// lean: a waiting read gives the empty buffer back first (Await), for
	// readLoop, which may wait on an idle socket for the connection's life.
	lean bool
}

// source is what an inbox reads: one read into p, at least one byte, or
// errWouldBlock (wait false), io.EOF at the socket's end, or the socket's
// error. Await waits until a read would not block, or fails as a read
// would (a deadline, a close); it takes nothing.
type source interface {
	Read(p []byte, wait bool) (int, error)
	Await() error
}

func (in *inbox) buffered() int { return in.w - in.r }

// fill reads until at least need bytes are buffered. With wait false it
// returns errWouldBlock rather than wait for the socket. The end of the
// socket is io.EOF at a frame boundary (nothing buffered and no payload
// owed), io.ErrUnexpectedEOF inside a frame; the socket's errors, among
// them os.ErrDeadlineExceeded and net.ErrClosed, come as they are.
func (in *inbox) fill(need int, wait bool) error {
	for in.buffered() < need {
		in.room(need)
		n, err := in.src.Read(in.buf[in.w:], wait && !in.lean)
		if err == errWouldBlock && wait {
			in.release()
			if err = in.src.Await(); err == nil {
				continue
			}
		}
		if err == io.EOF && (in.buffered() > 0 || in.data > 0) {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			in.release()
			return err
		}
		in.w += n
	}
	return nil
}

// room makes sure buf can take need unread bytes, moving them to its
// start or into a larger pooled buffer.
func (in *inbox) room(need int) {
	switch {
	case in.buf == nil:
		in.buf, in.r, in.w = pool.Get(max(inboxSize, need)), 0, 0
	case need > len(in.buf):
		b := pool.Get(need)
		in.w = copy(b, in.buf[in.r:in.w])
		in.r = 0
		pool.Put(in.buf)
		in.buf = b
	case in.r+need > len(in.buf) || in.w == len(in.buf):
		in.w = copy(in.buf, in.buf[in.r:in.w])
		in.r = 0
	}
}

// preload puts b, read before the inbox existed, in front of what it reads.
func (in *inbox) preload(b []byte) {
	if len(b) == 0 {
		return
	}
	in.room(len(b))
	in.w += copy(in.buf[in.w:], b)
}

// release returns the buffer to the pool if it holds nothing unread.
func (in *inbox) release() {
	if in.buf != nil && in.r == in.w {
		pool.Put(in.buf)
		in.buf, in.r, in.w = nil, 0, 0
	}
}

// next reads the next frame, once data is 0 (callers check). For a
// Data frame it returns the header, with a nil message, and leaves the
// payload (h.Length bytes, at least 1) to take; for any other frame, the
// message. Malformed frames are handshake.ParseHeader's and Decode's errors.
func (in *inbox) next(wait bool) (handshake.Header, handshake.Message, error) {
	// Judged at each read: bytes that are not the magic fail at once (a
	// plain server's short reply to an early hello).
	for in.buffered() < handshake.HeaderLen {
		if err := in.fill(in.buffered()+1, wait); err != nil {
			return handshake.Header{}, nil, err
		}
		if !handshake.MatchesMagicPrefix(in.buf[in.r:in.w]) {
			return handshake.Header{}, nil, handshake.ErrBadMagic
		}
	}
	h, err := handshake.ParseHeader(in.buf[in.r : in.r+handshake.HeaderLen])
	if err != nil {
		return h, nil, err
	}
	if h.Type == handshake.TypeData {
		if h.Length == 0 {
			return h, nil, fmt.Errorf("%w: empty data frame", handshake.ErrMalformed)
		}
		in.r += handshake.HeaderLen
		in.data = int(h.Length)
		in.release()
		return h, nil, nil
	}
	size := handshake.HeaderLen + int(h.Length) // at most MaxBody: ParseHeader checked
	if err := in.fill(size, wait); err != nil {
		return h, nil, err
	}
	m, err := handshake.Decode(h, in.buf[in.r+handshake.HeaderLen:in.r+size])
	in.r += size
	in.release()
	return h, m, err
}

// take reads up to len(p) bytes of the current Data frame's payload into
// p, and at least one unless it fails. A p at least as long as the buffer
// is read into directly when nothing is buffered.
func (in *inbox) take(p []byte, wait bool) (int, error) {
	p = p[:min(len(p), in.data)]
	if len(p) == 0 {
		return 0, nil
	}
	if in.buffered() == 0 && len(p) >= inboxSize {
		n, err := in.src.Read(p, wait)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		in.data -= n
		return n, err
	}
	if err := in.fill(1, wait); err != nil {
		return 0, err
	}
	n := copy(p, in.buf[in.r:in.w])
	in.r += n
	in.data -= n
	in.release()
	return n, nil
}
