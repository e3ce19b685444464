package handshake_test

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

func TestConstants(t *testing.T) {
	assert.Equal(t, 12, handshake.HeaderLen)
	assert.Equal(t, 8, len(handshake.Magic))
	assert.Equal(t, byte(0x89), handshake.Magic[0])
	assert.Equal(t, 65524, handshake.MaxData)
	assert.Equal(t, 1<<16, handshake.HeaderLen+handshake.MaxData, "a maximal Data frame is 64 KiB")
	assert.Equal(t, uint16(1), handshake.FlagSwitch)
}

func TestParseHeader(t *testing.T) {
	h, err := handshake.ParseHeader(rawFrame(handshake.Version, 3, make([]byte, 0x0102))[:handshake.HeaderLen])
	require.NoError(t, err)
	assert.Equal(t, handshake.Header{Version: handshake.Version, Type: handshake.TypeDecline, Length: 0x0102}, h)

	// Exactly MaxBody is fine, one more is not.
	hdr := rawFrame(handshake.Version, 1, nil)
	hdr[10], hdr[11] = 0x10, 0x00
	_, err = handshake.ParseHeader(hdr)
	require.NoError(t, err)
	hdr[11] = 0x01
	_, err = handshake.ParseHeader(hdr)
	require.ErrorIs(t, err, handshake.ErrMalformed)
	hdr[10], hdr[11] = 0xff, 0xff
	_, err = handshake.ParseHeader(hdr)
	require.ErrorIs(t, err, handshake.ErrMalformed)

	// Data may reach MaxData, every other type MaxBody.
	for typ := uint8(1); typ <= 11; typ++ {
		limit := handshake.MaxBody
		if handshake.Type(typ) == handshake.TypeData {
			limit = handshake.MaxData
		}
		for _, l := range []int{0, 1, handshake.MaxBody, handshake.MaxBody + 1, handshake.MaxData, handshake.MaxData + 1, 0xffff} {
			hdr := rawFrame(handshake.Version, typ, nil)
			hdr[10], hdr[11] = byte(l>>8), byte(l)
			h, err := handshake.ParseHeader(hdr)
			assert.Equal(t, handshake.Header{Version: handshake.Version, Type: handshake.Type(typ), Length: uint16(l)}, h)
			if l > limit {
				assert.ErrorIs(t, err, handshake.ErrMalformed, "type %d length %d", typ, l)
			} else {
				assert.NoError(t, err, "type %d length %d", typ, l)
			}
		}
	}
	// Every length a uint16 holds past MaxData is rejected for Data.
	for l := handshake.MaxData + 1; l <= 0xffff; l++ {
		hdr := rawFrame(handshake.Version, 7, nil)
		hdr[10], hdr[11] = byte(l>>8), byte(l)
		_, err := handshake.ParseHeader(hdr)
		require.ErrorIs(t, err, handshake.ErrMalformed, l)
		_, err = handshake.Decode(handshake.Header{Version: handshake.Version, Type: handshake.TypeData, Length: uint16(l)}, make([]byte, l))
		require.ErrorIs(t, err, handshake.ErrMalformed, l)
	}

	// Short input.
	for n := range handshake.HeaderLen {
		_, err := handshake.ParseHeader(rawFrame(handshake.Version, 1, nil)[:n])
		require.ErrorIs(t, err, handshake.ErrMalformed, n)
	}
	_, err = handshake.ParseHeader([]byte("GET"))
	require.ErrorIs(t, err, handshake.ErrBadMagic)
}

func TestUnknownType(t *testing.T) {
	for _, typ := range []uint8{0, 12, 13, 128, 255} {
		frame := rawFrame(handshake.Version, typ, body{}.u8(0).u16(0))
		h, err := handshake.ParseHeader(frame)
		assert.ErrorIs(t, err, handshake.ErrMalformed, typ)
		assert.Equal(t, handshake.Type(typ), h.Type)
		_, err = handshake.Decode(handshake.Header{Version: handshake.Version, Type: handshake.Type(typ), Length: 3}, frame[handshake.HeaderLen:])
		assert.ErrorIs(t, err, handshake.ErrMalformed, typ)
		_, err = handshake.Read(bytes.NewReader(frame))
		assert.ErrorIs(t, err, handshake.ErrMalformed, typ)
	}
}

