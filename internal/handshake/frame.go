package handshake

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	pool "github.com/libp2p/go-buffer-pool"
)

// Header is the fixed part of a frame after the magic.
type Header struct {
	Version uint8
	Type    Type
	Length  uint16 // body length
}

// ParseHeader parses the first HeaderLen bytes of b. It returns ErrBadMagic
// if b does not start with Magic; ErrVersion, together with the parsed
// header, if the version is not Version (the type and length are then not
// checked: a future version may define them differently); ErrMalformed if b
// is shorter than HeaderLen, the type is unknown or the length exceeds
// MaxBody (MaxData for Data).
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		if !MatchesMagicPrefix(b) {
			return Header{}, ErrBadMagic
		}
		return Header{}, fmt.Errorf("%w: header is %d bytes, want %d", ErrMalformed, len(b), HeaderLen)
	}
	if string(b[:len(Magic)]) != Magic {
		return Header{}, ErrBadMagic
	}
	h := Header{
		Version: b[8],
		Type:    Type(b[9]),
		Length:  binary.BigEndian.Uint16(b[10:12]),
	}
	if h.Version != Version {
		return h, fmt.Errorf("%w: peer speaks version %d, want %d", ErrVersion, h.Version, Version)
	}
	if !h.Type.known() {
		return h, fmt.Errorf("%w: unknown message type %d", ErrMalformed, uint8(h.Type))
	}
	if int(h.Length) > h.Type.maxBody() {
		return h, fmt.Errorf("%w: %s body length %d exceeds %d", ErrMalformed, h.Type, h.Length, h.Type.maxBody())
	}
	return h, nil
}

// Decode parses the body of a frame whose header is h. It checks h as
// ParseHeader does, and that len(body) == h.Length. The result does not
// alias body.
func Decode(h Header, body []byte) (Message, error) {
	switch {
	case h.Version != Version:
		return nil, fmt.Errorf("%w: peer speaks version %d, want %d", ErrVersion, h.Version, Version)
	case !h.Type.known():
		return nil, fmt.Errorf("%w: unknown message type %d", ErrMalformed, uint8(h.Type))
	case int(h.Length) > h.Type.maxBody():
		return nil, fmt.Errorf("%w: %s body length %d exceeds %d", ErrMalformed, h.Type, h.Length, h.Type.maxBody())
	case len(body) != int(h.Length):
		return nil, fmt.Errorf("%w: %s body is %d bytes, header says %d", ErrMalformed, h.Type, len(body), h.Length)
	}
	return decodeBody(h.Type, body)
}

// Read reads exactly one frame from r and decodes it. It never reads past
// the end of the frame, so r may be the raw connection that carries later
// frames or other data. The frame is read into pooled scratch memory: only
// the decoded message is allocated.
//
// It returns io.EOF if r ends before the first byte, io.ErrUnexpectedEOF if
// it ends inside the frame, any other error from r as is, and otherwise the
// errors of ParseHeader and Decode. The header is checked against Magic as
// it arrives, so a peer that does not speak rsock is reported (ErrBadMagic)
// as soon as a wrong byte is received, without waiting for a full header.
// After ErrVersion, the body has not been read.
func Read(r io.Reader) (Message, error) { return read(r, 0) }

// ReadAfterMagic is Read for a frame whose magic the caller has already
// read from r and matched: it reads the rest of the frame. An r that ends
// before the rest is io.ErrUnexpectedEOF.
func ReadAfterMagic(r io.Reader) (Message, error) { return read(r, len(Magic)) }

func read(r io.Reader, skip int) (Message, error) {
	hb := pool.Get(HeaderLen)
	defer pool.Put(hb)
	copy(hb, Magic[:skip])
	if err := readHeader(r, hb, skip); err != nil {
		return nil, err
	}
	h, err := ParseHeader(hb)
	if err != nil {
		return nil, err
	}
	body := pool.Get(int(h.Length)) // at most MaxData: ParseHeader checked
	defer pool.Put(body)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return decodeBody(h.Type, body)
}

