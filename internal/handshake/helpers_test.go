package handshake_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"strings"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

// rawFrame builds a frame by hand (independently of the encoder) from a
// version, a type byte and a body; the length field is len(body).
func rawFrame(version, typ uint8, body []byte) []byte {
	b := []byte(handshake.Magic)
	b = append(b, version, typ)
	b = binary.BigEndian.AppendUint16(b, uint16(len(body)))
	return append(b, body...)
}

// body is a tiny big-endian builder for hand-made bodies.
type body []byte

func (b body) u8(v uint8) body    { return append(b, v) }
func (b body) u16(v uint16) body  { return binary.BigEndian.AppendUint16(b, v) }
func (b body) u32(v uint32) body  { return binary.BigEndian.AppendUint32(b, v) }
func (b body) u64(v uint64) body  { return binary.BigEndian.AppendUint64(b, v) }
func (b body) raw(p []byte) body  { return append(b, p...) }
func (b body) str(s string) body  { return append(b, s...) }
func (b body) lstr(s string) body { return b.u16(uint16(len(s))).str(s) }
func (b body) lraw(p []byte) body { return b.u16(uint16(len(p))).raw(p) }
func (b body) ring(r handshake.RingInfo) body {
	return b.u64(r.Size).u64(r.Addr).u32(r.RKey).u16(r.Credits)
}

var testRing = handshake.RingInfo{Size: 1 << 20, Addr: 0x7f00_1234_0000, RKey: 0xdeadbeef, Credits: 64}

func bytesOf(n int, c byte) []byte { return []byte(strings.Repeat(string(c), n)) }

// sample is a named message with its expected hand-built wire bytes.
type sample struct {
	name  string
	msg   handshake.Message
	frame []byte
}

