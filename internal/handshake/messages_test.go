package handshake_test

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

func TestRoundTrip(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			// The encoder produces exactly the hand-built bytes.
			got, err := handshake.Append([]byte("prefix"), s.msg)
			require.NoError(t, err)
			require.Equal(t, "prefix", string(got[:6]), "Append must keep b")
			require.Equal(t, s.frame, got[6:])

			// ParseHeader + Decode.
			h, err := handshake.ParseHeader(s.frame)
			require.NoError(t, err)
			assert.Equal(t, handshake.Header{Version: 1, Type: s.msg.Type(), Length: uint16(len(s.frame) - handshake.HeaderLen)}, h)
			m, err := handshake.Decode(h, s.frame[handshake.HeaderLen:])
			require.NoError(t, err)
			assert.Equal(t, s.msg, m)

			// Read.
			m, err = handshake.Read(bytes.NewReader(s.frame))
			require.NoError(t, err)
			assert.Equal(t, s.msg, m)

			// Write: one call with the whole frame.
			var w recordingWriter
			require.NoError(t, handshake.Write(&w, s.msg))
			require.Len(t, w.calls, 1)
			assert.Equal(t, s.frame, w.calls[0])
		})
	}
}

type recordingWriter struct{ calls [][]byte }

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.calls = append(w.calls, append([]byte(nil), p...))
	return len(p), nil
}

type shortWriter struct{}

func (shortWriter) Write(p []byte) (int, error) { return len(p) - 1, nil }

func TestWriteErrors(t *testing.T) {
	assert.ErrorIs(t, handshake.Write(shortWriter{}, &handshake.Confirm{}), io.ErrShortWrite)
	var w recordingWriter
	assert.ErrorIs(t, handshake.Write(&w, &handshake.Hello{}), handshake.ErrMalformed)
	assert.Empty(t, w.calls, "nothing written for an unencodable message")
}

func TestAppendNil(t *testing.T) {
	for _, m := range []handshake.Message{nil, (*handshake.Hello)(nil), (*handshake.Accept)(nil),
		(*handshake.Decline)(nil), (*handshake.Confirm)(nil), (*handshake.Goodbye)(nil)} {
		b, err := handshake.Append([]byte("x"), m)
		assert.ErrorIs(t, err, handshake.ErrMalformed)
		assert.Equal(t, []byte("x"), b)
	}
}

func TestDecodeDoesNotAlias(t *testing.T) {
	for _, s := range samples() {
		frame := bytes.Clone(s.frame)
		h, err := handshake.ParseHeader(frame)
		require.NoError(t, err)
		m, err := handshake.Decode(h, frame[handshake.HeaderLen:])
		require.NoError(t, err)
		for i := range frame {
			frame[i] ^= 0xff
		}
		assert.Equal(t, s.msg, m, s.name)
	}
}

func TestUnknownValuesKept(t *testing.T) {
	m, err := handshake.Read(bytes.NewReader(rawFrame(1, 1, body{}.u16(0xffff).u8(2).
		u8(0).ring(testRing).u16(0).
		u8(255).ring(testRing).u16(0))))
	require.NoError(t, err)
	h := m.(*handshake.Hello)
	assert.Equal(t, uint16(0xffff), h.Flags)
	assert.Equal(t, handshake.Transport(0), h.Offers[0].Transport)
	assert.Equal(t, handshake.Transport(255), h.Offers[1].Transport)
	assert.Nil(t, h.Offers[0].Info, "empty info decodes as nil")

	m, err = handshake.Read(bytes.NewReader(rawFrame(1, 4, body{}.u8(200).u16(0))))
	require.NoError(t, err)
	assert.Equal(t, &handshake.Confirm{Code: 200}, m)

	// Goodbye: unknown flag bits are ignored; only bit 0 means Abort.
	m, err = handshake.Read(bytes.NewReader(rawFrame(1, 5, body{}.u8(0xfe).u64(3).u16(0))))
	require.NoError(t, err)
	assert.Equal(t, &handshake.Goodbye{FinalProd: 3}, m)
	m, err = handshake.Read(bytes.NewReader(rawFrame(1, 5, body{}.u8(0xff).u64(3).u16(0))))
	require.NoError(t, err)
	assert.Equal(t, &handshake.Goodbye{Abort: true, FinalProd: 3}, m)
}

