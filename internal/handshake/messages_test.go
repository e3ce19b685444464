package handshake_test

import (
	"bytes"
	"fmt"
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
			assert.Equal(t, handshake.Header{Version: handshake.Version, Type: s.msg.Type(), Length: uint16(len(s.frame) - handshake.HeaderLen)}, h)
			m, err := handshake.Decode(h, s.frame[handshake.HeaderLen:])
			require.NoError(t, err)
			assert.Equal(t, s.msg, m)

			// Read.
			m, err = handshake.Read(bytes.NewReader(s.frame))
			require.NoError(t, err)
			assert.Equal(t, s.msg, m)

			// Next.
			checkNext(t, s.frame, s.msg)

			// Write: one call with the whole frame.
			var w recordingWriter
			require.NoError(t, handshake.Write(&w, s.msg))
			require.Len(t, w.calls, 1)
			assert.Equal(t, s.frame, w.calls[0])
		})
	}
}

// checkNext reads frame with Next: the header as ParseHeader sees it and
// msg, or for Data no message and exactly the payload left in the reader.
func checkNext(t *testing.T, frame []byte, msg handshake.Message) {
	t.Helper()
	r := bytes.NewReader(frame)
	h, m, err := handshake.Next(r)
	require.NoError(t, err)
	assert.Equal(t, handshake.Header{Version: handshake.Version, Type: msg.Type(), Length: uint16(len(frame) - handshake.HeaderLen)}, h)
	if d, ok := msg.(*handshake.Data); ok {
		assert.Nil(t, m, "Next returns no message for Data")
		require.Equal(t, len(d.Payload), r.Len(), "Next must leave exactly the payload")
		rest, _ := io.ReadAll(r)
		assert.Equal(t, d.Payload, rest)
		return
	}
	assert.Equal(t, msg, m)
	assert.Zero(t, r.Len(), "Next must read the whole body")
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
		(*handshake.Decline)(nil), (*handshake.Confirm)(nil), (*handshake.Goodbye)(nil),
		(*handshake.Upgrade)(nil), (*handshake.Data)(nil), (*handshake.UpgradeOffer)(nil),
		(*handshake.Switch)(nil), (*handshake.Resume)(nil), (*handshake.Fin)(nil)} {
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
	m, err := handshake.Read(bytes.NewReader(rawFrame(handshake.Version, 1, body{}.u16(0xffff).u64(0).u8(2).
		u8(0).ring(testRing).u16(0).
		u8(255).ring(testRing).u16(0))))
	require.NoError(t, err)
	h := m.(*handshake.Hello)
	assert.Equal(t, uint16(0xffff), h.Flags)
	assert.Equal(t, handshake.Transport(0), h.Offers[0].Transport)
	assert.Equal(t, handshake.Transport(255), h.Offers[1].Transport)
	assert.Nil(t, h.Offers[0].Info, "empty info decodes as nil")

	m, err = handshake.Read(bytes.NewReader(rawFrame(handshake.Version, 4, body{}.u8(200).u16(0))))
	require.NoError(t, err)
	assert.Equal(t, &handshake.Confirm{Code: 200}, m)

	// Goodbye: unknown flag bits are ignored; only bit 0 means Abort.
	m, err = handshake.Read(bytes.NewReader(rawFrame(handshake.Version, 5, body{}.u8(0xfe).u64(3).u16(0))))
	require.NoError(t, err)
	assert.Equal(t, &handshake.Goodbye{FinalProd: 3}, m)
	m, err = handshake.Read(bytes.NewReader(rawFrame(handshake.Version, 5, body{}.u8(0xff).u64(3).u16(0))))
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
		b := body{}.u16(0).u64(0).u8(uint8(n))
		for range n {
			b = offerBody(b, nil)
		}
		return b
	}
	// A Hello body of exactly MaxBody bytes: 11 + 4*25 + infos = 4096.
	fill := handshake.MaxBody - 11 - 4*(1+handshake.RingInfoLen+2) - 3*handshake.MaxInfo
	require.Positive(t, fill)
	require.LessOrEqual(t, fill, handshake.MaxInfo)
	fullHello := &handshake.Hello{Offers: []handshake.Offer{offer(maxInfo), offer(maxInfo), offer(maxInfo), offer(bytesOf(fill, 'f'))}}
	fullHelloBody := offerBody(offerBody(offerBody(offerBody(body{}.u16(0).u64(0).u8(4), maxInfo), maxInfo), maxInfo), bytesOf(fill, 'f'))
	require.Len(t, fullHelloBody, handshake.MaxBody)
	overHello := &handshake.Hello{Offers: []handshake.Offer{offer(maxInfo), offer(maxInfo), offer(maxInfo), offer(bytesOf(fill+1, 'f'))}}

	ok := []sample{
		{"max-offers", &handshake.Hello{Offers: offers(handshake.MaxOffers)}, rawFrame(handshake.Version, 1, helloBody(handshake.MaxOffers))},
		{"max-body", fullHello, rawFrame(handshake.Version, 1, fullHelloBody)},
		{"hello-max-info", &handshake.Hello{Offers: []handshake.Offer{offer(maxInfo)}}, rawFrame(handshake.Version, 1, offerBody(body{}.u16(0).u64(0).u8(1), maxInfo))},
		{"accept-max-info", &handshake.Accept{Transport: 1, Ring: testRing, Info: maxInfo}, rawFrame(handshake.Version, 2, body{}.u8(1).ring(testRing).lraw(maxInfo))},
		{"decline-max-reason", &handshake.Decline{Code: 1, Reason: maxReason}, rawFrame(handshake.Version, 3, body{}.u8(1).lstr(maxReason))},
		{"confirm-max-reason", &handshake.Confirm{Code: 1, Reason: maxReason}, rawFrame(handshake.Version, 4, body{}.u8(1).lstr(maxReason))},
		{"goodbye-max-reason", &handshake.Goodbye{Reason: maxReason}, rawFrame(handshake.Version, 5, body{}.u8(0).u64(0).lstr(maxReason))},
		{"upgrade-max-transports", &handshake.Upgrade{Transports: make([]handshake.Transport, handshake.MaxOffers)},
			rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(handshake.MaxOffers).raw(make([]byte, handshake.MaxOffers)))},
		{"data-max", &handshake.Data{Payload: bytesOf(handshake.MaxData, 'd')}, rawFrame(handshake.Version, 7, bytesOf(handshake.MaxData, 'd'))},
		{"upgrade-offer-max-info", &handshake.UpgradeOffer{Offer: offer(maxInfo)}, rawFrame(handshake.Version, 8, offerBody(body{}, maxInfo))},
	}
	for _, s := range ok {
		t.Run(s.name, func(t *testing.T) {
			got, err := handshake.Append(nil, s.msg)
			require.NoError(t, err)
			require.Equal(t, s.frame, got)
			m, err := handshake.Read(bytes.NewReader(s.frame))
			require.NoError(t, err)
			assert.Equal(t, s.msg, m)
			checkNext(t, s.frame, s.msg)
		})
	}

	bad := []sample{
		{"zero-offers", &handshake.Hello{}, rawFrame(handshake.Version, 1, helloBody(0))},
		{"too-many-offers", &handshake.Hello{Offers: offers(handshake.MaxOffers + 1)}, rawFrame(handshake.Version, 1, helloBody(handshake.MaxOffers+1))},
		{"255-offers", &handshake.Hello{Offers: offers(255)}, rawFrame(handshake.Version, 1, body{}.u16(0).u64(0).u8(255))},
		{"hello-over-info", &handshake.Hello{Offers: []handshake.Offer{offer(overInfo)}}, rawFrame(handshake.Version, 1, offerBody(body{}.u16(0).u8(1), overInfo))},
		{"accept-over-info", &handshake.Accept{Transport: 1, Ring: testRing, Info: overInfo}, rawFrame(handshake.Version, 2, body{}.u8(1).ring(testRing).lraw(overInfo))},
		{"decline-over-reason", &handshake.Decline{Code: 1, Reason: overReason}, rawFrame(handshake.Version, 3, body{}.u8(1).lstr(overReason))},
		{"confirm-over-reason", &handshake.Confirm{Code: 1, Reason: overReason}, rawFrame(handshake.Version, 4, body{}.u8(1).lstr(overReason))},
		{"goodbye-over-reason", &handshake.Goodbye{Reason: overReason}, rawFrame(handshake.Version, 5, body{}.u8(0).u64(0).lstr(overReason))},
		{"decline-bad-utf8", &handshake.Decline{Reason: "a\xffb"}, rawFrame(handshake.Version, 3, body{}.u8(1).lstr("a\xffb"))},
		{"confirm-bad-utf8", &handshake.Confirm{Reason: "\xc3"}, rawFrame(handshake.Version, 4, body{}.u8(1).lstr("\xc3"))},
		{"goodbye-bad-utf8", &handshake.Goodbye{Reason: "\xed\xa0\x80"}, rawFrame(handshake.Version, 5, body{}.u8(0).u64(0).lstr("\xed\xa0\x80"))},
		{"over-body", overHello, rawFrame(handshake.Version, 1, offerBody(offerBody(offerBody(offerBody(body{}.u16(0).u64(0).u8(4), maxInfo), maxInfo), maxInfo), bytesOf(fill+1, 'f')))},
		{"upgrade-five-transports", &handshake.Upgrade{Transports: make([]handshake.Transport, handshake.MaxOffers+1)},
			rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(handshake.MaxOffers+1).raw(make([]byte, handshake.MaxOffers+1)))},
		{"upgrade-255-transports", &handshake.Upgrade{Transports: make([]handshake.Transport, 255)},
			rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(255).raw(make([]byte, 255)))},
		{"data-nil", &handshake.Data{}, rawFrame(handshake.Version, 7, nil)},
		{"data-empty", &handshake.Data{Payload: []byte{}}, rawFrame(handshake.Version, 7, nil)},
		{"data-over-max", &handshake.Data{Payload: bytesOf(handshake.MaxData+1, 'd')}, rawFrame(handshake.Version, 7, bytesOf(handshake.MaxData+1, 'd'))},
		{"upgrade-offer-over-info", &handshake.UpgradeOffer{Offer: offer(overInfo)}, rawFrame(handshake.Version, 8, offerBody(body{}, overInfo))},
	}
	for _, s := range bad {
		t.Run(s.name, func(t *testing.T) {
			got, err := handshake.Append([]byte("keep"), s.msg)
			require.ErrorIs(t, err, handshake.ErrMalformed)
			assert.Equal(t, []byte("keep"), got)
			m, err := handshake.Read(bytes.NewReader(s.frame))
			require.ErrorIs(t, err, handshake.ErrMalformed)
			assert.Nil(t, m)
			_, m, err = handshake.Next(bytes.NewReader(s.frame))
			require.ErrorIs(t, err, handshake.ErrMalformed)
			assert.Nil(t, m)
		})
	}
}

