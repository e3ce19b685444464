package rsock

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/sysdep"
)

// referenceFrames reads stream with handshake.Next, which reads exactly
// one frame at a time: the frames an inbox must yield, and the error that
// ends them.
func referenceFrames(stream []byte) ([]string, error) {
	r := bytes.NewReader(stream)
	var got []string
	for {
		h, m, err := handshake.Next(r)
		if err != nil {
			return got, err
		}
		if h.Type != handshake.TypeData {
			got = append(got, fmt.Sprintf("%v %#v", h.Type, m))
			continue
		}
		p := make([]byte, h.Length)
		if _, err := io.ReadFull(r, p); err != nil {
			return got, io.ErrUnexpectedEOF
		}
		got = append(got, "data "+string(p))
	}
}

// scripted is an inbox source that hands on stream in the pieces cuts
// says, cycling through it: a cut of 0 is one read that would block (or,
// right after one, a read of a byte), another one of at most that many
// bytes; io.EOF after the stream.
type scripted struct {
	stream, cuts []byte
	i            int
	blocked      bool
}

func (s *scripted) cut() int {
	if len(s.cuts) == 0 {
		return 7
	}
	c := int(s.cuts[s.i%len(s.cuts)])
	s.i++
	return c
}

func (s *scripted) Await() error { return nil } // the next read moves on

func (s *scripted) Read(p []byte, wait bool) (int, error) {
	if len(s.stream) == 0 {
		return 0, io.EOF
	}
	c := s.cut()
	if c == 0 && !wait && !s.blocked {
		s.blocked = true // (never twice in a row: the stream moves on)
		return 0, errWouldBlock
	}
	s.blocked = false
	n := copy(p[:min(len(p), max(c, 1))], s.stream)
	s.stream = s.stream[n:]
	return n, nil
}

// inboxFrames reads the stream through an inbox fed by src, with reads
// that do not wait and take buffers of the sizes cuts says.
func inboxFrames(t *testing.T, src *scripted) ([]string, error) {
	in := &inbox{src: src}
	var got []string
	var payload []byte
	for steps := 0; ; steps++ {
		require.Less(t, steps, 1<<20, "no progress")
		var err error
		if in.data > 0 {
			p := make([]byte, 1+src.cut()%200)
			var n int
			n, err = in.take(p, false)
			payload = append(payload, p[:n]...)
			if err == nil && in.data == 0 {
				got = append(got, "data "+string(payload))
				payload = nil
			}
		} else {
			var h handshake.Header
			var m handshake.Message
			h, m, err = in.next(false)
			if err == nil && h.Type != handshake.TypeData {
				got = append(got, fmt.Sprintf("%v %#v", h.Type, m))
			}
		}
		if in.buffered() == 0 {
			require.Nil(t, in.buf, "an empty inbox holds no buffer")
		}
		if errors.Is(err, errWouldBlock) {
			continue // nothing lost: the next read goes on where this one stopped
		}
		if err != nil {
			return got, err
		}
	}
}

func inboxSeeds() [][]byte {
	frame := func(m handshake.Message) []byte {
		b, err := handshake.Append(nil, m)
		if err != nil {
			panic(err)
		}
		return b
	}
	data := func(s string) []byte {
		var hb [handshake.HeaderLen]byte
		handshake.PutDataHeader(&hb, len(s))
		return append(hb[:], s...)
	}
	long := frame(&handshake.Goodbye{Abort: true, Reason: strings.Repeat("r", handshake.MaxReason)})
	stream := bytes.Join([][]byte{
		data("hello"), frame(&handshake.Switch{Cursor: 5}), data(strings.Repeat("d", 5000)),
		long, frame(&handshake.Fin{Cursor: 5005}),
	}, nil)
	return [][]byte{
		stream,
		// Frames that straddle reads: the buffer fills up and its
		// unread bytes move to its start.
		bytes.Repeat(frame(&handshake.Fin{Cursor: 1}), 400),
		stream[:len(stream)-3],                // cut inside the last frame
		stream[:handshake.HeaderLen+2],        // cut inside the first payload
		[]byte("GET / HTTP/1.1\r\n\r\n"),      // not frames
		append(data("x"), "RSOCK\x00\x01"...), // a header cut short
	}
}