func TestBadMagic(t *testing.T) {
	good := rawFrame(handshake.Version, 4, body{}.u8(0).u16(0))
	cases := map[string][]byte{
		"http":           []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"ssh":            []byte("SSH-2.0-OpenSSH_9.6\r\n"),
		"7-bit":          append([]byte{0x09}, good[1:]...),
		"crlf-to-lf":     append([]byte("\x89RSOCK\n"), good[8:]...),
		"lf-to-crlf":     append([]byte("\x89RSOCK\r\r\n"), good[8:]...),
		"zeros":          make([]byte, 32),
		"last-byte-diff": append(append([]byte("\x89RSOCK\r"), 0), good[8:]...),
	}
	for name, in := range cases {
		_, err := handshake.ParseHeader(in)
		assert.ErrorIs(t, err, handshake.ErrBadMagic, name)
		_, err = handshake.Read(bytes.NewReader(in))
		assert.ErrorIs(t, err, handshake.ErrBadMagic, name)
		assert.False(t, handshake.MatchesMagicPrefix(in), name)
	}
}

// stallingReader returns its data one byte per Read, then fails the test if
// read again: it checks Read gives up as soon as a byte is wrong.
type stallingReader struct {
	t    *testing.T
	data []byte
}

func (r *stallingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		r.t.Fatal("Read kept reading after a bad magic byte")
	}
	p[0] = r.data[0]
	r.data = r.data[1:]
	return 1, nil
}

func TestBadMagicEarly(t *testing.T) {
	for _, in := range []string{"G", "\x89RS0", "\x89RSOCK\n"} {
		_, err := handshake.Read(&stallingReader{t: t, data: []byte(in)})
		assert.ErrorIs(t, err, handshake.ErrBadMagic, "%q", in)
	}
	// A short non-rsock reply followed by EOF is bad magic, not EOF.
	_, err := handshake.Read(bytes.NewReader([]byte("NO\r\n")))
	assert.ErrorIs(t, err, handshake.ErrBadMagic)
}

func TestMatchesMagicPrefix(t *testing.T) {
	m := []byte(handshake.Magic)
	for n := 0; n <= len(m); n++ {
		assert.True(t, handshake.MatchesMagicPrefix(m[:n]), n)
	}
	assert.True(t, handshake.MatchesMagicPrefix(rawFrame(handshake.Version, 1, nil)), "longer input that starts with Magic")
	assert.False(t, handshake.MatchesMagicPrefix([]byte("\x88")))
	assert.False(t, handshake.MatchesMagicPrefix([]byte("\x89RSOCKS")))
	assert.False(t, handshake.MatchesMagicPrefix([]byte("GET / HTTP/1.1")))
}

func TestVersion(t *testing.T) {
	for _, v := range []uint8{0, 1, handshake.Version + 1, 255} {
		// A future version may have a longer body and a new type: the
		// header is still returned and nothing past it is read.
		frame := rawFrame(v, 77, bytesOf(5000, 'x'))
		h, err := handshake.ParseHeader(frame)
		require.ErrorIs(t, err, handshake.ErrVersion)
		assert.NotErrorIs(t, err, handshake.ErrMalformed)
		assert.Equal(t, handshake.Header{Version: v, Type: 77, Length: 5000}, h)

		r := bytes.NewReader(frame)
		m, err := handshake.Read(r)
		require.ErrorIs(t, err, handshake.ErrVersion)
		assert.Nil(t, m)
		assert.Equal(t, len(frame)-handshake.HeaderLen, r.Len(), "body must not be read")

		_, err = handshake.Decode(handshake.Header{Version: v, Type: handshake.TypeConfirm, Length: 3}, body{}.u8(0).u16(0))
		require.ErrorIs(t, err, handshake.ErrVersion)
	}
}