// TestBounds checks each bound at its exact maximum (accepted by both sides)
// and one past it (refused by the encoder, rejected by the decoder on
// hand-built bytes).
func TestBounds(t *testing.T) {
	maxInfo := bytesOf(handshake.MaxInfo, 'i')
	overInfo := bytesOf(handshake.MaxInfo+1, 'i')
	maxReason := strings.Repeat("r", handshake.MaxReason)
	overReason := maxReason + "r"
	offer := func(info []byte) handshake.Offer {
		return handshake.Offer{Transport: handshake.TransportVerbs, Ring: testRing, Info: info}
	}
	offerBody := func(b body, info []byte) body { return b.u8(1).ring(testRing).lraw(info) }
	offers := func(n int) []handshake.Offer {
		o := make([]handshake.Offer, n)
		for i := range o {
			o[i] = offer(nil)
		}
		return o
	}
	helloBody := func(n int) body {
		b := body{}.u16(0).u8(uint8(n))
		for range n {
			b = offerBody(b, nil)
		}
		return b
	}
	// A Hello body of exactly MaxBody bytes: 3 + 4*25 + infos = 4096.
	fill := handshake.MaxBody - 3 - 4*(1+handshake.RingInfoLen+2) - 3*handshake.MaxInfo
	require.Positive(t, fill)
	require.LessOrEqual(t, fill, handshake.MaxInfo)
	fullHello := &handshake.Hello{Offers: []handshake.Offer{offer(maxInfo), offer(maxInfo), offer(maxInfo), offer(bytesOf(fill, 'f'))}}
	fullHelloBody := offerBody(offerBody(offerBody(offerBody(body{}.u16(0).u8(4), maxInfo), maxInfo), maxInfo), bytesOf(fill, 'f'))
	require.Len(t, fullHelloBody, handshake.MaxBody)
	overHello := &handshake.Hello{Offers: []handshake.Offer{offer(maxInfo), offer(maxInfo), offer(maxInfo), offer(bytesOf(fill+1, 'f'))}}

	ok := []sample{
		{"max-offers", &handshake.Hello{Offers: offers(handshake.MaxOffers)}, rawFrame(1, 1, helloBody(handshake.MaxOffers))},
		{"max-body", fullHello, rawFrame(1, 1, fullHelloBody)},
		{"hello-max-info", &handshake.Hello{Offers: []handshake.Offer{offer(maxInfo)}}, rawFrame(1, 1, offerBody(body{}.u16(0).u8(1), maxInfo))},
		{"accept-max-info", &handshake.Accept{Transport: 1, Ring: testRing, Info: maxInfo}, rawFrame(1, 2, body{}.u8(1).ring(testRing).lraw(maxInfo))},
		{"decline-max-reason", &handshake.Decline{Code: 1, Reason: maxReason}, rawFrame(1, 3, body{}.u8(1).lstr(maxReason))},
		{"confirm-max-reason", &handshake.Confirm{Code: 1, Reason: maxReason}, rawFrame(1, 4, body{}.u8(1).lstr(maxReason))},
		{"goodbye-max-reason", &handshake.Goodbye{Reason: maxReason}, rawFrame(1, 5, body{}.u8(0).u64(0).lstr(maxReason))},
	}
	for _, s := range ok {
		t.Run(s.name, func(t *testing.T) {
			got, err := handshake.Append(nil, s.msg)
			require.NoError(t, err)
			require.Equal(t, s.frame, got)
			m, err := handshake.Read(bytes.NewReader(s.frame))
			require.NoError(t, err)
			assert.Equal(t, s.msg, m)
		})
	}

	bad := []sample{
		{"zero-offers", &handshake.Hello{}, rawFrame(1, 1, helloBody(0))},
		{"too-many-offers", &handshake.Hello{Offers: offers(handshake.MaxOffers + 1)}, rawFrame(1, 1, helloBody(handshake.MaxOffers+1))},
		{"255-offers", &handshake.Hello{Offers: offers(255)}, rawFrame(1, 1, body{}.u16(0).u8(255))},
		{"hello-over-info", &handshake.Hello{Offers: []handshake.Offer{offer(overInfo)}}, rawFrame(1, 1, offerBody(body{}.u16(0).u8(1), overInfo))},
		{"accept-over-info", &handshake.Accept{Transport: 1, Ring: testRing, Info: overInfo}, rawFrame(1, 2, body{}.u8(1).ring(testRing).lraw(overInfo))},
		{"decline-over-reason", &handshake.Decline{Code: 1, Reason: overReason}, rawFrame(1, 3, body{}.u8(1).lstr(overReason))},
		{"confirm-over-reason", &handshake.Confirm{Code: 1, Reason: overReason}, rawFrame(1, 4, body{}.u8(1).lstr(overReason))},
		{"goodbye-over-reason", &handshake.Goodbye{Reason: overReason}, rawFrame(1, 5, body{}.u8(0).u64(0).lstr(overReason))},
		{"decline-bad-utf8", &handshake.Decline{Reason: "a\xffb"}, rawFrame(1, 3, body{}.u8(1).lstr("a\xffb"))},
		{"confirm-bad-utf8", &handshake.Confirm{Reason: "\xc3"}, rawFrame(1, 4, body{}.u8(1).lstr("\xc3"))},
		{"goodbye-bad-utf8", &handshake.Goodbye{Reason: "\xed\xa0\x80"}, rawFrame(1, 5, body{}.u8(0).u64(0).lstr("\xed\xa0\x80"))},
		{"over-body", overHello, rawFrame(1, 1, offerBody(offerBody(offerBody(offerBody(body{}.u16(0).u8(4), maxInfo), maxInfo), maxInfo), bytesOf(fill+1, 'f')))},
	}
	for _, s := range bad {
		t.Run(s.name, func(t *testing.T) {
			got, err := handshake.Append([]byte("keep"), s.msg)
			require.ErrorIs(t, err, handshake.ErrMalformed)
			assert.Equal(t, []byte("keep"), got)
			m, err := handshake.Read(bytes.NewReader(s.frame))
			require.ErrorIs(t, err, handshake.ErrMalformed)
			assert.Nil(t, m)
		})
	}
}

