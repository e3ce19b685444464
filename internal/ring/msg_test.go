package ring

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMsgRoundTrip(t *testing.T) {
	msgs := []Msg{
		{},
		{Flags: FlagFIN, Seq: 1, Prod: 1, Cons: 2, Posted: 3},
		{Flags: FlagBlocked, Seq: 7, Prod: 4096, Cons: 8192, Posted: 4},
		{Flags: FlagClose | FlagFIN, Seq: math.MaxUint32, Prod: math.MaxUint64, Cons: math.MaxUint64 - 1, Posted: math.MaxUint64},
		{Flags: flagsKnown &^ FlagGrow, Seq: 0x01020304, Prod: 0x0102030405060708, Cons: 0x1112131415161718, Posted: 0x2122232425262728},
		{Flags: FlagGrow, Seq: 3, Posted: 9, Addr: math.MaxUint64, RKey: math.MaxUint32, SizeLog: 20},
		{Flags: FlagGrow | FlagFIN, Seq: 4, Posted: 10, Addr: 0x1000, RKey: 7, SizeLog: 255},
	}
	for f := Flags(0); f <= flagsKnown; f++ {
		if f&FlagGrow == 0 {
			msgs = append(msgs, Msg{Flags: f, Seq: uint32(f) + 1, Prod: uint64(f) << 40, Cons: uint64(f) << 20, Posted: uint64(f)})
		}
	}
	for _, m := range msgs {
		var b [MsgLen]byte
		m.Marshal(b[:])
		got, err := Unmarshal(b[:])
		require.NoError(t, err, "%+v", m)
		assert.Equal(t, m, got)
	}
}

func TestMsgWireLayout(t *testing.T) {
	m := Msg{Flags: FlagFIN | FlagClose, Seq: 0x01020304, Prod: 0x0102030405060708, Cons: 0x1112131415161718, Posted: 0x2122232425262728}
	b := make([]byte, MsgLen)
	for i := range b {
		b[i] = 0xee // garbage Marshal must overwrite, reserved bytes included
	}
	m.Marshal(b)
	want := []byte{
		1, 0x05, 0, 0, // version, FIN|CLOSE, reserved
		0x04, 0x03, 0x02, 0x01,
		0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,
		0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
		0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,
	}
	assert.Equal(t, want, b)

	// A longer buffer: only the first MsgLen bytes are written.
	long := make([]byte, MsgLen+4)
	for i := range long {
		long[i] = 0xaa
	}
	m.Marshal(long)
	assert.Equal(t, want, long[:MsgLen])
	assert.Equal(t, []byte{0xaa, 0xaa, 0xaa, 0xaa}, long[MsgLen:])
}

func TestMsgMarshalShortBufferPanics(t *testing.T) {
	m := Msg{Seq: 1}
	for _, n := range []int{0, 1, MsgLen - 1} {
		assert.Panics(t, func() { m.Marshal(make([]byte, n)) }, "len %d", n)
	}
}

func validWire() []byte {
	b := make([]byte, MsgLen)
	(&Msg{Flags: FlagBlocked, Seq: 9, Prod: 100, Cons: 50, Posted: 12}).Marshal(b)
	return b
}

func TestUnmarshalMalformed(t *testing.T) {
	type tc struct {
		name string
		b    []byte
	}
	var cases []tc
	for _, n := range []int{0, 1, MsgLen - 1, MsgLen + 1, 2 * MsgLen} {
		b := make([]byte, n)
		copy(b, validWire())
		cases = append(cases, tc{"length", b})
	}
	cases = append(cases, tc{"nil", nil})
	for _, v := range []byte{0, 2, 0x7f, 0xff} {
		b := validWire()
		b[0] = v
		cases = append(cases, tc{"version", b})
	}
	for bit := 5; bit < 8; bit++ {
		b := validWire()
		b[1] |= 1 << bit
		cases = append(cases, tc{"unknown flag", b})
	}
	for _, f := range []Flags{FlagBlocked, FlagClose, FlagMoved, 0x20, 0x80} {
		b := growWire()
		b[1] |= byte(f)
		cases = append(cases, tc{"flag on a grow message", b})
	}
	for _, i := range []int{3, 20, 21, 22, 23} {
		b := growWire()
		b[i] = 1
		cases = append(cases, tc{"reserved in a grow message", b})
	}
	for _, i := range []int{2, 3} {
		for _, v := range []byte{1, 0x80, 0xff} {
			b := validWire()
			b[i] = v
			cases = append(cases, tc{"reserved", b})
		}
	}
	for _, c := range cases {
		got, err := Unmarshal(c.b)
		require.Error(t, err, "%s % x", c.name, c.b)
		assert.ErrorIs(t, err, ErrMsgFormat, c.name)
		assert.ErrorIs(t, err, ErrProtocol, "%s: a malformed message is a protocol violation", c.name)
		assert.NotErrorIs(t, err, ErrUsage, c.name)
		assert.Equal(t, Msg{}, got, c.name)
	}

	// Every single-byte corruption of the header is caught or decodes to
	// exactly what the bytes say (the value fields accept anything).
	for i := range 4 {
		for v := range 256 {
			b := validWire()
			b[i] = byte(v)
			m, err := Unmarshal(b)
			ok := b[0] == msgVersion && b[1]&^byte(flagsKnown) == 0 && b[2] == 0 && b[3] == 0
			if Flags(b[1])&FlagGrow != 0 {
				ok = b[0] == msgVersion && Flags(b[1])&^(FlagGrow|FlagFIN) == 0 && b[3] == 0
			}
			if ok {
				require.NoError(t, err)
				assert.Equal(t, Flags(b[1]), m.Flags)
			} else {
				require.ErrorIs(t, err, ErrMsgFormat, "byte %d = %#x", i, v)
			}
		}
	}
}

