package handshake_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/bits"
	"reflect"
	"testing"
	"unicode/utf8"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// The seed corpora live in testdata/fuzz/<target>/ (see corpus_test.go).

// FuzzDecode feeds arbitrary bytes to Read, and to Decode as an arbitrary
// header and body. Nothing may panic, Read may not read more than one
// frame, errors must be the documented ones, and whatever decodes must
// re-encode canonically and decode again to an equal message.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		m, err := handshake.Read(r)
		consumed := len(data) - r.Len()
		if consumed > handshake.HeaderLen+handshake.MaxData {
			t.Fatalf("Read consumed %d bytes, more than a maximal frame", consumed)
		}
		if err != nil {
			checkDecodeErr(t, m, err, io.EOF, io.ErrUnexpectedEOF, handshake.ErrBadMagic)
		} else {
			frameLen := handshake.HeaderLen + int(binary.BigEndian.Uint16(data[10:12]))
			if consumed != frameLen {
				t.Fatalf("Read consumed %d bytes of a %d-byte frame", consumed, frameLen)
			}
			checkCanonical(t, m, data[:frameLen])
		}

		// Decode with the header bytes as they are (length possibly not
		// matching the body) and with the length fixed up, so arbitrary
		// bodies reach the body parsers whatever the type.
		if len(data) < handshake.HeaderLen {
			return
		}
		h := handshake.Header{Version: data[8], Type: handshake.Type(data[9]), Length: binary.BigEndian.Uint16(data[10:12])}
		checkDecode(t, h, data[handshake.HeaderLen:])
		if b := data[handshake.HeaderLen:]; len(b) <= math.MaxUint16 {
			h.Version, h.Length = handshake.Version, uint16(len(b))
			checkDecode(t, h, b)
		}
	})
}

func checkDecode(t *testing.T, h handshake.Header, body []byte) {
	t.Helper()
	b := bytes.Clone(body)
	m, err := handshake.Decode(h, b)
	if err != nil {
		checkDecodeErr(t, m, err)
		return
	}
	frame := append([]byte(handshake.Magic), h.Version, uint8(h.Type), 0, 0)
	binary.BigEndian.PutUint16(frame[10:], h.Length)
	checkCanonical(t, m, append(frame, body...))
	// The message must not alias the body it was decoded from.
	enc, _ := handshake.Append(nil, m)
	for i := range b {
		b[i] ^= 0x55
	}
	if enc2, _ := handshake.Append(nil, m); !bytes.Equal(enc, enc2) {
		t.Fatalf("decoded message aliases its input")
	}
}

// checkDecodeErr checks that a decode error is one of the package sentinels
// (or one of the extra allowed errors) and came with no message.
func checkDecodeErr(t *testing.T, m handshake.Message, err error, extra ...error) {
	t.Helper()
	if m != nil {
		t.Fatalf("got message %#v with error %v", m, err)
	}
	for _, e := range append(extra, handshake.ErrMalformed, handshake.ErrVersion) {
		if errors.Is(err, e) {
			return
		}
	}
	t.Fatalf("unexpected error %v", err)
}

// checkCanonical checks that m, decoded from frame, encodes back to frame
// (Goodbye flag bits other than Abort are not kept) and decodes again to an
// equal message.
func checkCanonical(t *testing.T, m handshake.Message, frame []byte) {
	t.Helper()
	want := bytes.Clone(frame)
	if m.Type() == handshake.TypeGoodbye {
		want[handshake.HeaderLen] &= 1
	}
	enc, err := handshake.Append(nil, m)
	if err != nil {
		t.Fatalf("decoded %#v does not re-encode: %v", m, err)
	}
	if !bytes.Equal(enc, want) {
		t.Fatalf("re-encoding differs:\n got %q\nwant %q", enc, want)
	}
	m2, err := handshake.Read(bytes.NewReader(enc))
	if err != nil {
		t.Fatalf("re-encoded %#v does not decode: %v", m, err)
	}
	if !reflect.DeepEqual(m, m2) {
		t.Fatalf("round trip changed the message:\n got %#v\nwant %#v", m2, m)
	}
}