// readHeader is io.ReadFull(r, hb[n:]), hb[:n] being read already, that
// fails with ErrBadMagic as soon as the bytes read so far are not a prefix
// of Magic.
func readHeader(r io.Reader, hb []byte, n int) error {
	for n < len(hb) {
		m, err := r.Read(hb[n:])
		if m < 0 || m > len(hb)-n {
			return fmt.Errorf("handshake: reader returned invalid count %d", m)
		}
		n += m
		if !MatchesMagicPrefix(hb[:n]) {
			return ErrBadMagic
		}
		if err != nil {
			if n == len(hb) {
				return nil // as io.ReadFull: a full read wins over err
			}
			if errors.Is(err, io.EOF) && n > 0 {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// MatchesMagicPrefix reports whether b agrees with Magic on their common
// length: for len(b) < len(Magic), whether b is a prefix of Magic (so an
// empty b matches); for longer b, whether b starts with Magic. A listener
// uses it to sniff the first bytes of a connection.
func MatchesMagicPrefix(b []byte) bool {
	n := min(len(b), len(Magic))
	return string(b[:n]) == Magic[:n]
}

// Append appends the frame (header and body) for m to b. It returns an
// error wrapping ErrMalformed, and b unchanged, if m cannot be encoded
// because the decoder would reject it: a nil message, an offer count
// outside 1..MaxOffers, info longer than MaxInfo, a reason longer than
// MaxReason or not valid UTF-8 (see SanitizeReason; reasons are refused,
// not truncated), or a body longer than MaxBody (possible only for a Hello
// with several large infos). RingInfo is not validated.
func Append(b []byte, m Message) ([]byte, error) {
	if isNil(m) {
		return b, fmt.Errorf("%w: cannot encode nil message", ErrMalformed)
	}
	start := len(b)
	out := append(b, Magic...)
	out = append(out, Version, uint8(m.Type()), 0, 0)
	out, err := m.appendBody(out)
	if err != nil {
		return b, err
	}
	n := len(out) - start - HeaderLen
	if n > m.Type().maxBody() {
		return b, fmt.Errorf("%w: cannot encode %s: body length %d exceeds %d", ErrMalformed, m.Type(), n, m.Type().maxBody())
	}
	binary.BigEndian.PutUint16(out[start+HeaderLen-2:], uint16(n))
	return out, nil
}

func isNil(m Message) bool {
	switch m := m.(type) {
	case nil:
		return true
	case *Hello:
		return m == nil
	case *Accept:
		return m == nil
	case *Decline:
		return m == nil
	case *Confirm:
		return m == nil
	case *Goodbye:
		return m == nil
	case *Upgrade:
		return m == nil
	case *Data:
		return m == nil
	case *UpgradeOffer:
		return m == nil
	case *Switch:
		return m == nil
	case *Resume:
		return m == nil
	case *Fin:
		return m == nil
	}
	return false
}

// Write encodes m and writes the whole frame to w with a single Write call.
func Write(w io.Writer, m Message) error { return write(w, m, 0) }

// WriteAfterMagic is Write without the leading Magic: for a side that has
// already sent the magic on its own (the listener answers a client's magic
// with its own at once, before it has a frame to send). The bytes on the
// wire are the same as one Write's.
func WriteAfterMagic(w io.Writer, m Message) error { return write(w, m, len(Magic)) }

func write(w io.Writer, m Message, skip int) error {
	frame, err := Append(pool.Get(256)[:0], m)
	defer pool.Put(frame)
	if err != nil {
		return err
	}
	n, err := w.Write(frame[skip:])
	if err == nil && n != len(frame)-skip {
		err = io.ErrShortWrite
	}
	return err
}

// Next reads one frame's header from r and, unless it is a Data frame, its
// body, decoded, with Read's errors. A Data frame's payload (h.Length
// bytes, 1..MaxData) is left in r for the caller to read where it wants
// it, and the message is nil. Like Read, it never reads past the frame.
func Next(r io.Reader) (Header, Message, error) {
	hb := pool.Get(HeaderLen)
	defer pool.Put(hb)
	if err := readHeader(r, hb, 0); err != nil {
		return Header{}, nil, err
	}
	h, err := ParseHeader(hb)
	if err != nil {
		return h, nil, err
	}
	if h.Type == TypeData {
		if h.Length == 0 {
			return h, nil, fmt.Errorf("%w: empty data frame", ErrMalformed)
		}
		return h, nil, nil
	}
	body := pool.Get(int(h.Length))
	defer pool.Put(body)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return h, nil, err
	}
	m, err := decodeBody(h.Type, body)
	return h, m, err
}

// PutDataHeader writes into hb the header of a Data frame carrying n
// payload bytes (1..MaxData); the payload follows it on the wire.
func PutDataHeader(hb *[HeaderLen]byte, n int) {
	copy(hb[:], Magic)
	hb[8], hb[9] = Version, uint8(TypeData)
	binary.BigEndian.PutUint16(hb[10:], uint16(n))
}