func TestDecodeLengthMismatch(t *testing.T) {
	b := body{}.u8(0).u16(0)
	for _, l := range []uint16{0, 2, 4, handshake.MaxBody, handshake.MaxBody + 1, 0xffff} {
		_, err := handshake.Decode(handshake.Header{Version: handshake.Version, Type: handshake.TypeConfirm, Length: l}, b)
		assert.ErrorIs(t, err, handshake.ErrMalformed, l)
	}
	// A body over MaxBody is rejected even when the header agrees.
	big := make([]byte, handshake.MaxBody+1)
	_, err := handshake.Decode(handshake.Header{Version: handshake.Version, Type: handshake.TypeHello, Length: uint16(len(big))}, big)
	assert.ErrorIs(t, err, handshake.ErrMalformed)
}

// TestTruncatedFrame cuts every valid frame at every byte position: Read
// reports io.EOF for nothing at all and io.ErrUnexpectedEOF otherwise.
func TestTruncatedFrame(t *testing.T) {
	for _, s := range samples() {
		for n := range len(s.frame) {
			for _, r := range []io.Reader{
				bytes.NewReader(s.frame[:n]),
				iotest.OneByteReader(bytes.NewReader(s.frame[:n])),
				iotest.DataErrReader(bytes.NewReader(s.frame[:n])),
			} {
				m, err := handshake.Read(r)
				require.Nil(t, m)
				if n == 0 {
					require.ErrorIs(t, err, io.EOF, "%s cut at %d", s.name, n)
				} else {
					require.ErrorIs(t, err, io.ErrUnexpectedEOF, "%s cut at %d", s.name, n)
				}
			}
		}
	}
}

func TestReadErrorPassedThrough(t *testing.T) {
	boom := errors.New("boom")
	frame := samples()[0].frame
	for _, n := range []int{0, 5, handshake.HeaderLen, handshake.HeaderLen + 3} {
		r := io.MultiReader(bytes.NewReader(frame[:n]), iotest.ErrReader(boom))
		_, err := handshake.Read(r)
		assert.ErrorIs(t, err, boom, n)
	}
	// Data and EOF in the same call complete the frame.
	m, err := handshake.Read(iotest.DataErrReader(bytes.NewReader(frame)))
	require.NoError(t, err)
	assert.Equal(t, samples()[0].msg, m)
}

// countingReader counts bytes handed out.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestReadConsumesOneFrame(t *testing.T) {
	ss := samples()
	for i, s := range ss {
		next := ss[(i+1)%len(ss)]
		stream := append(append(bytes.Clone(s.frame), next.frame...), "tail"...)
		for _, wrap := range []func(io.Reader) io.Reader{
			func(r io.Reader) io.Reader { return r },
			iotest.OneByteReader,
			iotest.HalfReader,
		} {
			src := bytes.NewReader(stream)
			cr := &countingReader{r: wrap(src)}
			m, err := handshake.Read(cr)
			require.NoError(t, err)
			assert.Equal(t, s.msg, m)
			assert.Equal(t, len(s.frame), cr.n, s.name)
			m, err = handshake.Read(cr)
			require.NoError(t, err)
			assert.Equal(t, next.msg, m)
			assert.Equal(t, len(s.frame)+len(next.frame), cr.n, s.name)
			rest, _ := io.ReadAll(src)
			assert.Equal(t, "tail", string(rest))
		}
	}
}

// bytesPerRun returns the heap bytes f allocates per call, averaged.
func bytesPerRun(runs int, f func()) float64 {
	f() // warm up
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(runs)
}

