package handshake

import (
	"strconv"
	"strings"
)

// Framing constants.
const (
	// Magic opens every frame. Like PNG's signature, its high-bit first
	// byte catches 7-bit channels and its CRLF catches line-ending
	// translation.
	Magic = "\x89RSOCK\r\n"
	// Version is the only protocol version this package speaks. Version
	// 1 had a second handshake, which set the ring up before the
	// connection carried data; version 2 has only the switching one.
	Version = 2
	// HeaderLen is the size of the frame header: magic, version, type,
	// body length.
	HeaderLen = len(Magic) + 1 + 1 + 2
)

// Bounds. The decoder rejects anything outside them with ErrMalformed and
// the encoder refuses to produce it.
const (
	MaxBody   = 4096              // body bytes per frame, Data excepted
	MaxData   = 1<<16 - HeaderLen // payload bytes per Data frame: a whole frame is 64 KiB
	MaxOffers = 4                 // offers per Hello (at least one)
	MaxInfo   = 1024              // opaque provider info bytes per offer or Accept
	MaxReason = 256               // reason bytes (UTF-8) in Decline, Confirm, Goodbye
)

// RingInfo bounds, enforced by RingInfo.Validate (not by the decoder).
const (
	MinRing    = 4096    // smallest receive ring, bytes
	MaxRing    = 1 << 30 // largest receive ring, bytes
	MinCredits = 4       // fewest initially posted receive work requests
	MaxCredits = 1024    // most initially posted receive work requests
)

// Type is the message type in the frame header.
type Type uint8

// Message types.
const (
	TypeHello   Type = 1 // client -> server: transport offers
	TypeAccept  Type = 2 // server -> client: chosen transport
	TypeDecline Type = 3 // server -> client: no to a Hello (the server closes) or to an Offer (stay on TCP)
	TypeConfirm Type = 4 // client -> server: switch (or give up) after Accept
	TypeGoodbye Type = 5 // either side, before closing: in order, or an abort

	// The switching protocol (Hello flag FlagSwitch; docs/protocol.md §9).
	TypeUpgrade Type = 6  // server -> client: switching agreed, at once after the Hello
	TypeData    Type = 7  // either side: stream bytes carried on TCP
	TypeOffer   Type = 8  // client -> server: one prepared transport, answered by Accept or Decline
	TypeSwitch  Type = 9  // either side: my sending moves to the ring at this stream cursor
	TypeResume  Type = 10 // either side: my ring failed; I have received this much
	TypeFin     Type = 11 // either side, while sending on TCP: my stream ends at this cursor
)

// Hello flags.
const (
	// FlagSwitch marks the switching protocol: the connection starts on
	// TCP and moves to a ring later. Every version-2 hello carries it; a
	// listener refuses one without it.
	FlagSwitch uint16 = 1 << 0
	// FlagGrow says the client follows a move of the server's ring: the
	// server's ring may start small and grow (GROW and MOVED state
	// messages, docs/protocol.md §3.11).
	FlagGrow uint16 = 1 << 1
	// FlagEarly says the client did not wait for the answer: its frames
	// may follow the hello at once, and the server may hold its Upgrade
	// until its own first frame (docs/protocol.md §9.11). A client sets it
	// only for a server that answered UpgradeEarly before.
	FlagEarly uint16 = 1 << 2
)

// Upgrade flags.
const (
	// UpgradeGrow says the server follows a move of the client's ring, as
	// FlagGrow says of the client.
	UpgradeGrow uint16 = 1 << 0
	// UpgradeEarly says the server reads whatever follows a switching
	// hello as the connection's frames, whether or not its client waited
	// for this answer: later hellos to it may carry FlagEarly.
	UpgradeEarly uint16 = 1 << 1
)

func (t Type) String() string {
	switch t {
	case TypeHello:
		return "hello"
	case TypeAccept:
		return "accept"
	case TypeDecline:
		return "decline"
	case TypeConfirm:
		return "confirm"
	case TypeGoodbye:
		return "goodbye"
	case TypeUpgrade:
		return "upgrade"
	case TypeData:
		return "data"
	case TypeOffer:
		return "offer"
	case TypeSwitch:
		return "switch"
	case TypeResume:
		return "resume"
	case TypeFin:
		return "fin"
	}
	return "type(" + strconv.Itoa(int(t)) + ")"
}

func (t Type) known() bool { return t >= TypeHello && t <= TypeFin }

// maxBody is the largest body of type t.
func (t Type) maxBody() int {
	if t == TypeData {
		return MaxData
	}
	return MaxBody
}

// Transport identifies a verbs provider a connection can switch to. Values
// this package does not know decode fine and are kept, so a server can skip
// offers for transports it does not support.
type Transport uint8

// Known transports.
const (
	TransportVerbs Transport = 1 // RDMA verbs (libibverbs)
	TransportShm   Transport = 2 // shared memory, same host
	TransportSim   Transport = 3 // in-process simulation, for tests
)

var transportNames = [...]string{TransportVerbs: "verbs", TransportShm: "shm", TransportSim: "sim"}

func (t Transport) String() string {
	if int(t) < len(transportNames) && transportNames[t] != "" {
		return transportNames[t]
	}
	return "transport(" + strconv.Itoa(int(t)) + ")"
}

// TransportByName returns the transport named name ("verbs", "shm", "sim",
// compared case-insensitively).
func TransportByName(name string) (Transport, bool) {
	for t, n := range transportNames {
		if n != "" && strings.EqualFold(n, name) {
			return Transport(t), true
		}
	}
	return 0, false
}

// DeclineCode says why a side does not switch transport. Codes this package
// does not know decode fine and are kept.
type DeclineCode uint8

// Decline codes. DeclineNone is only meaningful in Confirm, where it means
// OK.
const (
	DeclineNone              DeclineCode = 0 // OK (Confirm only)
	DeclineNoCommonTransport DeclineCode = 1 // no offered transport is supported
	DeclineUnavailable       DeclineCode = 2 // transport supported but unavailable now
	DeclineResources         DeclineCode = 3 // out of memory, queue pairs, ...
	DeclineFailed            DeclineCode = 4 // setting up the transport failed
	DeclinePolicy            DeclineCode = 5 // refused by configuration
	DeclineVersion           DeclineCode = 6 // peer's protocol version unsupported
)

var declineNames = [...]string{
	DeclineNone:              "none",
	DeclineNoCommonTransport: "no-common-transport",
	DeclineUnavailable:       "unavailable",
	DeclineResources:         "resources",
	DeclineFailed:            "failed",
	DeclinePolicy:            "policy",
	DeclineVersion:           "version",
}

func (c DeclineCode) String() string {
	if int(c) < len(declineNames) {
		return declineNames[c]
	}
	return "decline(" + strconv.Itoa(int(c)) + ")"
}
