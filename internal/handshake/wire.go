package handshake

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"
)

// decoder reads big-endian fields from a body with bounds checks. The first
// failure sticks: later reads return zero values and err reports the first
// problem, so decode functions read all fields and check err once.
type decoder struct {
	msg string // message name, for error text
	ctx string // part of the message being read ("offer 1"), for error text
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err != nil {
		return
	}
	where := d.msg
	if d.ctx != "" {
		where += " " + d.ctx
	}
	d.err = fmt.Errorf("%w: %s: %s", ErrMalformed, where, fmt.Sprintf(format, args...))
}

// take returns the next n bytes of the body, aliasing it.
func (d *decoder) take(n int, field string) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail("truncated %s: need %d bytes, have %d", field, n, len(d.b))
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u8(field string) uint8 {
	if p := d.take(1, field); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16(field string) uint16 {
	if p := d.take(2, field); p != nil {
		return binary.BigEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) u32(field string) uint32 {
	if p := d.take(4, field); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64(field string) uint64 {
	if p := d.take(8, field); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}

// info reads infoLen uint16 + info bytes and returns a copy (nil if empty).
func (d *decoder) info() []byte {
	n := d.u16("info length")
	if d.err != nil {
		return nil
	}
	if n > MaxInfo {
		d.fail("info length %d exceeds %d", n, MaxInfo)
		return nil
	}
	p := d.take(int(n), "info")
	if len(p) == 0 {
		return nil
	}
	return append([]byte(nil), p...)
}

// reason reads reasonLen uint16 + UTF-8 reason and returns it as a string
// (a copy).
func (d *decoder) reason() string {
	n := d.u16("reason length")
	if d.err != nil {
		return ""
	}
	if n > MaxReason {
		d.fail("reason length %d exceeds %d", n, MaxReason)
		return ""
	}
	p := d.take(int(n), "reason")
	if d.err != nil {
		return ""
	}
	if !utf8.Valid(p) {
		d.fail("reason is not valid UTF-8")
		return ""
	}
	return string(p)
}

// ring reads a fixed-size RingInfo.
func (d *decoder) ring() RingInfo {
	return RingInfo{
		Size:    d.u64("ring size"),
		Addr:    d.u64("ring addr"),
		RKey:    d.u32("ring rkey"),
		Credits: d.u16("ring credits"),
	}
}

// finish reports trailing bytes after the last field, and the first error.
func (d *decoder) finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing byte(s) after body", len(d.b))
	}
	return d.err
}

// Encoding helpers. They check the same bounds as the decoder so that the
// encoder never produces what the decoder would reject.

func encodeErr(msg, format string, args ...any) error {
	return fmt.Errorf("%w: cannot encode %s: %s", ErrMalformed, msg, fmt.Sprintf(format, args...))
}

func appendInfo(b []byte, msg string, info []byte) ([]byte, error) {
	if len(info) > MaxInfo {
		return b, encodeErr(msg, "info length %d exceeds %d", len(info), MaxInfo)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(info)))
	return append(b, info...), nil
}

func appendReason(b []byte, msg, reason string) ([]byte, error) {
	if len(reason) > MaxReason {
		return b, encodeErr(msg, "reason length %d exceeds %d (see SanitizeReason)", len(reason), MaxReason)
	}
	if !utf8.ValidString(reason) {
		return b, encodeErr(msg, "reason is not valid UTF-8 (see SanitizeReason)")
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(reason)))
	return append(b, reason...), nil
}

func appendRing(b []byte, r RingInfo) []byte {
	b = binary.BigEndian.AppendUint64(b, r.Size)
	b = binary.BigEndian.AppendUint64(b, r.Addr)
	b = binary.BigEndian.AppendUint32(b, r.RKey)
	return binary.BigEndian.AppendUint16(b, r.Credits)
}

// SanitizeReason makes s acceptable as a reason: each run of invalid UTF-8 bytes
// is replaced with U+FFFD and the result is cut to at most MaxReason bytes at a
// rune boundary. Use it on reasons built from error text before encoding;
// Append itself refuses (rather than silently alters) a bad reason.
func SanitizeReason(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= MaxReason {
		return s
	}
	n := MaxReason
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