// FuzzRoundTrip builds a message of each type from fuzzed fields. The
// encoder must refuse exactly what is out of bounds, and whatever it encodes
// must have the predicted length and decode to an equal message, with Read
// and with Next.
func FuzzRoundTrip(f *testing.F) {
	f.Fuzz(func(t *testing.T, kind uint8, flags uint16, nOffers uint8, transport uint8,
		size, addr uint64, rkey uint32, credits uint16, info []byte,
		code uint8, reason string, abort bool, finalProd uint64) {
		ring := handshake.RingInfo{Size: size, Addr: addr, RKey: rkey, Credits: credits}
		checkValidate(t, ring)
		reasonBad := len(reason) > handshake.MaxReason || !utf8.ValidString(reason)

		var m handshake.Message
		var bodyLen int
		var wantErr bool
		switch kind % 11 {
		case 0:
			n := int(nOffers) % (handshake.MaxOffers + 2) // 0..MaxOffers+1
			h := &handshake.Hello{Flags: flags, RingMax: finalProd, Offers: make([]handshake.Offer, n)}
			bodyLen = 11
			for i := range h.Offers {
				o := handshake.Offer{
					Transport: handshake.Transport(transport + uint8(i)),
					Ring: handshake.RingInfo{Size: size >> i, Addr: addr + uint64(i),
						RKey: rkey ^ uint32(i), Credits: credits + uint16(i)},
					Info: nilIfEmpty(info[:len(info)*(i+1)/n]),
				}
				checkValidate(t, o.Ring)
				h.Offers[i] = o
				bodyLen += 1 + handshake.RingInfoLen + 2 + len(o.Info)
				wantErr = wantErr || len(o.Info) > handshake.MaxInfo
			}
			wantErr = wantErr || n == 0 || n > handshake.MaxOffers || bodyLen > handshake.MaxBody
			m = h
		case 1:
			m = &handshake.Accept{Transport: handshake.Transport(transport), Ring: ring, Info: nilIfEmpty(info)}
			bodyLen = 1 + handshake.RingInfoLen + 2 + len(info)
			wantErr = len(info) > handshake.MaxInfo
		case 2:
			m = &handshake.Decline{Code: handshake.DeclineCode(code), Reason: reason}
			bodyLen, wantErr = 3+len(reason), reasonBad
		case 3:
			m = &handshake.Confirm{Code: handshake.DeclineCode(code), Reason: reason}
			bodyLen, wantErr = 3+len(reason), reasonBad
		case 4:
			m = &handshake.Goodbye{Abort: abort, FinalProd: finalProd, Reason: reason}
			bodyLen, wantErr = 11+len(reason), reasonBad
		case 5:
			n := int(nOffers) % (handshake.MaxOffers + 2) // 0..MaxOffers+1
			u := &handshake.Upgrade{Flags: flags, RingMax: finalProd}
			for i := range n {
				u.Transports = append(u.Transports, handshake.Transport(transport+uint8(i)))
			}
			m, bodyLen, wantErr = u, 11+n, n > handshake.MaxOffers
		case 6:
			// The payload's length comes from size, 0..MaxData+1; its
			// bytes from info.
			n := int(size % uint64(handshake.MaxData+2))
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(i)
				if len(info) > 0 {
					p[i] = info[i%len(info)]
				}
			}
			m, bodyLen, wantErr = &handshake.Data{Payload: nilIfEmpty(p)}, n, n == 0 || n > handshake.MaxData
		case 7:
			m = &handshake.UpgradeOffer{Offer: handshake.Offer{Transport: handshake.Transport(transport), Ring: ring, Info: nilIfEmpty(info)}}
			bodyLen = 1 + handshake.RingInfoLen + 2 + len(info)
			wantErr = len(info) > handshake.MaxInfo
		case 8:
			m, bodyLen = &handshake.Switch{Cursor: finalProd}, 8
		case 9:
			m, bodyLen = &handshake.Resume{Cursor: finalProd}, 8
		case 10:
			m, bodyLen = &handshake.Fin{Cursor: finalProd}, 8
		}

		enc, err := handshake.Append(nil, m)
		if wantErr {
			if !errors.Is(err, handshake.ErrMalformed) || enc != nil {
				t.Fatalf("encoding out-of-bounds %#v: got %q, %v; want ErrMalformed", m, enc, err)
			}
			if k := kind % 11; reasonBad && k >= 2 && k <= 4 {
				if _, err := handshake.Append(nil, &handshake.Goodbye{Reason: handshake.SanitizeReason(reason)}); err != nil {
					t.Fatalf("sanitized reason still refused: %v", err)
				}
			}
			return
		}
		if err != nil {
			t.Fatalf("encoding %#v: %v", m, err)
		}
		if len(enc) != handshake.HeaderLen+bodyLen {
			t.Fatalf("encoded %d bytes, want %d", len(enc), handshake.HeaderLen+bodyLen)
		}

		// Read exactly the frame out of a longer stream.
		r := bytes.NewReader(append(bytes.Clone(enc), enc...))
		got, err := handshake.Read(r)
		if err != nil {
			t.Fatalf("decoding %#v: %v", m, err)
		}
		if r.Len() != len(enc) {
			t.Fatalf("Read left %d bytes, want %d", r.Len(), len(enc))
		}
		if !reflect.DeepEqual(m, got) {
			t.Fatalf("round trip:\n got %#v\nwant %#v", got, m)
		}

		// Next: the same, except that a Data payload is left in r.
		isData := m.Type() == handshake.TypeData
		r = bytes.NewReader(append(bytes.Clone(enc), enc...))
		h, got, err := handshake.Next(r)
		if err != nil {
			t.Fatalf("Next on %#v: %v", m, err)
		}
		if want := (handshake.Header{Version: handshake.Version, Type: m.Type(), Length: uint16(bodyLen)}); h != want {
			t.Fatalf("Next header %+v, want %+v", h, want)
		}
		left := len(enc)
		if isData {
			left += bodyLen
			if got != nil {
				t.Fatalf("Next returned %#v for Data", got)
			}
		} else if !reflect.DeepEqual(m, got) {
			t.Fatalf("Next round trip:\n got %#v\nwant %#v", got, m)
		}
		if r.Len() != left {
			t.Fatalf("Next left %d bytes, want %d", r.Len(), left)
		}

		// A cut frame is an unexpected EOF (for Next, unless the header of
		// a Data frame is whole); a cut body with a fixed-up length is
		// malformed, but for Data a shorter payload.
		cut := int(finalProd % uint64(len(enc)))
		if _, err := handshake.Read(bytes.NewReader(enc[:cut])); !errors.Is(err, io.ErrUnexpectedEOF) && !(cut == 0 && err == io.EOF) {
			t.Fatalf("frame cut at %d: %v", cut, err)
		}
		_, got, err = handshake.Next(bytes.NewReader(enc[:cut]))
		switch {
		case got != nil:
			t.Fatalf("Next on a frame cut at %d returned %#v", cut, got)
		case isData && cut >= handshake.HeaderLen:
			if err != nil {
				t.Fatalf("Next on a Data frame cut at %d: %v", cut, err)
			}
		case !errors.Is(err, io.ErrUnexpectedEOF) && !(cut == 0 && err == io.EOF):
			t.Fatalf("Next on a frame cut at %d: %v", cut, err)
		}
		if cut >= handshake.HeaderLen {
			h := handshake.Header{Version: handshake.Version, Type: m.Type(), Length: uint16(cut - handshake.HeaderLen)}
			got, err := handshake.Decode(h, enc[handshake.HeaderLen:cut])
			if isData && cut > handshake.HeaderLen {
				if want := (&handshake.Data{Payload: enc[handshake.HeaderLen:cut]}); err != nil || !reflect.DeepEqual(got, want) {
					t.Fatalf("payload cut at %d: got %#v, %v", cut, got, err)
				}
			} else if !errors.Is(err, handshake.ErrMalformed) {
				t.Fatalf("body cut at %d: %v", cut, err)
			}
		}
	})
}