// TestReadAllocationBound checks that a header announcing a huge body makes
// Read neither allocate nor read it, and that a maximal frame costs about
// two MaxBody buffers (the body and the decoded copies).
func TestReadAllocationBound(t *testing.T) {
	frame := rawFrame(handshake.Version, 1, nil)
	frame[10], frame[11] = 0xff, 0xff
	r := bytes.NewReader(append(frame, bytesOf(0xffff, 0)...))
	perRun := bytesPerRun(100, func() {
		_, _ = r.Seek(0, io.SeekStart)
		if _, err := handshake.Read(r); !errors.Is(err, handshake.ErrMalformed) {
			t.Fatal(err)
		}
	})
	assert.Equal(t, 0xffff, r.Len(), "body must not be read")
	assert.Less(t, perRun, 1024.0)

	// A Hello with a body of exactly MaxBody bytes.
	b := body{}.u16(0).u64(0).u8(4)
	for i := range 4 {
		n := handshake.MaxInfo
		if i == 3 {
			n = handshake.MaxBody - len(b) - (1 + handshake.RingInfoLen + 2)
		}
		b = b.u8(1).ring(testRing).lraw(bytesOf(n, 'i'))
	}
	require.Len(t, b, handshake.MaxBody)
	full := rawFrame(handshake.Version, 1, b)
	fr := bytes.NewReader(full)
	perRun = bytesPerRun(100, func() {
		_, _ = fr.Seek(0, io.SeekStart)
		if _, err := handshake.Read(fr); err != nil {
			t.Fatal(err)
		}
	})
	assert.Less(t, perRun, float64(2*handshake.MaxBody+1024))

	// A Data header over MaxData: neither Read nor Next allocates or reads
	// the body.
	frame = rawFrame(handshake.Version, 7, nil)
	frame[10], frame[11] = 0xff, 0xff
	r = bytes.NewReader(append(frame, bytesOf(0xffff, 0)...))
	perRun = bytesPerRun(100, func() {
		_, _ = r.Seek(0, io.SeekStart)
		if _, err := handshake.Read(r); !errors.Is(err, handshake.ErrMalformed) {
			t.Fatal(err)
		}
		_, _ = r.Seek(0, io.SeekStart)
		if _, _, err := handshake.Next(r); !errors.Is(err, handshake.ErrMalformed) {
			t.Fatal(err)
		}
	})
	assert.Equal(t, 0xffff, r.Len(), "body must not be read")
	assert.Less(t, perRun, 1024.0)

	// A maximal Data frame: Read costs about the payload's copy (and the
	// pooled body, when the pool drops it), Next nothing per payload byte.
	data := rawFrame(handshake.Version, 7, bytesOf(handshake.MaxData, 'd'))
	dr := bytes.NewReader(data)
	perRun = bytesPerRun(100, func() {
		_, _ = dr.Seek(0, io.SeekStart)
		if _, err := handshake.Read(dr); err != nil {
			t.Fatal(err)
		}
	})
	assert.Less(t, perRun, float64(2*handshake.MaxData+1024))
	perRun = bytesPerRun(100, func() {
		_, _ = dr.Seek(0, io.SeekStart)
		if _, _, err := handshake.Next(dr); err != nil {
			t.Fatal(err)
		}
	})
	assert.Equal(t, handshake.MaxData, dr.Len(), "Next leaves the payload")
	assert.Less(t, perRun, 1024.0)
}

// TestWriteAfterMagic: the magic followed by WriteAfterMagic's bytes is
// exactly one Write's frame, and Read takes it as one message.
func TestWriteAfterMagic(t *testing.T) {
	m := &handshake.Decline{Code: handshake.DeclineVersion, Reason: "server speaks version 2"}
	var whole, split bytes.Buffer
	require.NoError(t, handshake.Write(&whole, m))
	split.WriteString(handshake.Magic)
	require.NoError(t, handshake.WriteAfterMagic(&split, m))
	require.Equal(t, whole.Bytes(), split.Bytes())
	got, err := handshake.Read(&split)
	require.NoError(t, err)
	assert.Equal(t, m, got)
	assert.ErrorIs(t, handshake.WriteAfterMagic(io.Discard, nil), handshake.ErrMalformed)
}