// samples returns one or more valid messages of every type, each with the
// frame built by hand from the spec.
func samples() []sample {
	ring2 := handshake.RingInfo{Size: 4096, Addr: 0, RKey: 1, Credits: 4}
	return []sample{
		{"hello-one", &handshake.Hello{Offers: []handshake.Offer{{Transport: handshake.TransportVerbs, Ring: testRing, Info: []byte("mlx5_0:1")}}},
			rawFrame(handshake.Version, 1, body{}.u16(0).u64(0).u8(1).u8(1).ring(testRing).lstr("mlx5_0:1"))},
		{"hello-four", &handshake.Hello{Flags: 0xbeef, RingMax: 1 << 20, Offers: []handshake.Offer{
			{Transport: handshake.TransportVerbs, Ring: testRing, Info: []byte("a")},
			{Transport: handshake.TransportShm, Ring: ring2},
			{Transport: handshake.TransportSim, Ring: testRing, Info: []byte{0, 1, 2}},
			{Transport: 200, Ring: handshake.RingInfo{}, Info: []byte("future")},
		}}, rawFrame(handshake.Version, 1, body{}.u16(0xbeef).u64(1<<20).u8(4).
			u8(1).ring(testRing).lstr("a").
			u8(2).ring(ring2).u16(0).
			u8(3).ring(testRing).lraw([]byte{0, 1, 2}).
			u8(200).ring(handshake.RingInfo{}).lstr("future"))},
		{"accept", &handshake.Accept{Transport: handshake.TransportShm, Ring: testRing, Info: []byte("/dev/shm/rsock-1")},
			rawFrame(handshake.Version, 2, body{}.u8(2).ring(testRing).lstr("/dev/shm/rsock-1"))},
		{"accept-noinfo", &handshake.Accept{Transport: handshake.TransportSim, Ring: ring2},
			rawFrame(handshake.Version, 2, body{}.u8(3).ring(ring2).u16(0))},
		{"decline", &handshake.Decline{Code: handshake.DeclineNoCommonTransport, Reason: "no verbs device"},
			rawFrame(handshake.Version, 3, body{}.u8(1).lstr("no verbs device"))},
		{"decline-unknown-code", &handshake.Decline{Code: 99, Reason: "Zürich ✓"},
			rawFrame(handshake.Version, 3, body{}.u8(99).lstr("Zürich ✓"))},
		{"confirm-ok", &handshake.Confirm{},
			rawFrame(handshake.Version, 4, body{}.u8(0).u16(0))},
		{"confirm-fail", &handshake.Confirm{Code: handshake.DeclineFailed, Reason: "connect qp: timeout"},
			rawFrame(handshake.Version, 4, body{}.u8(4).lstr("connect qp: timeout"))},
		{"goodbye", &handshake.Goodbye{FinalProd: 1<<40 + 7},
			rawFrame(handshake.Version, 5, body{}.u8(0).u64(1<<40+7).u16(0))},
		{"goodbye-abort", &handshake.Goodbye{Abort: true, FinalProd: ^uint64(0), Reason: "qp error"},
			rawFrame(handshake.Version, 5, body{}.u8(1).u64(^uint64(0)).lstr("qp error"))},

		// The switching protocol. Data samples stay small (TestTruncatedFrame
		// cuts every frame at every byte); TestBounds has a MaxData payload.
		{"hello-switch", &handshake.Hello{Flags: handshake.FlagSwitch, Offers: []handshake.Offer{{Transport: handshake.TransportShm}}},
			rawFrame(handshake.Version, 1, body{}.u16(1).u64(0).u8(1).u8(2).ring(handshake.RingInfo{}).u16(0))},
		{"upgrade-none", &handshake.Upgrade{},
			rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(0))},
		{"upgrade-four", &handshake.Upgrade{Flags: 0x8001, RingMax: 64 << 10, Transports: []handshake.Transport{
			handshake.TransportShm, handshake.TransportVerbs, handshake.TransportSim, 200}},
			rawFrame(handshake.Version, 6, body{}.u16(0x8001).u64(64<<10).u8(4).u8(2).u8(1).u8(3).u8(200))},
		{"data-one", &handshake.Data{Payload: []byte{0}},
			rawFrame(handshake.Version, 7, body{}.u8(0))},
		{"data-frame-like", &handshake.Data{Payload: rawFrame(handshake.Version, 4, body{}.u8(0).u16(0))},
			rawFrame(handshake.Version, 7, rawFrame(handshake.Version, 4, body{}.u8(0).u16(0)))},
		{"upgrade-offer", &handshake.UpgradeOffer{Offer: handshake.Offer{Transport: handshake.TransportVerbs, Ring: testRing, Info: []byte("mlx5_0:1")}},
			rawFrame(handshake.Version, 8, body{}.u8(1).ring(testRing).lstr("mlx5_0:1"))},
		{"upgrade-offer-noinfo", &handshake.UpgradeOffer{Offer: handshake.Offer{Transport: 77}},
			rawFrame(handshake.Version, 8, body{}.u8(77).ring(handshake.RingInfo{}).u16(0))},
		{"switch-zero", &handshake.Switch{},
			rawFrame(handshake.Version, 9, body{}.u64(0))},
		{"switch-max", &handshake.Switch{Cursor: ^uint64(0)},
			rawFrame(handshake.Version, 9, body{}.u64(^uint64(0)))},
		{"resume-zero", &handshake.Resume{},
			rawFrame(handshake.Version, 10, body{}.u64(0))},
		{"resume-max", &handshake.Resume{Cursor: ^uint64(0)},
			rawFrame(handshake.Version, 10, body{}.u64(^uint64(0)))},
		{"fin-zero", &handshake.Fin{},
			rawFrame(handshake.Version, 11, body{}.u64(0))},
		{"fin-max", &handshake.Fin{Cursor: ^uint64(0)},
			rawFrame(handshake.Version, 11, body{}.u64(^uint64(0)))},
	}
}

// readWhole reads one message with Next, and a Data frame's payload after
// it, so a Data frame comes back as the *Data that Read returns.
func readWhole(r io.Reader) (handshake.Message, error) {
	h, m, err := handshake.Next(r)
	if err != nil || h.Type != handshake.TypeData {
		return m, err
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(r, p); err != nil {
		return nil, err
	}
	return &handshake.Data{Payload: p}, nil
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