func growWire() []byte {
	b := make([]byte, MsgLen)
	(&Msg{Flags: FlagGrow, Seq: 9, Posted: 12, Addr: 0x10000, RKey: 0x55, SizeLog: 20}).Marshal(b)
	return b
}

func TestGrowWireLayout(t *testing.T) {
	b := make([]byte, MsgLen)
	for i := range b {
		b[i] = 0xee
	}
	(&Msg{Flags: FlagGrow | FlagFIN, Seq: 0x01020304, Prod: 1, Cons: 2, Posted: 0x2122232425262728,
		Addr: 0x0102030405060708, RKey: 0x11121314, SizeLog: 20}).Marshal(b)
	want := []byte{
		1, 0x09, 20, 0, // version, FIN|GROW, log2 size, reserved
		0x04, 0x03, 0x02, 0x01,
		0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // addr: no cursors in a GROW
		0x14, 0x13, 0x12, 0x11, 0, 0, 0, 0, // rkey, reserved
		0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21,
	}
	assert.Equal(t, want, b)
}

func TestErrMsgFormat(t *testing.T) {
	assert.ErrorIs(t, ErrMsgFormat, ErrProtocol)
	assert.NotErrorIs(t, ErrProtocol, ErrMsgFormat)
	assert.NotErrorIs(t, ErrMsgFormat, ErrUsage)
	assert.Equal(t, "ring: malformed state message", ErrMsgFormat.Error())
	_, err := Unmarshal(nil)
	assert.Equal(t, "ring: malformed state message: 0 bytes, want 32", err.Error())
	// A rule of the state machine is not a format error.
	a, _ := newPair(t, small)
	err = a.Receive(Msg{Seq: 2})
	assert.ErrorIs(t, err, ErrProtocol)
	assert.NotErrorIs(t, err, ErrMsgFormat)
}

func TestUnmarshalValueFieldsAcceptAnything(t *testing.T) {
	b := validWire()
	for i := 4; i < MsgLen; i++ {
		b[i] = 0xff
	}
	m, err := Unmarshal(b)
	require.NoError(t, err)
	assert.Equal(t, Msg{Flags: FlagBlocked, Seq: math.MaxUint32, Prod: math.MaxUint64, Cons: math.MaxUint64, Posted: math.MaxUint64}, m)
	assert.Equal(t, uint32(math.MaxUint32), binary.LittleEndian.Uint32(b[4:]))
}

func TestFlagsString(t *testing.T) {
	for f, want := range map[Flags]string{
		0:                                     "0",
		FlagFIN:                               "FIN",
		FlagBlocked:                           "BLOCKED",
		FlagClose:                             "CLOSE",
		FlagFIN | FlagClose:                   "FIN|CLOSE",
		FlagFIN | FlagBlocked | FlagClose:     "FIN|BLOCKED|CLOSE",
		0x80:                                  "0x80",
		FlagBlocked | 0xe0:                    "BLOCKED|0xe0",
		FlagBlocked | 0xf0:                    "BLOCKED|MOVED|0xe0",
		FlagFIN | FlagBlocked | FlagClose | 8: "FIN|BLOCKED|CLOSE|GROW",
		FlagFIN | FlagGrow:                    "FIN|GROW",
	} {
		assert.Equal(t, want, f.String(), "%#x", uint8(f))
	}
}