// TestNextConsumesOneFrame: Next reads a frame's header and, except for
// Data, its body; a Data payload is left in the reader, and after the
// caller reads its Length bytes the next frame follows. Nothing past the
// frame is read, whatever the reader's read sizes.
func TestNextConsumesOneFrame(t *testing.T) {
	ss := samples()
	for i, s := range ss {
		next := ss[(i+1)%len(ss)]
		stream := append(append(bytes.Clone(s.frame), next.frame...), "tail"...)
		for _, wrap := range []func(io.Reader) io.Reader{
			func(r io.Reader) io.Reader { return r },
			iotest.OneByteReader,
			iotest.HalfReader,
		} {
			src := bytes.NewReader(stream)
			cr := &countingReader{r: wrap(src)}
			h, m, err := handshake.Next(cr)
			require.NoError(t, err, s.name)
			assert.Equal(t, handshake.Header{Version: handshake.Version, Type: s.msg.Type(), Length: uint16(len(s.frame) - handshake.HeaderLen)}, h, s.name)
			if d, ok := s.msg.(*handshake.Data); ok {
				assert.Nil(t, m, s.name)
				assert.Equal(t, handshake.HeaderLen, cr.n, "%s: Next read into the payload", s.name)
				p := make([]byte, h.Length)
				_, err := io.ReadFull(cr, p)
				require.NoError(t, err)
				assert.Equal(t, d.Payload, p, s.name)
			} else {
				assert.Equal(t, s.msg, m, s.name)
			}
			assert.Equal(t, len(s.frame), cr.n, s.name)

			m, err = readWhole(cr)
			require.NoError(t, err, s.name)
			assert.Equal(t, next.msg, m, s.name)
			assert.Equal(t, len(s.frame)+len(next.frame), cr.n, s.name)
			rest, _ := io.ReadAll(src)
			assert.Equal(t, "tail", string(rest), s.name)
		}
	}
}

// TestNextMaxData: a maximal Data frame followed by another frame.
func TestNextMaxData(t *testing.T) {
	payload := bytesOf(handshake.MaxData, 'd')
	frame, err := handshake.Append(nil, &handshake.Data{Payload: payload})
	require.NoError(t, err)
	require.Len(t, frame, 1<<16)
	fin := rawFrame(handshake.Version, 11, body{}.u64(42))
	r := bytes.NewReader(append(frame, fin...))
	h, m, err := handshake.Next(r)
	require.NoError(t, err)
	assert.Nil(t, m)
	assert.Equal(t, handshake.Header{Version: handshake.Version, Type: handshake.TypeData, Length: uint16(handshake.MaxData)}, h)
	assert.Equal(t, handshake.MaxData+len(fin), r.Len())
	_, err = r.Seek(int64(h.Length), io.SeekCurrent)
	require.NoError(t, err)
	h, m, err = handshake.Next(r)
	require.NoError(t, err)
	assert.Equal(t, handshake.Header{Version: handshake.Version, Type: handshake.TypeFin, Length: 8}, h)
	assert.Equal(t, &handshake.Fin{Cursor: 42}, m)
	assert.Zero(t, r.Len())
}

// TestNextTruncated: Next on every valid frame cut at every byte. Like
// Read, except that a Data frame needs only its header.
func TestNextTruncated(t *testing.T) {
	for _, s := range samples() {
		for n := range len(s.frame) {
			for _, r := range []io.Reader{
				bytes.NewReader(s.frame[:n]),
				iotest.OneByteReader(bytes.NewReader(s.frame[:n])),
				iotest.DataErrReader(bytes.NewReader(s.frame[:n])),
			} {
				h, m, err := handshake.Next(r)
				require.Nil(t, m)
				switch {
				case n == 0:
					require.ErrorIs(t, err, io.EOF, "%s cut at %d", s.name, n)
				case s.msg.Type() == handshake.TypeData && n >= handshake.HeaderLen:
					require.NoError(t, err, "%s cut at %d", s.name, n)
					assert.Equal(t, handshake.TypeData, h.Type)
				default:
					require.ErrorIs(t, err, io.ErrUnexpectedEOF, "%s cut at %d", s.name, n)
				}
			}
		}
	}
}

