package handshake

import (
	"encoding/binary"
	"fmt"
)

// Message is one of *Hello, *Accept, *Decline, *Confirm, *Goodbye. The
// interface is sealed: only this package's message types implement it, and
// only as pointers (Decode returns pointers, so a type switch on a decoded
// message uses the same cases a sender uses).
type Message interface {
	Type() Type
	// appendBody appends the encoded body to b. It checks every bound
	// the decoder checks except MaxBody, which Append checks.
	appendBody(b []byte) ([]byte, error)
}

// Offer is one transport the client can switch to, with the receive ring it
// has already set up for it.
type Offer struct {
	Transport Transport
	Ring      RingInfo
	Info      []byte // opaque provider description, at most MaxInfo bytes
}

// Hello is the client's first message: the transports it offers, in order of
// preference. Wire body: flags uint16, count uint8 (1..MaxOffers), then per
// offer: transport uint8, RingInfo, infoLen uint16, info.
type Hello struct {
	Flags  uint16 // no flags are defined: send 0, ignore unknown bits
	Offers []Offer
}

// Accept is the server's answer choosing one offered transport, with its own
// receive ring. Wire body: transport uint8, RingInfo, infoLen uint16, info.
type Accept struct {
	Transport Transport
	Ring      RingInfo
	Info      []byte // opaque provider description, at most MaxInfo bytes
}

// Decline is the server's answer refusing to switch; both stay on TCP.
// Wire body: code uint8, reasonLen uint16, reason (UTF-8).
type Decline struct {
	Code   DeclineCode
	Reason string // at most MaxReason bytes of UTF-8
}

// Confirm is the client's answer to Accept. Code DeclineNone means the
// client switches to the accepted transport; any other code says why it
// gives up on it, and both fall back to TCP. Wire body: as Decline.
type Confirm struct {
	Code   DeclineCode
	Reason string // at most MaxReason bytes of UTF-8
}

// Goodbye is sent by either side after the switch, on the TCP connection,
// just before closing it. Wire body: flags uint8 (bit 0 Abort, other bits
// ignored), finalProd uint64, reasonLen uint16, reason (UTF-8).
type Goodbye struct {
	Abort     bool   // the sender aborted: data in flight may be lost
	FinalProd uint64 // sender's final producer cursor: all bytes it ever wrote
	Reason    string // at most MaxReason bytes of UTF-8
}

const goodbyeAbort = 1 << 0

// offerNames names offers in decode errors without allocating per offer.
var offerNames = [MaxOffers]string{"offer 0", "offer 1", "offer 2", "offer 3"}

func (*Hello) Type() Type   { return TypeHello }
func (*Accept) Type() Type  { return TypeAccept }
func (*Decline) Type() Type { return TypeDecline }
func (*Confirm) Type() Type { return TypeConfirm }
func (*Goodbye) Type() Type { return TypeGoodbye }

func (m *Hello) appendBody(b []byte) ([]byte, error) {
	if len(m.Offers) == 0 || len(m.Offers) > MaxOffers {
		return b, encodeErr("hello", "%d offers, want 1..%d", len(m.Offers), MaxOffers)
	}
	b = binary.BigEndian.AppendUint16(b, m.Flags)
	b = append(b, uint8(len(m.Offers)))
	for i, o := range m.Offers {
		b = append(b, uint8(o.Transport))
		b = appendRing(b, o.Ring)
		if len(o.Info) > MaxInfo {
			return b, encodeErr("hello", "offer %d: info length %d exceeds %d", i, len(o.Info), MaxInfo)
		}
		b, _ = appendInfo(b, "hello", o.Info)
	}
	return b, nil
}

func (m *Accept) appendBody(b []byte) ([]byte, error) {
	b = append(b, uint8(m.Transport))
	b = appendRing(b, m.Ring)
	return appendInfo(b, "accept", m.Info)
}

func (m *Decline) appendBody(b []byte) ([]byte, error) {
	b = append(b, uint8(m.Code))
	return appendReason(b, "decline", m.Reason)
}

func (m *Confirm) appendBody(b []byte) ([]byte, error) {
	b = append(b, uint8(m.Code))
	return appendReason(b, "confirm", m.Reason)
}

func (m *Goodbye) appendBody(b []byte) ([]byte, error) {
	var flags uint8
	if m.Abort {
		flags |= goodbyeAbort
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint64(b, m.FinalProd)
	return appendReason(b, "goodbye", m.Reason)
}

// decodeBody parses a body of type t. Everything kept in the result is a
// copy: it does not alias body. The decoder reads inside composite literals
// rely on Go's lexical left-to-right evaluation of calls, which is wire
// order.
func decodeBody(t Type, body []byte) (Message, error) {
	d := &decoder{msg: t.String(), b: body}
	var m Message
	switch t {
	case TypeHello:
		h := &Hello{Flags: d.u16("flags")}
		n := d.u8("offer count")
		if d.err == nil && (n == 0 || n > MaxOffers) {
			d.fail("%d offers, want 1..%d", n, MaxOffers)
		}
		if d.err == nil {
			h.Offers = make([]Offer, n)
			for i := range h.Offers {
				d.ctx = offerNames[i]
				h.Offers[i] = Offer{
					Transport: Transport(d.u8("transport")),
					Ring:      d.ring(),
					Info:      d.info(),
				}
			}
		}
		m = h
	case TypeAccept:
		m = &Accept{
			Transport: Transport(d.u8("transport")),
			Ring:      d.ring(),
			Info:      d.info(),
		}
	case TypeDecline:
		m = &Decline{Code: DeclineCode(d.u8("code")), Reason: d.reason()}
	case TypeConfirm:
		m = &Confirm{Code: DeclineCode(d.u8("code")), Reason: d.reason()}
	case TypeGoodbye:
		m = &Goodbye{
			Abort:     d.u8("flags")&goodbyeAbort != 0,
			FinalProd: d.u64("final producer cursor"),
			Reason:    d.reason(),
		}
	default:
		return nil, fmt.Errorf("%w: unknown message type %d", ErrMalformed, uint8(t))
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return m, nil
}
