package handshake

import "errors"

// Decode errors. Every error returned by ParseHeader, Decode and Read for
// bytes received from a peer wraps exactly one of these (or is an I/O error
// from the underlying reader such as io.EOF or io.ErrUnexpectedEOF), so the
// caller can tell a hostile or broken peer apart from a network failure and
// tear down just that connection.
var (
	// ErrMalformed reports a frame or body that violates the wire format:
	// an unknown message type, a length over its bound, a truncated body,
	// trailing bytes, invalid UTF-8 in a reason, a bad offer count.
	// Append returns errors wrapping ErrMalformed too, for messages it
	// refuses to encode because the decoder would reject them, and
	// RingInfo.Validate for ring parameters out of bounds.
	ErrMalformed = errors.New("handshake: malformed message")

	// ErrBadMagic reports that the peer does not speak rsock: the first
	// bytes of the frame are not Magic.
	ErrBadMagic = errors.New("handshake: bad magic (peer does not speak rsock)")

	// ErrVersion reports a frame with a protocol version other than
	// Version. ParseHeader still returns the parsed header with it, so a
	// server can answer Decline{Code: DeclineVersion}.
	ErrVersion = errors.New("handshake: unsupported protocol version")
)