// TestNextErrors: Next reports Read's errors, with the header once it has
// one, and reads nothing past a rejected header.
func TestNextErrors(t *testing.T) {
	_, _, err := handshake.Next(bytes.NewReader(nil))
	assert.ErrorIs(t, err, io.EOF)

	for _, in := range []string{"G", "\x89RS0", "\x89RSOCK\n"} {
		h, m, err := handshake.Next(&stallingReader{t: t, data: []byte(in)})
		assert.ErrorIs(t, err, handshake.ErrBadMagic, "%q", in)
		assert.Nil(t, m)
		assert.Zero(t, h)
	}

	// A future version: the header is returned, the body not read.
	frame := rawFrame(handshake.Version+1, 77, bytesOf(5000, 'x'))
	r := bytes.NewReader(frame)
	h, m, err := handshake.Next(r)
	require.ErrorIs(t, err, handshake.ErrVersion)
	assert.Nil(t, m)
	assert.Equal(t, handshake.Header{Version: handshake.Version + 1, Type: 77, Length: 5000}, h)
	assert.Equal(t, 5000, r.Len(), "body must not be read")

	// Rejected headers: the header is returned, nothing after it read.
	overData := rawFrame(handshake.Version, 7, nil)
	overData[10], overData[11] = 0xff, 0xf5 // MaxData+1
	overBody := rawFrame(handshake.Version, 9, nil)
	overBody[10], overBody[11] = 0x10, 0x01 // MaxBody+1
	for name, c := range map[string]struct {
		hdr  []byte
		want handshake.Header
	}{
		"data-empty":    {rawFrame(handshake.Version, 7, nil), handshake.Header{Version: handshake.Version, Type: handshake.TypeData}},
		"data-over-max": {overData, handshake.Header{Version: handshake.Version, Type: handshake.TypeData, Length: uint16(handshake.MaxData + 1)}},
		"switch-4097":   {overBody, handshake.Header{Version: handshake.Version, Type: handshake.TypeSwitch, Length: uint16(handshake.MaxBody + 1)}},
		"unknown-type":  {rawFrame(handshake.Version, 12, nil), handshake.Header{Version: handshake.Version, Type: 12}},
	} {
		r := bytes.NewReader(append(bytes.Clone(c.hdr), samples()[0].frame...))
		h, m, err := handshake.Next(r)
		assert.ErrorIs(t, err, handshake.ErrMalformed, name)
		assert.Nil(t, m, name)
		assert.Equal(t, c.want, h, name)
		assert.Equal(t, len(samples()[0].frame), r.Len(), "%s: read past the header", name)
	}

	// Reader errors pass through, inside the header or a non-Data body.
	boom := errors.New("boom")
	frame = rawFrame(handshake.Version, 10, body{}.u64(7))
	for _, n := range []int{0, 5, handshake.HeaderLen, handshake.HeaderLen + 3} {
		_, _, err := handshake.Next(io.MultiReader(bytes.NewReader(frame[:n]), iotest.ErrReader(boom)))
		assert.ErrorIs(t, err, boom, n)
	}
	// A Data frame's header is all Next reads: an error after it is the
	// caller's to see.
	data := rawFrame(handshake.Version, 7, []byte("xy"))
	h, m, err = handshake.Next(io.MultiReader(bytes.NewReader(data[:handshake.HeaderLen]), iotest.ErrReader(boom)))
	require.NoError(t, err)
	assert.Nil(t, m)
	assert.Equal(t, uint16(2), h.Length)
}

// TestPutDataHeader: PutDataHeader writes the header Append writes for a
// Data frame of that many bytes, whatever hb held before.
func TestPutDataHeader(t *testing.T) {
	for _, n := range []int{1, 2, 255, 256, handshake.MaxBody, handshake.MaxBody + 1, handshake.MaxData - 1, handshake.MaxData} {
		var hb [handshake.HeaderLen]byte
		for i := range hb {
			hb[i] = 0xa5
		}
		handshake.PutDataHeader(&hb, n)
		frame, err := handshake.Append(nil, &handshake.Data{Payload: bytesOf(n, 'p')})
		require.NoError(t, err)
		assert.Equal(t, frame[:handshake.HeaderLen], hb[:], n)
		h, err := handshake.ParseHeader(hb[:])
		require.NoError(t, err)
		assert.Equal(t, handshake.Header{Version: handshake.Version, Type: handshake.TypeData, Length: uint16(n)}, h)

		m, err := handshake.Read(io.MultiReader(bytes.NewReader(hb[:]), bytes.NewReader(bytesOf(n, 'p'))))
		require.NoError(t, err)
		assert.Equal(t, &handshake.Data{Payload: bytesOf(n, 'p')}, m)
	}
}