func TestTrailingBytes(t *testing.T) {
	for _, s := range samples() {
		if s.msg.Type() == handshake.TypeData {
			continue // a Data body is all payload: one more byte is a longer payload
		}
		b := append(bytes.Clone(s.frame[handshake.HeaderLen:]), 0)
		_, err := handshake.Read(bytes.NewReader(rawFrame(handshake.Version, uint8(s.msg.Type()), b)))
		assert.ErrorIs(t, err, handshake.ErrMalformed, s.name)
		assert.ErrorContains(t, err, "trailing", s.name)
	}
}

// TestShortBody cuts each sample body at every position and fixes up the
// length field, so the body is shorter than its fields.
func TestShortBody(t *testing.T) {
	for _, s := range samples() {
		b := s.frame[handshake.HeaderLen:]
		cuts := len(b)
		if s.msg.Type() == handshake.TypeData {
			cuts = 1 // a Data body has no fields: only the empty one is short
		}
		for n := range cuts {
			frame := rawFrame(handshake.Version, uint8(s.msg.Type()), b[:n])
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
	assert.Equal(t, "type(0)", handshake.Type(0).String())
	assert.Equal(t, "upgrade", handshake.TypeUpgrade.String())
	assert.Equal(t, "data", handshake.TypeData.String())
	assert.Equal(t, "offer", handshake.TypeOffer.String())
	assert.Equal(t, "switch", handshake.TypeSwitch.String())
	assert.Equal(t, "resume", handshake.TypeResume.String())
	assert.Equal(t, "fin", handshake.TypeFin.String())
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

// TestSwitchingMalformed: hand-built bodies of the switching protocol's
// frames that the decoder rejects (Read, Next and Decode alike), beyond
// TestBounds' encoder counterparts and TestShortBody's cuts.
func TestSwitchingMalformed(t *testing.T) {
	cases := []struct {
		name string
		typ  uint8
		body body
	}{
		{"upgrade-empty", 6, body{}},
		{"upgrade-no-count", 6, body{}.u16(0)},
		{"upgrade-five-no-transports", 6, body{}.u16(0).u8(5)},
		{"upgrade-five-of-five", 6, body{}.u16(0).u8(5).raw([]byte{1, 2, 3, 1, 2})},
		{"upgrade-count-past-end", 6, body{}.u16(0).u8(3).u8(1).u8(2)},
		{"upgrade-one-missing", 6, body{}.u16(0).u8(1)},
		{"upgrade-trailing", 6, body{}.u16(0).u8(1).u8(1).u8(2)},
		{"data-empty", 7, body{}},
		{"offer-empty", 8, body{}},
		{"offer-info-over-max", 8, body{}.u8(1).ring(testRing).lraw(bytesOf(handshake.MaxInfo+1, 'i'))},
		{"offer-info-len-huge", 8, body{}.u8(1).ring(testRing).u16(0xffff)},
		{"offer-info-past-end", 8, body{}.u8(1).ring(testRing).u16(4).str("abc")},
		{"offer-no-info-len", 8, body{}.u8(1).ring(testRing)},
		{"offer-trailing", 8, body{}.u8(1).ring(testRing).u16(0).u8(0)},
	}
	for typ, name := range map[uint8]string{9: "switch", 10: "resume", 11: "fin"} {
		for _, n := range []int{0, 1, 7, 9, 16} {
			cases = append(cases, struct {
				name string
				typ  uint8
				body body
			}{fmt.Sprintf("%s-%d-bytes", name, n), typ, bytesOf(n, 0xff)})
		}
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			frame := rawFrame(handshake.Version, c.typ, c.body)
			m, err := handshake.Read(bytes.NewReader(frame))
			require.ErrorIs(t, err, handshake.ErrMalformed)
			assert.Nil(t, m)

			r := bytes.NewReader(frame)
			h, m, err := handshake.Next(r)
			require.ErrorIs(t, err, handshake.ErrMalformed)
			assert.Nil(t, m)
			assert.Equal(t, handshake.Header{Version: handshake.Version, Type: handshake.Type(c.typ), Length: uint16(len(c.body))}, h)
			assert.Zero(t, r.Len(), "Next reads the whole (non-Data) frame before rejecting it")

			m, err = handshake.Decode(h, frame[handshake.HeaderLen:])
			require.ErrorIs(t, err, handshake.ErrMalformed)
			assert.Nil(t, m)
		})
	}
}

// TestUpgradeFlagsKept: Upgrade and Hello keep unknown flag bits; an Upgrade
// encoded with an empty (non-nil) transport list decodes with nil.
func TestUpgradeFlagsKept(t *testing.T) {
	m, err := handshake.Read(bytes.NewReader(rawFrame(handshake.Version, 6, body{}.u16(0xffff).u64(0).u8(1).u8(0))))
	require.NoError(t, err)
	assert.Equal(t, &handshake.Upgrade{Flags: 0xffff, Transports: []handshake.Transport{0}}, m)

	frame, err := handshake.Append(nil, &handshake.Upgrade{Transports: []handshake.Transport{}})
	require.NoError(t, err)
	assert.Equal(t, rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(0)), frame)
	m, err = handshake.Read(bytes.NewReader(frame))
	require.NoError(t, err)
	assert.Equal(t, &handshake.Upgrade{}, m)

	m, err = handshake.Read(bytes.NewReader(rawFrame(handshake.Version, 1, body{}.u16(handshake.FlagSwitch|0x8000).u64(0).u8(1).u8(1).ring(testRing).u16(0))))
	require.NoError(t, err)
	assert.Equal(t, handshake.FlagSwitch|0x8000, m.(*handshake.Hello).Flags)
}
