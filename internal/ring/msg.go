package ring

import (
	"encoding/binary"
	"fmt"
)

// MsgLen is the size of a state message on the wire.
const MsgLen = 32

// msgVersion is the first byte of every state message.
const msgVersion = 1

// Flags are the sticky states and one-shot signals a state message carries.
type Flags uint8

const (
	// FlagFIN says the sender will write no more: Prod is final. Once sent it
	// is set on every later message of that sender (sticky).
	FlagFIN Flags = 1 << iota
	// FlagBlocked says the sender has data to write but no ring space or no
	// message credits. The receiver answers with an update as soon as it has
	// freed space it has not announced (see State.NeedUpdate).
	FlagBlocked
	// FlagClose says the sender will read no more (full close); writes to it
	// fail. Sticky, like FlagFIN.
	FlagClose
	// FlagGrow marks a GROW message: the sender offers a larger receive
	// ring (Msg.Addr, RKey, SizeLog) in place of the cursors (see Msg).
	// Sent at most once per side.
	FlagGrow
	// FlagMoved says the sender now writes into the ring the receiver's
	// GROW offered: bytes from this message's Prod on are in the new ring.
	// One-shot, at most once per side.
	FlagMoved

	flagsKnown = FlagFIN | FlagBlocked | FlagClose | FlagGrow | FlagMoved
	flagsStick = FlagFIN | FlagClose
)

func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	s := ""
	add := func(name string) {
		if s != "" {
			s += "|"
		}
		s += name
	}
	if f&FlagFIN != 0 {
		add("FIN")
	}
	if f&FlagBlocked != 0 {
		add("BLOCKED")
	}
	if f&FlagClose != 0 {
		add("CLOSE")
	}
	if f&FlagGrow != 0 {
		add("GROW")
	}
	if f&FlagMoved != 0 {
		add("MOVED")
	}
	if rest := f &^ flagsKnown; rest != 0 {
		add(fmt.Sprintf("%#x", uint8(rest)))
	}
	return s
}

// Msg is the one notification of the ring protocol. Every message carries the
// sender's whole state as absolute values, so it is idempotent: a receiver
// never adds deltas, it validates and adopts.
//
// Wire layout (32 bytes, little-endian: unlike the bootstrap frames, which
// are in network order, state messages are read on the hot path and every
// platform rsock runs on is little-endian):
//
//	0   u8   version (1)
//	1   u8   flags
//	2   u16  reserved, zero
//	4   u32  seq: 1 for the first message of a connection, +1 each
//	8   u64  prod: bytes the sender has written into the receiver's ring
//	16  u64  cons: bytes the sender has consumed from its own ring
//	24  u64  posted: receive work requests the sender has posted in total
//
// A GROW message (FlagGrow) carries the offered ring instead of the
// cursors, and no other flag but FIN (when a message before it carried
// FIN):
//
//	2   u8   log2 of the new ring's size
//	3   u8   reserved, zero
//	8   u64  addr: the new ring's address
//	16  u32  rkey: the new ring's key
//	20  u32  reserved, zero
type Msg struct {
	Flags  Flags
	Seq    uint32
	Prod   uint64
	Cons   uint64
	Posted uint64

	// The offered ring, in a GROW message only.
	Addr    uint64
	RKey    uint32
	SizeLog uint8
}

// ErrMsgFormat is returned for a state message that does not parse. It
// wraps ErrProtocol: a malformed message is the peer breaking the protocol.
var ErrMsgFormat error = msgFormatError{}

type msgFormatError struct{}

func (msgFormatError) Error() string { return "ring: malformed state message" }
func (msgFormatError) Unwrap() error { return ErrProtocol }

// Marshal writes m into b, which must hold MsgLen bytes.
func (m *Msg) Marshal(b []byte) {
	_ = b[MsgLen-1]
	b[0] = msgVersion
	b[1] = byte(m.Flags)
	b[2], b[3] = 0, 0
	binary.LittleEndian.PutUint32(b[4:], m.Seq)
	if m.Flags&FlagGrow != 0 {
		b[2] = m.SizeLog
		binary.LittleEndian.PutUint64(b[8:], m.Addr)
		binary.LittleEndian.PutUint32(b[16:], m.RKey)
		binary.LittleEndian.PutUint32(b[20:], 0)
	} else {
		binary.LittleEndian.PutUint64(b[8:], m.Prod)
		binary.LittleEndian.PutUint64(b[16:], m.Cons)
	}
	binary.LittleEndian.PutUint64(b[24:], m.Posted)
}

// Unmarshal parses a state message. b must be exactly MsgLen bytes with a
// known version, known flags and zero reserved bytes; a GROW message may
// carry only FIN beside FlagGrow.
func Unmarshal(b []byte) (Msg, error) {
	if len(b) != MsgLen {
		return Msg{}, fmt.Errorf("%w: %d bytes, want %d", ErrMsgFormat, len(b), MsgLen)
	}
	if b[0] != msgVersion {
		return Msg{}, fmt.Errorf("%w: version %d", ErrMsgFormat, b[0])
	}
	f := Flags(b[1])
	if f&^flagsKnown != 0 {
		return Msg{}, fmt.Errorf("%w: unknown flags %v", ErrMsgFormat, f)
	}
	if f&FlagGrow != 0 {
		if f&^(FlagGrow|FlagFIN) != 0 {
			return Msg{}, fmt.Errorf("%w: flags %v on a grow message", ErrMsgFormat, f)
		}
		if b[3] != 0 || binary.LittleEndian.Uint32(b[20:]) != 0 {
			return Msg{}, fmt.Errorf("%w: reserved bytes set", ErrMsgFormat)
		}
		return Msg{
			Flags:   f,
			Seq:     binary.LittleEndian.Uint32(b[4:]),
			SizeLog: b[2],
			Addr:    binary.LittleEndian.Uint64(b[8:]),
			RKey:    binary.LittleEndian.Uint32(b[16:]),
			Posted:  binary.LittleEndian.Uint64(b[24:]),
		}, nil
	}
	if b[2] != 0 || b[3] != 0 {
		return Msg{}, fmt.Errorf("%w: reserved bytes set", ErrMsgFormat)
	}
	return Msg{
		Flags:  f,
		Seq:    binary.LittleEndian.Uint32(b[4:]),
		Prod:   binary.LittleEndian.Uint64(b[8:]),
		Cons:   binary.LittleEndian.Uint64(b[16:]),
		Posted: binary.LittleEndian.Uint64(b[24:]),
	}, nil
}