// FuzzInbox: an inbox fed in arbitrary pieces, with reads that would block
// anywhere and takes of any size, yields exactly the frames
// handshake.Next reads from the whole stream, and ends cleanly exactly
// where Next does.
func FuzzInbox(f *testing.F) {
	for _, s := range inboxSeeds() {
		f.Add(s, []byte{0, 1, 3, 200, 0, 17})
		f.Add(s, []byte{251}) // prime: reads and frames rarely end together
	}
	f.Fuzz(func(t *testing.T, stream, cuts []byte) {
		want, werr := referenceFrames(stream)
		got, gerr := inboxFrames(t, &scripted{stream: stream, cuts: cuts})
		assert.Equal(t, want, got)
		assert.Equal(t, werr == io.EOF, gerr == io.EOF, "the stream ends cleanly for both or neither: %v, %v", werr, gerr)
	})
}

// TestInboxLongControlFrame: a control frame longer than the inbox's
// buffer (a Hello of several offers with long provider descriptions) is
// read whole, in a larger one.
func TestInboxLongControlFrame(t *testing.T) {
	// MaxOffers offers with descriptions as long as the body allows.
	hello := handshake.Hello{Offers: make([]handshake.Offer, handshake.MaxOffers)}
	info := handshake.MaxInfo
	var b []byte
	for {
		for i := range hello.Offers {
			hello.Offers[i] = handshake.Offer{Transport: handshake.TransportSim, Info: bytes.Repeat([]byte{'i'}, info)}
		}
		var err error
		if b, err = handshake.Append(nil, &hello); err == nil {
			break
		}
		info--
	}
	require.Greater(t, len(b), inboxSize)
	got, err := inboxFrames(t, &scripted{stream: b, cuts: []byte{100}})
	assert.Equal(t, io.EOF, err)
	assert.Equal(t, []string{fmt.Sprintf("%v %#v", handshake.TypeHello, &hello)}, got)
}

// awaitProbe is a source whose first read finds nothing; await records
// whether the inbox held a buffer while it waited.
type awaitProbe struct {
	in            *inbox
	stream        []byte
	awaited, held bool
}

func (s *awaitProbe) Read(p []byte, wait bool) (int, error) {
	if !s.awaited {
		return 0, errWouldBlock
	}
	n := copy(p, s.stream)
	s.stream = s.stream[n:]
	return n, nil
}

func (s *awaitProbe) Await() error {
	s.awaited, s.held = true, s.in.buf != nil
	return nil
}

// A lean inbox (readLoop's) waits for the socket holding no buffer, so
// that a connection idle on TCP, or on a ring with readLoop parked on its
// bootstrap, pins no pooled memory; and what comes after the wait is
// read whole.
func TestInboxLeanWaitHoldsNoBuffer(t *testing.T) {
	frame, err := handshake.Append(nil, &handshake.Fin{Cursor: 7})
	require.NoError(t, err)
	src := &awaitProbe{stream: frame}
	in := &inbox{src: src, lean: true}
	src.in = in
	_, msg, err := in.next(true)
	require.NoError(t, err)
	require.Equal(t, &handshake.Fin{Cursor: 7}, msg)
	require.True(t, src.awaited, "the first read found nothing: it waited")
	require.False(t, src.held, "it waited holding a buffer")
	require.Nil(t, in.buf, "the frame was read: the buffer went back")
}

// A lean inbox waiting on a socket whose peer resets it reports the
// reset, not the end of the stream: a peek takes the socket's pending
// error, and the read after it would find only the end (a cut stream
// must never pass for a whole one).
func TestInboxLeanWaitSeesReset(t *testing.T) {
	a, b := tcpPair(t)
	var src sysdep.Reader
	src.Init(a.SyscallConn())
	require.NoError(t, b.SetLinger(0))
	require.NoError(t, b.Close()) // an RST
	// The wait meets the reset, whether it came before the peek or while
	// it waited, and reports it: once taken, a read would find only the
	// end.
	require.ErrorIs(t, src.Await(), syscall.ECONNRESET)
}
