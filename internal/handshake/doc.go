// Package handshake encodes and decodes rsock's bootstrap messages: the
// frames a client and server exchange on the TCP connection to agree on a
// transport (verbs, shm, sim) and trade receive-ring descriptions, the
// frames that carry the stream on TCP and move it to a ring and back
// (rsock/switching.go), and the Goodbye that closes a connection.
//
// # Framing
//
// Every message, in both directions, before and after the transport switch,
// is one frame. All integers are big-endian.
//
//	magic    [8]byte  "\x89RSOCK\r\n"
//	version  uint8    2
//	type     uint8    1 Hello, 2 Accept, 3 Decline, 4 Confirm, 5 Goodbye,
//	                  6 Upgrade, 7 Data, 8 Offer, 9 Switch, 10 Resume, 11 Fin
//	length   uint16   body length, <= MaxBody (4096);
//	                  Data: 1..MaxData (65524, so a whole frame is 64 KiB)
//	body     [length]byte
//
// The 12-byte header starts with a PNG-style magic: the high-bit first byte
// catches 7-bit channels and the CRLF catches line-ending translation, and a
// client recognises an rsock server's reply (and a listener an rsock client)
// by it.
//
// Read reads and decodes one frame. Next does the same, except that it
// leaves a Data frame's payload (the header's length, in bytes) in the
// reader for the caller; PutDataHeader writes the header that precedes it.
//
// # Bodies
//
//	RingInfo (22 bytes): size uint64, addr uint64, rkey uint32, credits uint16
//	Hello    flags uint16, ringMax uint64, count uint8 (1..4),
//	         count × { transport uint8, RingInfo, infoLen uint16 (<= 1024), info }
//	Accept   transport uint8, RingInfo, infoLen uint16 (<= 1024), info
//	Decline  code uint8, reasonLen uint16 (<= 256), reason
//	Confirm  code uint8 (0 = OK), reasonLen uint16 (<= 256), reason
//	Goodbye  flags uint8 (bit 0 Abort), finalProd uint64,
//	         reasonLen uint16 (<= 256), reason
//	Upgrade  flags uint16, ringMax uint64, count uint8 (0..4), count × transport uint8
//	Data     payload (1..65524 bytes)
//	Offer    as one Hello offer (UpgradeOffer)
//	Switch, Resume, Fin   cursor uint64
//
// Transports: 1 verbs, 2 shm, 3 sim; unknown values are kept, and a server
// skips offers it does not understand. Decline codes: 1 no common transport,
// 2 unavailable, 3 resources, 4 failed, 5 policy, 6 version; unknown codes
// are kept. Hello flags: bit 0 FlagSwitch, bit 1 FlagGrow, bit 2 FlagEarly; Upgrade: bit 0 UpgradeGrow, bit 1 UpgradeEarly; receivers
// ignore unknown bits of both and keep the value. Goodbye flag bits other
// than Abort are ignored and dropped. Info is
// an opaque provider description. Reasons are UTF-8.
//
// RingInfo describes the sender's receive ring: size in bytes, the address
// and remote key the peer writes to, and credits, the number of receive work
// requests initially posted (the messages the peer may send before waiting
// for credit). RingInfo.Validate checks size is a power of two in
// [4096, 1<<30], credits in [4, 1024] and addr+size does not overflow;
// decoding does not apply it.
//
// # Hostile input
//
// Everything received is untrusted. The decoder rejects, with an error
// wrapping ErrMalformed: a length over its bound, an offer count outside
// 1..4 (an Upgrade transport count over 4), an empty Data payload, an
// unknown message type, a reason that is not valid UTF-8, a body shorter
// than its fields and trailing bytes after them. A wrong magic is
// ErrBadMagic and a version other than Version (2) is ErrVersion (ParseHeader still
// returns the header, so a server can answer Decline with code version).
// Nothing panics, Read and Next never read past the frame, Read allocates at
// most the frame's length bound for it (MaxBody, MaxData for Data), and
// decoded messages never alias the input.
//
// The encoder refuses, with the same errors, anything the decoder would
// reject, including a Hello whose body would exceed MaxBody (four offers
// with maximal info do not fit). Over-long reasons are refused, not
// truncated; SanitizeReason makes an arbitrary string acceptable.
package handshake