// FuzzNext feeds arbitrary bytes to Next. Nothing may panic; Next may not
// read more than one frame's header and, unless it is a Data frame, its
// body; for a Data frame it returns no message and leaves the payload
// (1..MaxData bytes) unread; otherwise it agrees with Read, message, error
// and bytes consumed.
func FuzzNext(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		h, m, err := handshake.Next(r)
		consumed := len(data) - r.Len()
		if consumed > handshake.HeaderLen+handshake.MaxBody {
			t.Fatalf("Next consumed %d bytes, more than a maximal non-Data frame", consumed)
		}
		rr := bytes.NewReader(data)
		rm, rerr := handshake.Read(rr)
		rconsumed := len(data) - rr.Len()

		if err == nil && h.Type == handshake.TypeData {
			if m != nil {
				t.Fatalf("Next returned %#v for a Data frame", m)
			}
			if consumed != handshake.HeaderLen {
				t.Fatalf("Next consumed %d bytes of a Data frame, want the %d-byte header", consumed, handshake.HeaderLen)
			}
			if h.Length == 0 || int(h.Length) > handshake.MaxData {
				t.Fatalf("Next accepted a Data frame of length %d", h.Length)
			}
			// Read sees the payload Next left, when it is all there.
			payload := data[handshake.HeaderLen:]
			if len(payload) < int(h.Length) {
				if !errors.Is(rerr, io.ErrUnexpectedEOF) {
					t.Fatalf("Read on a truncated Data frame: %v", rerr)
				}
				return
			}
			want := &handshake.Data{Payload: payload[:h.Length]}
			if rerr != nil || !reflect.DeepEqual(rm, want) {
				t.Fatalf("Read disagrees with Next on a Data frame: %#v, %v", rm, rerr)
			}
			return
		}

		if err != nil {
			checkDecodeErr(t, m, err, io.EOF, io.ErrUnexpectedEOF, handshake.ErrBadMagic)
			for _, e := range []error{io.EOF, io.ErrUnexpectedEOF, handshake.ErrBadMagic, handshake.ErrMalformed, handshake.ErrVersion} {
				if errors.Is(err, e) != errors.Is(rerr, e) {
					t.Fatalf("Next error %v, Read error %v", err, rerr)
				}
			}
		} else {
			if m == nil || m.Type() != h.Type {
				t.Fatalf("Next returned %#v for a %s header", m, h.Type)
			}
			if consumed != handshake.HeaderLen+int(h.Length) {
				t.Fatalf("Next consumed %d bytes of a %d-byte frame", consumed, handshake.HeaderLen+int(h.Length))
			}
			if rerr != nil || !reflect.DeepEqual(m, rm) {
				t.Fatalf("Read disagrees with Next: %#v, %v; Next %#v", rm, rerr, m)
			}
		}
		if consumed != rconsumed {
			t.Fatalf("Next consumed %d bytes, Read %d", consumed, rconsumed)
		}
		// Once Next has a header, it is the one ParseHeader sees.
		if len(data) >= handshake.HeaderLen && consumed >= handshake.HeaderLen {
			ph, _ := handshake.ParseHeader(data)
			if ph != h {
				t.Fatalf("Next header %+v, ParseHeader %+v", h, ph)
			}
		}
	})
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// checkValidate compares RingInfo.Validate with an independent statement of
// its rules.
func checkValidate(t *testing.T, r handshake.RingInfo) {
	t.Helper()
	_, carry := bits.Add64(r.Addr, r.Size, 0)
	want := r.Size >= handshake.MinRing && r.Size <= handshake.MaxRing && r.Size&(r.Size-1) == 0 &&
		r.Credits >= handshake.MinCredits && r.Credits <= handshake.MaxCredits && carry == 0
	err := r.Validate()
	if (err == nil) != want || (err != nil && !errors.Is(err, handshake.ErrMalformed)) {
		t.Fatalf("Validate(%+v) = %v, want ok=%v", r, err, want)
	}
}