func TestTrailingBytes(t *testing.T) {
	for _, s := range samples() {
		b := append(bytes.Clone(s.frame[handshake.HeaderLen:]), 0)
		_, err := handshake.Read(bytes.NewReader(rawFrame(1, uint8(s.msg.Type()), b)))
		assert.ErrorIs(t, err, handshake.ErrMalformed, s.name)
		assert.ErrorContains(t, err, "trailing", s.name)
	}
}

// TestShortBody cuts each sample body at every position and fixes up the
// length field, so the body is shorter than its fields.
func TestShortBody(t *testing.T) {
	for _, s := range samples() {
		b := s.frame[handshake.HeaderLen:]
		for n := range len(b) {
			frame := rawFrame(1, uint8(s.msg.Type()), b[:n])
			_, err := handshake.Read(bytes.NewReader(frame))
			require.ErrorIs(t, err, handshake.ErrMalformed, "%s cut at %d", s.name, n)
			h, err := handshake.ParseHeader(frame)
			require.NoError(t, err)
			_, err = handshake.Decode(h, frame[handshake.HeaderLen:])
			require.ErrorIs(t, err, handshake.ErrMalformed, "%s cut at %d", s.name, n)
		}
	}
}

func TestSanitizeReason(t *testing.T) {
	long := strings.Repeat("é", handshake.MaxReason) // 2 bytes each
	for _, in := range []string{"", "fine", "a\xffb", long, strings.Repeat("x", handshake.MaxReason-1) + "€", "\xff" + long} {
		out := handshake.SanitizeReason(in)
		assert.LessOrEqual(t, len(out), handshake.MaxReason)
		_, err := handshake.Append(nil, &handshake.Goodbye{Reason: out})
		assert.NoError(t, err, "%q", in)
	}
	assert.Equal(t, "fine", handshake.SanitizeReason("fine"))
	assert.Equal(t, "a\uFFFDb", handshake.SanitizeReason("a\xffb"))
	assert.Equal(t, strings.Repeat("é", handshake.MaxReason/2), handshake.SanitizeReason(long))
	assert.Equal(t, strings.Repeat("x", handshake.MaxReason-1), handshake.SanitizeReason(strings.Repeat("x", handshake.MaxReason-1)+"€"))
}

func TestStrings(t *testing.T) {
	assert.Equal(t, "hello", handshake.TypeHello.String())
	assert.Equal(t, "goodbye", handshake.TypeGoodbye.String())
	assert.Equal(t, "type(12)", handshake.Type(12).String())
	assert.Equal(t, "switch", handshake.TypeSwitch.String())
	assert.Equal(t, "verbs", handshake.TransportVerbs.String())
	assert.Equal(t, "shm", handshake.TransportShm.String())
	assert.Equal(t, "sim", handshake.TransportSim.String())
	assert.Equal(t, "transport(0)", handshake.Transport(0).String())
	assert.Equal(t, "transport(42)", handshake.Transport(42).String())
	assert.Equal(t, "none", handshake.DeclineNone.String())
	assert.Equal(t, "no-common-transport", handshake.DeclineNoCommonTransport.String())
	assert.Equal(t, "version", handshake.DeclineVersion.String())
	assert.Equal(t, "decline(7)", handshake.DeclineCode(7).String())

	for _, tr := range []handshake.Transport{handshake.TransportVerbs, handshake.TransportShm, handshake.TransportSim} {
		got, ok := handshake.TransportByName(tr.String())
		assert.True(t, ok)
		assert.Equal(t, tr, got)
	}
	got, ok := handshake.TransportByName("SHM")
	assert.True(t, ok)
	assert.Equal(t, handshake.TransportShm, got)
	for _, name := range []string{"", "tcp", "transport(1)", "verbs "} {
		_, ok := handshake.TransportByName(name)
		assert.False(t, ok, name)
	}
}
