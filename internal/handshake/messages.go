package handshake

import (
	"encoding/binary"
	"fmt"
)

// Message is one of *Hello, *Accept, *Decline, *Confirm, *Goodbye, and of
// the switching protocol's *Upgrade, *Data, *UpgradeOffer, *Switch, *Resume,
// *Fin. The
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
// preference. Wire body: flags uint16, ringMax uint64, count uint8
// (1..MaxOffers), then per offer: transport uint8, RingInfo, infoLen
// uint16, info.
type Hello struct {
	Flags uint16 // FlagSwitch; unknown bits are ignored
	// RingMax is the largest receive ring the client accepts from the
	// server (its own ring size): the server's ring never grows past it.
	RingMax uint64
	Offers  []Offer
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

// Goodbye is sent by either side on the TCP connection just before it
// closes it: in order, or to abort. Wire body: flags uint8 (bit 0 Abort,
// other bits ignored), finalProd uint64, reasonLen uint16, reason (UTF-8).
type Goodbye struct {
	Abort     bool   // the sender aborted: data in flight may be lost
	FinalProd uint64 // the sender's final stream cursor: all bytes it ever sent
	Reason    string // at most MaxReason bytes of UTF-8
}

const goodbyeAbort = 1 << 0

// Upgrade is a switching server's answer to a Hello with FlagSwitch: the
// connection runs on TCP now, and the client may later offer one of
// Transports (the server's order; none: it will take none). Wire body:
// flags uint16 (UpgradeGrow, UpgradeEarly; unknown bits ignored), ringMax
// uint64, count uint8 (0..MaxOffers), count × transport uint8.
type Upgrade struct {
	Flags uint16
	// RingMax is the largest receive ring the server accepts from the
	// client (its own ring size): the client's ring never grows past it.
	RingMax    uint64
	Transports []Transport
}

// Data carries stream bytes on TCP. Wire body: the payload, 1..MaxData
// bytes.
type Data struct {
	Payload []byte
}

// UpgradeOffer is the client's offer of one prepared transport on a
// switching connection; the server answers Accept or Decline, and Confirm
// follows an Accept as in the handshake. Wire body: as one Hello offer.
type UpgradeOffer struct {
	Offer
}

// Switch says the sender's bytes from stream cursor Cursor on go into the
// ring. Wire body: cursor uint64.
type Switch struct{ Cursor uint64 }

// Resume says the sender's ring failed and it has received Cursor bytes of
// the stream; the receiver sends the rest on TCP. Wire body: cursor uint64.
type Resume struct{ Cursor uint64 }

// Fin says the sender, sending on TCP, will send no more: its stream ends
// at Cursor. Wire body: cursor uint64.
type Fin struct{ Cursor uint64 }

// offerNames names offers in decode errors without allocating per offer.
var offerNames = [MaxOffers]string{"offer 0", "offer 1", "offer 2", "offer 3"}

func (*Hello) Type() Type   { return TypeHello }
func (*Accept) Type() Type  { return TypeAccept }
func (*Decline) Type() Type { return TypeDecline }
func (*Confirm) Type() Type { return TypeConfirm }
func (*Goodbye) Type() Type { return TypeGoodbye }
func (*Upgrade) Type() Type { return TypeUpgrade }
func (*Data) Type() Type    { return TypeData }
func (*UpgradeOffer) Type() Type {
	return TypeOffer
}
func (*Switch) Type() Type { return TypeSwitch }
func (*Resume) Type() Type { return TypeResume }
func (*Fin) Type() Type    { return TypeFin }

func (m *Hello) appendBody(b []byte) ([]byte, error) {
	if len(m.Offers) == 0 || len(m.Offers) > MaxOffers {
		return b, encodeErr("hello", "%d offers, want 1..%d", len(m.Offers), MaxOffers)
	}
	b = binary.BigEndian.AppendUint16(b, m.Flags)
	b = binary.BigEndian.AppendUint64(b, m.RingMax)
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

func (m *Upgrade) appendBody(b []byte) ([]byte, error) {
	if len(m.Transports) > MaxOffers {
		return b, encodeErr("upgrade", "%d transports, want at most %d", len(m.Transports), MaxOffers)
	}
	b = binary.BigEndian.AppendUint16(b, m.Flags)
	b = binary.BigEndian.AppendUint64(b, m.RingMax)
	b = append(b, uint8(len(m.Transports)))
	for _, t := range m.Transports {
		b = append(b, uint8(t))
	}
	return b, nil
}

func (m *Data) appendBody(b []byte) ([]byte, error) {
	if len(m.Payload) == 0 || len(m.Payload) > MaxData {
		return b, encodeErr("data", "payload of %d bytes, want 1..%d", len(m.Payload), MaxData)
	}
	return append(b, m.Payload...), nil
}

func (m *UpgradeOffer) appendBody(b []byte) ([]byte, error) {
	b = append(b, uint8(m.Transport))
	b = appendRing(b, m.Ring)
	return appendInfo(b, "offer", m.Info)
}

func (m *Switch) appendBody(b []byte) ([]byte, error) {
	return binary.BigEndian.AppendUint64(b, m.Cursor), nil
}

func (m *Resume) appendBody(b []byte) ([]byte, error) {
	return binary.BigEndian.AppendUint64(b, m.Cursor), nil
}

func (m *Fin) appendBody(b []byte) ([]byte, error) {
	return binary.BigEndian.AppendUint64(b, m.Cursor), nil
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
		h := &Hello{Flags: d.u16("flags"), RingMax: d.u64("ring max")}
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
	case TypeUpgrade:
		u := &Upgrade{Flags: d.u16("flags"), RingMax: d.u64("ring max")}
		n := d.u8("transport count")
		if d.err == nil && n > MaxOffers {
			d.fail("%d transports, want at most %d", n, MaxOffers)
		}
		if d.err == nil && n > 0 {
			u.Transports = make([]Transport, n)
			for i := range u.Transports {
				u.Transports[i] = Transport(d.u8("transport"))
			}
		}
		m = u
	case TypeData:
		if len(body) == 0 {
			d.fail("empty payload")
		}
		m = &Data{Payload: append([]byte(nil), body...)}
		d.b = nil
	case TypeOffer:
		m = &UpgradeOffer{Offer{
			Transport: Transport(d.u8("transport")),
			Ring:      d.ring(),
			Info:      d.info(),
		}}
	case TypeSwitch:
		m = &Switch{Cursor: d.u64("cursor")}
	case TypeResume:
		m = &Resume{Cursor: d.u64("cursor")}
	case TypeFin:
		m = &Fin{Cursor: d.u64("cursor")}
	default:
		return nil, fmt.Errorf("%w: unknown message type %d", ErrMalformed, uint8(t))
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return m, nil
}
